"""Every common picture format in one folder, from scikit-image's bundled photographs: all are
taken, none is dropped, and each stored picture is what the cleaning rules make of Pillow's own
decode of the file."""

from __future__ import annotations

import h5py
import numpy as np
from PIL import Image
from skimage import data, filters

from h5forge._format.layout import decode_str

PHOTOS = {"astronaut": "png", "coffee": "jpg", "chelsea": "webp", "rocket": "bmp", "immunohistochemistry": "tif",
          "camera": "tiff", "coins": "jpeg", "moon": "png"}
GLOBS = [f"images/*.{ext}" for ext in sorted(set(PHOTOS.values()))]
SIZE = 256


def write_photos(root):
    (root / "images").mkdir(parents=True)
    (root / "masks").mkdir()
    for name, ext in PHOTOS.items():
        pixels = getattr(data, name)()
        grey = pixels if pixels.ndim == 2 else pixels.mean(axis=2).astype(np.uint8)
        if name == "camera":  # a 16-bit TIFF: v * 257 must come back as v
            Image.fromarray((pixels.astype(np.uint16) * 257)).save(root / "images" / f"{name}.{ext}")
        else:
            Image.fromarray(pixels).save(root / "images" / f"{name}.{ext}")
        Image.fromarray(((grey > filters.threshold_otsu(grey)) * 255).astype(np.uint8)).save(
            root / "masks" / f"{name}.png")


def spec_data(root, out, files=GLOBS, **image):
    return {"name": "photos", "source": {"root": str(root)}, "output": {"dir": str(out)},
            "splits": {"ratios": {"train": 1.0}},
            "fields": {"images": {"kind": "image", "files": files, "size": [SIZE, SIZE], **image},
                       "masks": {"kind": "mask", "files": "masks/*.png", "like": "images"}}}


def expected(path, size=SIZE):
    """Pillow's decode of the file, as RGB, centre-cropped / padded to size x size (the rules)."""
    img = Image.open(path)
    arr = np.asarray(img)
    if img.mode.startswith("I;16"):
        arr = ((arr.astype(np.uint32) * 255 + 32767) // 65535).astype(np.uint8)
    arr = np.repeat(arr[..., None], 3, axis=2) if arr.ndim == 2 else arr[..., :3]
    h, w = arr.shape[:2]
    ch, cw = min(h, size), min(w, size)
    crop = arr[(h - ch) // 2:(h - ch) // 2 + ch, (w - cw) // 2:(w - cw) // 2 + cw]
    ph, pw = size - ch, size - cw
    return np.pad(crop, ((ph // 2, ph - ph // 2), (pw // 2, pw - pw // 2), (0, 0))).transpose(2, 0, 1)


def test_every_format_is_taken_and_decoded_by_the_rules(tmp_path, build_spec):
    root = tmp_path / "raw"
    write_photos(root)
    path, summary = build_spec(spec_data(root, tmp_path / "out"))
    assert summary.rejections == () and summary.samples == len(PHOTOS)
    with h5py.File(path, "r") as f:
        g = f["train"]
        for row, (sid, files) in enumerate(zip(decode_str(g["ids"][()]), g["source_files"][()])):
            stored = g["images"][row]
            assert np.array_equal(stored, expected(root / files[0].decode())), sid
        camera = decode_str(g["ids"][()]).index("camera")
        assert np.array_equal(g["images"][camera][0], expected_grey_camera())


def expected_grey_camera():
    cam = data.camera()  # 512 x 512, cropped to the centre 256 x 256
    return cam[128:384, 128:384]


def test_a_single_glob_drops_the_other_formats_with_a_reason(tmp_path, build_spec):
    root = tmp_path / "raw"
    write_photos(root)
    _, summary = build_spec(spec_data(root, tmp_path / "out", files="images/*.png"))
    assert summary.samples == 2
    reasons = {r.sample_id: r.reason for r in summary.rejections}
    assert set(reasons) == set(PHOTOS) - {"astronaut", "moon"}
    assert all("no file for images (images/*.png)" in r for r in reasons.values())


def test_exif_orientation_is_applied_to_the_picture(tmp_path, build_spec):
    root = tmp_path / "raw"
    (root / "images").mkdir(parents=True)
    (root / "masks").mkdir()
    pixels = data.chelsea()[:200, :120]  # taller than wide as stored
    exif = Image.Exif()
    exif[0x0112] = 6  # shown rotated 90 degrees clockwise: 120 x 200 upright
    Image.fromarray(pixels).save(root / "images" / "cat.jpg", quality=95, exif=exif)
    upright = np.asarray(Image.open(root / "images" / "cat.jpg").transpose(Image.Transpose.ROTATE_270))
    mask = np.zeros(upright.shape[:2], np.uint8)
    mask[10:20, 30:60] = 1
    Image.fromarray(mask).save(root / "masks" / "cat.png")
    spec = spec_data(root, tmp_path / "out", files="images/*.jpg")
    spec["fields"]["images"]["size"] = list(upright.shape[:2])
    path, summary = build_spec(spec)
    assert summary.rejections == ()
    with h5py.File(path, "r") as f:
        assert np.array_equal(f["train"]["images"][0].transpose(1, 2, 0), upright)
        assert f["train"]["masks"][0, 0, 10:20, 30:60].all()
