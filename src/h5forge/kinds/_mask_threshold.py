"""The rule that tells a binary mask saved in a lossy format (Kvasir-SEG's JPEG masks: values near 0
and 255, moved a little near edges) from a grey picture, shared by the mask kind's ``threshold`` and
by ``init``, which writes that option only for masks the kind then reads.

A pixel is unclear when its grey value lies at least ``FAR`` from both 0 and 255 (64..191), or when
its colour channels spread ``FAR`` or more apart (a colour, not a grey). JPEG's own noise keeps a
drawn mask's pixels within a few levels of 0 and 255 (under 0.2 % of pixels beyond 32 at quality
75), while a photograph has 40-99 % of its pixels in that band: a mask with more than
``MAX_UNCLEAR`` of them unclear is no binary mask and is refused, never cut at the threshold. So is
one whose unclear pixels lie away from its edges (``stray_pixels``: a region drawn in grey, which
a threshold would drop or keep whole by its shade)."""

from __future__ import annotations

import numpy as np

FAR = 64  # levels from 0 and from 255, and between two channels, that no compression noise moves a pixel
MAX_UNCLEAR = 0.05  # the share of unclear pixels a binary mask may hold (anti-aliased or blurred edges)
EDGE = 3  # pixels from both a dark and a bright one within which an unclear pixel is an edge's
THRESHOLD_DOC = (
    "binary masks in a lossy format (JPEG): a value >= threshold is 1, below is 0; a mask already "
    f"holding {{0,1}} or {{0,255}} is read as without it, and one with more than {MAX_UNCLEAR:.0%} of its "
    f"pixels {FAR}..{255 - FAR} (or coloured), one such pixel off an edge, or nothing near 255 is rejected"
)


def luma(colour: np.ndarray) -> np.ndarray:
    """HW uint8 ITU-R 601-2 luma of HWC uint8 RGB, as Pillow's ``convert("L")`` computes it."""
    r, g, b = (colour[..., k].astype(np.uint32) for k in range(3))
    return ((r * 19595 + g * 38470 + b * 7471 + 0x8000) >> 16).astype(np.uint8)


def grey_and_unclear(pixels: np.ndarray) -> tuple[np.ndarray, int]:
    """The HW grey values of HW grey or HWC RGB uint8 pixels, and how many pixels are unclear."""
    if pixels.ndim == 2:
        grey, spread = pixels, None
    else:
        colour = pixels[..., :3]
        grey = colour[..., 0] if (colour == colour[..., :1]).all() else luma(colour)
        spread = colour.max(axis=2) - colour.min(axis=2)
    far = (grey >= FAR) & (grey <= 255 - FAR)
    if spread is not None:
        far |= spread >= FAR
    return grey, int(np.count_nonzero(far))


def clear_enough(unclear: int, size: int) -> bool:
    """Whether a mask of ``size`` pixels, ``unclear`` of them unclear, is read as a binary mask."""
    return unclear <= MAX_UNCLEAR * size


def stray_pixels(grey: np.ndarray) -> int:
    """How many unclear pixels of a HW grey mask lie farther than ``EDGE`` pixels from a dark (below
    ``FAR``) or from a bright (above ``255 - FAR``) one: no edge between the two made them."""
    unclear = (grey >= FAR) & (grey <= 255 - FAR)
    if not unclear.any():
        return 0
    on_edge = _near(grey < FAR, EDGE) & _near(grey > 255 - FAR, EDGE)
    return int(np.count_nonzero(unclear & ~on_edge))


def _near(mask: np.ndarray, k: int) -> np.ndarray:
    """Where a HW bool ``mask`` has a True pixel within ``k`` pixels (a square around each)."""
    h, w = mask.shape
    padded, out = np.pad(mask, k), np.zeros_like(mask)
    for dy in range(2 * k + 1):
        for dx in range(2 * k + 1):
            out |= padded[dy : dy + h, dx : dx + w]
    return out
