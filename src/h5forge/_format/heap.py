"""The global heap of a version file, checked before HDF5 reads it.

HDF5 keeps every variable-length string (ids, source paths, string columns, most attributes) in
global heap collections, which carry no checksum. The library walks a collection's objects by their
stored sizes: a damaged size sends that walk past the collection's end into other bytes, or round
for ever (an object of size 0), so one flipped bit there makes a read of any string in it fail with
an unrelated message or never return. ``damage`` walks every collection of a file first, as HDF5
does but within bounds, and names what is wrong.

A collection lies outside every dataset's stored data, so the search for collections skips the
contiguous datasets and the chunks HDF5's chunk indexes list where they are large (``_stored``): a
version of large pictures is read for its metadata and strings, a few MB; the small chunks of small
pictures are searched with the rest, a pass over their bytes. ``verify`` and a build walk the files
they read before HDF5 reads a string of them.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import struct
from functools import lru_cache
from pathlib import Path
from typing import Callable

import h5py
import numpy as np

from h5forge._format.row_files import listed_row_files

SIGNATURE = b"GCOL\x01\x00\x00\x00"  # a collection starts so: signature, version 1, three reserved bytes
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
    stored = _stored(path, size)
    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as m:
        for at in _signatures(m, _gaps(stored, len(m))):
            problem = _collection_problem(m, at)
            if problem:
                return f"its global heap collection at byte {at} {problem} (the file is damaged)"
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


# a listed chunk costs a Python call of HDF5's chunk iteration, microseconds, where searching a byte
# costs a fraction of a nanosecond: the chunks of a dataset whose chunks are smaller are searched
LISTED_CHUNK_BYTES = 32 << 10


def _stored(path: str, size: int) -> list[tuple[int, int]]:
    """(start, end) of the bytes each dataset's stored data takes (its chunks, where they average
    ``LISTED_CHUNK_BYTES`` or more, or its contiguous block), in order; none when HDF5 cannot list
    them, or two overlap, or one ends past the file (a damaged index: then every byte is searched).
    Listing them reads HDF5's metadata, no string."""
    starts: list[int] = []
    ends: list[int] = []

    def chunk(info) -> None:
        starts.append(info.byte_offset)
        ends.append(info.byte_offset + info.size)

    def visit(_: str, obj: object) -> None:
        if not isinstance(obj, h5py.Dataset) or obj.is_virtual:
            return
        if obj.chunks is not None:
            n = obj.id.get_num_chunks()
            if n and obj.id.get_storage_size() >= n * LISTED_CHUNK_BYTES:
                obj.id.chunk_iter(chunk)
        elif (offset := obj.id.get_offset()) is not None:
            starts.append(offset)
            ends.append(offset + obj.id.get_storage_size())

    try:
        with h5py.File(path, "r") as f:
            f.visititems(visit)
    except Exception:  # noqa: BLE001 - whatever HDF5 cannot list is searched byte by byte
        return []
    order = np.argsort(starts, kind="stable")
    s, e = np.asarray(starts, np.int64)[order], np.asarray(ends, np.int64)[order]
    if len(s) and (s[0] < 0 or e.max() > size or (s[1:] < e[:-1]).any()):
        return []
    return list(zip(s.tolist(), e.tolist()))


def _gaps(stored: list[tuple[int, int]], size: int) -> list[tuple[int, int]]:
    """(start, end) of the bytes between the ``stored`` ranges, up to ``size``."""
    gaps, at = [], 0
    for start, end in stored:
        if start > at:
            gaps.append((at, start))
        at = max(at, end)
    return gaps + [(at, size)] if at < size else gaps


def _signatures(m: mmap.mmap, spans: list[tuple[int, int]]) -> list[int]:
    """The offset of every collection signature that starts within the (start, end) ``spans`` of ``m``."""
    found: list[int] = []
    n = len(SIGNATURE)
    if MEMMEM is None:
        for start, end in spans:
            at = m.find(SIGNATURE, start, end + n - 1)
            while 0 <= at < end:
                found.append(at)
                at = m.find(SIGNATURE, at + n, end + n - 1)
        return found
    view = np.frombuffer(m, np.uint8)
    try:
        base = view.ctypes.data
        for start, end in spans:
            at, stop = start, min(end + n - 1, len(m))
            while at < end and (hit := MEMMEM(base + at, stop - at, SIGNATURE, n)):
                found.append(hit - base)
                at = hit - base + n
    finally:
        del view  # the mapping closes only once nothing holds its buffer
    return found


def _collection_problem(m: mmap.mmap, at: int) -> str | None:
    if at + HEADER > len(m):
        return "is cut short"
    (size,) = struct.unpack_from("<Q", m, at + 8)
    if not MIN_SIZE <= size <= len(m) - at:
        return f"gives its size as {size} bytes, which does not fit in the file"
    end, p = at + size, at + HEADER
    while end - p >= HEADER:  # less than a header left over is free space, as HDF5 reads it
        index, _, _, object_size = struct.unpack_from("<HHIQ", m, p)
        # an object takes its header and its size rounded up to 8; the free space (index 0) its size
        need = HEADER + (object_size + 7) // 8 * 8 if index else object_size
        if not HEADER <= need <= end - p:
            return f"holds an object at byte {p} of {object_size} bytes, which does not fit in it"
        p += need
    return None
