"""The global heap of a version file, checked before HDF5 reads it.

HDF5 keeps every variable-length string (ids, source paths, string columns, most attributes) in
global heap collections, which carry no checksum. The library walks a collection's objects by their
stored sizes: a damaged size sends that walk past the collection's end into other bytes, or round
for ever (an object of size 0), so one flipped bit there makes a read of any string in it fail with
an unrelated message or never return. ``damage`` walks every collection of a file first, as HDF5
does but within bounds, and names what is wrong.

The walk trusts nothing in the file but the bytes it searches: it finds every collection by its
signature in one pass over the whole file, never by where HDF5's metadata says data lies (a
damaged or crafted address could point HDF5's own listing, and so the walk, away from a damaged
collection, or make that listing loop). ``verify`` and a build walk the files they read before
HDF5 reads a string of them.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import struct
from functools import lru_cache
from pathlib import Path
from typing import Callable, Iterator

import h5py
import numpy as np

from h5forge._format.row_files import listed_row_files

# a collection starts so: signature and version 1, then three reserved bytes HDF5 does not check
SIGNATURE = b"GCOL\x01"
RESERVED = b"\x00\x00\x00"  # as HDF5 writes them
# a collection's header read as an object's: no object's reads so, as its reserved bytes are 0
COLLECTION_AS_OBJECT = struct.unpack("<HHI", SIGNATURE + RESERVED)
MIN_SIZE = 4096  # HDF5 makes no smaller collection
HEADER = 16  # a collection's header, and an object's: index (u16), references (u16), reserved (4), size (u64)


def damage(path: str | Path) -> str | None:
    """What is wrong with the global heap of the file at ``path``, or None when every collection
    holds together. A file is walked once per process while its size and times stay the same."""
    real = os.path.realpath(path)
    st = os.stat(real)
    return _damage(real, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def version_damage(path: str | Path) -> str | None:
    """``damage`` of a version file, then of each row file it reads from (named in what it says)."""
    problem = damage(path)
    if problem:
        return problem
    with h5py.File(os.path.realpath(path), "r") as f:
        listed = listed_row_files(f) or []
    folder = Path(os.path.realpath(path)).parent
    for row_file in listed:
        problem = damage(folder / row_file["file"])
        if problem:
            return f"{row_file['file']}, which it reads from: {problem}"
    return None


@lru_cache(maxsize=256)
def _damage(path: str, _inode: int, size: int, _mtime: int, _ctime: int) -> str | None:
    if size == 0:
        return None
    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as m:
        walked = (0, 0)  # the start and end of the last collection walked
        for at in _signatures(m):
            if at < walked[1] and _in_an_object(m, walked[0], at):
                continue  # a string that spells a signature
            problem, end = _collection_problem(m, at)
            if problem:
                return f"its global heap collection at byte {at} {problem} (the file is damaged)"
            if end > at:
                walked = (at, end)
    return None


def _memmem() -> Callable | None:
    try:
        found = ctypes.CDLL(None).memmem  # the C library is among this process's own symbols
    except (AttributeError, OSError, TypeError):
        return None
    found.restype = ctypes.c_void_p
    found.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_size_t]
    return found


MEMMEM = _memmem()  # the C library's search: a few times faster than mmap.find over a large file


def _signatures(m: mmap.mmap) -> list[int]:
    """The offset of every collection signature in ``m``."""
    found: list[int] = []
    if MEMMEM is None:
        at = m.find(SIGNATURE)
        while at >= 0:
            found.append(at)
            at = m.find(SIGNATURE, at + len(SIGNATURE))
        return found
    view = np.frombuffer(m, np.uint8)
    try:
        base, at = view.ctypes.data, 0
        while hit := MEMMEM(base + at, len(m) - at, SIGNATURE, len(SIGNATURE)):
            found.append(hit - base)
            at = hit - base + len(SIGNATURE)
    finally:
        del view  # the mapping closes only once nothing holds its buffer
    return found


def _objects(m: mmap.mmap, at: int, end: int) -> Iterator[tuple[int, int, int]]:
    """(start, bytes taken, index) of each object of the collection at ``at`` ending at ``end``, as
    HDF5 walks them; ``bytes taken`` is 0 for one that does not fit and -1 for another collection's
    header, and the walk stops there."""
    p = at + HEADER
    while end - p >= HEADER:  # less than a header left over is free space, as HDF5 reads it
        index, references, reserved, object_size = struct.unpack_from("<HHIQ", m, p)
        if (index, references, reserved) == COLLECTION_AS_OBJECT:
            yield p, -1, index
            return
        # an object takes its header and its size rounded up to 8; the free space (index 0) its size
        need = HEADER + (object_size + 7) // 8 * 8 if index else object_size
        if not HEADER <= need <= end - p:
            yield p, 0, index
            return
        yield p, need, index
        p += need


def _in_an_object(m: mmap.mmap, at: int, hit: int) -> bool:
    """Whether ``hit`` lies in the bytes of an object (not the free space) of the collection at ``at``."""
    (size,) = struct.unpack_from("<Q", m, at + 8)
    for p, need, index in _objects(m, at, at + size):
        if p > hit or need <= 0:
            return False
        if index and p + HEADER <= hit < p + need:
            return True
    return False


def _collection_problem(m: mmap.mmap, at: int) -> tuple[str | None, int]:
    """What is wrong with the collection whose signature is at ``at``, and where it ends (``at``
    when the signature starts no collection)."""
    # five bytes can recur by chance in a large file's data: only a signature with HDF5's reserved
    # bytes is a collection whatever its size, another one when its size fits
    written = m[at + 5 : at + 8] == RESERVED
    if at + HEADER > len(m):
        return ("is cut short" if written else None), at
    (size,) = struct.unpack_from("<Q", m, at + 8)
    if not MIN_SIZE <= size <= len(m) - at:
        return (f"gives its size as {size} bytes, which does not fit in the file" if written else None), at
    for p, need, _ in _objects(m, at, at + size):
        if need < 0:
            return f"runs into the collection at byte {p}", at + size
        if need == 0:
            (object_size,) = struct.unpack_from("<Q", m, p + 8)
            return f"holds an object at byte {p} of {object_size} bytes, which does not fit in it", at + size
    return None, at + size
