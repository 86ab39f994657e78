"""The raw-file hash cache of an output folder: each raw file's state (size, mtime, ctime, inode)
and sha256 as the last build saw them, so that a rebuild hashes only the files whose state changed.

It lives beside the versions (``.h5forge-hashes.json``), never inside one: losing it costs one full
hashing pass. Any write to a file changes its ctime, which no tool can set back, so a file in the
same state holds the same bytes, with one exception handled here: a file changed again within
the same timestamp tick as the change its state shows would look unchanged, so a file whose last
change was less than ``RACY_SECONDS`` before its state was taken is not trusted (git's "racy
clean" rule). Case folders (DICOM series) are always hashed: a folder's own state does not follow
its files' contents.
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

from h5forge._format.names import HASH_CACHE

RACY_SECONDS = 2.0
State = tuple[int, int, int, int]  # size, mtime_ns, ctime_ns, inode


def state_of(path: str) -> State | None:
    """The state of a regular file, or None (missing, a folder, a device...)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode):
        return None
    return st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino


@dataclass
class HashCache:
    """Known raw-file hashes by path relative to ``root``."""

    root: str = ""
    entries: dict[str, tuple[State, str]] = field(default_factory=dict)

    def hex_for(self, rel: str, state: State | None) -> str | None:
        """The file's sha256 when it is in the state the cache recorded."""
        known = self.entries.get(rel)
        return known[1] if known is not None and state is not None and known[0] == state else None


def load(out: Path, root: Path) -> HashCache:
    """The output folder's cache for raw files under ``root`` (empty when missing, unreadable or
    made for another source folder)."""
    try:
        data = json.loads((Path(out) / HASH_CACHE).read_text())
        if data.get("root") != str(root):
            return HashCache(str(root))
        return HashCache(
            str(root),
            {rel: (tuple(v[:4]), v[4]) for rel, v in data["files"].items() if len(v) == 5 and isinstance(v[4], str)},
        )
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError):  # no cache: hash all
        return HashCache(str(root))


def save(out: Path, root: Path, states: dict[str, State], hexes: dict[str, str], stated_at_ns: int) -> int:
    """Record the hashes of the files whose state was taken before they were read; returns how
    many were recorded. Written whole and moved into place: a reader never sees half of it."""
    settled = stated_at_ns - int(RACY_SECONDS * 1e9)
    files = {rel: [*state, hexes[rel]] for rel, state in states.items() if hexes.get(rel) and state[2] < settled}
    path = Path(out) / HASH_CACHE
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(json.dumps({"root": str(root), "files": files}))
        os.replace(tmp, path)
    except OSError:  # a cache: the next build hashes everything instead
        tmp.unlink(missing_ok=True)
        return 0
    return len(files)


def known_digests(out: Path, root: Path, states: dict[str, State]) -> dict[str, str]:
    """The sha256 of each file whose state (as discovery took it) is the one the cache recorded."""
    cache = load(out, root)
    return {rel: h for rel, st in states.items() if (h := cache.hex_for(rel, st)) is not None}
