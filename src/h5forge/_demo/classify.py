"""The ``classify`` demo: a class-folder tree of four visually distinct shape classes, in the
mixed formats real collections hold, some JPEGs stored rotated with an EXIF orientation tag."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from h5forge._demo.pictures import save_picture

CLASSIFY_CLASSES = ("circles", "squares", "stripes", "triangles")
_FORMATS = (".jpg", ".png", ".jpg", ".jpeg", ".webp", ".JPG", ".png", ".bmp")
_SPLIT_FOLDERS = (("train", 0.7), ("val", 0.15), ("test", 0.15))


def _contrast(rng: np.random.Generator, background: np.ndarray) -> tuple[int, int, int]:
    """A colour far from the background's mean, so the shapes always show."""
    base = np.where(background.reshape(-1, 3).mean(axis=0) > 128, 40, 215)
    r, g, b = (int(v) for v in np.clip(base + rng.integers(-35, 36, 3), 0, 255))
    return r, g, b


def _shape_picture(rng: np.random.Generator, cls: str, h: int, w: int) -> Image.Image:
    """A textured background with the class's shapes: discs, squares, stripes or triangles."""
    c0, c1 = rng.integers(30, 226, 3), rng.integers(30, 226, 3)
    angle = rng.uniform(0, np.pi)
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    t = ((xx * np.cos(angle) + yy * np.sin(angle)) / (w + h) + 0.5).clip(0, 1)[..., None]
    background = c0 * (1 - t) + c1 * t
    img = Image.fromarray(background.astype(np.uint8))
    draw = ImageDraw.Draw(img)
    colour = _contrast(rng, background)
    side = min(h, w)
    if cls == "circles":
        for _ in range(int(rng.integers(2, 6))):
            r = rng.uniform(0.08, 0.2) * side
            cx, cy = rng.uniform(r, w - r), rng.uniform(r, h - r)
            draw.ellipse([cx - r, cy - r, cx + r, cy + r], fill=colour)
    elif cls == "squares":
        for _ in range(int(rng.integers(2, 5))):
            r = rng.uniform(0.08, 0.2) * side
            cx, cy, a = rng.uniform(r, w - r), rng.uniform(r, h - r), rng.uniform(0, np.pi / 2)
            corners = [(cx + r * np.cos(a + k * np.pi / 2), cy + r * np.sin(a + k * np.pi / 2)) for k in range(4)]
            draw.polygon(corners, fill=colour)
    elif cls == "triangles":
        for _ in range(int(rng.integers(2, 5))):
            r = rng.uniform(0.1, 0.22) * side
            cx, cy, a = rng.uniform(r, w - r), rng.uniform(r, h - r), rng.uniform(0, 2 * np.pi)
            corners = [
                (cx + r * np.cos(a + k * 2 * np.pi / 3), cy + r * np.sin(a + k * 2 * np.pi / 3)) for k in range(3)
            ]
            draw.polygon(corners, fill=colour)
    else:  # stripes
        a, period = rng.uniform(0, np.pi), rng.uniform(0.12, 0.25) * side
        phase = (xx * np.cos(a) + yy * np.sin(a)) / period
        stripes = (phase - np.floor(phase)) < 0.45
        arr = np.asarray(img).copy()
        arr[stripes] = colour
        img = Image.fromarray(arr)
    arr = np.asarray(img).astype(np.float32) + rng.normal(0, 7, (h, w, 3))  # sensor noise
    return Image.fromarray(np.clip(arr, 0, 255).astype(np.uint8))


def generate_classify(
    root: str | Path,
    n: int = 240,
    seed: int = 0,
    bad: bool = True,
    prefix: str = "",
    split_folders: bool = False,
    size_range: tuple[int, int] = (72, 144),
) -> dict[str, str]:
    """``n`` good pictures in ROOT/<class>/ (or ROOT/<split>/<class>/), classes taking turns, plus
    (``bad``) a truncated JPEG and a zero-byte PNG. Each class numbers its files from 0, so the same
    file name appears in every class (class-folder ids are paths, so they do not collide)."""
    root = Path(root)
    per_class = dict.fromkeys(CLASSIFY_CLASSES, 0)
    for i in range(n):
        rng = np.random.default_rng([seed, i])
        cls = CLASSIFY_CLASSES[i % len(CLASSIFY_CLASSES)]
        h, w = (int(v) for v in rng.integers(size_range[0], size_range[1] + 1, 2))
        folder = root / cls
        if split_folders:
            split = _SPLIT_FOLDERS[int(np.searchsorted(np.cumsum([r for _, r in _SPLIT_FOLDERS]), rng.random()))][0]
            folder = root / split / cls
        folder.mkdir(parents=True, exist_ok=True)
        ext = _FORMATS[(i // len(CLASSIFY_CLASSES)) % len(_FORMATS)]
        picture = _shape_picture(rng, cls, h, w)
        if i % 23 == 7:
            picture = picture.convert("L")  # a grey one
        save_picture(picture, folder / f"{prefix}{per_class[cls]:04d}{ext}", rotate_exif=i % 9 == 4)
        per_class[cls] += 1
    defects: dict[str, str] = {}
    if bad:
        rng = np.random.default_rng([seed, 1_000_003])
        where = "train/" if split_folders else ""
        first, second = (root / where / c for c in CLASSIFY_CLASSES[:2])
        first.mkdir(parents=True, exist_ok=True)
        second.mkdir(parents=True, exist_ok=True)
        buf = io.BytesIO()
        _shape_picture(rng, CLASSIFY_CLASSES[0], 120, 120).save(buf, "JPEG", quality=90)
        (first / f"{prefix}bad_truncated.jpg").write_bytes(buf.getvalue()[: len(buf.getvalue()) // 2])
        defects[f"{where}{CLASSIFY_CLASSES[0]}/{prefix}bad_truncated.jpg"] = "truncated JPEG"
        (second / f"{prefix}bad_empty.png").write_bytes(b"")
        defects[f"{where}{CLASSIFY_CLASSES[1]}/{prefix}bad_empty.png"] = "zero-byte file"
    return defects
