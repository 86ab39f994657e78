"""An inbox append to a dataset whose masks are named ``<image stem><id_suffix>`` (ISIC's
``_segmentation``): new pictures, suffixed masks and sidecar records dropped into the inbox become
samples under the image's id, their files move to ``processed/vNNNN/``, and a mask dropped without
the suffix goes to ``quarantine/`` with its picture and record, each with the reason."""

from __future__ import annotations

import json

import h5py
import numpy as np
import yaml
from PIL import Image
from skimage import data, filters

import h5forge
from h5forge._format.layout import decode_str
from h5forge._store.verify import verify_file
from tests.helpers.data import age_files

SUFFIX = "_segmentation"


def grey(name: str) -> np.ndarray:
    return np.asarray(Image.fromarray(getattr(data, name)()).convert("L").resize((64, 64)))


def mask_of(g: np.ndarray) -> np.ndarray:
    return np.where(g > filters.threshold_otsu(g), 255, 0).astype(np.uint8)


def drop(folder, sid: str, name: str, label: str, suffix: str = SUFFIX) -> np.ndarray:
    """A picture, its mask named ``<sid><suffix>`` and a sidecar record, as a user drops them."""
    g = grey(name)
    (folder / "images").mkdir(parents=True, exist_ok=True)
    (folder / "masks").mkdir(exist_ok=True)
    Image.fromarray(g).save(folder / "images" / f"{sid}.png")
    Image.fromarray(mask_of(g)).save(folder / "masks" / f"{sid}{suffix}.png")
    (folder / f"{sid}.json").write_text(json.dumps({"id": sid, "label": label}))
    return mask_of(g) // 255


def test_an_inbox_append_takes_suffixed_masks_and_quarantines_one_without_the_suffix(tmp_path):
    raw, inbox, out = tmp_path / "raw", tmp_path / "inbox", tmp_path / "out"
    for i, name in enumerate(("camera", "coins", "moon", "page")):
        drop(raw, f"ISIC_{i:07d}", name, "nevus")
    records = [json.loads(p.read_text()) for p in sorted(raw.glob("*.json"))]
    for p in raw.glob("*.json"):
        p.unlink()
    (raw / "annotations.json").write_text(json.dumps(records))
    spec_file = tmp_path / "isic.yaml"
    spec_file.write_text(yaml.safe_dump({
        "name": "isic", "source": {"root": str(raw), "inbox": str(inbox)}, "output": {"dir": str(out)},
        "splits": {"ratios": {"train": 1.0}}, "append": {"settle_seconds": 0.5},
        "fields": {"images": {"kind": "image", "files": "images/*.png", "size": [64, 64]},
                   "masks": {"kind": "mask", "files": "masks/*.png", "like": "images", "id_suffix": SUFFIX}},
        "annotations": {"file": "annotations.json", "id_key": "id", "columns": {"label": "str"}}}))
    assert h5forge.build(spec_file).version == 1
    new = {"ISIC_0000100": drop(inbox, "ISIC_0000100", "astronaut", "melanoma"),
           "ISIC_0000101": drop(inbox, "ISIC_0000101", "chelsea", "nevus")}
    drop(inbox, "ISIC_0000102", "coffee", "melanoma", suffix="")  # the mask lacks the suffix
    age_files(inbox)
    result = h5forge.append(spec_file)
    assert (result.version, result.added) == (2, 2)
    why = "the file name does not end in '_segmentation' (the field's id_suffix)"
    assert [(r.sample_id, r.paths, r.reason) for r in result.rejections] == [
        ("ISIC_0000102", ("masks/ISIC_0000102.png",), why)]
    with h5py.File(out / "dataset_latest.h5", "r") as f:
        g = f["train"]
        ids = decode_str(g["ids"][()])
        assert ids == [f"ISIC_{i:07d}" for i in range(4)] + sorted(new)
        labels = decode_str(g["meta"]["label"][()])
        assert [labels[ids.index(s)] for s in sorted(new)] == ["melanoma", "nevus"]
        for sid, truth in new.items():
            assert np.array_equal(g["masks"][ids.index(sid), 0], truth), sid
    left = sorted(p.relative_to(inbox).as_posix() for p in inbox.rglob("*") if p.is_file())
    assert left == [
        "processed/v0002/ISIC_0000100.json", "processed/v0002/ISIC_0000101.json", "processed/v0002/annotations.json",
        "processed/v0002/images/ISIC_0000100.png", "processed/v0002/images/ISIC_0000101.png",
        "processed/v0002/masks/ISIC_0000100_segmentation.png", "processed/v0002/masks/ISIC_0000101_segmentation.png",
        "quarantine/ISIC_0000102.json", "quarantine/ISIC_0000102.json.reason",
        "quarantine/images/ISIC_0000102.png", "quarantine/images/ISIC_0000102.png.reason",
        "quarantine/masks/ISIC_0000102.png", "quarantine/masks/ISIC_0000102.png.reason",
    ]
    assert (inbox / "quarantine/masks/ISIC_0000102.png.reason").read_text().strip() == why
    assert (inbox / "quarantine/images/ISIC_0000102.png.reason").read_text().strip() == (
        f"sample 'ISIC_0000102' refused (masks/ISIC_0000102.png: {why})")
    report = verify_file(out / "dataset_latest.h5", resample=10)  # the appended samples cleaned again from processed/
    assert report.ok, report.errors
