"""The ``sr`` demo: super-resolution pairs, each LR picture made from its HR partner by
``Image.resize``, from pictures with detail at every scale so the pairs are worth learning."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw


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


def generate_sr(
    root: str | Path,
    n: int = 100,
    seed: int = 0,
    bad: bool = True,
    prefix: str = "",
    scale: int = 4,
    lr_range: tuple[int, int] = (24, 48),
) -> dict[str, str]:
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
