"""A binary mask saved as JPEG (Kvasir-SEG's, and many medical sets'): values near 0 and 255, moved
a few levels by the compression. Without the mask field's ``threshold`` such a mask is rejected; with
it, a value >= threshold is 1, a grey or colour picture given as a mask is still rejected, and masks
holding {0,1} or {0,255} exactly read as they always did. Pictures from scikit-image, masks drawn
with Pillow."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
from PIL import Image, ImageDraw
from pydantic import ValidationError
from skimage import data

from h5forge._format.layout import decode_str
from h5forge.kinds.mask import MaskField

SIZE = (96, 128)  # (h, w) of every picture: stored as is, no crop or pad


def drawn(i: int) -> Image.Image:
    """A polyp-like shape: an ellipse and a triangle, white on black."""
    h, w = SIZE
    m = Image.new("L", (w, h), 0)
    d = ImageDraw.Draw(m)
    d.ellipse((20 + 3 * i, 15, 70 + 3 * i, 80), fill=255)
    d.polygon([(85, 10), (120, 40), (95, 85)], fill=255)
    return m


@pytest.fixture
def raw(tmp_path):
    root = tmp_path / "raw"
    (root / "images").mkdir(parents=True)
    (root / "masks").mkdir()
    photo = Image.fromarray(data.astronaut()).resize(SIZE[::-1])
    for i, (mode, quality) in enumerate([("L", 75), ("RGB", 75), ("L", 90), ("RGB", 95)]):
        photo.save(root / "images" / f"j{i}.png")
        drawn(i).convert(mode).save(root / "masks" / f"j{i}.jpg", quality=quality)
    photo.save(root / "images" / "grey.png")  # a grey photograph given as a mask
    Image.fromarray(data.camera()).resize(SIZE[::-1]).save(root / "masks" / "grey.jpg", quality=90)
    photo.save(root / "images" / "red.png")  # a colour mask: red on black
    red = Image.new("RGB", SIZE[::-1])
    ImageDraw.Draw(red).ellipse((10, 10, 110, 90), fill=(255, 0, 0))
    red.save(root / "masks" / "red.jpg", quality=90)
    photo.save(root / "images" / "ones.png")  # exact masks: {0,1} and {0,255}
    Image.fromarray((np.asarray(drawn(5)) // 255).astype(np.uint8)).save(root / "masks" / "ones.png")
    photo.save(root / "images" / "exact.png")
    drawn(6).save(root / "masks" / "exact.png")
    photo.save(root / "images" / "scaled.png")  # a {0,1} mask saved as JPEG: nothing near 255 to cut at 128
    Image.fromarray((np.asarray(drawn(7)) // 255).astype(np.uint8)).save(root / "masks" / "scaled.jpg", quality=90)
    photo.save(root / "images" / "faint.png")  # a small region drawn grey (100): no edge, a threshold would drop it
    faint = drawn(8)
    ImageDraw.Draw(faint).rectangle((2, 86, 20, 94), fill=100)
    faint.save(root / "masks" / "faint.png")
    return root


def on_edge(mask: np.ndarray) -> np.ndarray:
    """The pixels with a 4-neighbour of the other value."""
    padded = np.pad(mask, 1, mode="edge")
    h, w = mask.shape
    return np.any([mask != padded[dy:dy + h, dx:dx + w] for dy, dx in ((0, 1), (2, 1), (1, 0), (1, 2))], axis=0)


def spec_data(root, out, **mask):
    return {"name": "kvasir", "source": {"root": str(root)}, "output": {"dir": str(out)},
            "splits": {"ratios": {"train": 1.0}},
            "fields": {"images": {"kind": "image", "files": "images/*.png", "size": list(SIZE)},
                       "masks": {"kind": "mask", "files": ["masks/*.jpg", "masks/*.png"], "like": "images", **mask}}}


def stored_masks(path) -> dict[str, np.ndarray]:
    with h5py.File(path, "r") as f:
        return dict(zip(decode_str(f["train"]["ids"][()]), f["train"]["masks"][:, 0]))


def test_without_threshold_a_jpeg_mask_is_rejected_and_the_reason_names_the_option(raw, tmp_path, build_spec):
    path, summary = build_spec(spec_data(raw, tmp_path / "out"))
    reasons = {r.sample_id: r.reason for r in summary.rejections}
    assert sorted(reasons) == ["faint", "grey", "j0", "j1", "j2", "j3", "red", "scaled"]
    assert reasons["j0"].startswith("mask values [0, 1, 2") and "not allowed" in reasons["j0"]
    for i in range(4):  # grey and RGB JPEGs alike
        assert reasons[f"j{i}"].endswith("not allowed: a mask must hold {0,1} or {0,255} (JPEG: the field's "
                                         "threshold reads a lossy binary mask)"), i
    masks = stored_masks(path)
    assert sorted(masks) == ["exact", "ones"]


def test_threshold_reads_jpeg_masks_at_the_threshold_and_still_rejects_pictures(raw, tmp_path, build_spec):
    path, summary = build_spec(spec_data(raw, tmp_path / "out", threshold=128))
    reasons = {r.sample_id: r.reason for r in summary.rejections}
    assert sorted(reasons) == ["faint", "grey", "red", "scaled"]
    for sid in ("grey", "red"):
        assert "of its pixels far from 0 and 255 (or coloured): not a binary mask" in reasons[sid]
    assert reasons["scaled"].startswith("mask values 0..") and "nothing near 255" in reasons["scaled"]
    assert "pixels 64..191 away from any edge" in reasons["faint"]
    masks = stored_masks(path)
    for i in range(4):
        file = Image.open(raw / "masks" / f"j{i}.jpg")
        values = np.asarray(file.convert("L"))  # a grey JPEG as is, an RGB one by Pillow's luma
        assert not np.isin(values, (0, 255)).all()  # the compression moved values: exact reading refuses it
        assert np.array_equal(masks[f"j{i}"], (values >= 128).astype(np.uint8)), i
        truth = np.asarray(drawn(i)) // 255
        assert not (masks[f"j{i}"] != truth)[~on_edge(truth)].any()  # JPEG moves edges only, if at all
    assert np.array_equal(masks["ones"], np.asarray(drawn(5)) // 255)  # {0,1}: not cut at 128 to nothing
    assert np.array_equal(masks["exact"], np.asarray(drawn(6)) // 255)


def test_threshold_is_for_binary_masks_only():
    with pytest.raises(ValidationError, match="threshold reads binary masks only"):
        MaskField(files="masks/*.jpg", like="images", classes=3, threshold=128)
    assert MaskField(files="masks/*.jpg", like="images").threshold is None
