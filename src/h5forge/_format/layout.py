"""Storage of the small per-sample columns and of the row indexes (format in ``names``)."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import h5py
import numpy as np

from h5forge._format.names import CHECKSUM, IDS, INDEX, SOURCE_FILES, SOURCE_SHA256

STR = h5py.string_dtype("utf-8")
HEX = h5py.string_dtype("ascii", 64)
SMALL_ROWS = 1024  # rows per chunk of the per-sample columns (ids, hashes, annotations)
SMALL_CODEC = {"compression": "gzip", "compression_opts": 1}  # portable; these are tiny


def small_options(dtype) -> dict:
    """Chunking and compression of a per-sample column (variable-length strings stay unfiltered)."""
    info = h5py.check_string_dtype(np.dtype(dtype))
    return {} if info is not None and info.length is None else dict(SMALL_CODEC)


def provenance_layout(file_fields: int) -> dict[str, tuple[tuple[int, ...], Any]]:
    """Shape (after the row axis) and dtype of each per-sample provenance dataset, for a sample
    with ``file_fields`` raw-file fields."""
    return {
        IDS: ((), STR),
        SOURCE_FILES: ((file_fields,), STR),
        SOURCE_SHA256: ((file_fields,), HEX),
        CHECKSUM: ((), HEX),
    }


def decode_str(values: Any) -> list[str]:
    return [v.decode() if isinstance(v, bytes) else str(v) for v in values]


def _index_values(values: np.ndarray) -> list:
    return [v.decode() if isinstance(v, bytes) else v.item() if hasattr(v, "item") else v for v in values]


def index_rows(f: h5py.File, split: str, column: str, value) -> np.ndarray:
    """Row numbers of ``split`` whose annotation ``column`` equals ``value`` (sorted)."""
    try:
        group = f[INDEX][split][column]
    except KeyError:
        raise KeyError(f"no index for column {column!r} in split {split!r} of {f.filename}") from None
    return index_parts(group).get(value, np.zeros(0, dtype=np.int64))


def index_parts(group: h5py.Group) -> dict:
    """{value: rows} of one index group."""
    values = _index_values(group["values"][()])
    offsets, rows = group["offsets"][()], group["rows"][()]
    return {v: rows[offsets[k] : offsets[k + 1]] for k, v in enumerate(values)}


def _write_index_group(g: h5py.Group, keys: list, parts: list[np.ndarray]) -> None:
    for name in ("values", "offsets", "rows"):
        if name in g:
            del g[name]
    offsets = np.concatenate([[0], np.cumsum([len(x) for x in parts])]).astype(np.int64)
    rows = np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, np.int64)
    if keys and all(isinstance(k, str) for k in keys):
        g.create_dataset("values", data=np.array(keys, dtype=object), dtype=STR)
    else:
        g.create_dataset("values", data=np.asarray(keys))
    g.create_dataset("offsets", data=offsets)
    g.create_dataset("rows", data=rows)


def write_index(f: h5py.File, split: str, column: str, values: np.ndarray) -> None:
    """CSR-style index of rows by column value."""
    write_index_lists(f, split, column, [[v] for v in _index_values(values)])


def write_index_lists(f: h5py.File, split: str, name: str, values_per_row: list[list]) -> None:
    """CSR-style index of rows by value, where a row may be listed under several values."""
    rows_of: dict = defaultdict(list)
    for row, values in enumerate(values_per_row):
        for v in values:
            rows_of[v].append(row)
    keys = sorted(rows_of, key=lambda k: str(k) if isinstance(k, str) else k)
    _write_index_group(
        f.require_group(f"{INDEX}/{split}/{name}"), keys, [np.asarray(rows_of[k], dtype=np.int64) for k in keys]
    )


def merge_index(f: h5py.File, split: str, column: str, parent: h5py.Group, delta: h5py.Group, n_parent: int) -> None:
    """The parent's row index plus the delta's (rows shifted past the parent's): no column re-read."""
    old, new = index_parts(parent), index_parts(delta)
    keys = sorted(set(old) | set(new), key=str)
    empty = np.zeros(0, np.int64)
    parts = [np.concatenate([old.get(k, empty), new.get(k, empty) + n_parent]) for k in keys]
    _write_index_group(f.require_group(f"{INDEX}/{split}/{column}"), keys, parts)
