"""The raw-file hash cache of an output folder: each raw file's state (size, mtime, ctime, inode)
and sha256 as the last build saw them, so that a rebuild hashes only the files whose state changed.

It lives beside the versions (``.h5forge-hashes.npz``), never inside one: losing it costs one full
hashing pass. Any write to a file changes its ctime, which no tool can set back, so a file in the
same state holds the same bytes, with one exception handled here: a file changed again within
the same timestamp tick as the change its state shows would look unchanged, so a file whose last
change was less than ``RACY_SECONDS`` before its state was taken is not trusted (git's "racy
clean" rule). Case folders (DICOM series) are always hashed: a folder's own state does not follow
its files' contents.

A build writes the cache whole when it ends. While it runs, each checkpoint appends the hashes it
learnt since the last one to a log beside it (``.h5forge-hashes.log``): appending costs what was
learnt, where writing the whole cache costs all of it, so a killed build's successor hashes again
only the files read after its last checkpoint. The log is read with the cache, its entries over
the cache's, and removed once the cache is written whole; a torn or damaged block ends it.
"""

from __future__ import annotations

import os
import stat
import struct
import zipfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

import numpy as np

from h5forge._format.names import HASH_CACHE, HASH_LOG

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
    made for another source folder), with its log's entries after its own."""
    base = _load_whole(out, root)
    logged = _read_log(Path(out) / HASH_LOG, root)
    if not logged:
        return base
    paths, states, digits = zip(*logged)
    return HashCache(
        str(root),
        base.paths + [p for part in paths for p in part],
        np.concatenate([base.states, *states]),
        base.digits + "".join(digits),
    )


def _load_whole(out: Path, root: Path) -> HashCache:
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
        path.with_name(HASH_LOG).unlink(missing_ok=True)  # every entry it held is in the cache now
    except OSError:  # a cache: the next build hashes everything instead
        tmp.unlink(missing_ok=True)
        return 0
    return len(kept)


_LOG_MAGIC = b"h5forge hash log 1\n"
_BLOCK = struct.Struct("<4sII")  # b"HASH", entries, bytes of their paths joined by NUL; then states,
# 64 hex digits each, and the CRC-32 of the block up to it


def append(
    out: Path, root: Path, states: dict[str, State], hexes: dict[str, str], stated_at_ns: int, rels: list[str]
) -> int:
    """Record the hashes of ``rels`` (among ``states`` and ``hexes``, as ``save`` would) at the end of
    the output folder's log, in one block; returns how many were recorded."""
    settled = stated_at_ns - int(RACY_SECONDS * 1e9)
    kept = [(rel, st, h) for rel in rels if (st := states.get(rel)) and (h := hexes.get(rel)) and st[2] < settled]
    if not kept:
        return 0
    paths = "\0".join(rel for rel, _, _ in kept).encode("utf-8", "surrogateescape")
    body = (
        _BLOCK.pack(b"HASH", len(kept), len(paths))
        + paths
        + _table([st for _, st, _ in kept]).astype("<i8").tobytes()
        + "".join(h for _, _, h in kept).encode("ascii")
    )
    head = _log_head(root)
    path = Path(out) / HASH_LOG
    try:
        with open(path, "a+b") as f:  # every write goes to the end
            f.seek(0)
            if f.read(len(head)) != head:  # new, or another source folder's: started again
                f.truncate(0)
                f.write(head)
            else:  # after the last whole block: a block torn by a kill would hide the ones after it
                f.truncate(_end_of_blocks(f, len(head)))
            f.write(body + struct.pack("<I", zlib.crc32(body)))
    except OSError:  # a cache: the next build hashes these files again instead
        return 0
    return len(kept)


def _log_head(root: Path) -> bytes:
    """What a log for raw files under ``root`` starts with: its format, then the root."""
    named = str(root).encode("utf-8", "surrogateescape")
    return _LOG_MAGIC + struct.pack("<I", len(named)) + named


def _block_end(at: int, n: int, nbytes: int) -> int:
    """Where the block at ``at`` of ``n`` entries, their paths ``nbytes``, ends, before its CRC-32."""
    return at + _BLOCK.size + nbytes + 32 * n + 64 * n


def _end_of_blocks(f: BinaryIO, at: int) -> int:
    """Where the log's last block that is all there ends (its blocks' heads read, not their bodies)."""
    size = f.seek(0, os.SEEK_END)
    while at + _BLOCK.size <= size:
        f.seek(at)
        tag, n, nbytes = _BLOCK.unpack(f.read(_BLOCK.size))
        end = _block_end(at, n, nbytes) + 4
        if tag != b"HASH" or end > size:
            break
        at = end
    return at


def _read_log(path: Path, root: Path) -> list[tuple[list[str], np.ndarray, str]]:
    """The log's blocks for ``root``, in order, up to the first torn or damaged one."""
    try:
        data = path.read_bytes()
    except OSError:
        return []
    head = _log_head(root)
    if not data.startswith(head):
        return []
    blocks, at = [], len(head)
    while at + _BLOCK.size <= len(data):
        tag, n, nbytes = _BLOCK.unpack_from(data, at)
        end = _block_end(at, n, nbytes)
        if tag != b"HASH" or end + 4 > len(data) or zlib.crc32(data[at:end]) != struct.unpack_from("<I", data, end)[0]:
            break
        paths = data[at + _BLOCK.size : at + _BLOCK.size + nbytes].decode("utf-8", "surrogateescape").split("\0")
        states = np.frombuffer(data, "<i8", 4 * n, at + _BLOCK.size + nbytes).reshape(n, 4).astype(np.int64)
        digits = data[end - 64 * n : end]
        if len(paths) != n or digits.translate(None, b"0123456789abcdef"):
            break
        blocks.append((paths, states, digits.decode("ascii")))
        at = end + 4
    return blocks


def known_digests(out: Path, root: Path, states: dict[str, State]) -> dict[str, str]:
    """The sha256 of each file whose state (as discovery took it) is the one the cache recorded."""
    return load(out, root).known(states)
