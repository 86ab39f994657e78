"""COCO as it is downloaded: an ``instances_<split><year>.json`` per split beside the split's picture
folder (``train2017/``, ``val2017/``; ``test2017/`` has pictures and no instances file). ``init``
keeps each picture in its folder's split, and a picture named alike in two splits (each split
exported on its own numbers its pictures from 1) never takes the other split's boxes. Scikit-image's
photographs, the files read back by pycocotools."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

import h5forge
from h5forge._format.names import SPLITS
from h5forge.read._reader import SplitReader

CLASSES = ("person", "cup", "cat")
# split folder -> picture -> (scikit-image photograph, boxes as (class, x, y, w, h) in its pixels)
SPLIT_PICTURES = {
    "train2017": {
        "000000000001": ("astronaut", [("person", 150, 30, 210, 480), ("cup", 5, 400, 55, 70)]),
        "000000000002": ("coffee", [("cup", 180, 40, 290, 290)]),
        "000000000003": ("rocket", []),
    },
    "val2017": {"000000000004": ("chelsea", [("cat", 60, 20, 340, 280)])},
}


def _photo(name: str) -> np.ndarray:
    import skimage.data

    return getattr(skimage.data, name)()


def _instances(pictures: dict[str, tuple[str, list]], path: Path) -> None:
    from pycocotools.coco import COCO

    images, annotations = [], []
    for i, (stem, (photo, objects)) in enumerate(pictures.items(), 1):
        h, w = _photo(photo).shape[:2]
        images.append({"id": i, "file_name": f"{stem}.png", "height": h, "width": w})
        for cls, x, y, bw, bh in objects:
            annotations.append({"id": len(annotations) + 1, "image_id": i, "category_id": CLASSES.index(cls) + 1,
                                "bbox": [x, y, bw, bh], "area": float(bw * bh), "iscrowd": 0})
    categories = [{"id": k + 1, "name": c} for k, c in enumerate(CLASSES)]
    path.write_text(json.dumps({"images": images, "annotations": annotations, "categories": categories}))
    COCO(str(path))  # the reference reader takes it


def _coco_download(raw: Path, split_pictures: dict) -> Path:
    from PIL import Image

    (raw / "annotations").mkdir(parents=True)
    for folder, pictures in split_pictures.items():
        (raw / folder).mkdir()
        for stem, (photo, _) in pictures.items():
            Image.fromarray(_photo(photo)).save(raw / folder / f"{stem}.png")
        _instances(pictures, raw / "annotations" / f"instances_{folder}.json")
    return raw


def _published(path: str) -> dict[str, tuple[str, np.ndarray]]:
    """id -> (split, boxes as x0 y0 x1 y1 class)."""
    out = {}
    for split in SPLITS:
        with SplitReader(path, split, fields=["boxes"]) as r:
            if len(r):
                values = r.read(range(len(r)))
                out |= {sid: (split, values["boxes"][i]) for i, sid in enumerate(r.ids())}
    return out


def _raw_boxes(objects: list) -> np.ndarray:
    return np.array([[x, y, x + w, y + h, CLASSES.index(c)] for c, x, y, w, h in objects], np.float32).reshape(-1, 5)


def test_init_keeps_coco_2017_splits_and_leaves_the_unannotated_test_folder_out(tmp_path):
    from PIL import Image

    from h5forge._init import infer_spec

    raw = _coco_download(tmp_path / "coco", SPLIT_PICTURES)
    (raw / "test2017").mkdir()  # COCO's test pictures come without an instances file
    Image.fromarray(_photo("camera")).save(raw / "test2017" / "000000000009.png")
    found = infer_spec(raw, tmp_path / "spec.yaml")
    spec = yaml.safe_load(found.text)
    assert found.layout == "boxes"
    assert spec["fields"]["images"]["files"] == ["train2017/*.png", "val2017/*.png"]
    assert spec["fields"]["boxes"]["coco"] == ["annotations/instances_train2017.json",
                                               "annotations/instances_val2017.json"]
    assert spec["splits"]["column"] == "split" and spec["annotations"]["folders"] == {"split": -1}
    assert any("test2017" in n for n in found.notes), found.notes  # said, not silently dropped

    # the spec as init wrote it, kept at its size so no box moves, built
    spec["fields"]["images"] |= {"size": [640, 640], "larger": "shrink"}
    spec["source"]["root"] = str(raw)
    spec["output"]["dir"] = str(tmp_path / "out")
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec))
    result = h5forge.build(tmp_path / "spec.yaml")
    assert result.rejected == 0, result.rejections
    got = _published(result.path)
    expected = {stem: (folder[:-4], photo, objects) for folder, pictures in SPLIT_PICTURES.items()
                for stem, (photo, objects) in pictures.items()}
    assert set(got) == set(expected)
    for stem, (split, photo, objects) in expected.items():
        h, w = _photo(photo).shape[:2]
        scale = min(640 / h, 640 / w, 1.0)
        sh, sw = round(h * scale), round(w * scale)
        pad = np.array([(640 - sw) // 2, (640 - sh) // 2] * 2 + [0], np.float32)
        want = _raw_boxes(objects) * np.array([sw / w, sh / h, sw / w, sh / h, 1], np.float32) + pad
        assert got[stem][0] == split, stem
        assert np.allclose(got[stem][1], want, atol=1e-2), (stem, got[stem][1], want)


def test_pictures_appended_into_split_folders_take_their_folders_split_and_their_boxes(tmp_path):
    """The inbox of a COCO download's dataset: new pictures in ``val2017/`` and ``train2017/`` with
    the instances file of each at the spec's paths. Each lands in its folder's split with its own
    boxes, and a rebuild from the processed folders keeps them."""
    from h5forge._init import infer_spec
    from tests.helpers.data import age_files

    raw = _coco_download(tmp_path / "coco", SPLIT_PICTURES)
    spec = yaml.safe_load(infer_spec(raw, tmp_path / "spec.yaml").text)
    spec["fields"]["images"] |= {"size": [640, 640], "larger": "shrink"}
    spec["source"] |= {"root": str(raw), "inbox": str(tmp_path / "inbox")}
    spec["output"]["dir"] = str(tmp_path / "out")
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec))
    assert h5forge.build(tmp_path / "spec.yaml").rejected == 0
    arriving = {"val2017": {"000000000010": ("hubble_deep_field", [("cup", 10, 20, 100, 50)])},
                "train2017": {"000000000011": ("immunohistochemistry", [("cat", 5, 6, 200, 150),
                                                                        ("cat", 250, 10, 100, 100)])}}
    inbox = _coco_download(tmp_path / "inbox", arriving)
    age_files(inbox)
    added = h5forge.append(tmp_path / "spec.yaml")
    assert added.added == 2 and added.rejections == (), added.rejections
    for path in (added.path, h5forge.build(tmp_path / "spec.yaml").path):
        got = _published(path)
        assert got["000000000010"][0] == "val" and got["000000000011"][0] == "train"
        for stem, (photo, objects) in {**arriving["val2017"], **arriving["train2017"]}.items():
            h, w = _photo(photo).shape[:2]
            scale = min(640 / h, 640 / w, 1.0)
            pad = np.array([(640 - round(w * scale)) // 2, (640 - round(h * scale)) // 2] * 2 + [0], np.float32)
            want = _raw_boxes(objects) * np.array([scale] * 4 + [1], np.float32) + pad
            assert np.allclose(got[stem][1], want, atol=1e-2), (stem, got[stem][1], want)


def test_a_picture_named_alike_in_two_coco_files_never_takes_the_other_files_boxes(tmp_path):
    """Each split exported on its own names its first picture 1.png: with path ids both pictures are
    samples, and the COCO files name pictures by file name only. Which file's boxes are a picture's
    cannot be told (the pictures are alike in size, so no size check tells either), so both are
    quarantined with that reason; a picture one file lists is built."""
    pictures = {"train": {"1": ("astronaut", [("person", 150, 30, 210, 480)]), "2": ("coffee", [])},
                "val": {"1": ("immunohistochemistry", [("cat", 60, 20, 340, 280)])}}  # 512x512 as astronaut
    raw = _coco_download(tmp_path / "raw", pictures)
    spec = {"name": "clash", "source": {"root": str(raw), "ids": "path"},
            "fields": {"images": {"kind": "image", "files": "*/*.png", "size": [640, 640],
                                  "larger": "shrink"},
                       "boxes": {"kind": "boxes", "like": "images", "classes": list(CLASSES),
                                 "coco": ["annotations/instances_train.json", "annotations/instances_val.json"]}},
            "annotations": {"columns": {"split": "str"}, "folders": {"split": -1}, "required": False},
            "splits": {"column": "split"}, "max_rejected": 0.9,
            "output": {"dir": str(tmp_path / "out")}, "verify": {"latency_reads": 0}}
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec))
    result = h5forge.build(tmp_path / "spec.yaml")
    reasons = {r.sample_id: r.reason for r in result.rejections}
    assert set(reasons) == {"train/1", "val/1"}, reasons
    assert all("instances_train.json" in why and "instances_val.json" in why for why in reasons.values()), reasons
    assert set(_published(result.path)) == {"train/2"}


@pytest.mark.parametrize("value,split", [("train2017", "train"), ("val2014", "val"), ("Test2015", "test"),
                                         ("2012_train", "train"), ("validation", "val")])
def test_a_split_named_with_its_year_is_that_split(value, split):
    from h5forge._ingest.splits import assign_split
    from h5forge.spec import Splits

    assert assign_split("x", Splits(column="split"), {"split": value}) == split


@pytest.mark.parametrize("value", ["train2", "trainer", "2017", "val20171", "holdout"])
def test_a_split_column_value_naming_no_split_is_refused(value):
    from h5forge._ingest.splits import assign_split
    from h5forge.spec import Splits

    with pytest.raises(ValueError, match="expected one of train, val, test"):
        assign_split("x", Splits(column="split"), {"split": value})
