"""Which raw files verify may read, when the paths come from the file it checks.

A version records its sources as paths relative to the spec's source root, and the spec itself is
stored in the file: both are data, and a tampered (or careless) file may point anywhere. Verify
reads a source only when it resolves (symlinks followed) below the recorded source root or the
inbox, is a regular file (a folder of regular files for kinds that read folders), and is no larger
than a bound. Anything else is reported and left unread.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Iterable

MAX_SOURCE_BYTES = 1 << 30  # a raw file (or folder) verify reads again at most
MAX_FOLDER_FILES = 10_000  # files of one folder source (a DICOM series) verify looks at


def _inside(real: str, roots: list[str]) -> bool:
    return any(real == r or real.startswith(r.rstrip(os.sep) + os.sep) for r in roots)


def source_problem(
    roots: Iterable[Path], rel: str, *, folders: bool = False, max_bytes: int = MAX_SOURCE_BYTES
) -> str | None:
    """Why the source ``rel`` (relative to the first root) must not be read, or None when it may.
    A source that does not exist is no problem here: reading it rejects the sample as usual."""
    real_roots = [os.path.realpath(r) for r in roots]
    real = os.path.realpath(os.path.join(real_roots[0], rel))
    if not _inside(real, real_roots):
        return "is outside the source root"
    try:
        st = os.stat(real)
    except OSError:
        return None
    if stat.S_ISDIR(st.st_mode) and folders:
        return _folder_problem(real, real_roots, max_bytes)
    if not stat.S_ISREG(st.st_mode):
        return "is not a regular file"
    if st.st_size > max_bytes:
        return f"is larger than the {max_bytes} bytes verify reads"
    return None


def _folder_problem(folder: str, roots: list[str], max_bytes: int) -> str | None:
    total, seen = 0, 0
    for dirpath, dirnames, filenames in os.walk(folder):
        for name in [*filenames, *dirnames]:
            path = os.path.join(dirpath, name)
            if not _inside(os.path.realpath(path), roots):
                return f"holds {os.path.relpath(path, folder)!r}, which is outside the source root"
        for name in filenames:
            st = os.stat(os.path.join(dirpath, name))
            if not stat.S_ISREG(st.st_mode):
                return f"holds {name!r}, which is not a regular file"
            total += st.st_size
            seen += 1
            if total > max_bytes or seen > MAX_FOLDER_FILES:
                return f"holds more than the {max_bytes} bytes or {MAX_FOLDER_FILES} files verify reads"
    return None
