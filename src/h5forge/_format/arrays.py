"""How one stored field is laid out in a split group, fixed or ragged, in one place.

- **fixed**: one dataset ``<path>`` of shape (N, *shape), sample axis first (an image field, a
  label);
- **ragged**: rows whose first axis differs per sample (a recording, a CT case's slices) are
  concatenated into one dataset ``<path>`` of shape (total, *shape), chunked by elements, plus
  ``<path>_lengths`` (N,) int64. Lengths rather than offsets, so a thin version can map them
  virtually: a row's offset is the sum of the lengths before it, computed when read.

The writer, thin versions, verify, export and the readers call these functions and never branch
on a field kind.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any, Sequence

import h5py
import numpy as np

from h5forge._format.mapped import read_all, rows_of

LENGTHS = "_lengths"


@dataclass(frozen=True)
class Stored:
    """How a field's rows are stored in each split group."""

    shape: tuple[int, ...]  # one sample's shape; for a ragged field, one element's (after the varying axis)
    dtype: Any  # numpy dtype, or an h5py string dtype
    bulk: bool  # True: sample arrays (the spec's codec); False: a small column (read whole by readers)
    ragged: bool = False
    chunk_elements: int = 0  # ragged: elements per chunk (0: the writer picks ~1 MiB)
    codec: str | None = None  # the field's own codec, when its kind's data wants another one

    def codec_of(self, default: str) -> str:
        return self.codec or default

    def datasets(self, path: str) -> tuple[str, ...]:
        return (path, path + LENGTHS) if self.ragged else (path,)

    def chunk(self, chunk_rows: int, small_rows: int) -> tuple[int, ...]:
        if self.ragged:
            per = max(1, int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize)
            return (self.chunk_elements or max(1, (1 << 20) // per), *self.shape)
        return ((chunk_rows if self.bulk else small_rows), *self.shape)


@dataclass(frozen=True)
class Ragged:
    """Rows of different lengths: the rows' elements end to end, and each row's length."""

    values: np.ndarray  # (sum(lengths), *shape)
    lengths: np.ndarray  # (n,) int64

    @classmethod
    def of(cls, rows: Sequence[np.ndarray], shape: tuple[int, ...], dtype: Any) -> "Ragged":
        if not rows:
            return cls(np.zeros((0, *shape), dtype), np.zeros(0, np.int64))
        return cls(np.concatenate(rows).astype(dtype, copy=False), np.array([len(r) for r in rows], np.int64))

    @classmethod
    def concat(cls, parts: Sequence["Ragged"]) -> "Ragged":
        return cls(np.concatenate([p.values for p in parts]), np.concatenate([p.lengths for p in parts]))

    @cached_property  # rows are read one by one in loops: the sums are made once
    def offsets(self) -> np.ndarray:
        return np.concatenate([[0], np.cumsum(self.lengths)]).astype(np.int64)

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, idx) -> Any:
        """An int gives that row's array; a slice, index array or mask gives a Ragged of those rows."""
        off = self.offsets
        if isinstance(idx, (int, np.integer)):
            i = int(idx) + (len(self) if idx < 0 else 0)
            return self.values[off[i] : off[i + 1]]
        if isinstance(idx, slice):
            start, stop, step = idx.indices(len(self))
            if step == 1:
                return Ragged(self.values[off[start] : off[max(start, stop)]], self.lengths[start:stop])
            idx = np.arange(start, stop, step)
        rows = np.flatnonzero(idx) if np.asarray(idx).dtype == bool else np.asarray(idx, dtype=np.int64)
        return Ragged.of([self.values[off[i] : off[i + 1]] for i in rows], self.values.shape[1:], self.values.dtype)


def create(g: h5py.Group, path: str, st: Stored, chunks: tuple[int, ...], options: dict) -> h5py.Dataset:
    """The empty, resizable dataset(s) of a field; returns the values dataset."""
    ds = g.create_dataset(path, (0, *st.shape), st.dtype, maxshape=(None, *st.shape), chunks=chunks, **options)
    if st.ragged:
        lengths = {"maxshape": (None,), "chunks": (4096,), "compression": "gzip", "compression_opts": 1}
        g.create_dataset(path + LENGTHS, (0,), np.int64, **lengths)
    return ds


def extend(g: h5py.Group, path: str, data: Any) -> None:
    """Append rows (an array, or a Ragged for a ragged field) at the end of the field's datasets."""
    parts = ((path, data.values), (path + LENGTHS, data.lengths)) if isinstance(data, Ragged) else ((path, data),)
    for name, block in parts:
        ds = g[name]
        start = ds.shape[0]
        ds.resize(start + len(block), axis=0)
        ds[start:] = block


def cut(g: h5py.Group, path: str, st: Stored, n: int) -> None:
    """Keep the first ``n`` rows of the field, dropping the rest (a ragged field's elements too)."""
    if st.ragged:
        g[path].resize(int(g[path + LENGTHS][:n].sum()), axis=0)
        g[path + LENGTHS].resize(n, axis=0)
    else:
        g[path].resize(n, axis=0)


def rows(g: h5py.Group, path: str, st: Stored) -> int:
    return g[path + LENGTHS].shape[0] if st.ragged else g[path].shape[0]


def offsets(g: h5py.Group, path: str) -> np.ndarray:
    """(N+1,) where each row of a ragged field starts, from its lengths."""
    return np.concatenate([[0], np.cumsum(read_all(g[path + LENGTHS]))]).astype(np.int64)


class RowReader:
    """Rows of one field by number, its dataset opened once (and a ragged field's offsets read once);
    a mapped field's rows are read from the files it maps (``_format.mapped``)."""

    def __init__(self, g: h5py.Group, path: str, st: Stored):
        self.values = rows_of(g[path])
        self.starts = offsets(g, path) if st.ragged else None

    def __call__(self, start: int, stop: int) -> Any:
        """Rows ``start:stop``: an array, or a Ragged."""
        if self.starts is None:
            return self.values[start:stop]
        off = self.starts
        return Ragged(self.values[off[start] : off[stop]], np.diff(off[start : stop + 1]))

    def row(self, i: int) -> np.ndarray:
        if self.starts is None:
            return self.values[i]
        return self.values[self.starts[i] : self.starts[i + 1]]


def same_values(made: Any, stored: Any) -> bool:
    """Whether a value made again equals the stored one bit for bit, once in the stored dtype: a
    NaN equals a NaN with the same bits, and 0.0 and -0.0 differ (``==`` says the opposite of both)."""
    a, b = np.asarray(made), np.asarray(stored)
    if a.shape != b.shape:
        return False
    if b.dtype.kind not in "fc":
        return bool(np.array_equal(a, b))
    a = np.ascontiguousarray(a.astype(b.dtype, copy=False))
    return a.tobytes() == np.ascontiguousarray(b).tobytes()
