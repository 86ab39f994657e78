"""COCO files in an inbox: found whatever they are called, and split by picture, so each picture's
entry travels with it (to ``processed/``, to ``quarantine/``) and the entries of pictures still
waiting stay in the inbox.

A COCO file of the inbox is a JSON object with ``images`` and ``categories`` lists where the spec's
COCO files lie, or at the top of the inbox. A subset keeps what it holds exactly as written, so a
picture's entry digest is the same before and after the move.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path, PurePosixPath
from typing import Any

from h5forge._format.names import INBOX_MANAGED
from h5forge.kinds.base import DEFAULT_MAX_BYTES

LOADED_FILES = 4  # an inbox holds a few COCO files, each read many times while an append sorts its pictures
_LOADED: dict[str, tuple[tuple[int, int], dict | None]] = {}  # path -> ((mtime_ns, size), its COCO object)


def _load(path: Path, max_bytes: int = DEFAULT_MAX_BYTES) -> dict | None:
    """The COCO object of ``path``, or None when it is not one (or not a regular file of at most
    ``max_bytes``, the field's limit, read without following a symlink); parsed once while it stays
    the same."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode) or st.st_size > max_bytes:
        return None
    state = (st.st_mtime_ns, st.st_size)
    cached = _LOADED.get(str(path))
    if cached is not None and cached[0] == state:
        return cached[1]
    try:
        data = json.loads(path.read_bytes())
    except (OSError, ValueError, RecursionError):
        data = None
    coco = isinstance(data, dict) and isinstance(data.get("images"), list) and isinstance(data.get("categories"), list)
    if len(_LOADED) >= LOADED_FILES:
        del _LOADED[next(iter(_LOADED))]
    _LOADED[str(path)] = (state, data if coco else None)
    return data if coco else None


def coco_files_in(inbox: Path, named: tuple[str, ...], max_bytes: int = DEFAULT_MAX_BYTES) -> tuple[str, ...]:
    """The COCO files of ``inbox``: those at the paths ``named`` first, then any other in their
    folders or at the top of the inbox, sorted; hidden and temporary names are not read."""
    folders = dict.fromkeys([*(PurePosixPath(rel).parent for rel in named), PurePosixPath(".")])
    found = [rel for rel in named if _load(inbox / rel, max_bytes) is not None]
    for folder in folders:
        if folder.parts and folder.parts[0] in INBOX_MANAGED:
            continue
        for path in sorted((inbox / folder).glob("*.json")):
            rel = path.relative_to(inbox).as_posix()
            if path.name.startswith(".") or rel in found:
                continue
            if _load(path, max_bytes) is not None:
                found.append(rel)
    return tuple(found)


def coco_subset(
    root: Path, shared: tuple[str, ...], names: set[str], complement: bool = False, max_bytes: int = DEFAULT_MAX_BYTES
) -> str | None:
    """One COCO file of the pictures named ``names`` (file names; ``complement``: every other
    picture) as the files ``shared`` describe them, or None when none of them is there. The first
    file that lists a picture gives its entry; image and annotation ids are kept unless two files
    use the same one, which the later file's pictures then get renumbered past."""
    images: list[dict] = []
    annotations: list[dict] = []
    categories: dict[Any, dict] = {}
    taken: set[str] = set()
    image_ids: set[Any] = set()
    ann_ids: set[Any] = set()
    for rel in shared:
        data = _load(root / rel, max_bytes)
        if data is None:
            continue
        chosen = {}
        for im in data["images"]:
            name = PurePosixPath(str(im.get("file_name"))).name
            if (name in names) != complement and name not in taken:
                chosen[im.get("id")] = im
                taken.add(name)
        if not chosen:
            continue
        renumber = bool(image_ids & set(chosen))
        own = [a for a in data.get("annotations", []) if isinstance(a, dict) and a.get("image_id") in chosen]
        renumber = renumber or bool(ann_ids & {a.get("id") for a in own})
        cats = {c.get("id"): c for c in data["categories"] if isinstance(c, dict)}
        renumber = renumber or any(categories.get(k, c) != c for k, c in cats.items())
        if renumber:
            chosen, own, cats = _renumbered(chosen, own, cats, image_ids, ann_ids, categories)
        images.extend(chosen.values())
        annotations.extend(own)
        image_ids.update(chosen)
        ann_ids.update(a.get("id") for a in own)
        categories.update(cats)
    if not images:
        return None
    return json.dumps({"images": images, "annotations": annotations, "categories": list(categories.values())}, indent=1)


def _renumbered(chosen, own, cats, image_ids, ann_ids, categories):
    """The pictures of a second COCO file with ids past those already taken from the first."""
    next_image = max([i for i in image_ids if isinstance(i, int)], default=0) + 1
    next_ann = max([i for i in ann_ids if isinstance(i, int)], default=0) + 1
    next_cat = max([i for i in categories if isinstance(i, int)], default=0) + 1
    by_name = {c.get("name"): k for k, c in categories.items()}
    cat_map = {}
    for k, c in cats.items():
        if categories.get(k) == c:
            cat_map[k] = k
        elif c.get("name") in by_name:
            cat_map[k] = by_name[c.get("name")]
        else:
            cat_map[k], next_cat = next_cat, next_cat + 1
    image_map = {old: next_image + k for k, old in enumerate(chosen)}
    new_images = {image_map[k]: {**im, "id": image_map[k]} for k, im in chosen.items()}
    new_anns = [
        {
            **a,
            "id": next_ann + k,
            "image_id": image_map[a["image_id"]],
            "category_id": cat_map.get(a.get("category_id")),
        }
        for k, a in enumerate(own)
    ]
    new_cats = {cat_map[k]: {**c, "id": cat_map[k]} for k, c in cats.items() if cat_map[k] not in categories}
    return new_images, new_anns, new_cats
