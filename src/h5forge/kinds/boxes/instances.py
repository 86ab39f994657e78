"""Instance masks (``masks: true``): each box's object as a binary mask, from the COCO
``segmentation`` (polygons, or RLE compressed or not) or a YOLO segmentation polygon, at the raw
picture's size, then cropped, shrunk (nearest) and padded with the picture's plan. A box without
a segmentation is its own mask.

Every segmentation of a picture is checked before any is decoded (an RLE's size and run lengths,
a polygon's vertices within ``max_vertices`` and the outline within ``max_outline``), else the
picture is rejected with the reason. RLE masks are made here from the checked run lengths;
polygons are rasterised by pycocotools, whose memory grows with the outline.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from h5forge.kinds.boxes.sources import Limits, Objects, _is_int, _is_number, finite
from h5forge._samples import Reject

RLE_ALPHABET = 64  # COCO's compressed counts: characters 48 ('0') .. 111 ('o'), 5 bits and a continuation bit
RLE_GROUP_CHARS = 7  # 35 bits: more than any picture's run length needs


@dataclass(frozen=True)
class Box:
    """A box with no segmentation: its mask is the box."""

    corners: np.ndarray


@dataclass(frozen=True)
class Runs:
    """A checked RLE: run lengths (first of 0s) that cover h x w pixels in column order."""

    counts: np.ndarray


@dataclass(frozen=True)
class Polygons:
    """Checked polygons in pixels, each a flat [x1, y1, x2, y2, ...] of 3 or more vertices."""

    polygons: list[list[float]]


def instance_masks(objects: Objects, kept: np.ndarray, geometry, size: tuple[int, int], where: str, limits: Limits):
    """(n, H, W) uint8 {0, 1}: the masks of the ``kept`` objects through the picture's plan, once
    every object's segmentation is checked; one raw mask at a time is held."""
    h, w = geometry.raw
    every = [
        _plan(seg, objects.corners[i], (h, w), where, objects.names[i], limits)
        for i, seg in enumerate(objects.segments)
    ]
    plans = [every[i] for i in kept]
    outline = sum(_outline(p) for p in plans if isinstance(p, Polygons))
    if outline > limits.max_outline:
        raise Reject(
            where,
            f"the polygons have {outline:,.0f} pixels of outline, more than the field's limit of "
            f"{limits.max_outline:,} per picture (max_outline)",
        )
    out = np.zeros((len(plans), *size), np.uint8)
    for i, plan in enumerate(plans):
        out[i] = _placed(_raw_mask(plan, (h, w)), geometry)
    return out


def _plan(segmentation, corners: np.ndarray, raw: tuple[int, int], where: str, what: str, limits: Limits):
    """The checked form of one segmentation (``Box``, ``Runs`` or ``Polygons``); raises Reject."""
    if segmentation is None or segmentation == []:
        return Box(corners)
    if isinstance(segmentation, list):
        return _polygons(segmentation, raw, where, what, limits.max_vertices)
    if isinstance(segmentation, dict) and "counts" in segmentation:
        _check_size(segmentation.get("size"), raw, where, what)
        counts = segmentation["counts"]
        runs = (
            _string_counts(counts, raw, where, what)
            if isinstance(counts, (str, bytes))
            else _list_counts(counts, raw, where, what)
        )
        _check_cover(runs, raw, where, what)
        return Runs(runs)
    raise Reject(where, f"{what}: segmentation is neither polygons nor RLE ({{size, counts}})")


def _check_cover(runs: np.ndarray, raw: tuple[int, int], where: str, what: str) -> None:
    """The run lengths add up to the picture's pixels exactly: a mask from fewer would hold pixels
    no run wrote (pycocotools leaves them as the heap held them), one from more would not fit."""
    h, w = raw
    if runs.size and runs.max() > h * w:  # checked first: no sum of runs wraps around
        raise Reject(where, f"{what}: a run of the RLE is longer than its {w}x{h} (WxH) picture")
    covered = int(runs.sum())
    if covered != h * w:
        raise Reject(
            where, f"{what}: the RLE's run lengths cover {covered:,} pixels; its {w}x{h} (WxH) picture has {h * w:,}"
        )


def _check_size(size, raw: tuple[int, int], where: str, what: str) -> None:
    if not (isinstance(size, list) and len(size) == 2 and all(map(_is_int, size))):
        raise Reject(where, f"{what}: the RLE's size must be [height, width]")
    if tuple(size) != raw:
        raise Reject(where, f"{what}: segmentation is {size[1]}x{size[0]} (WxH); the picture is {raw[1]}x{raw[0]}")


def _list_counts(counts, raw: tuple[int, int], where: str, what: str) -> np.ndarray:
    """An uncompressed RLE's run lengths: integers from 0 to the picture's pixels."""
    if not isinstance(counts, list) or not all(map(_is_int, counts)):
        raise Reject(where, f"{what}: the RLE's counts must be a list of integers or a compressed string")
    if counts and min(counts) < 0:
        raise Reject(where, f"{what}: the RLE holds a negative run length")
    if counts and max(counts) > raw[0] * raw[1]:  # checked on Python's integers: none wraps around in numpy
        raise Reject(where, f"{what}: a run of the RLE is longer than its {raw[1]}x{raw[0]} (WxH) picture")
    return np.array(counts, np.int64)


def _string_counts(counts: str | bytes, raw: tuple[int, int], where: str, what: str) -> np.ndarray:
    """A compressed RLE's run lengths, decoded as pycocotools' ``rleFrString`` reads them, but
    checked: a string too long for the picture, a character outside the alphabet, a number cut
    off or a negative run rejects the picture."""
    data = counts.encode() if isinstance(counts, str) else counts
    # a number takes one character, and one more only for a difference of 16 or more pixels (each
    # run is in two differences), so an RLE of h x w pixels is shorter than 2 h w characters and
    # the first three numbers
    if len(data) > 2 * raw[0] * raw[1] + 3 * RLE_GROUP_CHARS:
        raise Reject(where, f"{what}: the RLE's counts string is longer than any RLE of its picture")
    c = np.frombuffer(data, np.uint8) - np.uint8(48)  # wraps below '0' to large values: outside the alphabet
    if c.size == 0:
        return np.zeros(0, np.int64)
    if (c >= RLE_ALPHABET).any():
        raise Reject(where, f"{what}: the RLE's counts string holds a character outside its alphabet")
    ends = np.flatnonzero((c & 0x20) == 0)  # a number ends where the continuation bit is clear
    if not ends.size or ends[-1] != c.size - 1:
        raise Reject(where, f"{what}: the RLE's counts string ends inside a number")
    starts = np.r_[0, ends[:-1] + 1]
    lengths = ends - starts + 1
    if lengths.max() > RLE_GROUP_CHARS:
        raise Reject(where, f"{what}: the RLE's counts string holds a number longer than any run")
    values = np.zeros(ends.size, np.int64)
    for k in range(int(lengths.max())):  # the k-th 5 bits of every number that has them
        has = lengths > k
        values[has] += (c[starts[has] + k] & 0x1F).astype(np.int64) << (5 * k)
    negative = (c[ends] & 0x10) != 0
    values[negative] -= np.left_shift(1, 5 * lengths[negative])
    runs = values.copy()
    runs[1::2] = np.cumsum(values[1::2])
    runs[2::2] = np.cumsum(values[2::2])
    if (runs < 0).any():
        raise Reject(where, f"{what}: the RLE holds a negative run length")
    return runs


def _polygons(segmentation: list, raw: tuple[int, int], where: str, what: str, max_vertices: int) -> Polygons:
    polygons = []
    for poly in segmentation:
        if not isinstance(poly, list) or not all(map(_is_number, poly)):
            raise Reject(where, f"{what}: a polygon must be a list of numbers [x1, y1, x2, y2, ...]")
        if len(poly) % 2:
            raise Reject(where, f"{what}: a polygon has an odd number ({len(poly)}) of coordinates")
        if len(poly) < 6:
            raise Reject(where, f"{what}: a polygon has {len(poly) // 2} vertices; it needs at least 3")
        if len(poly) // 2 > max_vertices:
            raise Reject(
                where,
                f"{what}: a polygon of {len(poly) // 2:,} vertices, more than the field's limit of "
                f"{max_vertices:,} (max_vertices)",
            )
        xy = finite(poly)
        if xy is None:
            raise Reject(where, f"{what}: a polygon coordinate is not a finite number")
        h, w = raw
        far = np.abs(xy.reshape(-1, 2) - [w / 2, h / 2]) > [1.5 * w, 1.5 * h]  # beyond a picture's size off its edge
        if far.any():
            raise Reject(where, f"{what}: a polygon vertex lies more than the picture's size outside it")
        polygons.append(xy.tolist())
    return Polygons(polygons)


def _outline(plan: Polygons) -> float:
    """Pixels along the polygons' edges as the rasteriser walks them (each edge's longer side)."""
    total = 0.0
    for poly in plan.polygons:
        xy = np.asarray(poly).reshape(-1, 2)
        step = np.abs(np.diff(xy, axis=0, append=xy[:1]))
        total += float(step.max(axis=1).sum())
    return total


def _raw_mask(plan, raw: tuple[int, int]) -> np.ndarray:
    """(h, w) uint8 {0, 1}: the object in its raw picture."""
    h, w = raw
    if isinstance(plan, Box):
        out = np.zeros((h, w), np.uint8)
        x0, y0, x1, y1 = np.clip(np.round(plan.corners), 0, [w, h, w, h]).astype(int)
        out[y0:y1, x0:x1] = 1
        return out
    if isinstance(plan, Runs):
        values = np.zeros(len(plan.counts), np.uint8)
        values[1::2] = 1
        return np.ascontiguousarray(np.repeat(values, plan.counts).reshape(w, h).T)
    from pycocotools import mask as rle

    return np.ascontiguousarray(rle.decode(rle.merge(rle.frPyObjects(plan.polygons, h, w))), np.uint8)


def _placed(mask: np.ndarray, geometry) -> np.ndarray:
    from h5forge.kinds.image import apply_geometry

    return apply_geometry(mask[..., None], geometry, 0, nearest=True)[0]
