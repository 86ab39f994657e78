"""Ultralytics' dataset conventions: its split folders (``labels/train/`` beside ``images/train/``)
and its ``data.yaml``, which says what the label files do not: the class ``names`` and, for pose
labels, ``kpt_shape: [K, D]`` (each line's box followed by K keypoints of D numbers). Ultralytics
reads every label line by the ``kpt_shape`` its dataset declares, so ``init`` writes it into the
spec, and a build refuses lines a declared ``kpt_shape`` makes pose lines when the spec does not
say so.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import yaml

from h5forge._format.names import SPLIT_FOLDER_NAMES as SPLIT_FOLDERS  # Ultralytics' images/train/, labels/train/
from h5forge.kinds.base import read_bounded

DATA_YAML = "data.yaml"
SMALL_FILE = 1 << 20  # a data.yaml names classes and folders: a larger one is no such file
KEYPOINT_NUMBERS = (2, 3)  # x y, or x y visibility


def split_folder_names() -> tuple[str, ...]:
    """Each split folder name as folders spell it: ``train``, ``Train``, ``TRAIN``."""
    return tuple(dict.fromkeys(v for name in SPLIT_FOLDERS for v in (name, name.capitalize(), name.upper())))


def parse(text: str | None) -> dict:
    """The mapping a data.yaml's text holds; empty when it is no YAML mapping."""
    try:
        data = yaml.safe_load(text) if text is not None else None
    except yaml.YAMLError:
        return {}
    return data if isinstance(data, dict) else {}


def kpt_shape_of(data: dict) -> tuple[int, int] | None:
    """``kpt_shape`` as (K, D) when it is one Ultralytics can read: K >= 1 keypoints of 2 or 3 numbers."""
    value = data.get("kpt_shape")
    if not isinstance(value, (list, tuple)) or len(value) != 2:
        return None
    k, d = value
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (k, d)):
        return None
    return (k, d) if k >= 1 and d in KEYPOINT_NUMBERS else None


# by (path, mtime, size): each worker reads a data.yaml once while it stays the same
_CACHE: dict[tuple[str, int, int], Any] = {}
_LOCK = threading.Lock()


def declared_kpt_shape(root: Path, files: tuple[str, ...], allow_outside: bool) -> Any:
    """The ``kpt_shape`` the first of the data.yaml ``files`` (relative to ``root``) that declares one
    gives, as written; None when none does. A file that cannot be read declares nothing."""
    for rel in files:
        path = root / rel
        try:
            st = os.stat(path)
        except OSError:
            continue
        key = (str(path), st.st_mtime_ns, st.st_size)
        with _LOCK:
            if key not in _CACHE:
                for old in [k for k in _CACHE if k[0] == key[0]]:
                    del _CACHE[old]
                _CACHE[key] = _read_kpt_shape(path, root, allow_outside)
            value = _CACHE[key]
        if value is not None:
            return value
    return None


def _read_kpt_shape(path: Path, root: Path, allow_outside: bool) -> Any:
    try:
        text = read_bounded(path, SMALL_FILE, root, allow_outside).decode("utf-8", errors="replace")
    except (OSError, ValueError):
        return None
    return parse(text).get("kpt_shape")
