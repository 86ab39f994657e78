"""Pillow helpers shared by the pictures h5forge writes (the preview sheet, the codec chart):
the caption font, text cut to a width, a picture fitted into a box, overlay blending."""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from PIL import Image, ImageDraw, ImageFont

BACKGROUND = (34, 34, 38)
TEXT = (235, 235, 235)
DIM_TEXT = (170, 170, 175)
FONT_SIZE = 11
LINE_HEIGHT = 14


@lru_cache(maxsize=4)
def font(size: int = FONT_SIZE) -> ImageFont.ImageFont | ImageFont.FreeTypeFont:
    """Pillow's bundled font (no system font needed, so every machine draws the same)."""
    return ImageFont.load_default(size=size)


def fit_text(draw: ImageDraw.ImageDraw, text: str, width: int, size: int = FONT_SIZE) -> str:
    """``text`` cut (with an ellipsis) to fit ``width`` pixels."""
    f = font(size)
    if draw.textlength(text, font=f) <= width:
        return text
    while text and draw.textlength(text + "…", font=f) > width:
        text = text[:-1]
    return text + "…"


def wrap_text(draw: ImageDraw.ImageDraw, words: list[str], width: int, max_lines: int) -> list[str]:
    """Words (captions) packed into at most ``max_lines`` lines of ``width`` pixels; the last
    line is cut with an ellipsis when they do not all fit."""
    lines: list[str] = []
    line = ""
    for word in words:
        trial = f"{line}  {word}" if line else word
        if line and draw.textlength(trial, font=font()) > width:
            lines.append(line)
            line = word
        else:
            line = trial
    if line:
        lines.append(line)
    if len(lines) > max_lines:
        lines = lines[: max_lines - 1] + ["  ".join(lines[max_lines - 1 :])]
    return [fit_text(draw, text, width) for text in lines]


def fitted_size(h: int, w: int, box: int, box_width: int | None = None) -> tuple[int, int]:
    """(height, width) of an h x w picture scaled to fit a box high and ``box_width`` (default:
    ``box``) wide, aspect kept."""
    scale = min(box / h, (box_width or box) / w)
    return max(1, round(h * scale)), max(1, round(w * scale))


def resized(picture: np.ndarray, size: tuple[int, int], labels: bool = False) -> np.ndarray:
    """An (H, W, 3) uint8 picture at ``size`` (height, width). Photographs shrink with Lanczos
    and grow with nearest neighbour (small pictures stay crisp); label pictures are always
    nearest neighbour, so no colour between two classes is invented."""
    h, w = size
    if picture.shape[:2] == (h, w):
        return picture
    grow = h >= picture.shape[0] and w >= picture.shape[1]
    method = Image.Resampling.NEAREST if labels or grow else Image.Resampling.LANCZOS
    return np.asarray(Image.fromarray(picture).resize((w, h), method))


def blend(base: np.ndarray, overlay: np.ndarray) -> np.ndarray:
    """``overlay`` painted half-transparent over ``base`` where it is not black."""
    painted = overlay.any(axis=2)
    out = base.copy()
    mixed = (base[painted].astype(np.uint16) + overlay[painted] + 1) // 2
    out[painted] = mixed.astype(np.uint8)
    return out
