"""One stored chunk's bytes made (and undone) outside HDF5, for fields stored one sample per chunk.

With one sample per chunk a row is a chunk, so a cleaning worker can compress its rows itself and
the single writer only places the bytes (``write_direct_chunk``): compression runs in parallel and
the writer's work per sample stays small. A reader can likewise fetch a chunk's bytes
(``read_direct_chunk``) and undo the codec in process. Both must produce exactly what HDF5's own
filter would, so a file written either way reads the same through h5py:

- ``none``: the row's bytes (C order, native byte order);
- ``gzip-N``: HDF5's deflate filter stores a zlib stream (``compress2`` at level N);
- ``lz4``: hdf5plugin's LZ4 filter (32004) stores a big-endian 8-byte original size and 4-byte
  block size, then per block a big-endian 4-byte compressed size and an LZ4 block; a block LZ4
  would not make smaller is stored as is (its compressed size equals its plain size). With the
  filter's default options (block size 0) one block covers the whole chunk up to 1 GiB.

Any other codec (zstd, blosc2, bitshuffle, lzf) is left to HDF5: ``encodable`` says which.

For a field stored several samples per chunk the writer joins the rows' chunks into one (``none``
and ``lz4`` only: each row becomes one LZ4 block of the chunk, a framing the filter reads though
it would have made one block of the whole chunk); ``joinable`` says which.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import struct
import zlib
from dataclasses import dataclass
from typing import Any, Sequence

import lz4.block
import numpy as np

LZ4_FILTER = 32004  # hdf5plugin.LZ4_ID
DEFLATE_FILTER = 1
LZ4_DEFAULT_BLOCK = 1 << 30  # H5Zlz4.c DEFAULT_BLOCK_SIZE, used when the filter's option is 0
_LZ4_HEADER = struct.Struct(">QI")  # original size, block size
_LZ4_BLOCK = struct.Struct(">I")  # compressed size of the next block


def _load_lz4() -> Any:
    """``LZ4_decompress_safe(src, dst, compressed_size, dst_capacity)`` from a loaded LZ4 library, to
    decompress a block straight into its row: the lz4 package's block module (the library it
    bundles) or else the system's liblz4. The package's own ``decompress`` returns a new bytes
    object, which then has to be copied into place. Used only if it round-trips a block the lz4
    package compressed and refuses a corrupt one; otherwise None."""
    candidates = [getattr(getattr(lz4.block, "_block", None), "__file__", None), ctypes.util.find_library("lz4")]
    plain = (np.arange(4096, dtype=np.uint32) % 251).astype(np.uint8).tobytes()
    packed = lz4.block.compress(plain, store_size=False)
    for path in candidates:
        if not path:
            continue
        try:
            fn = ctypes.CDLL(path).LZ4_decompress_safe  # CDLL: the GIL is released during the call
        except (OSError, AttributeError):
            continue
        fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
        fn.restype = ctypes.c_int
        out = ctypes.create_string_buffer(len(plain))
        bad = packed[: len(packed) // 2]
        if (
            fn(packed, out, len(packed), len(plain)) == len(plain)
            and out.raw == plain
            and fn(bad, out, len(bad), len(plain)) < 0
        ):
            return fn
    return None


_LZ4_SAFE = _load_lz4()

ZSTD_FILTER = 32015  # hdf5plugin.ZSTD_ID


def _load_zstd() -> tuple[Any, Any] | None:
    """``ZSTD_decompress`` and ``ZSTD_isError`` of hdf5plugin's own Zstd filter library, or None.
    HDF5 reads a zstd chunk through that filter, which hands back uninitialised memory, not an
    error, for a chunk zstd finds corrupt (hdf5plugin 7.1.0; HDFGroup/hdf5_plugins#280 fixes it
    upstream): what it returns then can even equal the chunk's true values, so ``zstd_intact``
    asks zstd itself."""
    import glob

    import hdf5plugin

    for path in glob.glob(os.path.join(hdf5plugin.PLUGIN_PATH, "*h5zstd*")):
        try:
            lib = ctypes.CDLL(path)
            decompress, is_error = lib.ZSTD_decompress, lib.ZSTD_isError
        except (OSError, AttributeError):
            continue
        decompress.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t]
        decompress.restype = ctypes.c_size_t
        is_error.argtypes = [ctypes.c_size_t]
        is_error.restype = ctypes.c_uint
        return decompress, is_error
    return None


_ZSTD = _load_zstd()


def zstd_intact(chunk: bytes, size: int) -> bool | None:
    """Whether a chunk stored by the Zstd filter decodes to exactly ``size`` bytes; None where
    hdf5plugin's Zstd library cannot be called."""
    if _ZSTD is None:
        return None
    decompress, is_error = _ZSTD
    out = ctypes.create_string_buffer(max(1, size))
    made = decompress(out, size, chunk, len(chunk))
    return not is_error(made) and made == size


def _gzip_level(codec: str) -> int | None:
    name, _, level = codec.partition("-")
    return int(level) if name == "gzip" and level.isdigit() else None


def encodable(codec: str) -> bool:
    """Whether ``encode`` makes this codec's chunks exactly as its HDF5 filter does."""
    return codec in ("none", "lz4") or _gzip_level(codec) is not None


def joinable(codec: str) -> bool:
    """Whether rows ``encode`` made under ``codec`` join into one chunk of several rows."""
    return codec in ("none", "lz4")


def pipeline(codec: str) -> list[tuple[int, tuple[int, ...]]]:
    """The HDF5 filter pipeline (id, options) a dataset created with ``codec`` has; chunks made
    by ``encode`` may only be written into a dataset with exactly this pipeline."""
    if codec == "none":
        return []
    if codec == "lz4":
        return [(LZ4_FILTER, (0,))]
    level = _gzip_level(codec)
    if level is None:
        raise ValueError(f"codec {codec!r} is not encoded outside HDF5")
    return [(DEFLATE_FILTER, (level,))]


def encode(codec: str, row: np.ndarray) -> bytes:
    """The chunk HDF5 would store for ``row`` (one whole chunk) under ``codec``."""
    plain = memoryview(np.ascontiguousarray(row).data).cast("B")
    if codec == "none":
        return plain.tobytes()
    if codec == "lz4":
        return lz4_frame(plain)
    level = _gzip_level(codec)
    if level is None:
        raise ValueError(f"codec {codec!r} is not encoded outside HDF5")
    return zlib.compress(plain, level)


def lz4_frame(plain: memoryview, block: int = LZ4_DEFAULT_BLOCK) -> bytes:
    """``plain`` in hdf5plugin's LZ4 chunk framing (what H5Zlz4.c writes)."""
    total = len(plain)
    block = min(block, total) if total else block
    parts = [_LZ4_HEADER.pack(total, block)]
    for start in range(0, total, block):
        piece = plain[start : start + block]
        packed = lz4.block.compress(piece, mode="default", store_size=False)
        if len(packed) >= len(piece):  # LZ4 did not help: the filter stores the block as is
            packed = piece.tobytes()
        parts += [_LZ4_BLOCK.pack(len(packed)), packed]
    return b"".join(parts)


def lz4_into(chunk: bytes | memoryview, flat: np.ndarray) -> bool:
    """Decode one chunk in hdf5plugin's LZ4 framing into ``flat`` (uint8, C-contiguous, writable);
    False if the framing does not describe exactly ``flat.size`` bytes or a block does not decode
    (the caller then lets HDF5 read it). ``chunk`` may be a slice of a mapped file: each block is
    decompressed from it straight into ``flat`` when an LZ4 library could be loaded."""
    if len(chunk) < _LZ4_HEADER.size:
        return False
    total, block = _LZ4_HEADER.unpack_from(chunk, 0)
    if total != flat.size or block == 0:
        return False
    decompress = _LZ4_SAFE
    src = np.frombuffer(chunk, np.uint8).ctypes.data if decompress is not None else 0  # the bytes' address
    view, pos, done = memoryview(chunk), _LZ4_HEADER.size, 0
    while done < total:
        if pos + _LZ4_BLOCK.size > len(chunk):
            return False
        (size,) = _LZ4_BLOCK.unpack_from(chunk, pos)
        pos += _LZ4_BLOCK.size
        n = min(block, total - done)
        if pos + size > len(chunk):
            return False
        if size == n:  # stored as is: LZ4 would not have made it smaller
            flat[done : done + n] = np.frombuffer(view[pos : pos + size], np.uint8)
        elif decompress is not None:
            if decompress(src + pos, flat.ctypes.data + done, size, n) != n:
                return False
        else:
            try:
                plain = lz4.block.decompress(view[pos : pos + size], uncompressed_size=n)
            except lz4.block.LZ4BlockError:
                return False
            if len(plain) != n:
                return False
            flat[done : done + n] = np.frombuffer(plain, np.uint8)
        pos += size
        done += n
    return True


def lz4_at(chunk: memoryview, src: int, dst: int, n: int) -> bool:
    """``lz4_into`` for a caller that knows the addresses: ``chunk`` (a slice of a mapped file)
    starts at address ``src`` and its ``n`` plain bytes go to address ``dst``. It spares the
    per-call address look-ups of numpy arrays, which a reader of single slices would pay on every
    read. It walks the blocks as ``lz4_into`` does, kept apart so that path adds no call per block.
    False when no LZ4 library could be loaded, or as ``lz4_into``."""
    decompress = _LZ4_SAFE
    if decompress is None or len(chunk) < _LZ4_HEADER.size:
        return False
    total, block = _LZ4_HEADER.unpack_from(chunk, 0)
    if total != n or block == 0:
        return False
    pos, done = _LZ4_HEADER.size, 0
    while done < total:
        if pos + _LZ4_BLOCK.size > len(chunk):
            return False
        (size,) = _LZ4_BLOCK.unpack_from(chunk, pos)
        pos += _LZ4_BLOCK.size
        part = min(block, total - done)
        if pos + size > len(chunk):
            return False
        if size == part:  # stored as is
            ctypes.memmove(dst + done, src + pos, part)
        elif decompress(src + pos, dst + done, size, part) != part:
            return False
        pos += size
        done += part
    return True


def joined(chunk: bytes | memoryview, rows: int, n: int) -> bool:
    """Whether a stored ``lz4`` chunk is framed as ``EncodedRows.joined`` frames ``rows`` rows of
    ``n`` bytes (each row one block, so ``row_at`` decodes a row alone), by its header."""
    return len(chunk) >= _LZ4_HEADER.size and _LZ4_HEADER.unpack_from(chunk, 0) == (rows * n, n)


def row_at(codec: str, chunk: memoryview, src: int, dst: int, n: int, row: int, rows: int) -> bool:
    """Row ``row`` of a stored chunk of ``rows`` rows of ``n`` bytes (``chunk``, at address ``src``)
    into the ``n`` bytes at ``dst``, without decoding the others: ``none`` (or a chunk stored
    unfiltered) is the rows end to end; ``lz4`` when each row is one block (``EncodedRows.joined``).
    False for anything else (a chunk HDF5 compressed whole, a framing that does not add up): the
    caller decodes the whole chunk."""
    if codec == "none":
        if len(chunk) != rows * n:
            return False
        ctypes.memmove(dst, src + row * n, n)
        return True
    decompress = _LZ4_SAFE
    if codec != "lz4" or decompress is None or not joined(chunk, rows, n):
        return False
    pos, end = _LZ4_HEADER.size, len(chunk)
    for _ in range(row):  # the blocks before the row's
        if pos + _LZ4_BLOCK.size > end:
            return False
        pos += _LZ4_BLOCK.size + _LZ4_BLOCK.unpack_from(chunk, pos)[0]
    if pos + _LZ4_BLOCK.size > end:
        return False
    (size,) = _LZ4_BLOCK.unpack_from(chunk, pos)
    pos += _LZ4_BLOCK.size
    if pos + size > end:
        return False
    if size == n:  # stored as is
        ctypes.memmove(dst, src + pos, n)
        return True
    return decompress(src + pos, dst, size, n) == n


def decode(codec: str, chunk: bytes | memoryview, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    """The row a chunk made by ``encode`` holds; ValueError when the bytes do not decode to it."""
    out = np.empty(shape, dtype)
    flat = out.reshape(-1).view(np.uint8)
    if codec == "lz4":
        if not lz4_into(chunk, flat):
            raise ValueError("not an LZ4 chunk of this row's size")
        return out
    plain = chunk if codec == "none" else zlib.decompress(chunk)
    if len(plain) != flat.size:
        raise ValueError(f"chunk holds {len(plain)} bytes, the row {flat.size}")
    flat[:] = np.frombuffer(plain, np.uint8)
    return out


@dataclass
class EncodedRows:
    """A block of rows of a fixed field as stored chunks, one per row: what a cleaning worker
    returns in place of the array. Indexes like the array it stands for (an int gives a row's
    chunk, anything else the rows it selects)."""

    codec: str
    shape: tuple[int, ...]  # one row's
    dtype: np.dtype
    chunks: list[bytes | memoryview]  # memoryview: slices of one chunk file read by the writer

    @classmethod
    def of(cls, codec: str, block: np.ndarray) -> "EncodedRows":
        return cls(codec, tuple(block.shape[1:]), block.dtype, [encode(codec, row) for row in block])

    @classmethod
    def concat(cls, parts: Sequence["EncodedRows"]) -> "EncodedRows":
        first = parts[0]
        return cls(first.codec, first.shape, first.dtype, [c for p in parts for c in p.chunks])

    def __len__(self) -> int:
        return len(self.chunks)

    def __getitem__(self, idx) -> Any:
        if isinstance(idx, (int, np.integer)):
            return self.chunks[int(idx)]
        picked = np.arange(len(self.chunks))[idx]
        return EncodedRows(self.codec, self.shape, self.dtype, [self.chunks[i] for i in picked.tolist()])

    @property
    def nbytes(self) -> int:
        return sum(map(len, self.chunks))

    def joined(self, rows: int) -> list[bytes | memoryview]:
        """The stored chunks of ``rows`` rows each (``len(self)`` a multiple of it): the rows' own
        chunks for one; else ``rows`` rows' end to end (``none``), or under one LZ4 header whose
        block size is a row's, each row's block as it is (``lz4``: a row's chunk is one block)."""
        if rows == 1:
            return self.chunks
        if not joinable(self.codec) or len(self) % rows:
            raise ValueError(f"{len(self)} {self.codec} rows do not join into chunks of {rows}")
        nbytes = int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize
        if self.codec == "none":
            return [b"".join(self.chunks[i : i + rows]) for i in range(0, len(self), rows)]
        if not 0 < nbytes <= LZ4_DEFAULT_BLOCK:
            raise ValueError(f"a row of {nbytes} bytes is not one LZ4 block")
        head, skip = _LZ4_HEADER.pack(rows * nbytes, nbytes), _LZ4_HEADER.size
        return [b"".join([head, *(c[skip:] for c in self.chunks[i : i + rows])]) for i in range(0, len(self), rows)]

    def decoded(self) -> np.ndarray:
        """The rows as an array (for the rare paths that must look at values again)."""
        out = np.empty((len(self.chunks), *self.shape), self.dtype)
        for i, chunk in enumerate(self.chunks):
            out[i] = decode(self.codec, chunk, self.shape, self.dtype)
        return out


def accepts(ds: Any, codec: str, shape: tuple[int, ...], dtype: Any) -> bool:
    """Whether chunks ``encode`` made for rows of ``shape``/``dtype`` under ``codec`` can be written
    into the h5py dataset ``ds`` as they are (one row per chunk) or joined (``EncodedRows.joined``),
    with exactly the codec's pipeline."""
    dcpl = ds.id.get_create_plist()
    filters = [(f[0], tuple(f[2])) for f in map(dcpl.get_filter, range(dcpl.get_nfilters()))]
    rows_ok = ds.chunks is not None and (ds.chunks[0] == 1 or joinable(codec))
    return rows_ok and ds.chunks[1:] == tuple(shape) and ds.dtype == np.dtype(dtype) and filters == pipeline(codec)


def append_chunks(
    ds: Any, chunks: Sequence[bytes | memoryview], masks: Sequence[int] | None = None, rows: int = 1
) -> None:
    """Append ``rows`` rows per stored chunk at the end of ``ds``, which ends on a chunk boundary
    (``write_direct_chunk``; ``masks``: each chunk's filter mask, 0 — every filter applied — when
    not given)."""
    start = ds.shape[0]
    ds.resize(start + rows * len(chunks), axis=0)
    write, tail = ds.id.write_direct_chunk, (0,) * (ds.ndim - 1)
    for i, chunk in enumerate(chunks):
        write((start + rows * i, *tail), chunk, 0 if masks is None else masks[i])
