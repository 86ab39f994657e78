"""The two box formats: COCO ``instances_*.json`` (one file for many pictures) and YOLO
``labels/<stem>.txt`` (one file per picture). Both give a picture's boxes as ``(n, 4)`` corners
``x0, y0, x1, y1`` in its raw pixels, ``(n,)`` class indices into the field's ``classes``, and each
box's segmentation (COCO's as given, a YOLO polygon in pixels, or None) for instance masks.

COCO: ``bbox`` is ``[x, y, width, height]`` in pixels; a picture is found by its ``file_name``
(the last path component: pictures in several folders may share an annotation file), and its
``width``/``height`` must be the picture's; ``iscrowd`` regions are not objects and are left out;
a category is matched by its name. YOLO: each line is ``class cx cy w h`` relative to the
picture's width and height (``class x1 y1 x2 y2 ...``, a polygon of YOLO segmentation labels,
gives its bounding box); an empty file is a picture without objects.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import numpy as np

from h5forge.samples import Reject


@dataclass(frozen=True)
class CocoIndex:
    """One COCO file, indexed by picture file name."""

    rel: str
    images: dict[str, dict | None]  # file name -> image entry (None when two entries share the name)
    annotations: dict[int, list[dict]]  # image id -> its annotations
    categories: dict[int, str]  # category id -> name


_CACHE: dict[tuple[str, int, int], CocoIndex] = {}
CACHED_FILES = 8  # a spec lists a few COCO files (train, val, ...); each sample looks in each
_LOCK = threading.Lock()


def coco_index(root: Path, rel: str) -> CocoIndex:
    """The index of ``root/rel``, parsed once per process while the file stays the same."""
    path = root / rel
    try:
        st = os.stat(path)
    except OSError as err:
        raise Reject(rel, f"cannot read the COCO file {rel}: {err.strerror or err}") from None
    key = (str(path), st.st_mtime_ns, st.st_size)
    with _LOCK:
        if key not in _CACHE:
            stale = [k for k in _CACHE if k[0] == key[0]]  # the same file as it was before
            oldest = list(_CACHE)[: max(0, len(_CACHE) - CACHED_FILES + 1)]
            for k in stale or oldest:
                del _CACHE[k]
            _CACHE[key] = _parse(path, rel)
        return _CACHE[key]


def _parse(path: Path, rel: str) -> CocoIndex:
    try:
        data = json.loads(path.read_bytes())
        images, anns, cats = data["images"], data.get("annotations", []), data["categories"]
        categories = {int(c["id"]): str(c["name"]) for c in cats}
        by_name: dict[str, dict | None] = {}
        for im in images:
            name = PurePosixPath(str(im["file_name"])).name
            by_name[name] = None if name in by_name else im
        by_image: dict[int, list[dict]] = {}
        for a in anns:
            by_image.setdefault(int(a["image_id"]), []).append(a)
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise Reject(
            rel, f"not a COCO instances file ({type(err).__name__}: {err}): it needs images, annotations and categories"
        ) from None
    return CocoIndex(rel, by_name, by_image, categories)


def coco_entry(index: CocoIndex, picture: str) -> tuple[dict, list[dict]]:
    """The image entry of ``picture`` (its path) and its annotations."""
    name = PurePosixPath(picture).name
    if name not in index.images:
        raise Reject(picture, f"no image entry with file_name {name!r} in {index.rel}")
    entry = index.images[name]
    if entry is None:
        raise Reject(picture, f"two image entries of {index.rel} have the file_name {name!r}")
    return entry, sorted(index.annotations.get(int(entry["id"]), []), key=lambda a: a.get("id", 0))


def coco_digest(index: CocoIndex, picture: str) -> str:
    """sha256 of what the COCO file says of one picture: its entry, annotations and their categories."""
    entry, anns = coco_entry(index, picture)
    used = sorted({int(a.get("category_id", -1)) for a in anns})
    record = [entry, anns, [index.categories.get(c) for c in used]]
    return hashlib.sha256(json.dumps(record, sort_keys=True, default=str).encode()).hexdigest()


def coco_boxes(index: CocoIndex, picture: str, raw: tuple[int, int], classes: tuple[str, ...]):
    """(corners (n, 4), class indices (n,), segmentations) of ``picture``, whose decoded size is ``raw`` (h, w)."""
    entry, anns = coco_entry(index, picture)
    h, w = raw
    if (int(entry.get("height", h)), int(entry.get("width", w))) != (h, w):
        raise Reject(
            picture, f"{index.rel} says the picture is {entry.get('width')}x{entry.get('height')} (WxH); it is {w}x{h}"
        )
    corners: list[list[float]] = []
    labels: list[int] = []
    segments: list[list[list[float]] | None] = []
    for a in anns:
        if a.get("iscrowd"):
            continue
        name = index.categories.get(int(a.get("category_id", -1)))
        if name is None or name not in classes:
            raise Reject(
                picture,
                f"annotation {a.get('id')} of {index.rel}: category "
                f"{name or a.get('category_id')!r} is not one of the classes {list(classes)}",
            )
        try:
            x, y, bw, bh = (float(v) for v in a["bbox"])
        except (KeyError, TypeError, ValueError):
            raise Reject(
                picture, f"annotation {a.get('id')} of {index.rel}: bbox must be [x, y, width, height]"
            ) from None
        corners.append(_checked([x, y, x + bw, y + bh], picture, f"annotation {a.get('id')} of {index.rel}"))
        labels.append(classes.index(name))
        segments.append(a.get("segmentation"))
    return np.array(corners, np.float64).reshape(-1, 4), np.array(labels, np.int64), segments


def yolo_boxes(data: bytes, rel: str, raw: tuple[int, int], n_classes: int):
    """(corners (n, 4), class indices (n,), polygons) of a YOLO label file for a picture of size ``raw`` (h, w)."""
    h, w = raw
    corners: list[list[float]] = []
    labels: list[int] = []
    segments: list[list[list[float]] | None] = []
    for number, line in enumerate(data.decode("utf-8", errors="replace").splitlines(), 1):
        parts = line.split()
        if not parts:
            continue
        try:
            cls, values = int(parts[0]), [float(v) for v in parts[1:]]
        except ValueError:
            raise Reject(rel, f"line {number}: expected a class index and numbers, found {line.strip()!r}") from None
        if not 0 <= cls < n_classes:
            raise Reject(rel, f"line {number}: class {cls} is not a class index 0..{n_classes - 1}")
        if len(values) == 4:
            cx, cy, bw, bh = values
            box = [cx - bw / 2, cy - bh / 2, cx + bw / 2, cy + bh / 2]
            if bw < 0 or bh < 0:
                raise Reject(rel, f"line {number}: negative width or height")
            segments.append(None)
        elif len(values) >= 6 and len(values) % 2 == 0:
            xs, ys = values[0::2], values[1::2]
            box = [min(xs), min(ys), max(xs), max(ys)]
            segments.append([[v * (w if k % 2 == 0 else h) for k, v in enumerate(values)]])
        else:
            raise Reject(rel, f"line {number}: expected class cx cy w h (or a polygon), found {len(values)} numbers")
        corners.append(_checked([box[0] * w, box[1] * h, box[2] * w, box[3] * h], rel, f"line {number}"))
        labels.append(cls)
    return np.array(corners, np.float64).reshape(-1, 4), np.array(labels, np.int64), segments


def _checked(box: list[float], where: str, what: str) -> list[float]:
    if not np.isfinite(box).all():
        raise Reject(where, f"{what}: a coordinate is not a finite number")
    if box[2] < box[0] or box[3] < box[1]:
        raise Reject(where, f"{what}: negative width or height")
    return box
