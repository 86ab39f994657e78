"""Segmentation masks: binary, or a class index per pixel with ``classes`` and ``ignore_value``
read from the values of sampled masks. A value seen in one sampled mask only is taken for a stray
(and noted) unless it continues the class indices, so one bad mask does not declare a class. Binary
masks in a lossy format whose values lie near 0 and 255 (Kvasir-SEG's JPEG masks) get the field's
``threshold``, by the rule the mask kind reads them with."""

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
from h5forge.kinds._mask_threshold import FAR, MAX_UNCLEAR, clear_enough, grey_and_unclear
from h5forge.kinds.base import lossy_format

MASK_SAMPLE = 50
THRESHOLD = 128  # halfway: JPEG moves a drawn mask's values a few levels, never near the middle


@dataclass
class MaskClasses:
    classes: int | None = None  # None: binary
    ignore_value: int | None = None
    sampled: int = 0
    palette: int = 0  # palette-mode masks among the sampled
    found: list[int] = field(default_factory=list)
    threshold: int | None = None  # binary masks in a lossy format, read by their values near 0 and 255
    # class -> colour: palette masks whose files number their colours differently, read by colour
    colours: dict[int, tuple[int, int, int]] | None = None


def _mask_values(path: Path) -> tuple[set[int] | None, str]:
    """The values of one mask (palette index for a palette PNG), or None with what it is."""
    try:
        with Image.open(path) as im:
            if im.size[0] * im.size[1] > HEADER_LIMIT:
                return None, "too large"
            if lossy_format(path.read_bytes()):  # as a build judges it: JPEG, lossy WebP, TIFF-JPEG, ...
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


def near_binary(path: Path) -> bool:
    """Whether a mask in a lossy format is a binary mask the field's threshold reads: its values
    near 0 and 255 (``_mask_threshold``), not a grey or colour picture."""
    try:
        with Image.open(path) as im:
            arr = np.asarray(im if im.mode in ("L", "RGB") else im.convert("RGB"))
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError):
        return False
    _, unclear = grey_and_unclear(arr)
    return clear_enough(unclear, arr.shape[0] * arr.shape[1])


def mask_classes(paths: list[Path], notes: list[str], by_colour: bool = True) -> MaskClasses:
    """The classes of sampled masks; ``by_colour``: palette masks whose files number their colours
    differently are declared by their colours (``MaskClasses.colours``), which a 2-D mask field
    reads (a volume mask's slices have no palette to declare)."""
    per_file: list[tuple[Path, set[int]]] = []
    palettes: list[tuple[Path, dict[int, tuple[int, int, int]]]] = []
    info = MaskClasses()
    colour = lossy = binary_lossy = 0
    for p in sample(paths, MASK_SAMPLE):
        values, mode = _mask_values(p)
        if values is None:
            colour += mode == "colour"
            if mode == "lossy":
                lossy += 1
                binary_lossy += near_binary(p)
            continue
        info.palette += mode == "P"
        per_file.append((p, values))
        if mode == "P" and (drawn := _palette_colours(p, values)) is not None:
            palettes.append((p, drawn))
    info.sampled = len(per_file)
    if (clash := _renumbered(palettes)) is not None:
        where = "; ".join(f"{p.name}: index {i} is {list(c)}" for p, i, c in clash)
        if by_colour and len(colours := sorted({c for _, d in palettes for c in d.values()}, key=_black_first)) <= 255:
            info.colours = dict(enumerate(colours))
            info.classes, info.ignore_value, info.found = max(len(colours), 2), None, sorted(info.colours)
            notes.append(
                f"the palette masks number their colours differently ({where}): the index is no class, so "
                "they are read by their colours (palette), black first; name the classes in that order"
            )
            return info
        notes.append(f"the palette masks number their colours differently ({where}): the index is no class; remap them")
    if colour:
        notes.append(
            f"{colour} sampled masks are RGB colour pictures: declare the mask's palette "
            "({class: [r, g, b]}) and classes, or they are rejected"
        )
    classes_of_values(per_file, info, notes)
    if lossy:
        lossy_masks(info, lossy, binary_lossy, min(len(paths), MASK_SAMPLE), notes)
    return info


def _palette_colours(path: Path, used: set[int]) -> dict[int, tuple[int, int, int]] | None:
    """The colour a palette mask draws each of its ``used`` indices in, or None when unreadable."""
    try:
        with Image.open(path) as im:
            palette = im.getpalette() or []
    except (OSError, ValueError):
        return None
    if 3 * (max(used, default=0) + 1) > len(palette):
        return None
    return {i: (palette[3 * i], palette[3 * i + 1], palette[3 * i + 2]) for i in sorted(used)}


def _renumbered(palettes: list[tuple[Path, dict[int, tuple[int, int, int]]]]) -> list | None:
    """Two masks that draw one index in other colours, as (file, index, colour) each; else None,
    also when they draw black and one colour only: a binary mask's palette is read by its colours."""
    if len({c for _, drawn in palettes for c in drawn.values()} - {(0, 0, 0)}) <= 1:
        return None
    first: dict[int, tuple[Path, tuple[int, int, int]]] = {}
    for path, drawn in palettes:
        for index, colour in drawn.items():
            seen = first.setdefault(index, (path, colour))
            if seen[1] != colour:
                return [(seen[0], index, seen[1]), (path, index, colour)]
    return None


def _black_first(colour: tuple[int, int, int]) -> tuple[bool, tuple[int, int, int]]:
    return (colour != (0, 0, 0), colour)


def lossy_masks(info: MaskClasses, lossy: int, binary: int, sampled: int, notes: list[str]) -> None:
    """The threshold for binary masks in a lossy format, or a note on the lossy masks a build rejects."""
    if info.classes is not None:
        notes.append(
            f"{lossy} of {sampled} sampled masks are JPEG (or in another lossy format): their compression moves values "
            "near every edge onto other classes, so a build rejects such a class mask: save the masks as PNG"
        )
        return
    if binary:
        info.threshold = THRESHOLD
    if binary < lossy:
        notes.append(
            f"{lossy - binary} of {lossy} sampled JPEG (or other lossy) masks have over {MAX_UNCLEAR:.0%} of "
            f"their pixels {FAR}..{255 - FAR} or coloured (grey pictures, not binary masks?): a build rejects them"
        )


def classes_of_values(per_file: list[tuple[Path, set[int]]], info: MaskClasses, notes: list[str]) -> None:
    """``info``'s classes and ignore value from the values of the sampled masks (binary: none)."""
    if not per_file:
        return
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
        return  # binary: {0,1} or {0,255} per mask
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
        return
    info.classes = max(top + 1, 2)
    info.ignore_value = 255 if 255 in real else None
    info.found = sorted(real)
    if info.classes > 8 and len(real - {255}) < info.classes / 2:
        notes.append(
            f"mask values {sorted(real - {255})} are sparse for classes: {info.classes}; if they are "
            "grey levels rather than class indices, remap them to 0..K-1"
        )


def class_lines(t: SpecText, mc: MaskClasses, ignored: str) -> None:
    """A class mask's ``classes`` and ``ignore_value`` lines (none for a binary mask); ``ignored``
    says what the ignore value marks. Shared by picture masks and volume masks."""
    if mc.colours is not None:
        t(2, f"classes: {mc.classes}", f"{len(mc.colours)} colours in {mc.sampled} sampled palette masks")
        listed = ", ".join(f"{k}: {list(c)}" for k, c in mc.colours.items())
        t(2, f"palette: {{{listed}}}", "class -> colour: each file numbers its colours in its own order")
    elif mc.classes is not None:
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
        index = " (palette PNGs: the palette index)" if mc.palette and mc.colours is None else ""
        t(2, "kind: mask", "class index per pixel" + (" (palette masks: by colour)" if mc.colours else index))
    t(2, f"files: {files_value(globs)}")
    if suffix:
        t(2, f"id_suffix: {json.dumps(suffix)}", f"mask names end in it after their image's stem (<id>{suffix})")
    t(2, "like: images", "must have its image's size; padded/cropped the same way")
    if mc.threshold is not None:
        why = (
            f"JPEG masks: a value >= {mc.threshold} is 1, below is 0 (compression moves values near edges); "
            f"a mask with over {MAX_UNCLEAR:.0%} of its pixels {FAR}..{255 - FAR} is rejected"
        )
        t(2, f"threshold: {mc.threshold}", why)
    class_lines(t, mc, "pixels to ignore in the loss (VOC convention); padding uses it")
    pad_line(t, mc)
