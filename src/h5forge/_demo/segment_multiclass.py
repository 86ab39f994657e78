"""The ``segment-multiclass`` demo: images/ + masks/ with class masks (background, cytoplasm,
nucleus; 255 where the annotator was unsure of the edge), one palette PNG mask, and an
annotations.csv whose columns are text to be typed."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
from PIL import Image

from h5forge._demo.pictures import save_picture

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


def generate_segment_multiclass(
    root: str | Path,
    n: int = 120,
    seed: int = 0,
    bad: bool = True,
    prefix: str = "scan_",
    size_range: tuple[int, int] = (96, 160),
) -> dict[str, str]:
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
        save_picture(Image.fromarray(rgb), root / "images" / f"{sid}{ext}")
        rows.append(
            {
                "file": f"{sid}{ext}",
                "stain": ("H&E", "DAPI", "GFP")[i % 3],
                "num_cells": n_cells,
                "focus": f"{rng.uniform(0.2, 1.0):.3f}",
                "reviewed": "true" if i % 3 else "false",
            }
        )
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
