"""Padding is never a class: a mask padded to its image's size gets ``pad_value`` (255 unless the
spec says otherwise, the ignore value when one is declared), which ``<mask>_class_pixels`` does not
count, so the class weights of a balanced loss see only labelled pixels; ``init`` writes the pad
value into the spec. A volume is padded with what its modality or dtype calls background: air
(-1024 HU) for CT, 0 for MR and for an unsigned NIfTI volume."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import h5py
import nibabel
import numpy as np
import pydicom
import pytest
import yaml
from PIL import Image
from pydicom.data import get_testdata_file
from pydicom.uid import generate_uid

import h5forge
from h5forge._format import arrays
from h5forge._format.layout import decode_str
from h5forge.spec import DatasetSpec
from tests.helpers.files import make_raw

SIZE = [128, 128]  # the demo pictures are 64..96 pixels a side: every one is padded


def mask_spec(raw: Path, out: Path, **mask) -> DatasetSpec:
    return DatasetSpec.model_validate({
        "name": "cells", "source": {"root": str(raw)}, "output": {"dir": str(out)},
        "fields": {"images": {"kind": "image", "files": "images/*.png", "size": SIZE},
                   "masks": {"kind": "mask", "files": "masks/*.png", "like": "images", **mask}},
        "splits": {"ratios": {"train": 1.0}}})


def labelled_pixels(raw: Path, ids: list[str], to_class) -> np.ndarray:
    """Class pixel counts over the raw masks themselves (what was labelled, no padding)."""
    total = None
    for sid in ids:
        values = to_class(np.asarray(Image.open(raw / "masks" / f"{sid}.png").convert("L")))
        counts = np.bincount(values.ravel(), minlength=3)[:3]
        total = counts if total is None else total + counts
    return total


def test_binary_mask_padding_is_not_counted_as_background(tmp_path):
    raw = make_raw(tmp_path / "raw", n=8, seed=3)
    result = h5forge.build(mask_spec(raw, tmp_path / "out"))
    with h5py.File(result.path, "r") as f:
        g = f["train"]
        ids = decode_str(g["ids"][()])
        masks = g["masks"][()]
        pixels = g.attrs["masks_class_pixels"].tolist()
    want = labelled_pixels(raw, ids, lambda v: (v > 0).astype(np.uint8))[:2]  # {0,1} or {0,255} files
    assert pixels == want.tolist()
    assert sum(pixels) < masks.size  # every picture was padded
    assert set(np.unique(masks).tolist()) == {0, 1, 255}
    assert int(np.count_nonzero(masks == 255)) == masks.size - sum(pixels)


def test_class_mask_padding_uses_the_declared_pad_value_and_is_not_counted(tmp_path):
    raw = make_raw(tmp_path / "raw", n=6, seed=4)
    for p in (raw / "masks").iterdir():  # 0/255 masks as classes 0 and 2
        v = np.asarray(Image.open(p).convert("L"))
        Image.fromarray(np.where(v > 0, 2, 0).astype(np.uint8)).save(p)
    result = h5forge.build(mask_spec(raw, tmp_path / "out", classes=3, pad_value=7))
    with h5py.File(result.path, "r") as f:
        g = f["train"]
        ids = decode_str(g["ids"][()])
        masks = g["masks"][()]
        assert g["masks"].attrs["pad_value"] == 7
        pixels = g.attrs["masks_class_pixels"].tolist()
    assert pixels == labelled_pixels(raw, ids, lambda v: v).tolist()
    assert int(np.count_nonzero(masks == 7)) == masks.size - sum(pixels)


def test_a_pad_value_that_is_a_class_is_refused(tmp_path):
    with pytest.raises(ValueError, match="pad_value 1 is one of the classes 0..2"):
        mask_spec(tmp_path, tmp_path / "out", classes=3, pad_value=1)
    with pytest.raises(ValueError, match="pad_value 0 is one of the classes 0..1"):
        mask_spec(tmp_path, tmp_path / "out", pad_value=0)


def test_init_writes_the_pad_value(tmp_path):
    from h5forge._init import infer_spec

    raw = make_raw(tmp_path / "raw", n=6, seed=2)
    inferred = infer_spec(raw, tmp_path / "spec.yaml")
    masks = yaml.safe_load(inferred.text)["fields"]["masks"]
    assert masks["pad_value"] == 255
    assert "pad_value: 255" in inferred.text and "not a class" in inferred.text


def write_series(folder: Path, source: str, depth: int = 3) -> np.ndarray:
    folder.mkdir(parents=True)
    base = pydicom.dcmread(get_testdata_file(source))
    series = generate_uid()
    for k in range(depth):
        ds = copy.deepcopy(base)
        ds.SeriesInstanceUID, ds.SOPInstanceUID = series, generate_uid()
        ds.ImageOrientationPatient = [1, 0, 0, 0, 1, 0]
        ds.ImagePositionPatient = [0.0, 0.0, 2.0 * k]
        ds.save_as(folder / f"{k}.dcm", enforce_file_format=True)
    return base.pixel_array


def test_volume_padding_follows_the_modality_or_dtype(tmp_path):
    root = tmp_path / "raw"
    ct = write_series(root / "cases" / "ct", "CT_small.dcm")
    mr = write_series(root / "cases" / "mr", "MR_small.dcm")
    (root / "nifti").mkdir()
    grey = np.random.default_rng(0).integers(1, 250, size=(40, 30, 4)).astype(np.uint8)  # (x, y, z)
    nibabel.save(nibabel.Nifti1Image(grey, np.eye(4)), root / "nifti" / "grey.nii.gz")
    size = [max(ct.shape[0], mr.shape[0]) + 8, max(ct.shape[1], mr.shape[1]) + 8]
    for name, files in (("dicom", "cases/*"), ("nifti", "nifti/*.nii.gz")):
        spec = DatasetSpec.model_validate({
            "name": name, "source": {"root": str(root)}, "output": {"dir": str(tmp_path / name)},
            "splits": {"ratios": {"train": 1.0}}, "fields": {"v": {"kind": "volume", "files": files, "size": size}}})
        result = h5forge.build(spec)
        with h5py.File(result.path, "r") as f:
            g = f["train"]
            read = arrays.RowReader(g, "v", arrays.Stored(tuple(size), np.int16, True, True, 1))
            for row, sid in enumerate(decode_str(g["ids"][()])):
                corner = int(read.row(row)[0, 0, 0])
                assert corner == {"ct": -1024, "mr": 0, "grey": 0}[sid], sid
