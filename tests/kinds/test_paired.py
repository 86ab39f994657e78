"""Super-resolution pairs from real photographs: LR made with Image.resize at scale 4, the scale
checked per pair before any crop, and HR's crop offset exactly 4 times LR's."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
from PIL import Image
from skimage import data

from h5forge._format.layout import decode_str
from h5forge.read.torch import H5Dataset

PHOTOS = ("astronaut", "coffee", "chelsea", "rocket")
LR = (48, 64)  # smaller than every LR picture: both are centre-cropped


def write_pairs(root, wrong=("rocket",)):
    (root / "lr").mkdir(parents=True)
    (root / "hr").mkdir()
    for name in PHOTOS:
        hr = Image.fromarray(getattr(data, name)())
        hr = hr.crop((0, 0, hr.width - hr.width % 4, hr.height - hr.height % 4))
        hr.save(root / "hr" / f"{name}.png")
        k = 3 if name in wrong else 4
        hr.resize((hr.width // k, hr.height // k), Image.Resampling.BICUBIC).save(root / "lr" / f"{name}.png")


def spec_data(root, out):
    return {"name": "sr", "source": {"root": str(root)}, "output": {"dir": str(out)},
            "splits": {"ratios": {"train": 1.0}},
            "fields": {"low_res": {"kind": "image", "files": "lr/*.png", "size": list(LR)},
                       "high_res": {"kind": "paired", "files": "hr/*.png", "like": "low_res", "scale": 4}}}


def test_pairs_stay_aligned_and_a_wrong_scale_is_rejected(tmp_path, build_spec):
    root = tmp_path / "raw"
    write_pairs(root)
    path, summary = build_spec(spec_data(root, tmp_path / "out"))
    [bad] = summary.rejections
    assert bad.sample_id == "rocket" and "scale 4 needs" in bad.reason and "HR is 424x640" in bad.reason
    with h5py.File(path, "r") as f:
        g = f["train"]
        assert g["high_res"].shape[1:] == (3, 4 * LR[0], 4 * LR[1])
        for row, sid in enumerate(decode_str(g["ids"][()])):
            lr = np.asarray(Image.open(root / "lr" / f"{sid}.png"))
            hr = np.asarray(Image.open(root / "hr" / f"{sid}.png"))
            top, left = (lr.shape[0] - LR[0]) // 2, (lr.shape[1] - LR[1]) // 2
            assert np.array_equal(g["low_res"][row].transpose(1, 2, 0), lr[top:top + LR[0], left:left + LR[1]])
            assert np.array_equal(g["high_res"][row].transpose(1, 2, 0),
                                  hr[4 * top:4 * (top + LR[0]), 4 * left:4 * (left + LR[1])]), sid
    low, high = H5Dataset(path, fields=("low_res", "high_res"))[0]  # one lookup gives the pair
    assert low.shape == (3, *LR) and high.shape == (3, 4 * LR[0], 4 * LR[1])


def test_paired_needs_an_image_partner(tmp_path):
    from h5forge.spec import DatasetSpec

    bad = spec_data(tmp_path, tmp_path / "out")
    bad["fields"]["high_res"]["like"] = "nope"
    with pytest.raises(ValueError, match="fields.high_res.like: 'nope' is not an image field"):
        DatasetSpec.model_validate(bad)
