"""Segmentation masks: binary, or a class index per pixel with ``classes`` and ``ignore_value``
read from the values of sampled masks. A value seen in one sampled mask only is taken for a stray
(and noted) unless it continues the class indices, so one bad mask does not declare a class."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image

from h5forge._init.folders import sample
from h5forge._init.pictures import HEADER_LIMIT
from h5forge._init.text import SpecText, files_value
from h5forge.kinds.base import lossy_format

MASK_SAMPLE = 50


@dataclass
class MaskClasses:
    classes: int | None = None  # None: binary
    ignore_value: int | None = None
    sampled: int = 0
    palette: int = 0  # palette-mode masks among the sampled
    found: list[int] = field(default_factory=list)


def _mask_values(path: Path) -> tuple[set[int] | None, str]:
    """The values of one mask (palette index for a palette PNG), or None with what it is."""
    try:
        with Image.open(path) as im:
            if im.size[0] * im.size[1] > HEADER_LIMIT:
                return None, "too large"
            if im.format == "JPEG" or (im.format == "WEBP" and lossy_format(path.read_bytes())):
                return None, "lossy"
            im.load()
            mode = im.mode
            if mode in ("RGB", "RGBA", "LA", "La", "RGBa"):
                arr = np.asarray(im)
                colour = arr[..., :3] if arr.shape[2] >= 3 else arr[..., :1]
                if not (colour == colour[..., :1]).all():
                    return None, "colour"
                arr = colour[..., 0]
            else:
                arr = np.asarray(im)
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError):
        return None, "unreadable"
    if arr.dtype == np.uint8 or arr.dtype == bool:
        values = np.flatnonzero(np.bincount(arr.astype(np.uint8).ravel(), minlength=256))
    else:
        values = np.unique(arr)
    return {int(v) for v in values}, mode


def mask_classes(paths: list[Path], notes: list[str]) -> MaskClasses:
    per_file: list[tuple[Path, set[int]]] = []
    info = MaskClasses()
    colour = lossy = 0
    for p in sample(paths, MASK_SAMPLE):
        values, mode = _mask_values(p)
        if values is None:
            colour += mode == "colour"
            lossy += mode == "lossy"
            continue
        info.palette += mode == "P"
        per_file.append((p, values))
    info.sampled = len(per_file)
    if colour:
        notes.append(
            f"{colour} sampled masks are RGB colour pictures: declare the mask's palette "
            "({class: [r, g, b]}) and classes, or they are rejected"
        )
    if lossy:
        notes.append(
            f"{lossy} of {min(len(paths), MASK_SAMPLE)} sampled masks are JPEG (or lossy WebP): their "
            "compression leaves values near every edge that are no class, so their values declare none; "
            "a build rejects such a mask unless it holds exactly {0,1} or {0,255} (and any multi-class "
            "one): save the masks as PNG"
        )
    if not per_file:
        return info
    freq = Counter(v for _, vals in per_file for v in vals)
    rare = {v for v, n in freq.items() if n == 1 and len(per_file) >= 5}  # in one sampled mask only

    def note_strays(strays: set[int]) -> None:
        if strays:
            where = [f"{p.name}: {sorted(vals & strays)}" for p, vals in per_file if vals & strays]
            notes.append(
                f"mask values {sorted(strays)} appear in one sampled mask each ({'; '.join(where[:4])}); "
                "they are not declared, so those masks will be rejected (raise classes if they are real "
                "classes)"
            )

    binary_strays = rare - {0, 1, 255}
    if all((vals - binary_strays) <= {0, 1} or (vals - binary_strays) <= {0, 255} for _, vals in per_file):
        note_strays(binary_strays)
        return info  # binary: {0,1} or {0,255} per mask
    real = set(freq) - rare
    for v in sorted(rare):  # a rare value is a rare class when it is within (or continues) 0..K-1
        if v != 255 and v <= max(real - {255}, default=-1) + 1:
            real.add(v)
    note_strays(set(freq) - real)
    top = max(real - {255}, default=0)
    if max(real, default=0) > 255:
        notes.append(
            f"masks hold values up to {max(real)} (16-bit, instance ids?): only 8-bit class indices "
            "are supported; the mask is declared binary and such masks will be rejected"
        )
        return info
    info.classes = max(top + 1, 2)
    info.ignore_value = 255 if 255 in real else None
    info.found = sorted(real)
    if info.classes > 8 and len(real - {255}) < info.classes / 2:
        notes.append(
            f"mask values {sorted(real - {255})} are sparse for classes: {info.classes}; if they are "
            "grey levels rather than class indices, remap them to 0..K-1"
        )
    return info


def class_lines(t: SpecText, mc: MaskClasses, ignored: str) -> None:
    """A class mask's ``classes`` and ``ignore_value`` lines (none for a binary mask); ``ignored``
    says what the ignore value marks. Shared by picture masks and volume masks."""
    if mc.classes is not None:
        t(2, f"classes: {mc.classes}", f"values 0..{mc.classes - 1}: found {mc.found} in {mc.sampled} sampled masks")
        if mc.ignore_value is not None:
            t(2, f"ignore_value: {mc.ignore_value}", ignored)


def pad_line(t: SpecText, mc: MaskClasses) -> None:
    """The pad value, unless the ignore value is the padding already."""
    if mc.ignore_value is None:
        why = "where a mask is padded to its image's size: not a class, not counted; give the loss ignore_index=255"
        t(2, "pad_value: 255", why)


def mask_field(t: SpecText, globs: list[str], mc: MaskClasses, suffix: str | None = None) -> None:
    t(1, "masks:")
    if mc.classes is None:
        t(2, "kind: mask", "single channel, values {0,1} or {0,255}; stored as {0,1}")
    else:
        t(2, "kind: mask", "class index per pixel" + (" (palette PNGs: the palette index)" if mc.palette else ""))
    t(2, f"files: {files_value(globs)}")
    if suffix:
        t(2, f"id_suffix: {json.dumps(suffix)}", f"mask names end in it after their image's stem (<id>{suffix})")
    t(2, "like: images", "must have its image's size; padded/cropped the same way")
    class_lines(t, mc, "pixels to ignore in the loss (VOC convention); padding uses it")
    pad_line(t, mc)
