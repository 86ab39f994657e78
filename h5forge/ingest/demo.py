"""Realistic demo raw folders, one per layout h5forge reads, each with the defects real ones have.

``cells`` (the default, ``generate``): stained-cell micrographs, binary masks, annotations
    ROOT/images/<id>.png  ROOT/masks/<id>.png  ROOT/annotations.json
Images vary in size (150-260 px by default) and in PNG mode (RGB, RGBA, palette, grey, 16-bit grey).
``classify`` (``generate_classify``): a class-folder tree ROOT/<class>/<nnnn>.<ext> (optionally
    ROOT/<split>/<class>/...) of four visually distinct classes, in mixed formats (PNG, JPEG as
    .jpg/.jpeg/.JPG, WebP, BMP), some JPEGs stored rotated with an EXIF orientation tag.
``segment-multiclass`` (``generate_segment_multiclass``): ROOT/images/ + ROOT/masks/ with class
    masks (0 background, 1 cytoplasm, 2 nucleus, 255 an uncertain rim in some), one palette PNG
    mask, and ROOT/annotations.csv.
``sr`` (``generate_sr``): ROOT/hr/<id>.png and ROOT/lr/<id>.png made from it by ``Image.resize``
    at scale 4.
``ct`` (``generate_ct``): real DICOM series written with pydicom from its bundled ``CT_small.dcm``,
    one folder per case ROOT/<case>/ (files shuffled, InstanceNumber shuffled, one case's files
    without a suffix, as scanners write them), a sphere of +400 HU in each, and per-slice PNG masks
    of the sphere in ROOT/masks/<case>/slice_NNN.png.
``signals`` (``generate_signals``): EDF+ recordings written with pyedflib's EdfWriter, ROOT/<id>.edf,
    channels at different rates (ACC 1000 Hz, VOLT 100 Hz, TEMP 1 Hz) and lengths (2-10 s).
With ``bad=True`` each folder also holds defects, each of which the build must quarantine with a
reason while every good sample lands. Every generator is seeded (same arguments, same bytes) and
returns {path: what is wrong} for the defects it wrote.
"""

from __future__ import annotations

import csv
import io
import json
import struct
import zlib
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

LABELS = ("healthy", "infected", "dividing")
STAINS = ("H&E", "DAPI", "GFP")


def _cell_image(rng: np.random.Generator, h: int, w: int) -> tuple[np.ndarray, np.ndarray, int]:
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    # uneven illumination, as from a real microscope
    base = 200 + 25 * np.sin(xx / w * np.pi + rng.uniform(0, 3)) * np.cos(yy / h * np.pi)
    img = np.stack([base * 0.95, base * 0.9, base], axis=-1)
    mask = np.zeros((h, w), dtype=bool)
    n_cells = int(rng.integers(3, 12))
    stain = np.array(rng.choice([[150, 60, 170], [90, 40, 140], [170, 90, 160]]), dtype=np.float32)
    for _ in range(n_cells):
        cy, cx = rng.uniform(0, h), rng.uniform(0, w)
        ry, rx = rng.uniform(8, 28), rng.uniform(8, 28)
        theta = rng.uniform(0, np.pi)
        r = int(max(ry, rx)) + 1
        y0, y1 = max(0, int(cy) - r), min(h, int(cy) + r + 1)
        x0, x1 = max(0, int(cx) - r), min(w, int(cx) + r + 1)
        if y0 >= y1 or x0 >= x1:
            continue
        dy, dx = yy[y0:y1, x0:x1] - cy, xx[y0:y1, x0:x1] - cx
        u = (dx * np.cos(theta) + dy * np.sin(theta)) / rx
        v = (-dx * np.sin(theta) + dy * np.cos(theta)) / ry
        r2 = u * u + v * v
        inside = r2 <= 1.0
        mask[y0:y1, x0:x1] |= inside
        shade = np.clip(1.0 - 0.35 * r2, 0.5, 1.0)[..., None]
        patch = img[y0:y1, x0:x1]
        texture = rng.normal(0, 8, (y1 - y0, x1 - x0, 1))
        patch[:] = np.where(inside[..., None], stain * shade + texture, patch)
        patch[:] = np.where((r2 <= 0.18)[..., None], stain * 0.55, patch)
    img += rng.normal(0, 6, img.shape).astype(np.float32)  # sensor noise
    return np.clip(img, 0, 255).astype(np.uint8), mask, n_cells


def _write_sample(args: tuple[Path, str, int, int, int, str]) -> dict:
    root, sid, seed, lo, hi, mode = args
    rng = np.random.default_rng(seed)
    h, w = int(rng.integers(lo, hi + 1)), int(rng.integers(lo, hi + 1))
    if mode == "large":
        h, w = int(rng.integers(280, 400)), int(rng.integers(280, 400))
    rgb, mask, n_cells = _cell_image(rng, h, w)
    pic = Image.fromarray(rgb)
    if mode == "rgba":
        alpha = np.full((h, w), 255, np.uint8)
        alpha[: h // 8] = 0  # a transparent band
        pic = Image.fromarray(np.dstack([rgb, alpha]), "RGBA")
    elif mode == "palette":
        pic = pic.quantize(64)
    elif mode == "grey":
        pic = pic.convert("L")
    elif mode == "grey16":
        pic = Image.fromarray(np.asarray(pic.convert("L")).astype(np.uint16) * 257)
    pic.save(root / "images" / f"{sid}.png", compress_level=1)
    mask_values = 255 if seed % 2 else 1
    Image.fromarray(mask.astype(np.uint8) * mask_values).save(root / "masks" / f"{sid}.png")
    return {
        "id": sid,
        "label": LABELS[n_cells % 3],
        "num_cells": n_cells,
        "stain": STAINS[seed % 3],
        "focus_score": round(float(rng.uniform(0.2, 1.0)), 4),
    }


def _bomb_png(path: Path, width: int, height: int) -> None:
    """A tiny PNG whose header claims a huge size, as a decompression bomb does."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    raw = zlib.compress(b"\x00" * 16)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", raw) + chunk(b"IEND", b""))


def _add_bad_inputs(root: Path, rng: np.random.Generator, records: list[dict]) -> dict[str, str]:
    """Write the defects; return {file: what is wrong} for the caller's information."""
    img_dir, mask_dir = root / "images", root / "masks"
    bad: dict[str, str] = {}

    def good_pair(sid: str) -> None:
        rgb, mask, _ = _cell_image(rng, 180, 200)
        Image.fromarray(rgb).save(img_dir / f"{sid}.png")
        Image.fromarray(mask.astype(np.uint8) * 255).save(mask_dir / f"{sid}.png")
        records.append({"id": sid, "label": "healthy", "num_cells": 1, "stain": "H&E", "focus_score": 0.5})

    good_pair("bad_truncated")
    data = (img_dir / "bad_truncated.png").read_bytes()
    (img_dir / "bad_truncated.png").write_bytes(data[: len(data) // 2])
    bad["images/bad_truncated.png"] = "truncated PNG"

    good_pair("bad_empty")
    (img_dir / "bad_empty.png").write_bytes(b"")
    bad["images/bad_empty.png"] = "zero-byte file"

    good_pair("bad_notimage")
    (img_dir / "bad_notimage.png").write_text("this is a lab note, not a picture\n")
    bad["images/bad_notimage.png"] = "not an image"

    good_pair("bad_mask128")
    m = np.asarray(Image.open(mask_dir / "bad_mask128.png")).copy()
    m[m > 0] = 128
    Image.fromarray(m).save(mask_dir / "bad_mask128.png")
    bad["masks/bad_mask128.png"] = "mask value 128"

    good_pair("bad_masksize")
    Image.fromarray(np.zeros((50, 60), np.uint8)).save(mask_dir / "bad_masksize.png")
    bad["masks/bad_masksize.png"] = "mask size differs from image"

    good_pair("bad_bomb")
    _bomb_png(img_dir / "bad_bomb.png", 40_000, 40_000)
    bad["images/bad_bomb.png"] = "decompression bomb"

    good_pair("bad_nomask")
    (mask_dir / "bad_nomask.png").unlink()
    bad["images/bad_nomask.png"] = "image without mask"

    good_pair("bad_noimage")
    (img_dir / "bad_noimage.png").unlink()
    bad["masks/bad_noimage.png"] = "mask without image"

    records.append({"id": "bad_orphan_record", "label": "healthy", "num_cells": 2, "stain": "H&E", "focus_score": 0.1})
    bad["annotations.json#bad_orphan_record"] = "annotation without files"

    good_pair("bad_noannotation")
    records.pop()
    bad["images/bad_noannotation.png"] = "no annotation record"
    return bad


def generate(root: str | Path, n: int = 600, seed: int = 0, bad: bool = True,
             size_range: tuple[int, int] = (150, 260), workers: int = 2, prefix: str = "cell_") -> dict[str, str]:
    """Write ``n`` good samples (plus defects when ``bad``) under ``root``; returns the defects.

    Sample ids are ``<prefix><number>``: another prefix makes new samples for an inbox.
    """
    root = Path(root)
    (root / "images").mkdir(parents=True, exist_ok=True)
    (root / "masks").mkdir(parents=True, exist_ok=True)
    modes = ["rgb"] * 20 + ["rgba", "palette", "grey", "grey16", "large"]
    jobs = []
    for i in range(n):
        mode = modes[i % len(modes)] if bad else "rgb"
        jobs.append((root, f"{prefix}{i:06d}", seed * 1_000_003 + i, size_range[0], size_range[1], mode))
    if workers > 1 and n >= 64:
        with ProcessPoolExecutor(workers) as pool:
            records = list(pool.map(_write_sample, jobs, chunksize=32))
    else:
        records = [_write_sample(j) for j in jobs]
    defects = _add_bad_inputs(root, np.random.default_rng(seed), records) if bad else {}
    (root / "annotations.json").write_text(json.dumps(records, indent=1))
    return defects


# ---- classify: a class-folder tree ------------------------------------------------------------

CLASSIFY_CLASSES = ("circles", "squares", "stripes", "triangles")
_FORMATS = (".jpg", ".png", ".jpg", ".jpeg", ".webp", ".JPG", ".png", ".bmp")
_SPLIT_FOLDERS = (("train", 0.7), ("val", 0.15), ("test", 0.15))


def _contrast(rng: np.random.Generator, background: np.ndarray) -> tuple[int, int, int]:
    """A colour far from the background's mean, so the shapes always show."""
    base = np.where(background.reshape(-1, 3).mean(axis=0) > 128, 40, 215)
    return tuple(int(v) for v in np.clip(base + rng.integers(-35, 36, 3), 0, 255))


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
            corners = [(cx + r * np.cos(a + k * 2 * np.pi / 3), cy + r * np.sin(a + k * 2 * np.pi / 3))
                       for k in range(3)]
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


def _save_picture(img: Image.Image, path: Path, rotate_exif: bool = False) -> None:
    """Save by suffix; ``rotate_exif`` stores the pixels turned with an EXIF orientation 6 tag, as a
    phone does (a viewer, and h5forge, show it upright)."""
    fmt = {".jpg": "JPEG", ".jpeg": "JPEG", ".png": "PNG", ".webp": "WEBP", ".bmp": "BMP"}[path.suffix.lower()]
    if rotate_exif and fmt == "JPEG":
        exif = Image.Exif()
        exif[0x0112] = 6  # "rotate 90 degrees clockwise to view"
        img.transpose(Image.Transpose.ROTATE_90).save(path, fmt, quality=90, exif=exif.tobytes())
    elif fmt == "JPEG":
        img.save(path, fmt, quality=90)
    elif fmt == "WEBP":
        img.save(path, fmt, quality=90)
    else:
        img.save(path, fmt)


def generate_classify(root: str | Path, n: int = 240, seed: int = 0, bad: bool = True, prefix: str = "",
                      split_folders: bool = False, size_range: tuple[int, int] = (72, 144)) -> dict[str, str]:
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
        _save_picture(picture, folder / f"{prefix}{per_class[cls]:04d}{ext}", rotate_exif=i % 9 == 4)
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


# ---- segment-multiclass: images/ + class masks/ + annotations.csv -----------------------------

SEGMENT_CLASSES = ("background", "cytoplasm", "nucleus")
_MASK_PALETTE = [0, 0, 0, 230, 40, 40, 40, 160, 230] + [0, 0, 0] * 253


def _cell_scene(rng: np.random.Generator, h: int, w: int, uncertain: bool) -> tuple[np.ndarray, np.ndarray, int]:
    """A stained-cell picture and its class mask (1 cytoplasm, 2 nucleus, 255 an uncertain rim)."""
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    base = 205 + 20 * np.sin(xx / w * np.pi + rng.uniform(0, 3)) * np.cos(yy / h * np.pi)
    img = np.stack([base * 0.97, base * 0.9, base], axis=-1)
    mask = np.zeros((h, w), np.uint8)
    n_cells = int(rng.integers(2, 7))
    for _ in range(n_cells):
        cy, cx = rng.uniform(0.15, 0.85) * h, rng.uniform(0.15, 0.85) * w
        ry, rx = rng.uniform(10, 22), rng.uniform(10, 22)
        theta = rng.uniform(0, np.pi)
        dy, dx = yy - cy, xx - cx
        u = (dx * np.cos(theta) + dy * np.sin(theta)) / rx
        v = (-dx * np.sin(theta) + dy * np.cos(theta)) / ry
        r2 = u * u + v * v
        cytoplasm, nucleus = r2 <= 1.0, r2 <= 0.22
        img[cytoplasm] = [215, 130, 175] + rng.normal(0, 6, (int(cytoplasm.sum()), 3))
        img[nucleus] = [95, 45, 140] + rng.normal(0, 6, (int(nucleus.sum()), 3))
        mask[cytoplasm] = 1
        mask[nucleus] = 2
        if uncertain:
            mask[(r2 > 0.85) & cytoplasm] = 255  # the annotator was unsure of the edge
    img += rng.normal(0, 5, img.shape)
    return np.clip(img, 0, 255).astype(np.uint8), mask, n_cells


def generate_segment_multiclass(root: str | Path, n: int = 120, seed: int = 0, bad: bool = True,
                                prefix: str = "scan_", size_range: tuple[int, int] = (96, 160)) -> dict[str, str]:
    """``n`` good images/ + masks/ pairs with 3-class masks (every 4th with an ignore rim of 255,
    the 4th one a palette PNG), annotations.csv, and (``bad``) a mask holding the undeclared value 7."""
    root = Path(root)
    (root / "images").mkdir(parents=True, exist_ok=True)
    (root / "masks").mkdir(parents=True, exist_ok=True)
    rows = []

    def write(sid: str, rng: np.random.Generator, i: int) -> np.ndarray:
        h, w = (int(v) for v in rng.integers(size_range[0], size_range[1] + 1, 2))
        rgb, mask, n_cells = _cell_scene(rng, h, w, uncertain=i % 4 == 1)
        ext = ".jpg" if i % 5 == 2 else ".png"
        _save_picture(Image.fromarray(rgb), root / "images" / f"{sid}{ext}")
        rows.append({"file": f"{sid}{ext}", "stain": ("H&E", "DAPI", "GFP")[i % 3], "num_cells": n_cells,
                     "focus": f"{rng.uniform(0.2, 1.0):.3f}", "reviewed": "true" if i % 3 else "false"})
        return mask

    for i in range(n):
        sid = f"{prefix}{i:04d}"
        mask = write(sid, np.random.default_rng([seed, i]), i)
        if i == 3:  # a palette PNG: the palette index is the class
            pal = Image.frombytes("P", (mask.shape[1], mask.shape[0]), np.minimum(mask, 2).tobytes())
            pal.putpalette(_MASK_PALETTE)
            pal.save(root / "masks" / f"{sid}.png")
        else:
            Image.fromarray(mask).save(root / "masks" / f"{sid}.png")
    defects: dict[str, str] = {}
    if bad:
        sid = f"{prefix}bad_value"
        mask = write(sid, np.random.default_rng([seed, 1_000_003]), 0)
        mask[5:15, 5:15] = 7  # a label the dataset does not declare
        Image.fromarray(mask).save(root / "masks" / f"{sid}.png")
        defects[f"masks/{sid}.png"] = "mask value 7 is not a class"
    with open(root / "annotations.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return defects


# ---- sr: lr/ + hr/ super-resolution pairs -----------------------------------------------------

def _texture(rng: np.random.Generator, h: int, w: int) -> Image.Image:
    """A picture with detail at every scale: gratings, sharp-edged shapes, fine noise."""
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    arr = np.full((h, w, 3), 128, np.float32)
    for _ in range(4):
        f, a = rng.uniform(0.02, 0.35), rng.uniform(0, np.pi)
        arr += rng.uniform(10, 35, 3) * np.sin(f * (xx * np.cos(a) + yy * np.sin(a)) + rng.uniform(0, 6))[..., None]
    img = Image.fromarray(np.clip(arr, 0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(img)
    for _ in range(int(rng.integers(3, 8))):
        x0, y0 = rng.uniform(0, w), rng.uniform(0, h)
        x1, y1 = x0 + rng.uniform(8, w / 2), y0 + rng.uniform(8, h / 2)
        colour = tuple(int(v) for v in rng.integers(0, 256, 3))
        (draw.ellipse if rng.random() < 0.5 else draw.rectangle)([x0, y0, x1, y1], fill=colour)
    noisy = np.asarray(img).astype(np.float32) + rng.normal(0, 4, (h, w, 3))
    return Image.fromarray(np.clip(noisy, 0, 255).astype(np.uint8))


def generate_sr(root: str | Path, n: int = 100, seed: int = 0, bad: bool = True, prefix: str = "",
                scale: int = 4, lr_range: tuple[int, int] = (24, 48)) -> dict[str, str]:
    """``n`` pairs hr/<id>.png and lr/<id>.png (the HR picture shrunk ``scale`` times with bicubic
    ``Image.resize``), plus (``bad``) a pair made at scale 3."""
    root = Path(root)
    (root / "lr").mkdir(parents=True, exist_ok=True)
    (root / "hr").mkdir(parents=True, exist_ok=True)

    def pair(sid: str, rng: np.random.Generator, k: int) -> None:
        lh, lw = (int(v) for v in rng.integers(lr_range[0], lr_range[1] + 1, 2))
        hr = _texture(rng, lh * scale, lw * scale)
        hr.save(root / "hr" / f"{sid}.png")
        hr.resize((hr.width // k, hr.height // k), Image.Resampling.BICUBIC).save(root / "lr" / f"{sid}.png")

    for i in range(n):
        pair(f"{prefix}{i:04d}", np.random.default_rng([seed, i]), scale)
    defects: dict[str, str] = {}
    if bad:
        sid = f"{prefix}bad_scale"
        pair(sid, np.random.default_rng([seed, 1_000_003]), 3)
        defects[f"hr/{sid}.png"] = "HR is 3x its LR partner, not 4x"
    return defects


# ---- ct: DICOM series per case folder + per-slice PNG masks -----------------------------------

CT_SPACING = (2.0, 2.5, 3.0)  # mm between slices, one per case
CT_SPHERE_HU = 400


def _uid(*parts: object) -> str:
    """A DICOM UID derived from ``parts``: the same arguments give the same file bytes."""
    from pydicom.uid import generate_uid

    return generate_uid(entropy_srcs=[str(p) for p in parts])


def _ct_case(root: Path, case: str, base, seed: int, depth: int, *, skip: tuple[int, ...] = (),
             mask_depth: int | None = None, scout: int = 0, suffix: str = ".dcm") -> None:
    """A case folder of ``depth`` axial slices (minus ``skip``) at a fixed spacing, a sphere of
    +400 HU in it, saved in shuffled order with shuffled InstanceNumbers; its per-slice PNG masks
    (``mask_depth`` of them); and ``scout`` slices of a second series (a localizer) beside it."""
    import copy

    rng = np.random.default_rng([seed, sum(map(ord, case))])
    folder, masks = root / case, root / "masks" / case
    folder.mkdir(parents=True, exist_ok=True)
    masks.mkdir(parents=True, exist_ok=True)
    spacing = float(CT_SPACING[int(rng.integers(len(CT_SPACING)))])
    rows, cols = int(base.Rows), int(base.Columns)
    row_mm, col_mm = (float(v) for v in base.PixelSpacing)
    x0, y0, z0 = -col_mm * cols / 2, -row_mm * rows / 2, float(rng.uniform(-200, -100))
    radius = float(rng.uniform(8, 14))  # mm
    centre = np.array([rng.uniform(0.35, 0.65) * depth * spacing, rng.uniform(0.3, 0.7) * rows * row_mm,
                       rng.uniform(0.3, 0.7) * cols * col_mm])  # (z, y, x) in mm from the first voxel
    yy, xx = np.mgrid[0:rows, 0:cols].astype(np.float64)
    study, series = _uid(seed, case, "study"), _uid(seed, case, "series")
    pixels = base.pixel_array.astype(np.int32)
    numbers = rng.permutation(depth) + 1

    def write(ds, name: str) -> None:
        ds.save_as(folder / name, enforce_file_format=True)

    for k in rng.permutation(depth):
        inside = ((k * spacing - centre[0]) ** 2 + (yy * row_mm - centre[1]) ** 2
                  + (xx * col_mm - centre[2]) ** 2) <= radius ** 2
        if mask_depth is None or k < mask_depth:
            Image.fromarray(inside.astype(np.uint8) * 255).save(masks / f"slice_{k:03d}.png")
        if k in skip:
            continue
        values = pixels + CT_SPHERE_HU * inside + np.round(rng.normal(0, 12, pixels.shape)).astype(np.int32)
        ds = copy.deepcopy(base)
        ds.PixelData = np.clip(values, -32768, 32767).astype(np.int16).tobytes()
        ds.StudyInstanceUID, ds.SeriesInstanceUID = study, series
        ds.SOPInstanceUID = ds.file_meta.MediaStorageSOPInstanceUID = _uid(seed, case, "slice", k)
        ds.PatientID, ds.PatientName = case, case
        ds.SeriesDescription, ds.SeriesNumber = "axial", 2
        ds.ImageOrientationPatient = [1, 0, 0, 0, 1, 0]
        ds.ImagePositionPatient = [x0, y0, z0 + k * spacing]
        ds.SliceLocation, ds.SliceThickness = z0 + k * spacing, spacing
        ds.InstanceNumber = int(numbers[k])  # deliberately not the slice order
        write(ds, f"{ds.SOPInstanceUID}{suffix}" if suffix else f"IM{numbers[k]:04d}")
    for k in range(scout):  # a localizer series in the same folder: coronal, its own series UID
        ds = copy.deepcopy(base)
        ds.StudyInstanceUID, ds.SeriesInstanceUID = study, _uid(seed, case, "scout")
        ds.SOPInstanceUID = ds.file_meta.MediaStorageSOPInstanceUID = _uid(seed, case, "scout", k)
        ds.SeriesDescription, ds.SeriesNumber = "scout", 1
        ds.ImageOrientationPatient = [1, 0, 0, 0, 0, -1]
        ds.ImagePositionPatient = [x0, y0 + 40.0 * k, z0]
        ds.InstanceNumber = k + 1
        write(ds, f"{ds.SOPInstanceUID}{suffix}" if suffix else f"IM{depth + k + 1:04d}")


def generate_ct(root: str | Path, n: int = 6, seed: int = 0, bad: bool = True, prefix: str = "case_",
                depth_range: tuple[int, int] = (8, 20)) -> dict[str, str]:
    """``n`` good CT cases ROOT/<prefix>NNN/ of 8-20 slices with masks/<case>/, plus (``bad``) a case
    missing a slice, a case holding a second (scout) series, and a case whose mask lacks a slice."""
    import pydicom
    from pydicom.data import get_testdata_file

    root = Path(root)
    base = pydicom.dcmread(get_testdata_file("CT_small.dcm"))
    for i in range(n):
        depth = int(np.random.default_rng([seed, i]).integers(depth_range[0], depth_range[1] + 1))
        _ct_case(root, f"{prefix}{i:03d}", base, seed, depth, suffix="" if i == 1 else ".dcm")
    defects: dict[str, str] = {}
    if bad:
        _ct_case(root, f"{prefix}missing_slice", base, seed, 12, skip=(5,))
        defects[f"{prefix}missing_slice"] = "slice 5 of 12 is missing (a gap in the positions)"
        _ct_case(root, f"{prefix}two_series", base, seed, 12, scout=3)
        defects[f"{prefix}two_series"] = ("two series in one folder: 12 axial slices and a 3-slice scout "
                                          "(series: largest takes the axial one; without it, ambiguous)")
        _ct_case(root, f"{prefix}mask_depth", base, seed, 10, mask_depth=9)
        defects[f"masks/{prefix}mask_depth"] = "the mask has 9 slices, its volume 10"
    return defects


# ---- signals: multi-rate EDF recordings -------------------------------------------------------

SIGNAL_CHANNELS = {  # label: (rate Hz, unit, physical min, physical max)
    "ACC": (1000, "g", -8.0, 8.0),
    "VOLT": (100, "mV", -5.0, 5.0),
    "TEMP": (1, "degC", 20.0, 45.0),
}


def _channel(rng: np.random.Generator, label: str, seconds: int, rate: int) -> np.ndarray:
    t = np.arange(seconds * rate) / rate
    if label == "ACC":  # gait: ~1.8 Hz steps plus sensor noise
        return 1.0 + 0.6 * np.sin(2 * np.pi * rng.uniform(1.5, 2.1) * t) + rng.normal(0, 0.05, t.size)
    if label == "VOLT":  # an ECG-like pulse train at ~70 bpm
        beat = (t * rng.uniform(1.0, 1.3)) % 1.0
        return 1.2 * np.exp(-((beat - 0.3) / 0.02) ** 2) - 0.2 * np.exp(-((beat - 0.55) / 0.06) ** 2) \
            + rng.normal(0, 0.02, t.size)
    return rng.uniform(36.2, 37.0) + 0.05 * t / max(seconds, 1) + rng.normal(0, 0.01, t.size)


def _write_edf(path: Path, rng: np.random.Generator, seconds: int, channels: dict[str, int], start: int) -> None:
    import datetime

    import pyedflib

    w = pyedflib.EdfWriter(str(path), len(channels), file_type=pyedflib.FILETYPE_EDFPLUS)
    try:
        headers = []
        for label, rate in channels.items():
            _, unit, lo, hi = SIGNAL_CHANNELS[label]
            headers.append({"label": label, "dimension": unit, "sample_frequency": rate, "physical_min": lo,
                            "physical_max": hi, "digital_min": -32768, "digital_max": 32767})
        w.setSignalHeaders(headers)
        w.setStartdatetime(datetime.datetime(2024, 3, 1, 8, 0, 0) + datetime.timedelta(hours=start))
        w.writeSamples([np.clip(_channel(rng, label, seconds, rate), SIGNAL_CHANNELS[label][2],
                                SIGNAL_CHANNELS[label][3]) for label, rate in channels.items()])
    finally:
        w.close()


def generate_signals(root: str | Path, n: int = 8, seed: int = 0, bad: bool = True, prefix: str = "rec_",
                     seconds_range: tuple[int, int] = (2, 10)) -> dict[str, str]:
    """``n`` good EDF+ recordings ROOT/<prefix>NNN.edf (ACC 1000 Hz, VOLT 100 Hz, TEMP 1 Hz, 2-10 s),
    plus (``bad``) one with ACC at 500 Hz, one without TEMP and one truncated file."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    rates = {label: spec[0] for label, spec in SIGNAL_CHANNELS.items()}
    for i in range(n):
        rng = np.random.default_rng([seed, i])
        _write_edf(root / f"{prefix}{i:03d}.edf", rng, int(rng.integers(seconds_range[0], seconds_range[1] + 1)),
                   rates, i)
    defects: dict[str, str] = {}
    if bad:
        rng = np.random.default_rng([seed, 1_000_003])
        _write_edf(root / f"{prefix}bad_rate.edf", rng, 4, {**rates, "ACC": 500}, n)
        defects[f"{prefix}bad_rate.edf"] = "ACC recorded at 500 Hz, not 1000 Hz"
        _write_edf(root / f"{prefix}no_temp.edf", rng, 3, {k: v for k, v in rates.items() if k != "TEMP"}, n + 1)
        defects[f"{prefix}no_temp.edf"] = "the TEMP channel is missing"
        path = root / f"{prefix}truncated.edf"
        _write_edf(path, rng, 5, rates, n + 2)
        data = path.read_bytes()
        path.write_bytes(data[: len(data) * 2 // 3])
        defects[f"{prefix}truncated.edf"] = "truncated: the last third of the file is cut off"
    return defects


# the demo folders ``h5forge demo-data --kind`` writes: generator and default sample count
KINDS = {
    "cells": (generate, 600),
    "classify": (generate_classify, 240),
    "segment-multiclass": (generate_segment_multiclass, 120),
    "sr": (generate_sr, 100),
    "ct": (generate_ct, 6),
    "signals": (generate_signals, 8),
}
