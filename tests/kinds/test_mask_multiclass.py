"""Multi-class masks from real photographs (multi-Otsu classes of scikit-image's images): values,
palette indices and palette colours become class indices; anything undeclared is rejected with
the values found; class pixel counts and the per-class row index are stored per split."""

from __future__ import annotations

import io

import h5py
import numpy as np
import pytest
from PIL import Image
from skimage import data, filters

from h5forge._format.layout import decode_str
from h5forge.read import index_rows

PHOTOS = ("camera", "coins", "moon", "page", "text", "clock")


def classes_of(grey: np.ndarray) -> np.ndarray:
    return np.digitize(grey, filters.threshold_multiotsu(grey, classes=3)).astype(np.uint8)


@pytest.fixture
def raw(tmp_path):
    root = tmp_path / "raw"
    (root / "images").mkdir(parents=True)
    (root / "masks").mkdir()
    for name in PHOTOS:
        grey = getattr(data, name)()
        Image.fromarray(grey).save(root / "images" / f"{name}.png")
        Image.fromarray(classes_of(grey)).save(root / "masks" / f"{name}.png")
    return root


def spec_data(root, out, **mask):
    return {"name": "otsu", "source": {"root": str(root)}, "output": {"dir": str(out)},
            "splits": {"ratios": {"train": 1.0}},
            "fields": {"images": {"kind": "image", "files": "images/*.png", "size": [256, 256]},
                       "masks": {"kind": "mask", "files": "masks/*.png", "like": "images", "classes": 3, **mask}}}


def test_class_masks_are_stored_with_pixel_counts_and_a_class_index(raw, tmp_path, build_spec):
    bad = np.asarray(Image.open(raw / "masks" / "clock.png")).copy()
    bad[0, :5] = 7
    Image.fromarray(bad).save(raw / "masks" / "clock.png")
    path, summary = build_spec(spec_data(raw, tmp_path / "out"))
    [rejection] = summary.rejections
    assert rejection.sample_id == "clock" and "[7] are not classes 0..2" in rejection.reason
    with h5py.File(path, "r") as f:
        g = f["train"]
        masks = g["masks"][()]
        assert set(np.unique(masks)) <= {0, 1, 2, 255} and g["masks"].attrs["classes"] == 3  # 255: padding
        assert list(g.attrs["masks_class_pixels"]) == list(np.bincount(masks.ravel(), minlength=256)[:3])
        for cls in range(3):
            assert index_rows(f, "train", "masks", cls).tolist() == [
                r for r in range(len(masks)) if (masks[r] == cls).any()]
        for row, sid in enumerate(decode_str(g["ids"][()])):
            full = classes_of(getattr(data, sid)())
            h, w = full.shape
            top, left = max(0, (h - 256) // 2), max(0, (w - 256) // 2)
            crop = full[top:top + 256, left:left + 256]
            pt, pl = (256 - crop.shape[0]) // 2, (256 - crop.shape[1]) // 2
            assert np.array_equal(masks[row, 0, pt:pt + crop.shape[0], pl:pl + crop.shape[1]], crop), sid


def test_palette_png_masks_are_read_by_index_and_rgb_masks_by_colour(raw, tmp_path, build_spec):
    colours = {0: (0, 0, 0), 1: (255, 0, 0), 2: (0, 0, 255)}
    for name in PHOTOS[:3]:
        cls = classes_of(getattr(data, name)())
        pal = Image.fromarray(cls, "P")
        pal.putpalette([c for rgb in colours.values() for c in rgb])  # drawn colours differ from the index
        pal.save(raw / "masks" / f"{name}.png")
    rgb = np.zeros((*classes_of(data.page()).shape, 3), np.uint8)
    for cls, colour in colours.items():
        rgb[classes_of(data.page()) == cls] = colour
    Image.fromarray(rgb).save(raw / "masks" / "page.png")
    rgb[0, 0] = (9, 9, 9)
    Image.fromarray(rgb).save(raw / "masks" / "text.png")  # a colour outside the palette
    path, summary = build_spec(spec_data(raw, tmp_path / "out", palette={k: list(v) for k, v in colours.items()}))
    assert [(r.sample_id, "(9, 9, 9)" in r.reason) for r in summary.rejections] == [("text", True)]
    with h5py.File(path, "r") as f:
        ids = decode_str(f["train"]["ids"][()])
        for name in ("camera", "page"):
            stored = f["train"]["masks"][ids.index(name), 0]
            assert set(np.unique(stored)) - {255} == {0, 1, 2}  # 255: padding


def placed(full: np.ndarray, pad: int = 255) -> np.ndarray:
    """A mask as a 256 x 256 field stores it: centre-cropped, then padded evenly with ``pad``."""
    h, w = full.shape
    top, left = max(0, (h - 256) // 2), max(0, (w - 256) // 2)
    crop = full[top:top + 256, left:left + 256]
    out = np.full((256, 256), pad, np.uint8)
    pt, pl = (256 - crop.shape[0]) // 2, (256 - crop.shape[1]) // 2
    out[pt:pt + crop.shape[0], pl:pl + crop.shape[1]] = crop
    return out


def test_palette_png_masks_follow_the_declared_colours_not_their_index_order(raw, tmp_path, build_spec):
    colours = {0: (128, 128, 128), 1: (128, 0, 0), 2: (128, 64, 128)}
    for name, order in zip(PHOTOS, [(0, 1, 2), (2, 0, 1), (1, 2, 0), (2, 1, 0), (0, 2, 1), (1, 0, 2)]):
        cls = classes_of(getattr(data, name)())
        # an editor's indexed export: each file numbers the colours in its own order
        indexed = Image.fromarray(np.asarray(order, np.uint8)[cls], "P")
        indexed.putpalette([c for k in np.argsort(order) for c in colours[int(k)]])
        indexed.save(raw / "masks" / f"{name}.png")
    path, summary = build_spec(spec_data(raw, tmp_path / "out", palette={k: list(v) for k, v in colours.items()}))
    assert summary.rejections == ()
    with h5py.File(path, "r") as f:
        for row, sid in enumerate(decode_str(f["train"]["ids"][()])):
            assert np.array_equal(f["train"]["masks"][row, 0], placed(classes_of(getattr(data, sid)()))), sid


def test_class_masks_in_a_lossy_format_are_rejected_never_stored_with_its_noise(raw, tmp_path, build_spec):
    for name in PHOTOS[:4]:  # JPEG and lossy WebP change values near every edge, within the classes
        (raw / "masks" / f"{name}.png").unlink()
        mask = Image.fromarray(classes_of(getattr(data, name)()))
        mask.save(raw / "masks" / f"{name}.{'jpg' if name in PHOTOS[:2] else 'webp'}", quality=95)
    Image.fromarray(classes_of(data.text())).save(raw / "masks" / "text.webp", lossless=True)
    (raw / "masks" / "text.png").unlink()
    spec = spec_data(raw, tmp_path / "out", classes=21)
    spec["fields"]["masks"]["files"] = ["masks/*.png", "masks/*.jpg", "masks/*.webp"]
    path, summary = build_spec(spec)
    assert sorted(r.sample_id for r in summary.rejections) == sorted(PHOTOS[:4])
    assert all("lossy" in r.reason for r in summary.rejections)
    with h5py.File(path, "r") as f:
        ids = decode_str(f["train"]["ids"][()])
        assert ids == ["clock", "text"]
        for row, sid in enumerate(ids):
            assert np.array_equal(f["train"]["masks"][row, 0], placed(classes_of(getattr(data, sid)()))), sid


@pytest.mark.parametrize(
    "name,save",
    [
        ("tiff-jpeg", lambda mask, path: mask.save(path.with_suffix(".tif"), compression="jpeg", quality=95)),
        ("jpeg2000-97", lambda mask, path: mask.save(path.with_suffix(".jp2"), irreversible=True,
                                                    quality_mode="rates", quality_layers=[8])),
        ("avif", lambda mask, path: mask.save(path.with_suffix(".avif"), quality=95)),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_class_masks_in_other_lossy_encodings_are_rejected_and_lossless_ones_kept(raw, tmp_path, build_spec, name, save):
    """A TIFF whose strips are JPEG, a JPEG 2000 of the irreversible 9-7 wavelet and an AVIF move a
    class mask's values near its edges onto the neighbouring classes, as a JPEG does: each is refused
    as lossy. The same masks as LZW TIFF and reversible JPEG 2000 are stored exactly."""
    lossy, kept = PHOTOS[:2], PHOTOS[2:4]
    for photo in PHOTOS:
        (raw / "masks" / f"{photo}.png").unlink()
        mask = Image.fromarray(classes_of(getattr(data, photo)()))
        if photo in lossy:
            save(mask, raw / "masks" / photo)
        elif photo in kept:
            mask.save(raw / "masks" / f"{photo}.tif" if photo == kept[0] else raw / "masks" / f"{photo}.jp2",
                      **({"compression": "tiff_lzw"} if photo == kept[0] else {}))
        else:
            mask.save(raw / "masks" / f"{photo}.png")
    noisy = np.asarray(Image.open(next((raw / "masks").glob(f"{lossy[0]}.*"))))
    assert (noisy != classes_of(getattr(data, lossy[0])())).any()  # the encoding moved values
    spec = spec_data(raw, tmp_path / "out", classes=21)  # the noise stays within the classes
    spec["fields"]["masks"]["files"] = ["masks/*.png", "masks/*.tif", "masks/*.jp2", "masks/*.avif"]
    path, summary = build_spec(spec)
    assert sorted(r.sample_id for r in summary.rejections) == sorted(lossy), summary.rejections
    assert all("lossy" in r.reason and "save it as PNG" in r.reason for r in summary.rejections), summary.rejections
    with h5py.File(path, "r") as f:
        ids = decode_str(f["train"]["ids"][()])
        assert sorted(ids) == sorted(PHOTOS[2:])
        for row, sid in enumerate(ids):
            assert np.array_equal(f["train"]["masks"][row, 0], placed(classes_of(getattr(data, sid)()))), sid


def _damaged_in_its_last_block(png: bytes, classes: np.ndarray) -> bytes:
    """``png`` with one bit of its pixel data flipped where Pillow, which reads no IDAT checksum and
    stops once it has every row, decodes it without an error to other values that are all classes."""
    at = png.index(b"IDAT") - 4
    length = int.from_bytes(png[at : at + 4], "big")
    for pos in range(at + 8 + length - 5, at + 8, -1):  # the last deflate block: before its Adler-32
        for bit in (0x80, 0x10, 0x01):
            bad = bytearray(png)
            bad[pos] ^= bit
            try:
                with Image.open(io.BytesIO(bytes(bad))) as im:
                    got = np.asarray(im)
            except (OSError, SyntaxError, ValueError):
                continue
            if not np.array_equal(got, classes) and got.max() < 3:
                return bytes(bad)
    raise AssertionError("no such flip")


def test_a_class_mask_whose_pixel_data_is_damaged_is_rejected_not_stored_with_other_classes(raw, tmp_path, build_spec):
    """A PNG's IDAT checksum says its pixel data is not what was written (a bit flipped on a disk or
    in a copy): the mask is refused with that reason, never decoded to the classes the damage made."""
    cls = classes_of(data.coins())
    damaged = _damaged_in_its_last_block((raw / "masks" / "coins.png").read_bytes(), cls)
    (raw / "masks" / "coins.png").write_bytes(damaged)
    path, summary = build_spec(spec_data(raw, tmp_path / "out"))
    assert [(r.sample_id, r.paths) for r in summary.rejections] == [("coins", ("masks/coins.png",))]
    assert "IDAT" in summary.rejections[0].reason and "checksum" in summary.rejections[0].reason
    with h5py.File(path, "r") as f:
        ids = decode_str(f["train"]["ids"][()])
        assert sorted(ids) == sorted(set(PHOTOS) - {"coins"})
        for row, sid in enumerate(ids):
            assert np.array_equal(f["train"]["masks"][row, 0], placed(classes_of(getattr(data, sid)()))), sid


def test_masks_named_with_a_suffix_pair_with_their_images(raw, tmp_path, build_spec):
    for mask in (raw / "masks").glob("*.png"):  # ISIC: ISIC_0000000.jpg and ISIC_0000000_segmentation.png
        mask.rename(mask.with_name(f"{mask.stem}_segmentation.png"))
    Image.fromarray(classes_of(data.camera())).save(raw / "masks" / "camera.png")  # no suffix: no mask of camera
    path, summary = build_spec(spec_data(raw, tmp_path / "out", id_suffix="_segmentation"))
    assert {r.sample_id: r.reason for r in summary.rejections} == {
        "camera": "the file name does not end in '_segmentation' (the field's id_suffix)"}
    with h5py.File(path, "r") as f:
        ids = decode_str(f["train"]["ids"][()])
        assert ids == sorted(set(PHOTOS) - {"camera"})
        for row, sid in enumerate(ids):
            assert np.array_equal(f["train"]["masks"][row, 0], placed(classes_of(getattr(data, sid)()))), sid


def test_ignore_value_is_kept_and_pads(raw, tmp_path, build_spec):
    cls = classes_of(data.page())  # 191 x 384: padded to 256 rows, columns 64..320 kept
    cls[:, 100:110] = 255
    Image.fromarray(cls).save(raw / "masks" / "page.png")
    path, summary = build_spec(spec_data(raw, tmp_path / "out", ignore_value=255))
    assert summary.rejections == ()
    with h5py.File(path, "r") as f:
        g = f["train"]
        page = g["masks"][decode_str(g["ids"][()]).index("page"), 0]
        assert (page[:32] == 255).all() and (page[223:] == 255).all()  # padded with the ignore value
        assert (page[32:223, 36:46] == 255).all() and set(np.unique(page[32:223, 46:])) <= {0, 1, 2}
        assert g["masks"].attrs["ignore_value"] == 255


def test_multiclass_spec_errors():
    from h5forge.kinds.mask import MaskField

    with pytest.raises(ValueError, match="ignore_value 1 is one of the classes"):
        MaskField(files="m/*.png", like="images", classes=3, ignore_value=1)
    with pytest.raises(ValueError, match="need classes"):
        MaskField(files="m/*.png", like="images", ignore_value=255)



def test_float_masks_are_judged_by_their_exact_values(raw, tmp_path, build_spec):
    for name in PHOTOS[:4]:  # 32-bit float TIFFs (Pillow mode F) of the same classes
        (raw / "masks" / f"{name}.png").unlink()
        Image.fromarray(classes_of(getattr(data, name)()).astype(np.float32), "F").save(raw / "masks" / f"{name}.tif")
    soft = classes_of(data.moon()).astype(np.float32)
    soft[soft == 1] = 1.5  # a value between classes: never cut to class 1
    Image.fromarray(soft, "F").save(raw / "masks" / "moon.tif")
    binary = (data.page() > 128).astype(np.float32)
    binary[:, :20] = 0.5  # a soft binary mask: never cut to 0
    Image.fromarray(binary, "F").save(raw / "masks" / "page.tif")
    spec = spec_data(raw, tmp_path / "out")
    spec["fields"]["masks"]["files"] = ["masks/*.png", "masks/*.tif"]
    path, summary = build_spec(spec)
    assert {r.sample_id: r.reason for r in summary.rejections} == {
        "moon": "mask values [1.5] are not classes 0..2", "page": "mask values [0.5] are not classes 0..2"}
    with h5py.File(path, "r") as f:
        ids = decode_str(f["train"]["ids"][()])
        camera = f["train"]["masks"][ids.index("camera"), 0]  # 512 x 512: the middle 256 x 256 kept
        assert np.array_equal(camera, classes_of(data.camera())[128:384, 128:384])  # 0.0, 1.0, 2.0 exactly

    del spec["fields"]["masks"]["classes"]  # binary: {0,1} or {0,255}, exactly
    spec["output"]["dir"] = str(tmp_path / "binary")
    Image.fromarray((data.camera() > 100).astype(np.float32), "F").save(raw / "masks" / "camera.tif")
    for name in ("coins", "moon", "clock", "text"):
        for file in (*raw.glob(f"images/{name}.*"), *raw.glob(f"masks/{name}.*")):
            file.unlink()
    path, summary = build_spec(spec)
    assert {r.sample_id: r.reason for r in summary.rejections} == {
        "page": "mask values [0, 0.5, 1] not allowed: a mask must hold {0,1} or {0,255}"}
    with h5py.File(path, "r") as f:
        assert decode_str(f["train"]["ids"][()]) == ["camera"]
        assert np.array_equal(f["train"]["masks"][0, 0], (data.camera() > 100).astype(np.uint8)[128:384, 128:384])


@pytest.mark.parametrize("colour", [[255, 255, 255], [220, 20, 60]], ids=["white", "red"])
def test_binary_palette_masks_of_black_and_one_colour_are_read_by_their_colours(raw, tmp_path, build_spec, colour):
    """An editor numbers a palette's colours as it meets them: a mask drawn in white (or red) on
    black, saved as GIF or indexed PNG, may draw its colour with index 0 when the object touches the
    first pixel. The colour is the mask, black is not, whatever their indices; a palette of other
    colours (VOC's, with white) keeps the index as the value."""
    drawn = {}
    for k, name in enumerate(PHOTOS):
        grey = getattr(data, name)()
        drawn[name] = (grey > filters.threshold_otsu(grey)).astype(np.uint8)
        colour_first = k % 2 == 0
        index = (1 - drawn[name]) if colour_first else drawn[name]
        picture = Image.fromarray(index, "P")
        picture.putpalette(colour + [0, 0, 0] if colour_first else [0, 0, 0] + colour)
        (raw / "masks" / f"{name}.png").unlink()
        picture.save(raw / "masks" / f"{name}{'.gif' if k % 3 == 0 else '.png'}")
    if colour == [255, 255, 255]:
        voc = Image.fromarray(drawn["text"], "P")  # VOC's colours: index 1 is the class, drawn dark red
        voc.putpalette([0, 0, 0, 128, 0, 0])
        voc.save(raw / "masks" / "text.png")
    spec = spec_data(raw, tmp_path / "out")
    del spec["fields"]["masks"]["classes"]
    spec["fields"]["masks"]["files"] = ["masks/*.png", "masks/*.gif"]
    path, summary = build_spec(spec)
    assert summary.rejections == ()
    with h5py.File(path, "r") as f:
        ids = decode_str(f["train"]["ids"][()])
        assert ids == sorted(PHOTOS)
        for row, sid in enumerate(ids):
            assert np.array_equal(f["train"]["masks"][row, 0], placed(drawn[sid])), sid
