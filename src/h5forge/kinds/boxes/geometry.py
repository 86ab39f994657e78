"""Boxes through an image's crop/pad/scale plan (``kinds.image.Geometry``), and the frame rules.

Boxes are ``(n, 4)`` pixel corners ``x0, y0, x1, y1`` (x right, y down) of the raw picture, and
go through the image's plan so they stay on the same pixels. A box leaving the frame is clipped
(``outside: clip``) or dropped (``outside: drop``); one narrower or lower than ``min_size``
inside it is dropped either way.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Placed:
    boxes: np.ndarray  # (k, 4) float64 corners in the stored frame
    kept: np.ndarray  # (n,) bool: which input boxes are in ``boxes``
    clipped: int
    dropped: int


def place(boxes: np.ndarray, geometry, outside: str, min_size: float) -> Placed:
    """``boxes`` (n, 4) in the raw picture's pixels, brought into the stored frame."""
    b = np.asarray(boxes, np.float64).reshape(-1, 4).copy()
    h, w = geometry.raw
    if geometry.scaled is not None:
        sh, sw = geometry.scaled
        b[:, [0, 2]] *= sw / w
        b[:, [1, 3]] *= sh / h
    top, left, ch, cw = geometry.crop
    b[:, [0, 2]] -= left
    b[:, [1, 3]] -= top
    inside = np.column_stack([np.clip(b[:, [0, 2]], 0, cw), np.clip(b[:, [1, 3]], 0, ch)])[:, [0, 2, 1, 3]]
    cut = ~np.isclose(inside, b).all(axis=1)
    big = ((inside[:, 2] - inside[:, 0]) >= min_size) & ((inside[:, 3] - inside[:, 1]) >= min_size)
    kept = big & (~cut if outside == "drop" else True)
    pt, _, pl, _ = geometry.pad
    out = inside[kept] + np.array([pl, pt, pl, pt], np.float64)
    return Placed(out, kept, int(np.count_nonzero(cut & kept)), int(np.count_nonzero(~kept)))
