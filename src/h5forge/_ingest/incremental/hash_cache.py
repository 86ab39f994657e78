"""The raw-file hash cache of an output folder: each raw file's state (size, mtime, ctime, inode)
and sha256 as the last build saw them, so that a rebuild hashes only the files whose state changed.

It lives beside the versions (``.h5forge-hashes.npz``), never inside one: losing it costs one full
hashing pass. Any write to a file changes its ctime, which no tool can set back, so a file in the
same state holds the same bytes, with one exception handled here: a file changed again within
the same timestamp tick as the change its state shows would look unchanged, so a file whose last
change was less than ``RACY_SECONDS`` before its state was taken is not trusted (git's "racy
clean" rule). Case folders (DICOM series) are always hashed: a folder's own state does not follow
its files' contents.
"""

from __future__ import annotations

import os
import stat
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

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
    """Known raw-file hashes by path relative to ``root``: row i of ``states`` is the state of
    ``paths[i]`` when it was hashed, characters 64 i to 64 i + 64 of ``digits`` its sha256."""

    root: str = ""
    paths: list[str] = field(default_factory=list)
    states: np.ndarray = field(default_factory=lambda: np.zeros((0, 4), np.int64))
    digits: str = ""

    def known(self, states: dict[str, State]) -> dict[str, str]:
        """The sha256 of each file of ``states`` that is in the state the cache recorded."""
        if not self.paths or not states:
            return {}
        rows = dict(zip(self.paths, range(len(self.paths))))
        rels = list(states)
        at = np.fromiter((rows.get(rel, -1) for rel in rels), np.int64, len(rels))
        same = (at >= 0) & (self.states[at] == _table(list(states.values()))).all(axis=1)
        d = self.digits
        return {rels[i]: d[64 * r : 64 * r + 64] for i, r in zip(np.flatnonzero(same).tolist(), at[same].tolist())}


def _table(states: list[State]) -> np.ndarray:
    """States as rows of int64. A value beyond int64 (a time set centuries ahead, a 64-bit inode)
    is taken modulo 2**64: two states that differ still differ."""
    try:
        return np.fromiter((v for st in states for v in st), np.int64, 4 * len(states)).reshape(len(states), 4)
    except OverflowError:
        wrapped = [[v & 0xFFFF_FFFF_FFFF_FFFF for v in st] for st in states]
        return np.array(wrapped, np.uint64).reshape(len(states), 4).view(np.int64)


# Arrays, not JSON: every rebuild reads and writes the whole cache however little changed, and a first
# build's checkpoints write it several times; arrays skip a Python object per value.
# Paths are joined by NUL, the one byte no path holds; undecodable bytes round-trip (surrogateescape).
def load(out: Path, root: Path) -> HashCache:
    """The output folder's cache for raw files under ``root`` (empty when missing, unreadable or
    made for another source folder)."""
    try:
        with np.load(Path(out) / HASH_CACHE, allow_pickle=False) as saved:
            if str(saved["root"]) != str(root):
                return HashCache(str(root))
            joined = saved["paths"].tobytes().decode("utf-8", "surrogateescape")
            paths = joined.split("\0") if joined else []
            states, hexes = saved["states"], saved["hexes"].astype("S64")
    except (OSError, ValueError, KeyError, TypeError, UnicodeDecodeError, EOFError, zipfile.BadZipFile):
        return HashCache(str(root))  # no cache: hash all
    digits = hexes.tobytes()
    if (
        states.dtype != np.int64
        or states.shape != (len(paths), 4)
        or hexes.shape != (len(paths),)
        or digits.translate(None, b"0123456789abcdef")  # a digest of 64 hex digits each
    ):
        return HashCache(str(root))
    return HashCache(str(root), paths, states, digits.decode("ascii"))


def save(out: Path, root: Path, states: dict[str, State], hexes: dict[str, str], stated_at_ns: int) -> int:
    """Record the hashes of the files whose state was taken before they were read; returns how
    many were recorded. Written whole and moved into place: a reader never sees half of it."""
    settled = stated_at_ns - int(RACY_SECONDS * 1e9)
    kept = [(rel, state, h) for rel, state in states.items() if (h := hexes.get(rel)) and state[2] < settled]
    path = Path(out) / HASH_CACHE
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb") as f:
            np.savez(
                f,
                root=np.array(str(root)),
                paths=np.frombuffer("\0".join(rel for rel, _, _ in kept).encode("utf-8", "surrogateescape"), np.uint8),
                states=_table([state for _, state, _ in kept]),
                hexes=np.array([h for _, _, h in kept], "S64"),
            )
        os.replace(tmp, path)
        path.with_suffix(".json").unlink(missing_ok=True)  # the cache's earlier form, which this replaces
    except OSError:  # a cache: the next build hashes everything instead
        tmp.unlink(missing_ok=True)
        return 0
    return len(kept)


def known_digests(out: Path, root: Path, states: dict[str, State]) -> dict[str, str]:
    """The sha256 of each file whose state (as discovery took it) is the one the cache recorded."""
    return load(out, root).known(states)
