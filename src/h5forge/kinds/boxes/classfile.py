"""A YOLO folder's ``classes.txt``: one class name a line, a label line's class number being the
name's position. Exporters write one at the top, in ``labels/`` or in each split folder's labels
(``labels/val/classes.txt``), and two of them may list the classes in other orders: the numbers of a
label file are then those of the ``classes.txt`` nearest above it in its source folder (an
inbox batch's own, for the label files it came with). A number it names otherwise than
the field's ``classes`` would be stored as another class, so the picture is refused with both names
(``check``). ``init`` reads the names the same way (``names``).
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import threading
from pathlib import Path

import numpy as np

from h5forge.kinds.base import read_bounded
from h5forge._samples import Reject

CLASSES_TXT = "classes.txt"
SMALL_FILE = 1 << 20  # names of classes: a larger file is no such list


def names(text: str) -> dict[int, str]:
    """The names a classes.txt's text gives, by index: a blank line names no class but keeps its
    place; a byte-order mark and the spaces around a name are no part of it."""
    lines = [line.strip() for line in text.removeprefix("\ufeff").splitlines()]
    return {i: name for i, name in enumerate(lines) if name}


# by (path, mtime, size, symlink rule): a classes.txt is read once per worker while it stays the same
_CACHE: dict[tuple[str, int, int, str, bool], tuple[dict[int, str], str] | str] = {}
_LOCK = threading.Lock()


def nearest(root: Path, label: str, globs: tuple[str, ...]) -> tuple[str, Path] | None:
    """The classes.txt nearest above the label file ``label`` (relative to ``root``), matched by one
    of the field's ``globs``: in its folder, then each folder up to the top of its source folder
    (for an appended file, ``../inbox/processed/vNNNN/``, the inbox it was judged in, never the
    folders above it), and the folder it may not lead out of through a symlink; or None."""
    parts = label.split("/")
    top = 0
    for glob in globs:
        pattern = glob.split("/")
        if len(pattern) <= len(parts) and all(map(fnmatch.fnmatchcase, parts[-len(pattern) :], pattern)):
            top = len(parts) - len(pattern)
            break
    within = root / "/".join(parts[:top]) if ".." in parts[:top] else root
    for depth in range(len(parts) - 1, top - 1, -1):
        rel = "/".join([*parts[:depth], CLASSES_TXT])
        if os.path.lexists(root / rel):
            return rel, within
    return None


def read(root: Path, rel: str, within: Path, allow_outside: bool) -> tuple[dict[int, str], str]:
    """The names of ``root/rel`` and the sha256 of its bytes; a Reject of the file when it cannot be
    read as a classes.txt is (a regular file of at most 1 MiB, no symlink out of ``within``)."""
    path = root / rel
    try:
        st = os.stat(path)
        key: tuple[str, int, int, str, bool] | None = (
            str(path),
            st.st_mtime_ns,
            st.st_size,
            str(within),
            allow_outside,
        )
    except OSError:
        key = None
    with _LOCK:
        found = _CACHE.get(key) if key is not None else None
    if found is None:
        try:
            data = read_bounded(path, SMALL_FILE, within, allow_outside)
            found = (names(data.decode("utf-8", errors="replace")), hashlib.sha256(data).hexdigest())
        except (OSError, ValueError) as err:
            why = getattr(err, "strerror", None) or err
            found = f"cannot read {rel}, which names the classes of its label files: {why}"
        if key is not None:
            with _LOCK:
                for old in [k for k in _CACHE if k[0] == key[0]]:
                    del _CACHE[old]
                _CACHE[key] = found
    if isinstance(found, str):
        raise Reject(rel, found)
    return found


def check(listed: dict[int, str], rel: str, labels: np.ndarray, classes: tuple[str, ...], where: str) -> None:
    """Refuse the label file ``where`` when ``rel``, the classes.txt its numbers come from, names one
    of its ``labels`` otherwise than the field's ``classes``: the box would be stored as a class its
    file does not say."""
    for number in sorted(set(labels.tolist())):
        name = listed.get(number)
        if name is not None and name != classes[number]:
            raise Reject(
                where,
                f"class {number} is {name!r} in {rel} but {classes[number]!r} in the field's classes: its boxes "
                f"would be stored as another class (make the classes.txt files of the dataset list the same classes)",
            )
