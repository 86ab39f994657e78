"""Every demo kind end to end: ``h5forge demo-data --kind`` writes real pictures, ``init`` infers a
spec for them, the library builds it (no Prefect), every good sample lands, every defect is
quarantined with its reason, and a sample reads back through the torch reader."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from PIL import Image

import h5forge
from h5forge._demo import (CLASSIFY_CLASSES, KINDS, generate_classify, generate_segment_multiclass,
                                 generate_sr)
from h5forge._format.layout import decode_str
from h5forge.read import index_rows
from h5forge._init import infer_spec
from h5forge.read.torch import H5Dataset
from h5forge.spec import load_spec, override

H5FORGE = str(Path(sys.executable).parent / "h5forge")
SPLITS = ("train", "val", "test")


def init_and_build(raw: Path, tmp: Path):
    """``h5forge init`` (the library call), then build the spec it wrote (``h5forge.build``):
    (inferred, spec, version, build result)."""
    spec_path = tmp / "config" / f"{raw.name}.yaml"
    spec_path.parent.mkdir(parents=True, exist_ok=True)
    inferred = infer_spec(raw, spec_path)
    spec_path.write_text(inferred.text)
    spec = override(load_spec(spec_path), output=tmp / "out" / raw.name)
    result = h5forge.build(spec)
    return inferred, spec, Path(result.path), result


def rejected(result) -> dict[str, str]:
    return {r.path: r.reason for r in result.rejections}


def pictures(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if p.is_file() and p.suffix.lower() in (".png", ".jpg", ".jpeg", ".webp",
                                                                                   ".bmp")]


@pytest.mark.parametrize("split_folders", [False, True], ids=["class-folders", "split-and-class-folders"])
def test_classify_demo_builds_every_class_and_quarantines_the_defects(tmp_path, split_folders):
    raw = tmp_path / "classify"
    defects = generate_classify(raw, n=32, seed=3, split_folders=split_folders)
    assert set(defects.values()) == {"truncated JPEG", "zero-byte file"}
    files = pictures(raw)
    assert {p.suffix for p in files} >= {".jpg", ".JPG", ".jpeg", ".png", ".webp", ".bmp"}
    rotated = [p for p in files if p.suffix.lower() in (".jpg", ".jpeg") and p.stat().st_size
               and Image.open(p).getexif().get(0x0112) == 6]
    assert rotated, "some JPEGs carry an EXIF orientation"

    inferred, spec, path, summary = init_and_build(raw, tmp_path)
    assert inferred.layout == "classify" and spec.source.ids == "path"
    assert spec.fields["label"].classes == tuple(sorted(CLASSIFY_CLASSES))
    assert spec.annotations.folders == ({"label": -1, "split": -2} if split_folders else {"label": -1})
    assert (spec.splits.column == "split") is split_folders

    assert rejected(summary).keys() == set(defects)
    assert "truncated" in rejected(summary)[next(k for k, v in defects.items() if "truncated" in v)]
    assert "0 bytes" in rejected(summary)[next(k for k, v in defects.items() if "zero" in v)]
    good = [p.relative_to(raw) for p in files if p.relative_to(raw).as_posix() not in defects]
    want = Counter(p.parts[-2] for p in good)
    with h5py.File(path, "r") as f:
        counts = sum(np.asarray(f[s].attrs["label_class_counts"]) for s in SPLITS)
        ids = [i for s in SPLITS for i in decode_str(f[s]["ids"][()])]
        if split_folders:  # the split is the folder's, never the hash's
            for s in SPLITS:
                assert all(i.startswith(f"{s}/") for i in decode_str(f[s]["ids"][()]))
    assert dict(zip(spec.fields["label"].classes, counts.tolist())) == dict(want)
    assert len(ids) == len(set(ids)) == len(good)
    zeroth = [i for i in ids if i.endswith("/0000")]
    assert len(zeroth) == len(CLASSIFY_CLASSES), "the same file name in every class is one sample per class"

    ds = H5Dataset(path, split="train", fields=("images", "label", "meta/label"), image_dtype="uint8")
    image, label, name = ds[0]
    assert image.shape == (3, *spec.fields["images"].size) and image.dtype == torch.uint8
    assert spec.fields["label"].classes[int(label)] == name == ds.ids()[0].split("/")[-2]


def test_exif_rotated_pictures_are_stored_upright(tmp_path):
    raw = tmp_path / "classify"
    generate_classify(raw, n=40, seed=5, bad=False)
    inferred, spec, path, _ = init_and_build(raw, tmp_path)
    rotated = next(p for p in sorted(pictures(raw)) if p.suffix.lower() in (".jpg", ".jpeg")
                   and Image.open(p).getexif().get(0x0112) == 6 and Image.open(p).width != Image.open(p).height)
    stored_pixels = np.asarray(Image.open(rotated).convert("RGB"))
    sid = rotated.relative_to(raw).with_suffix("").as_posix()
    with h5py.File(path, "r") as f:
        for s in SPLITS:
            ids = decode_str(f[s]["ids"][()])
            if sid in ids:
                row = f[s]["images"][ids.index(sid)]
    upright = np.rot90(stored_pixels, k=-1)  # orientation 6: turn 90 degrees clockwise to view
    h, w = upright.shape[:2]
    th, tw = spec.fields["images"].size
    top, left = (th - h) // 2, (tw - w) // 2
    assert row.shape == (3, th, tw)
    assert np.array_equal(row[:, top:top + h, left:left + w].transpose(1, 2, 0), upright)


def test_segment_multiclass_demo_builds_three_classes_and_rejects_the_stray_value(tmp_path):
    raw = tmp_path / "segment"
    defects = generate_segment_multiclass(raw, n=24, seed=2)
    assert Image.open(raw / "masks" / "scan_0003.png").mode == "P"
    inferred, spec, path, summary = init_and_build(raw, tmp_path)
    masks = spec.fields["masks"]
    assert inferred.layout == "segment"
    assert (masks.classes, masks.ignore_value) == (3, 255)
    assert spec.fields["images"].files == ("images/*.png", "images/*.jpg")
    assert spec.annotations.file == "annotations.csv" and spec.annotations.id_key == "file"
    assert spec.annotations.columns == {"focus": "float", "num_cells": "int", "reviewed": "bool", "stain": "str"}

    [(where, reason)] = rejected(summary).items()
    assert where in defects and "mask values [7] are not classes 0..2 or the ignore value 255" in reason
    with h5py.File(path, "r") as f:
        assert sum(f[s]["ids"].shape[0] for s in SPLITS) == 24
        assert "scan_0003" in [i for s in SPLITS for i in decode_str(f[s]["ids"][()])]  # the palette mask
        for s in SPLITS:
            stored = f[s]["masks"][()]
            assert set(np.unique(stored)) <= {0, 1, 2, 255}
            assert list(f[s].attrs["masks_class_pixels"]) == list(np.bincount(stored.ravel(), minlength=256)[:3])
        assert len(index_rows(f, "train", "masks", 2)) == f["train"]["ids"].shape[0]  # every scan has a nucleus

    ds = H5Dataset(path, split="train", fields=("images", "masks", "reviewed", "num_cells"))
    image, mask, reviewed, num_cells = ds[0]
    assert image.dtype == torch.uint8 and mask.shape == (1, *spec.fields["images"].size)
    assert reviewed.dtype == torch.bool and num_cells.dtype == torch.int64 and int(num_cells) >= 2


def test_sr_demo_builds_aligned_pairs_and_rejects_the_wrong_scale(tmp_path):
    raw = tmp_path / "sr"
    defects = generate_sr(raw, n=16, seed=4)
    inferred, spec, path, summary = init_and_build(raw, tmp_path)
    assert inferred.layout == "sr"
    assert spec.fields["high_res"].kind == "paired" and spec.fields["high_res"].scale == 4
    assert spec.fields["high_res"].like == "low_res"
    [(where, reason)] = rejected(summary).items()
    assert where in defects and "scale 4 needs" in reason
    with h5py.File(path, "r") as f:
        assert sum(f[s]["ids"].shape[0] for s in SPLITS) == 16
    ds = H5Dataset(path, split="train", fields=("low_res", "high_res"), image_dtype="uint8")
    low, high = ds[0]
    lh, lw = spec.fields["low_res"].size
    assert low.shape == (3, lh, lw) and high.shape == (3, 4 * lh, 4 * lw)
    # aligned: the stored HR, shrunk 4 times, is the stored LR (where the picture is, not the padding)
    sid = ds.ids()[0]
    h, w = Image.open(raw / "lr" / f"{sid}.png").size[::-1]
    top, left = (lh - h) // 2, (lw - w) // 2
    hr = Image.fromarray(high.numpy().transpose(1, 2, 0)[4 * top:4 * (top + h), 4 * left:4 * (left + w)])
    assert np.array_equal(np.asarray(hr.resize((w, h), Image.Resampling.BICUBIC)),
                          low.numpy().transpose(1, 2, 0)[top:top + h, left:left + w])


@pytest.mark.parametrize("kind", [k for k in KINDS if k != "cells"])
def test_demo_kinds_are_deterministic(tmp_path, kind):
    generate, _ = KINDS[kind]
    generate(tmp_path / "b", n=12, seed=9)
    generate(tmp_path / "c", n=12, seed=9)
    a, b = sorted(pictures(tmp_path / "b")), sorted(pictures(tmp_path / "c"))
    assert [p.relative_to(tmp_path / "b") for p in a] == [p.relative_to(tmp_path / "c") for p in b]
    assert all(x.read_bytes() == y.read_bytes() for x, y in zip(a, b))


def test_demo_data_command_writes_each_kind(tmp_path):
    for kind, marker in (("classify", "circles"), ("segment-multiclass", "masks"), ("sr", "lr")):
        r = subprocess.run([H5FORGE, "demo-data", str(tmp_path / kind), "--kind", kind, "--n", "8"],
                           capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stderr
        assert (tmp_path / kind / marker).is_dir() and f"{kind}" in r.stdout
    r = subprocess.run([H5FORGE, "demo-data", str(tmp_path / "x"), "--kind", "nope"], capture_output=True, text=True)
    assert r.returncode == 2 and "classify" in r.stderr
