"""The two box formats: COCO ``instances_*.json`` (one file for many pictures) and YOLO
``labels/<stem>.txt`` (one file per picture). Both give a picture's boxes as ``(n, 4)`` corners
``x0, y0, x1, y1`` in its raw pixels, ``(n,)`` class indices into the field's ``classes``, and each
box's segmentation (COCO's as given, a YOLO polygon in pixels, or None) for instance masks.

COCO: ``bbox`` is ``[x, y, width, height]``; a picture is found by the last component of its
``file_name`` and must have its ``width``/``height``; ``iscrowd`` regions are left out; categories
match by name; an image id of several entries, a category id listed under two names or an
annotation listed twice whole in one picture (lists of merged files) refuse the pictures concerned.
YOLO: each line is ``class cx cy w h``, fractions 0..1 of the picture's size (a segmentation
polygon, or an oriented box's four corners, gives its bounding box); with the field's ``kpt_shape``
(K, D), a pose line: the box followed by K keypoints of D numbers (``pose_line``). Coordinates must be finite, and a picture holds at
most ``max_objects`` objects (``Limits``). A COCO file is read by ``read_bounded`` and parsed once
per process, in discovery: each sample gets only its picture's part (``CocoIndex.part``).
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np

from h5forge.kinds.base import read_bounded
from h5forge._samples import Reject


@dataclass(frozen=True)
class Limits:
    """What one picture may ask of the memory: objects, and each polygon's vertices and outline."""

    max_bytes: int  # of a COCO file or a YOLO label file
    max_objects: int  # annotations (or label lines) of one picture
    max_vertices: int  # of one polygon
    max_outline: int  # pixels of polygon outline in one picture (the rasteriser's memory grows with it)


@dataclass(frozen=True)
class CocoIndex:
    """One COCO file, indexed by picture file name (or the part of it that one picture needs)."""

    rel: str
    images: dict[str, dict | None]  # file name -> image entry (None when two entries share the name)
    annotations: dict[int, list[dict]]  # image id -> its annotations
    categories: dict[int, str]  # category id -> name
    # what a file merged by concatenating lists holds: an image id of several entries (their file
    # names), a category id listed with several names; a picture of either is refused
    shared_ids: dict[int, tuple[str, ...]] = field(default_factory=dict)
    named_twice: dict[int, tuple[str, ...]] = field(default_factory=dict)

    def part(self, picture: str, max_objects: int) -> "CocoIndex | Reject":
        """The index of ``picture`` alone (its entry, annotations and their categories), or the
        Reject its cleaning would raise: what a worker needs of the file for that one picture."""
        try:
            entry, anns = coco_entry(self, picture)
            _count_objects(len(anns), picture, max_objects)
        except Reject as err:
            return err
        used = {_category(a.get("category_id")) for a in anns}
        return CocoIndex(
            self.rel,
            {PurePosixPath(picture).name: entry},
            {int(entry["id"]): anns},
            {c: name for c, name in self.categories.items() if c in used},
        )


# by (path, mtime, size, max_bytes, allow_outside, within): a file that cannot be taken is kept as its
# Reject, so the pictures of a broken 200 MB file do not parse it once each
_CACHE: dict[tuple[str, int, int, int, bool, str], CocoIndex | Reject] = {}
CACHED_FILES = 8  # a spec lists a few COCO files (train, val, ...); each sample looks in each
_LOCK = threading.Lock()


def coco_index(
    root: Path, rel: str, max_bytes: int, allow_outside: bool = True, within: Path | None = None
) -> CocoIndex:
    """The index of ``root/rel``, parsed once per process while the file stays the same; a relative
    ``rel`` may not lead out of ``within`` (default ``root``) through a symlink unless
    ``allow_outside``."""
    path = root / rel
    try:
        st = os.stat(path)
    except OSError as err:
        raise Reject(rel, f"cannot read the COCO file {rel}: {err.strerror or err}") from None
    base = root if within is None else within
    key = (str(path), st.st_mtime_ns, st.st_size, max_bytes, allow_outside, str(base))
    with _LOCK:
        if key not in _CACHE:
            stale = [k for k in _CACHE if k[0] == key[0]]  # the same file as it was before
            oldest = list(_CACHE)[: max(0, len(_CACHE) - CACHED_FILES + 1)]
            for k in stale or oldest:
                del _CACHE[k]
            _CACHE[key] = _index_or_reject(
                path, rel, max_bytes, None if Path(rel).is_absolute() else base, allow_outside
            )
        found = _CACHE[key]
    if isinstance(found, Reject):
        raise Reject(found.path, found.reason)
    return found


def _index_or_reject(
    path: Path, rel: str, max_bytes: int, root: Path | None, allow_outside: bool
) -> CocoIndex | Reject:
    try:
        raw = read_bounded(path, max_bytes, root, allow_outside)
    except (ValueError, OSError) as err:  # ValueError: a FIFO, device or folder, too large, a symlink out
        return Reject(rel, f"cannot read the COCO file {rel}: {getattr(err, 'strerror', None) or err}")
    try:
        return _parse(raw, rel)
    except Reject as err:
        return err


def _parse(raw: bytes, rel: str) -> CocoIndex:
    try:
        data = json.loads(raw)
        images, anns, cats = data["images"], data.get("annotations", []), data["categories"]
        names: dict[int, list[str]] = {}
        for c in cats:
            names.setdefault(int(c["id"]), []).append(str(c["name"]))
        categories = {c: listed[-1] for c, listed in names.items()}
        named_twice = {c: tuple(sorted(set(listed))) for c, listed in names.items() if len(set(listed)) > 1}
        by_name: dict[str, dict | None] = {}
        files_of: dict[int, list[str]] = {}
        for im in images:
            name = PurePosixPath(str(im["file_name"])).name
            by_name[name] = None if name in by_name else im
            if _is_int(image_id := im.get("id")):  # any other id refuses its own picture (coco_entry)
                files_of.setdefault(image_id, []).append(name)
        shared = {i: tuple(files) for i, files in files_of.items() if len(files) > 1}
        by_image: dict[int, list[dict]] = {}
        for a in anns:
            by_image.setdefault(int(a["image_id"]), []).append(a)
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as err:
        raise Reject(
            rel, f"not a COCO instances file ({type(err).__name__}: {err}): it needs images, annotations and categories"
        ) from None
    return CocoIndex(rel, by_name, by_image, categories, shared, named_twice)


@dataclass(frozen=True)
class Objects:
    """A picture's objects: corners (n, 4) in its raw pixels, class indices (n,), each one's
    segmentation (COCO's as given, a YOLO polygon in pixels, or None) and what names it in a reason."""

    corners: np.ndarray
    labels: np.ndarray
    segments: list
    names: list[str]


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _category(value) -> int | None:
    """A category id as COCO writers spell it (``3``, or ``3.0`` by some tools), or None."""
    if _is_number(value) and float(value).is_integer():
        return int(value)
    return None


def _count_objects(n: int, where: str, max_objects: int) -> None:
    if n > max_objects:
        raise Reject(where, f"{n:,} objects, more than the field's limit of {max_objects:,} per picture (max_objects)")


def coco_entry(index: CocoIndex, picture: str) -> tuple[dict, list[dict]]:
    """The image entry of ``picture`` (its path) and its annotations."""
    name = PurePosixPath(picture).name
    if name not in index.images:
        raise Reject(picture, f"no image entry with file_name {name!r} in {index.rel}")
    entry = index.images[name]
    if entry is None:
        raise Reject(picture, f"two image entries of {index.rel} have the file_name {name!r}")
    if not isinstance(entry, dict) or not _is_int(entry.get("id")):
        raise Reject(picture, f"the image entry of {name!r} in {index.rel} has no integer id")
    anns = index.annotations.get(entry["id"], [])
    if not all(isinstance(a, dict) and _is_int(a.get("id", 0)) for a in anns):
        raise Reject(picture, f"an annotation of {name!r} in {index.rel} is not an object with an integer id")
    if files := index.shared_ids.get(entry["id"]):
        raise Reject(
            picture,
            f"image id {entry['id']} is used by {len(files)} image entries of {index.rel} ({', '.join(files)}): "
            "whose objects its annotations are cannot be told",
        )
    for category in sorted({c for a in anns if (c := _category(a.get("category_id"))) in index.named_twice}):
        listed = ", ".join(map(repr, index.named_twice[category]))
        raise Reject(picture, f"category id {category} names more than one class in {index.rel}: {listed}")
    # an annotation listed twice whole is one object twice (a file merged with itself); two objects
    # an exporter numbered alike are two objects
    repeated = next((a for i, a in enumerate(anns) if "id" in a and a in anns[:i]), None)
    if repeated is not None:
        raise Reject(
            picture, f"annotation id {repeated['id']} is listed twice in {index.rel}, the same object each time"
        )
    return entry, sorted(anns, key=lambda a: a.get("id", 0))


def coco_digest(index: CocoIndex, picture: str) -> str:
    """sha256 of what the COCO file says of one picture: its entry, annotations and their categories."""
    entry, anns = coco_entry(index, picture)
    used = sorted({c for a in anns if (c := _category(a.get("category_id"))) is not None})
    record = [entry, anns, [index.categories.get(c) for c in used]]
    return hashlib.sha256(json.dumps(record, sort_keys=True, default=str).encode()).hexdigest()


def coco_boxes(index: CocoIndex, picture: str, raw: tuple[int, int], classes: tuple[str, ...], max_objects: int):
    """The objects of ``picture``, whose decoded size is ``raw`` (h, w)."""
    entry, anns = coco_entry(index, picture)
    _count_objects(len(anns), picture, max_objects)
    h, w = raw
    if (entry.get("height", h), entry.get("width", w)) != (h, w):
        raise Reject(
            picture, f"{index.rel} says the picture is {entry.get('width')}x{entry.get('height')} (WxH); it is {w}x{h}"
        )
    found: list[tuple[list[float], int, Any, str]] = []  # corners, class index, segmentation, name
    for a in anns:
        if a.get("iscrowd"):
            continue
        what = f"annotation {a.get('id')} of {index.rel}"
        category = _category(a.get("category_id"))
        name = None if category is None else index.categories.get(category)
        if name is None or name not in classes:
            raise Reject(
                picture, f"{what}: category {name or a.get('category_id')!r} is not one of the classes {list(classes)}"
            )
        bbox = a.get("bbox")
        if not isinstance(bbox, list) or len(bbox) != 4 or not all(_is_number(v) for v in bbox):
            raise Reject(picture, f"{what}: bbox must be [x, y, width, height]")
        if (xywh := finite(bbox)) is None:
            raise Reject(picture, f"{what}: a coordinate is not a finite number")
        x, y, bw, bh = xywh.tolist()
        found.append(
            (_checked([x, y, x + bw, y + bh], picture, what), classes.index(name), a.get("segmentation"), what)
        )
    return _objects(found)


def _objects(found: list[tuple[list[float], int, Any, str]]) -> Objects:
    corners, labels, segments, names = zip(*found) if found else ((), (), (), ())
    return Objects(
        np.array(corners, np.float64).reshape(-1, 4), np.array(labels, np.int64), list(segments), list(names)
    )


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def finite(values: list) -> np.ndarray | None:
    """``values`` as float64 when each is a finite number (JSON's NaN, Infinity and integers too
    large for a float are not), else None."""
    if not all(_is_number(v) for v in values):
        return None
    try:
        out = np.array([float(v) for v in values], np.float64)
    except OverflowError:
        return None
    return out if np.isfinite(out).all() else None


def yolo_boxes(
    data: bytes,
    rel: str,
    raw: tuple[int, int],
    n_classes: int,
    limits: Limits,
    kpt_shape: tuple[int, int] | None = None,
    declared: Any = None,
):
    """The objects of a YOLO label file for a picture of size ``raw`` (h, w). ``kpt_shape`` (K, D):
    the lines are pose lines, read as ``pose_line`` says. ``declared``: the kpt_shape a data.yaml of
    the dataset declares when the spec gives none; a line that is no plain box is then refused."""
    h, w = raw
    found: list[tuple[list[float], int, Any, str]] = []
    text = data.decode("utf-8", errors="replace").removeprefix("\ufeff")  # a byte-order mark (Windows editors)
    lines = [(n, line) for n, line in enumerate(text.splitlines(), 1) if line.split()]
    _count_objects(len(lines), rel, limits.max_objects)
    for number, line in lines:
        parts = line.split()
        try:
            cls, values = int(parts[0]), [float(v) for v in parts[1:]]
        except ValueError:
            raise Reject(
                rel, f"line {number}: expected a class index and numbers, found {line.strip()[:80]!r}"
            ) from None
        if not 0 <= cls < n_classes:
            raise Reject(rel, f"line {number}: class {cls} is not a class index 0..{n_classes - 1}")
        if not np.isfinite(values).all():
            raise Reject(rel, f"line {number}: a coordinate is not a finite number")
        if kpt_shape is not None:
            box, segment = pose_line(values, rel, number, kpt_shape), None
        else:
            box, segment = _box_or_polygon(values, rel, number, limits, declared)
        corners = _checked([box[0] * w, box[1] * h, box[2] * w, box[3] * h], rel, f"line {number}")
        found.append((corners, cls, _in_pixels(segment, h, w), f"line {number}"))
    return _objects(found)


def _box_or_polygon(
    values: list[float], rel: str, number: int, limits: Limits, declared: Any
) -> tuple[list[float], list[float] | None]:
    """The box of a line ``cx cy w h`` or a polygon ``x1 y1 x2 y2 ...`` (its bounding box; an
    oriented box's four corners give the box around them), in fractions, and the polygon or None."""
    if len(values) == 4:
        cx, cy, bw, bh = values
        if bw < 0 or bh < 0:
            raise Reject(rel, f"line {number}: negative width or height")
        _check_fractions(values, rel, number)
        return [cx - bw / 2, cy - bh / 2, cx + bw / 2, cy + bh / 2], None
    if declared is not None:  # Ultralytics reads such a line by the dataset's kpt_shape
        raise Reject(
            rel,
            f"line {number}: {len(values)} numbers, and data.yaml declares kpt_shape {declared}: a pose line "
            f"(class cx cy w h and keypoints), no polygon; set the field's kpt_shape: {declared}",
        )
    if len(values) < 6 or len(values) % 2:
        raise Reject(
            rel,
            f"line {number}: expected class cx cy w h (or a polygon), found {len(values)} numbers "
            "(pose labels: set the field's kpt_shape)",
        )
    if len(values) // 2 > limits.max_vertices:
        raise Reject(
            rel,
            f"line {number}: a polygon of {len(values) // 2:,} vertices, more than the field's limit of "
            f"{limits.max_vertices:,} (max_vertices)",
        )
    _check_fractions(values, rel, number)
    xs, ys = values[0::2], values[1::2]
    return [min(xs), min(ys), max(xs), max(ys)], values


def pose_line(values: list[float], rel: str, number: int, kpt_shape: tuple[int, int]) -> list[float]:
    """The box of a pose line ``cx cy w h`` followed by K keypoints of D numbers (``x y`` or
    ``x y visibility``), as fractions: its first four numbers. The count must be 4 + K*D; each x and
    y is a fraction, a visibility no negative number (Ultralytics refuses both otherwise)."""
    k, d = kpt_shape
    if len(values) != 4 + k * d:
        raise Reject(
            rel,
            f"line {number}: {len(values)} numbers; a pose line of kpt_shape [{k}, {d}] holds {4 + k * d}: "
            f"class cx cy w h and {k} keypoints of {d} numbers",
        )
    cx, cy, bw, bh = values[:4]
    if bw < 0 or bh < 0:
        raise Reject(rel, f"line {number}: negative width or height")
    points = np.array(values[4:]).reshape(k, d)
    _check_fractions([*values[:4], *points[:, :2].ravel().tolist()], rel, number)
    if d == 3 and (points[:, 2] < 0).any():
        first = int(np.argmax(points[:, 2] < 0))
        raise Reject(rel, f"line {number}: keypoint {first + 1} has the visibility {points[first, 2]:g}, below 0")
    return [cx - bw / 2, cy - bh / 2, cx + bw / 2, cy + bh / 2]


def _in_pixels(polygon: list[float] | None, h: int, w: int) -> Any:
    """A polygon of fractions as a COCO segmentation in the picture's pixels, or None."""
    if polygon is None:
        return None
    return [[v * (w if k % 2 == 0 else h) for k, v in enumerate(polygon)]]


def _check_fractions(values: list[float], rel: str, number: int) -> None:
    """YOLO's numbers are fractions of the picture's width or height: one outside 0..1 is a label
    written in pixels (or for another picture), whose boxes would be clipped or dropped into
    something no one drew; Ultralytics' loader refuses such a file too."""
    outside = next((v for v in values if not 0 <= v <= 1), None)
    if outside is not None:
        raise Reject(
            rel,
            f"line {number}: {outside:g} is no fraction of the picture's size (YOLO coordinates lie in 0..1; "
            "a label in pixels?)",
        )


def _checked(box: list[float], where: str, what: str) -> list[float]:
    if not np.isfinite(box).all():
        raise Reject(where, f"{what}: a coordinate is not a finite number")
    if box[2] < box[0] or box[3] < box[1]:
        raise Reject(where, f"{what}: negative width or height")
    return box
