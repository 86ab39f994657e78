"""Rows of a fixed-size field read as whole chunks and decompressed in process.

With one sample per chunk a row is a chunk: its stored bytes are read (from the mapped file, or
``read_direct_chunk``) and decoded here, skipping HDF5's per-call machinery. With several samples
per chunk a row is decoded alone where the writer joined the rows' own chunks
(``chunk_codec.row_at``); a chunk HDF5 compressed whole is decoded whole and the last few are
kept, as the chunk-aware sampler asks for its rows close together. The codecs handled are
``none`` and hdf5plugin's LZ4 filter (``chunk_codec``); anything else (another pipeline, a chunk
never written, a framing that does not add up, virtual or contiguous storage, a non-native byte
order) is read by h5py, so the result is always exactly what h5py returns.
"""

from __future__ import annotations

import ctypes
import mmap
import os
from collections import OrderedDict
from typing import Literal

import h5py
import numpy as np

from h5forge.errors import ReadError
from h5forge._format.chunk_codec import LZ4_FILTER, joined, lz4_at, row_at
from h5forge._format.mapped import identity_of, opened_identity
from h5forge._format.chunk_codec import lz4_into as _lz4_into  # the framing, shared with the writer's encoder


class DirectRows:
    """``DirectRows.of(dataset)`` is None unless the dataset is chunked whole rows per chunk, with
    no filter or only the LZ4 filter, and one row per chunk unless ``cache_chunks`` (the decoded
    chunks kept) is at least one; then ``read_into(row, out)`` fills ``out`` (one row)."""

    def __init__(self, d: h5py.Dataset, codec: str, cache_rows: int = 0, cache_chunks: int = 0):
        self.d, self.codec = d, codec
        self.shape, self.dtype = tuple(d.shape[1:]), d.dtype
        self.nbytes = int(np.prod(d.shape[1:], dtype=np.int64)) * d.dtype.itemsize
        self.tail = (0,) * (len(d.shape) - 1)
        self.chunk_rows = int(d.chunks[0])
        self._index: _ChunkIndex | None | Literal[False] = None  # made on the first read in this process
        # decompressed rows kept for a next read (a 2.5-D stack's neighbours); none needs none: its
        # rows are copied straight from the map
        self.cache = _RowCache(cache_rows) if cache_rows > 0 and codec != "none" else None
        self.chunks = _RowCache(max(1, cache_chunks)) if self.chunk_rows > 1 else None  # decoded, by chunk

    @classmethod
    def of(cls, d: h5py.Dataset, cache_rows: int = 0, cache_chunks: int = 0) -> "DirectRows | None":
        codec = row_chunk_codec(d, {(): "none", (LZ4_FILTER,): "lz4"})
        if codec is None or (d.chunks[0] != 1 and cache_chunks < 1):
            return None
        return cls(d, codec, cache_rows, cache_chunks)

    def read_into(self, row: int, out: np.ndarray) -> None:
        """Row ``row`` into ``out`` (an array of one row, the dataset's dtype)."""
        if self.chunks is not None:
            chunk, at = divmod(row, self.chunk_rows)
            index = self._chunk_index()
            if not (index and out.flags.c_contiguous and index.read_row(chunk, at, out, self.codec)):
                out[...] = self._chunk(chunk)[at]
            return
        if not out.flags.c_contiguous:
            return self._by_h5py(row, out)
        flat = out.reshape(-1).view(np.uint8)
        index = self._chunk_index()
        if index and index.read(row, flat, self.codec):
            return
        try:
            if self.codec == "none":
                self.d.id.read_direct_chunk((row, *self.tail), out=flat)
                return
            mask, chunk = self.d.id.read_direct_chunk((row, *self.tail))
        except (OSError, ValueError, RuntimeError, KeyError):  # e.g. a chunk never written (fill value)
            return self._by_h5py(row, out)
        if not decode_chunk(chunk, flat, self.codec, mask):
            self._by_h5py(row, out)

    def _chunk_index(self) -> "_ChunkIndex | Literal[False]":
        """The file's chunk index, made on the first read in this process (False: not for the map)."""
        if self._index is None:
            self._index = _ChunkIndex.of(self.d) or False
        return self._index

    def read_rows(self, rows: np.ndarray, target: np.ndarray, positions: np.ndarray) -> None:
        """Each of ``rows`` into ``target[positions[k]]``."""
        for row, pos in zip(rows.tolist(), positions.tolist()):
            self.read_into(row, target[pos])

    def _chunk(self, c: int) -> np.ndarray:
        """Chunk ``c`` decoded, (chunk_rows, *shape): from the kept ones, or decoded and kept."""
        assert self.chunks is not None
        kept = self.chunks.get(c)
        if kept is not None:
            return kept
        index = self._chunk_index()
        kept = np.empty((self.chunk_rows, *self.shape), self.dtype)
        if not (index and index.read(c, kept.reshape(-1).view(np.uint8), self.codec)):
            start = c * self.chunk_rows
            stop = min(start + self.chunk_rows, self.d.shape[0])
            try:
                self.d.read_direct(kept, np.s_[start:stop], np.s_[: stop - start])
            except OSError as err:  # a damaged chunk
                raise unreadable(self.d, f"rows {start}:{stop}", err) from None
        self.chunks.put(c, kept)
        return kept

    def element(self, row: int) -> np.ndarray:
        """A new array of row ``row`` (what ``read_list([row])[0]`` holds)."""
        index = self._index
        if index and self.cache is None and self.chunks is None and self.nbytes:
            out = np.empty(self.shape, self.dtype)
            if index.read_at(row, _address(out), self.nbytes, self.codec):
                return out
        return self.read_list([row])[0]

    def read_list(self, rows: list[int]) -> np.ndarray:
        """A new array of ``len(rows)`` rows, row ``rows[k]`` at k: per row an index look-up and the
        copy or decompression itself (a row asked for twice is read once, a cached one copied)."""
        index = self._chunk_index()
        nb, codec, cache = self.nbytes, self.codec, self.cache
        flat = np.empty(len(rows) * nb, np.uint8)
        target = flat.view(self.dtype).reshape(len(rows), *self.shape)
        if not index or self.chunks is not None:
            for k, row in enumerate(rows):
                self.read_into(row, target[k])
            return target
        addr = _address(flat) if nb else 0
        seen: dict[int, int] = {}
        for k, row in enumerate(rows):
            at = k * nb
            dest = flat[at : at + nb]
            if row in seen:  # a neighbour repeated at a case's first or last slice, or asked twice
                before = seen[row] * nb
                dest[:] = flat[before : before + nb]
                continue
            seen[row] = k
            if cache is not None:
                kept = cache.get(row)
                if kept is not None:
                    dest[:] = kept
                    continue
            if not index.read_at(row, addr + at, nb, codec):
                self.read_into(row, target[k])
            if cache is not None:
                cache.put(row, dest.copy())
        return target

    def _by_h5py(self, row: int, out: np.ndarray) -> None:
        try:
            self.d.read_direct(out, np.s_[row], np.s_[...])
        except OSError as err:  # a damaged chunk
            raise unreadable(self.d, f"row {row}", err) from None

    def row(self, row: int) -> np.ndarray:
        out = np.empty(self.d.shape[1:], self.d.dtype)
        self.read_into(row, out)
        return out


def unreadable(d: h5py.Dataset, rows: str, err: BaseException) -> ReadError:
    """The error for rows h5py failed to read (a damaged chunk): h5py's own names neither the file
    nor the rows."""
    return ReadError(f"{d.file.filename}: {d.name} {rows} cannot be read ({err})")


def row_chunk_codec(d: h5py.Dataset, codecs: dict[tuple[int, ...], str]) -> str | None:
    """The codec ``codecs`` names for the filter pipeline of ``d`` when it is chunked whole rows per
    chunk and holds native, plain numbers; else None."""
    dcpl = d.id.get_create_plist()
    if (
        dcpl.get_layout() != h5py.h5d.CHUNKED
        or d.chunks is None
        or tuple(d.chunks[1:]) != tuple(d.shape[1:])
        or not d.dtype.isnative
        or d.dtype.hasobject
        or len(d.shape) < 2
    ):
        return None
    return codecs.get(tuple(dcpl.get_filter(k)[0] for k in range(dcpl.get_nfilters())))


def reads_rows_alone(d: h5py.Dataset) -> bool:
    """Whether ``DirectRows`` reads a row of ``d`` without decoding the rest of its chunk: one row
    per chunk, rows stored unfiltered, or LZ4 chunks the writer joined from the rows' own (judged
    by the first and the middle whole chunk)."""
    direct = DirectRows.of(d, cache_chunks=1)
    if direct is None:
        return False
    rows = direct.chunk_rows
    if rows == 1 or direct.codec == "none":
        return True
    whole = d.shape[0] // rows
    for c in sorted({0, whole // 2}) if whole else ():
        try:
            mask, chunk = d.id.read_direct_chunk((c * rows, *direct.tail))
        except (OSError, ValueError, RuntimeError, KeyError):  # never written
            continue
        if not mask & 1 and joined(chunk, rows, direct.nbytes):
            return True
    return False


class _ChunkIndex:
    """Where each chunk lies in the file (``chunk_places``) and the file mapped read-only, so a chunk
    is a slice of the map with no HDF5 call (a published version never changes). Built only when a
    chunk read through the map equals HDF5's own ``read_direct_chunk`` of it."""

    def __init__(self, offsets: np.ndarray, sizes: np.ndarray, masks: np.ndarray, view: memoryview, rows: int = 1):
        self.offsets, self.sizes, self.masks, self.view, self.rows = offsets, sizes, masks, view, rows
        self.base = np.frombuffer(view, np.uint8).ctypes.data  # the map's address: rows are copied from it

    @classmethod
    def of(cls, d: h5py.Dataset) -> "_ChunkIndex | None":
        rows = int(d.chunks[0]) if d.chunks else 1
        try:
            offsets, sizes, masks = chunk_places(d, rows)
            with open(d.file.filename, "rb") as fh:
                # the file HDF5 has open, not another put at its path since (the same name again)
                if os.fstat(fh.fileno()).st_size == 0 or identity_of(fh.fileno()) != opened_identity(d.file):
                    return None
                view = memoryview(mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ))
        except (OSError, ValueError, RuntimeError, AttributeError):  # no chunk iteration, driver without a file
            return None
        written = np.flatnonzero(offsets >= 0)
        if written.size == 0 or (offsets[written] + sizes[written]).max() > len(view):
            return None
        first = int(written[0])
        mask, chunk = d.id.read_direct_chunk((first * rows, *(0,) * (len(d.shape) - 1)))
        o, z = int(offsets[first]), int(sizes[first])
        if mask != masks[first] or view[o : o + z] != chunk:
            return None
        return cls(offsets, sizes, masks, view, rows)

    def place(self, row: int) -> tuple[int, int, int] | None:
        """Where chunk ``row`` (the row's, with one row per chunk) is stored: (byte offset in the
        file, size, filter mask); None when the chunk was never written."""
        o = int(self.offsets[row])
        if o < 0:
            return None
        return o, int(self.sizes[row]), int(self.masks[row])

    def read(self, row: int, flat: np.ndarray, codec: str) -> bool:
        """Chunk ``row`` decoded into ``flat``; False when it is not for the map (never written, or
        a framing the caller should hand to HDF5)."""
        o = int(self.offsets[row])
        # no copy: lz4_into decompresses from the map
        return o >= 0 and decode_chunk(self.view[o : o + int(self.sizes[row])], flat, codec, int(self.masks[row]))

    def read_row(self, chunk: int, at: int, out: np.ndarray, codec: str) -> bool:
        """Row ``at`` of chunk ``chunk`` into ``out`` (one row, C-contiguous) without decoding the
        chunk's other rows; False as ``chunk_codec.row_at`` says (the caller decodes the chunk)."""
        o = self.offsets.item(chunk)
        if o < 0 or not out.nbytes:
            return False
        z, codec = self.sizes.item(chunk), "none" if self.masks.item(chunk) & 1 else codec
        return row_at(codec, self.view[o : o + z], self.base + o, _address(out), out.nbytes, at, self.rows)

    def read_at(self, row: int, addr: int, n: int, codec: str) -> bool:
        """``read`` into the ``n`` bytes of one row at address ``addr``; False also when no LZ4
        library could be loaded (the caller's ``read_into`` then decompresses with the package)."""
        o = self.offsets.item(row)
        if o < 0:
            return False
        z = self.sizes.item(row)
        if codec == "none" or self.masks.item(row) & 1:
            if z != n:
                return False
            ctypes.memmove(addr, self.base + o, n)
            return True
        return lz4_at(self.view[o : o + z], self.base + o, addr, n)


def chunk_places(d: h5py.Dataset, rows: int = 1) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(byte offset, -1 where never written; stored size; filter mask) of each chunk of ``d`` by
    chunk number, ``rows`` rows a chunk, from one pass over HDF5's chunk index."""
    n = -(-d.shape[0] // rows)
    offsets, sizes, masks = np.full(n, -1, np.int64), np.zeros(n, np.int64), np.zeros(n, np.uint32)

    def visit(info) -> None:
        c = info.chunk_offset[0] // rows
        offsets[c], sizes[c], masks[c] = info.byte_offset, info.size, info.filter_mask

    d.id.chunk_iter(visit)
    return offsets, sizes, masks


def decode_chunk(chunk: bytes | memoryview, flat: np.ndarray, codec: str, mask: int) -> bool:
    """A stored chunk into ``flat`` (its plain bytes): copied when ``codec`` is none or the writer
    stored it unfiltered (bit 0 of ``mask``), else LZ4-decoded; False when it does not add up."""
    if codec == "none" or mask & 1:
        if len(chunk) != flat.size:
            return False
        flat[:] = np.frombuffer(chunk, np.uint8)
        return True
    return _lz4_into(chunk, flat)


class _RowCache:
    """The last ``size`` rows (or chunks) decompressed, least recently used out first."""

    def __init__(self, size: int):
        self.size = size
        self.rows: OrderedDict[int, np.ndarray] = OrderedDict()

    def get(self, row: int) -> np.ndarray | None:
        kept = self.rows.get(row)
        if kept is not None:
            self.rows.move_to_end(row)
        return kept

    def put(self, row: int, plain: np.ndarray) -> None:
        self.rows[row] = plain
        if len(self.rows) > self.size:
            self.rows.popitem(last=False)

    def __len__(self) -> int:
        return len(self.rows)


def _address(a: np.ndarray) -> int:
    """The address of a writable, C-contiguous, non-empty array's first byte (a fifth of the cost
    of ``a.ctypes.data``)."""
    return ctypes.addressof(ctypes.c_char.from_buffer(a))  # type: ignore[arg-type]  # an ndarray is a buffer


def chunk_index(d: h5py.Dataset) -> _ChunkIndex | None:
    """Where each row's stored chunk of ``d`` lies in its file (``place(row)``), so a chunk's bytes
    can be read with no HDF5 call (a rebuild copies unchanged rows' chunks this way). None when
    HDF5 cannot list the chunks or the file's bytes there disagree with HDF5's own read of one."""
    return _ChunkIndex.of(d)
