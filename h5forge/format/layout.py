"""The file layout (format_version 1), in one place. docs/format.md describes it for users.

/                      attrs: format, format_version, name, version, parent_version, created_at,
                              description, creator, h5forge/h5py/hdf5 versions, codec, codec_needs
/<split>/              train | val | test; attrs: count, fields, <field>_mean, <field>_std,
                              <field>_histogram (C, 256) for exact incremental updates
/<split>/<field>       (N, C, H, W) uint8, chunked (chunk_rows, C, H, W), sample axis resizable
/<split>/ids           (N,) UTF-8 sample ids, exactly as given
/<split>/source_files  (N, F) raw file paths relative to the source root (F = fields, in order)
/<split>/source_sha256 (N, F) hex sha256 of each raw file
/<split>/checksum      (N,) hex sha256 of the stored bytes of the sample's fields, in order
/<split>/meta/<col>    (N,) annotation column
/index/<split>/<col>/  values (K,), offsets (K+1,), rows (N,): rows[offsets[k]:offsets[k+1]]
                       are the rows of <split> whose <col> equals values[k]
/meta/spec             the spec that built the file (JSON)
/diagnostics           attrs: timings, sizes, compression ratio; rejections (R, 4) table
"""

from __future__ import annotations

import h5py
import numpy as np

FORMAT = "h5forge"
FORMAT_VERSION = 1
SPLITS = ("train", "val", "test")
PER_SAMPLE = ("ids", "source_files", "source_sha256", "checksum")
REJECTION_COLUMNS = ("sample_id", "path", "reason", "stage")

STR = h5py.string_dtype("utf-8")
HEX = h5py.string_dtype("ascii", 64)


def index_rows(f: h5py.File, split: str, column: str, value) -> np.ndarray:
    """Row numbers of ``split`` whose annotation ``column`` equals ``value`` (sorted)."""
    try:
        group = f["index"][split][column]
    except KeyError:
        raise KeyError(f"no index for column {column!r} in split {split!r} of {f.filename}") from None
    values = group["values"][()]
    if values.dtype.kind == "O" or values.dtype.kind == "S":
        values = np.array([v.decode() if isinstance(v, bytes) else v for v in values], dtype=object)
    hits = np.flatnonzero(values == value)
    if hits.size == 0:
        return np.zeros(0, dtype=np.int64)
    k = int(hits[0])
    offsets = group["offsets"]
    return group["rows"][int(offsets[k]) : int(offsets[k + 1])]


def decode_str(values: np.ndarray) -> list[str]:
    return [v.decode() if isinstance(v, bytes) else str(v) for v in values]
