"""The ``cells`` demo (the default): stained-cell micrographs of varied sizes and PNG modes, binary
masks ({0,1} or {0,255}), and an annotations.json, with every kind of defect the cleaning must
quarantine (truncated, empty and non-picture files, bad masks, a bomb, missing partners)."""

from __future__ import annotations

import json
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
from PIL import Image

from h5forge._demo.pictures import bomb_png

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
    bomb_png(img_dir / "bad_bomb.png", 40_000, 40_000)
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


def generate(
    root: str | Path,
    n: int = 600,
    seed: int = 0,
    bad: bool = True,
    size_range: tuple[int, int] = (150, 260),
    workers: int = 2,
    prefix: str = "cell_",
) -> dict[str, str]:
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
