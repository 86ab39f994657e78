"""Rows of a one-sample-per-chunk field read as whole chunks and decompressed in process.

With one sample per chunk a row is a chunk, so the reader can fetch the chunk's stored bytes
(``read_direct_chunk``) and undo the codec itself, skipping HDF5's per-call machinery (dataspace
selection, chunk cache, the filter pipeline and its buffer allocations). Two codecs are handled:
``none`` (the bytes are the row; they are read straight into their place in the batch) and
hdf5plugin's LZ4 filter (32004), whose chunk framing is a big-endian 8-byte original size and
4-byte block size, then per block a 4-byte compressed size and an LZ4 block (a block whose
compressed size equals its plain size is stored as is). Anything else — another codec or
pipeline, a chunk the writer stored unfiltered (filter mask), a chunk never written, a framing
that does not add up, virtual or contiguous storage, a non-native byte order — is read by h5py,
so the result is always exactly what h5py returns.
"""

from __future__ import annotations

import mmap
import os
from typing import Literal

import h5py
import numpy as np

from h5forge.format.chunk_codec import LZ4_FILTER
from h5forge.format.chunk_codec import lz4_into as _lz4_into  # the framing, shared with the writer's encoder


class DirectRows:
    """``DirectRows.of(dataset)`` is None unless the dataset is chunked one row per chunk, with no
    filter or only the LZ4 filter; then ``read_into(row, out)`` fills ``out`` (one row, C order)."""

    def __init__(self, d: h5py.Dataset, codec: str):
        self.d, self.codec = d, codec
        self.nbytes = int(np.prod(d.shape[1:], dtype=np.int64)) * d.dtype.itemsize
        self.tail = (0,) * (len(d.shape) - 1)
        self._index: _ChunkIndex | None | Literal[False] = None  # made on the first read in this process

    @classmethod
    def of(cls, d: h5py.Dataset) -> "DirectRows | None":
        dcpl = d.id.get_create_plist()
        if (
            dcpl.get_layout() != h5py.h5d.CHUNKED
            or d.chunks is None
            or d.chunks[1:] != d.shape[1:]
            or d.chunks[0] != 1
            or not d.dtype.isnative
            or d.dtype.hasobject
            or len(d.shape) < 2
        ):
            return None
        filters = [dcpl.get_filter(k)[0] for k in range(dcpl.get_nfilters())]
        if not filters:
            return cls(d, "none")
        if filters == [LZ4_FILTER]:
            return cls(d, "lz4")
        return None

    def read_into(self, row: int, out: np.ndarray) -> None:
        """Row ``row`` into ``out`` (a C-contiguous array of one row, the dataset's dtype)."""
        if not out.flags.c_contiguous:
            return self._by_h5py(row, out)
        flat = out.reshape(-1).view(np.uint8)
        if self._index is None:
            self._index = _ChunkIndex.of(self.d) or False
        if self._index and self._index.read(row, flat, self.codec):
            return
        try:
            if self.codec == "none":
                self.d.id.read_direct_chunk((row, *self.tail), out=flat)
                return
            mask, chunk = self.d.id.read_direct_chunk((row, *self.tail))
        except (OSError, ValueError, RuntimeError, KeyError):  # e.g. a chunk never written (fill value)
            return self._by_h5py(row, out)
        if mask & 1:  # the writer stored this chunk without the filter
            if len(chunk) != self.nbytes:
                return self._by_h5py(row, out)
            flat[:] = np.frombuffer(chunk, np.uint8)
        elif not _lz4_into(chunk, flat):
            self._by_h5py(row, out)

    def read_rows(self, rows: np.ndarray, target: np.ndarray, positions: np.ndarray) -> None:
        """Each of ``rows`` into ``target[positions[k]]``."""
        for row, pos in zip(rows.tolist(), positions.tolist()):
            self.read_into(row, target[pos])

    def _by_h5py(self, row: int, out: np.ndarray) -> None:
        self.d.read_direct(out, np.s_[row], np.s_[...])

    def row(self, row: int) -> np.ndarray:
        out = np.empty(self.d.shape[1:], self.d.dtype)
        self.read_into(row, out)
        return out


class _ChunkIndex:
    """Where each row's chunk lies in the file (byte offset, stored size, filter mask: one pass over
    HDF5's chunk index) and the file mapped read-only, so a row is a slice of the map with no HDF5
    call at all. A published version never changes, so the addresses hold for the reader's life.
    Built only when a chunk read through the map equals HDF5's own ``read_direct_chunk`` of it."""

    def __init__(self, offsets: np.ndarray, sizes: np.ndarray, masks: np.ndarray, view: memoryview):
        self.offsets, self.sizes, self.masks, self.view = offsets, sizes, masks, view

    @classmethod
    def of(cls, d: h5py.Dataset) -> "_ChunkIndex | None":
        n = d.shape[0]
        offsets, sizes, masks = np.full(n, -1, np.int64), np.zeros(n, np.int64), np.zeros(n, np.uint32)

        def visit(info) -> None:
            row = info.chunk_offset[0]
            offsets[row], sizes[row], masks[row] = info.byte_offset, info.size, info.filter_mask

        try:
            d.id.chunk_iter(visit)
            with open(d.file.filename, "rb") as fh:
                if os.fstat(fh.fileno()).st_size == 0:
                    return None
                view = memoryview(mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ))
        except (OSError, ValueError, RuntimeError, AttributeError):  # no chunk iteration, driver without a file
            return None
        written = np.flatnonzero(offsets >= 0)
        if written.size == 0 or (offsets[written] + sizes[written]).max() > len(view):
            return None
        first = int(written[0])
        mask, chunk = d.id.read_direct_chunk((first, *(0,) * (len(d.shape) - 1)))
        o, z = int(offsets[first]), int(sizes[first])
        if mask != masks[first] or view[o : o + z] != chunk:
            return None
        return cls(offsets, sizes, masks, view)

    def place(self, row: int) -> tuple[int, int, int] | None:
        """Where row ``row``'s chunk is stored: (byte offset in the file, size, filter mask); None
        when the chunk was never written."""
        o = int(self.offsets[row])
        if o < 0:
            return None
        return o, int(self.sizes[row]), int(self.masks[row])

    def read(self, row: int, flat: np.ndarray, codec: str) -> bool:
        """Row ``row`` into ``flat``; False when this row is not for the map (never written, or a
        framing the caller should hand to HDF5)."""
        o = int(self.offsets[row])
        if o < 0:
            return False
        chunk = self.view[o : o + int(self.sizes[row])]  # no copy: lz4_into decompresses from the map
        if codec == "none" or self.masks[row] & 1:
            if len(chunk) != flat.size:
                return False
            flat[:] = np.frombuffer(chunk, np.uint8)
            return True
        return _lz4_into(chunk, flat)


def chunk_index(d: h5py.Dataset) -> _ChunkIndex | None:
    """Where each row's stored chunk of ``d`` lies in its file (``place(row)``), so a chunk's bytes
    can be read with no HDF5 call (a rebuild copies unchanged rows' chunks this way). None when
    HDF5 cannot list the chunks or the file's bytes there disagree with HDF5's own read of one."""
    return _ChunkIndex.of(d)
