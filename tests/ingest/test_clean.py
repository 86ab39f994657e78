"""Cleaning rules, one bad-input kind or conversion rule per test, on real PNG files."""

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from h5forge._ingest.clean import Reject, clean_batch, clean_sample
from h5forge.kinds.image import plan_geometry
from h5forge._demo.pictures import bomb_png
from h5forge._ingest.discover import SampleRef
from tests.helpers.data import demo_spec


@pytest.fixture
def spec(tmp_path):
    return demo_spec(tmp_path, tmp_path / "out")


def save(root: Path, sid: str, image, mask) -> SampleRef:
    (root / "images").mkdir(exist_ok=True)
    (root / "masks").mkdir(exist_ok=True)
    for folder, pic in (("images", image), ("masks", mask)):
        target = root / folder / f"{sid}.png"
        if isinstance(pic, bytes):
            target.write_bytes(pic)
        elif isinstance(pic, Image.Image):
            pic.save(target)
        else:
            Image.fromarray(pic).save(target)
    return SampleRef(sid, "train", {"images": f"images/{sid}.png", "masks": f"masks/{sid}.png"}, COLUMNS)


COLUMNS = {"label": "healthy", "num_cells": 3, "stain": "DAPI", "focus_score": 0.5}  # the demo spec's columns


def rgb(h, w, value=100):
    return np.full((h, w, 3), value, np.uint8)


def binary(h, w, on=255):
    m = np.zeros((h, w), np.uint8)
    m[h // 4 : h // 2, w // 4 : w // 2] = on
    return m


def rejected(spec, root, ref) -> str:
    batch = clean_batch(spec, root, [ref])
    assert len(batch) == 0 and len(batch.rejections) == 1
    return batch.rejections[0].path + ": " + batch.rejections[0].reason


def test_pad_is_even_with_the_odd_pixel_bottom_right(spec, tmp_path):
    ref = save(tmp_path, "a", rgb(201, 150, 200), binary(201, 150))
    arrays, _ = clean_sample(spec, tmp_path, ref)
    img = arrays["images"]
    assert img.shape == (3, 224, 224)
    # 23 rows of padding: 11 on top, 12 below; 74 columns: 37 each side
    rows = np.flatnonzero(img[0].any(axis=1))
    cols = np.flatnonzero(img[0].any(axis=0))
    assert (rows[0], 223 - rows[-1]) == (11, 12)
    assert (cols[0], 223 - cols[-1]) == (37, 37)
    assert img[:, 11:212, 37:187].min() == 200  # content untouched, never stretched


def test_mask_follows_its_image_and_255_becomes_1(spec, tmp_path):
    image = rgb(180, 160, 50)
    mask = binary(180, 160, on=255)
    image[mask > 0] = 250
    arrays, _ = clean_sample(spec, tmp_path, save(tmp_path, "m", image, mask))
    m = arrays["masks"][0]
    assert arrays["masks"].shape == (1, 224, 224)
    assert set(np.unique(m)) == {0, 1, 255}  # 255: padding, no class
    assert np.array_equal(m == 1, arrays["images"][0] == 250)
    assert np.count_nonzero(m != 255) == 180 * 160


def test_mask_with_values_0_1_is_kept(spec, tmp_path):
    arrays, _ = clean_sample(spec, tmp_path, save(tmp_path, "m01", rgb(100, 100), binary(100, 100, on=1)))
    assert np.count_nonzero(arrays["masks"] == 1) == 25 * 25


def test_centre_crop_of_larger_images(spec, tmp_path):
    image = np.zeros((300, 240, 3), np.uint8)
    image[38:262, 8:232] = 77  # the centre 224x224 window
    arrays, _ = clean_sample(spec, tmp_path, save(tmp_path, "big", image, binary(300, 240)))
    assert (arrays["images"] == 77).all()


def test_shrink_keeps_aspect_then_pads(tmp_path):
    spec = demo_spec(tmp_path, tmp_path / "o")
    f = spec.fields["images"].model_copy(update={"larger": "shrink"})
    spec = spec.model_copy(update={"fields": {**spec.fields, "images": f}})
    image = np.full((448, 224, 3), 90, np.uint8)
    arrays, _ = clean_sample(spec, tmp_path, save(tmp_path, "tall", image, binary(448, 224)))
    cols = np.flatnonzero(arrays["images"][0].any(axis=0))
    assert cols.size == 112 and cols[0] == 56  # 448x224 -> 224x112, padded 56 | 56
    assert set(np.unique(arrays["masks"])) <= {0, 1, 255}
    assert np.count_nonzero(arrays["masks"] != 255) == 224 * 112


def test_reject_policy_for_larger_images(tmp_path):
    spec = demo_spec(tmp_path, tmp_path / "o")
    f = spec.fields["images"].model_copy(update={"larger": "reject"})
    spec = spec.model_copy(update={"fields": {**spec.fields, "images": f}})
    why = rejected(spec, tmp_path, save(tmp_path, "huge", rgb(230, 100), binary(230, 100)))
    assert "larger than the target 224x224" in why


def test_rgba_is_composited_over_the_fill_value(spec, tmp_path):
    rgba = np.zeros((50, 50, 4), np.uint8)
    rgba[..., :3] = 200
    rgba[:25, :, 3] = 255  # opaque top half, transparent bottom half
    arrays, _ = clean_sample(spec, tmp_path, save(tmp_path, "alpha", Image.fromarray(rgba, "RGBA"), binary(50, 50)))
    img = arrays["images"][:, 87:137, 87:137]
    assert (img[:, :25] == 200).all() and (img[:, 25:] == 0).all()


def test_palette_and_grey_become_rgb(spec, tmp_path):
    pal = Image.fromarray(rgb(40, 40, 123)).quantize(4)
    a, _ = clean_sample(spec, tmp_path, save(tmp_path, "pal", pal, binary(40, 40)))
    assert (a["images"][:, 92:132, 92:132] == 123).all()
    grey = Image.fromarray(np.full((40, 40), 66, np.uint8), "L")
    g, _ = clean_sample(spec, tmp_path, save(tmp_path, "grey", grey, binary(40, 40)))
    assert (g["images"][:, 92:132, 92:132] == 66).all()


def test_16_bit_is_scaled_never_clipped_or_wrapped(spec, tmp_path):
    values = np.array([[0, 257, 32768, 65535]], np.uint16).repeat(4, axis=0)
    a, _ = clean_sample(spec, tmp_path, save(tmp_path, "deep", Image.fromarray(values), binary(4, 4)))
    row = a["images"][0, 110, 110:114]
    assert row.tolist() == [0, 1, 128, 255]


@pytest.mark.parametrize("content, words", [
    (b"", "empty file (0 bytes)"),
    (b"just some text\n", "not an image"),
])
def test_empty_and_non_image_files(spec, tmp_path, content, words):
    why = rejected(spec, tmp_path, save(tmp_path, "x", content, binary(10, 10)))
    assert why.startswith("images/x.png: ") and words in why


def test_truncated_png(spec, tmp_path):
    ref = save(tmp_path, "t", np.random.default_rng(0).integers(0, 255, (120, 120, 3), dtype=np.uint8),
               binary(120, 120))
    p = tmp_path / "images" / "t.png"
    p.write_bytes(p.read_bytes()[:3000])
    assert "truncated" in rejected(spec, tmp_path, ref)


def test_decompression_bomb_is_rejected_before_decoding(spec, tmp_path):
    ref = save(tmp_path, "bomb", rgb(10, 10), binary(10, 10))
    bomb_png(tmp_path / "images" / "bomb.png", 30_000, 30_000)
    assert "decompression bomb: header declares 30000x30000" in rejected(spec, tmp_path, ref)


def test_mask_with_a_forbidden_value(spec, tmp_path):
    why = rejected(spec, tmp_path, save(tmp_path, "m128", rgb(30, 30), binary(30, 30, on=128)))
    assert why.startswith("masks/m128.png: ") and "[0, 128]" in why


def test_mask_mixing_1_and_255_is_ambiguous(spec, tmp_path):
    m = binary(30, 30, on=255)
    m[0, 0] = 1
    assert "[0, 1, 255]" in rejected(spec, tmp_path, save(tmp_path, "mix", rgb(30, 30), m))


def test_mask_size_must_match_its_image(spec, tmp_path):
    why = rejected(spec, tmp_path, save(tmp_path, "sz", rgb(30, 40), binary(30, 41)))
    assert "mask is 30x41 (HxW) but its image images/sz.png is 30x40" in why


def test_colour_mask_rejected_but_equal_channels_accepted(spec, tmp_path):
    colour = np.zeros((20, 20, 3), np.uint8)
    colour[..., 0] = binary(20, 20)
    assert "single-channel" in rejected(spec, tmp_path, save(tmp_path, "cm", rgb(20, 20), colour))
    same = np.repeat(binary(20, 20)[..., None], 3, axis=2)
    arrays, _ = clean_sample(spec, tmp_path, save(tmp_path, "gm", rgb(20, 20), same))
    assert np.count_nonzero(arrays["masks"] == 1) == 25


def test_one_bad_sample_does_not_lose_the_good_ones(spec, tmp_path):
    refs = [save(tmp_path, f"g{i}", rgb(30, 30, i + 1), binary(30, 30)) for i in range(3)]
    refs.insert(1, save(tmp_path, "bad", b"", binary(30, 30)))
    batch = clean_batch(spec, tmp_path, refs)
    assert batch.ids == ["g0", "g1", "g2"]
    assert [r.sample_id for r in batch.rejections] == ["bad"]
    assert batch.arrays["images"].decoded()[:, 0, 112, 112].tolist() == [1, 2, 3]
    hist = batch.stats["images"]["train"]
    assert hist.shape == (3, 256) and hist.sum() == 3 * 3 * 224 * 224


def test_raw_hashes_are_of_the_file_bytes(spec, tmp_path):
    import hashlib

    ref = save(tmp_path, "h", rgb(10, 10), binary(10, 10))
    _, hashes = clean_sample(spec, tmp_path, ref)
    assert hashes == [hashlib.sha256((tmp_path / ref.files[k]).read_bytes()).hexdigest() for k in ("images", "masks")]


def test_geometry_plan_pads_and_crops_per_axis():
    g = plan_geometry(300, 100, 224, 224, "crop", "x")
    assert g.crop == (38, 0, 224, 100) and g.pad == (0, 0, 62, 62)
    with pytest.raises(Reject):
        plan_geometry(300, 100, 224, 224, "reject", "x")


@pytest.mark.parametrize("shape", [(5, 3, 31, 17), (4, 1, 8, 8), (0, 3, 4, 4), (2, 3, 1, 1)])
def test_channel_counts_equal_a_bincount_per_channel(shape):
    """Counted two pixels at a time, odd sizes included: exactly numpy's bincount per channel."""
    from h5forge.kinds._pictures import channel_counts

    rng = np.random.default_rng(sum(shape))
    block = rng.integers(0, 256, shape, dtype=np.uint8)
    block[:, :, :1, :1] = 255  # the last bin, and a pixel pair (255, x) across the odd end
    want = np.stack([np.bincount(block[:, c].ravel(), minlength=256) for c in range(shape[1])])
    assert np.array_equal(channel_counts(block), want)
    assert channel_counts(block).sum() == block.size


@pytest.mark.parametrize("values, stored", [([0, 1], [0, 1]), ([0, 255], [0, 1]), ([255], [1]), ([0], [0])])
def test_binary_masks_take_the_quick_checks_with_the_same_values(values, stored):
    from h5forge.kinds.mask import binary_array

    arr = np.array(values * 6, np.uint8).reshape(3, -1)
    out = binary_array(arr, "m.png")
    assert out.dtype == np.uint8 and np.array_equal(out, np.array(stored * 6, np.uint8).reshape(3, -1))


@pytest.mark.parametrize("values", [[0, 128], [1, 255], [0, 1, 255], [2]])
def test_binary_masks_with_other_values_are_still_rejected_by_name(values):
    from h5forge.kinds.mask import binary_array
    from h5forge._samples import Reject

    with pytest.raises(Reject, match=r"mask values \[.*\] not allowed"):
        binary_array(np.array(values * 4, np.uint8), "m.png")
