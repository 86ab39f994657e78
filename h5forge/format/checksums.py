"""What a version's checksums cover, and how they are computed (format 2).

- **Row checksum** (``/<split>/checksum``): sha256 of every value a reader can return for that row
  (each field and annotation column in the spec's order, then the id, the source files and their
  hashes). It is a pure function of the row's stored values: a row copied to another version (an
  append's thin version, an export, a rebuild reusing unchanged samples) keeps its checksum.
- **Split digest** (attribute ``digest`` of each split group): sha256 of what a reader gets for
  the split as a whole: the split's attributes (count, statistics), the attributes of its
  datasets, every row index under ``/index/<split>``, and the spec the file stores.

Values are hashed by their meaning, not their storage: numbers as little-endian bytes with their
dtype and shape, strings as UTF-8 with their length. A chunk compressed another way, or a
string stored fixed-length instead of variable-length, gives the same checksum.

Format 1 files checksummed only the stored bytes of the field arrays; ``legacy_checksum`` keeps
verifying them.
"""

from __future__ import annotations

import hashlib
import struct
from typing import Any, Iterable, Sequence

import h5py
import numpy as np

from h5forge.format import arrays
from h5forge.format.names import IDS, INDEX, SOURCE_FILES, SOURCE_SHA256, SPEC, SPLITS, Attr

PROVENANCE = (IDS, SOURCE_FILES, SOURCE_SHA256)  # after the fields, in this order
# dimension-scale bookkeeping (object references and ids, different in every copy of a file): it
# names axes and changes no value a reader returns
_SKIPPED_ATTRS = frozenset({"DIMENSION_LIST", "REFERENCE_LIST", "CLASS", "NAME", "_Netcdf4Dimid",
                            "_Netcdf4Coordinates", Attr.DIGEST})


def _string(value: str | bytes) -> bytes:
    data = value if isinstance(value, bytes) else str(value).encode("utf-8", "surrogatepass")
    return b"s" + struct.pack("<Q", len(data)) + data


def canonical(value: Any) -> bytes:
    """The bytes a value is hashed by: the same for a value in memory and read back from a file."""
    if isinstance(value, (str, bytes)):
        return _string(value)
    arr = np.asarray(value)
    head = struct.pack("<B", arr.ndim) + struct.pack(f"<{arr.ndim}Q", *arr.shape)
    if arr.dtype.kind in "OSU":
        return b"a" + head + b"".join(_string(v) for v in arr.ravel().tolist())
    if arr.dtype.kind not in "biufc":
        raise TypeError(f"cannot checksum a value of dtype {arr.dtype}")
    little = arr.astype(arr.dtype.newbyteorder("<"), copy=False)
    return b"n" + little.dtype.str.encode() + head + np.ascontiguousarray(little).tobytes()


def row_checksum(values: Iterable[Any]) -> str:
    """The checksum of one row from its values: the fields', then id, source files, hashes."""
    h = hashlib.sha256()
    for v in values:
        h.update(canonical(v))
    return h.hexdigest()


def block_checksums(blocks: Sequence[Any], n: int) -> list[str]:
    """Checksums of ``n`` rows, from one block per value (arrays, Ragged, or lists), in order."""
    return [row_checksum(block[i] for block in blocks) for i in range(n)]


def read_blocks(g: h5py.Group, kinds: dict, start: int, stop: int) -> list[Any]:
    """Rows ``start:stop`` of every value a row checksum covers, read from split group ``g``."""
    blocks = [arrays.RowReader(g, path, kind.stored())(start, stop) for path, kind in kinds.items()]
    return blocks + [g[name][start:stop] for name in PROVENANCE]


def stored_checksums(g: h5py.Group, kinds: dict, start: int, stop: int) -> list[str]:
    """Row checksums recomputed from what split group ``g`` holds in rows ``start:stop``."""
    return block_checksums(read_blocks(g, kinds, start, stop), stop - start)


def legacy_checksum(values: Iterable[np.ndarray]) -> str:
    """Format 1: sha256 of the stored bytes of the checksummed fields, in field order."""
    h = hashlib.sha256()
    for v in values:
        h.update(np.ascontiguousarray(v).data)
    return h.hexdigest()


def _attrs(obj: h5py.HLObject) -> bytes:
    names = sorted(k for k in obj.attrs.keys() if k not in _SKIPPED_ATTRS)
    return b"".join(_string(k) + canonical(obj.attrs[k]) for k in names)


def split_digest(f: h5py.File, split: str) -> str:
    """sha256 of the split's attributes, its datasets' attributes, its row indexes and the spec."""
    h = hashlib.sha256()
    g = f[split]
    h.update(_attrs(g))
    datasets: list[tuple[str, h5py.Dataset]] = []
    g.visititems(lambda name, obj: datasets.append((name, obj)) if isinstance(obj, h5py.Dataset) else None)
    for name, ds in sorted(datasets, key=lambda item: item[0]):
        h.update(_string(name) + _attrs(ds))
    index: list[tuple[str, h5py.Dataset]] = []
    if f"{INDEX}/{split}" in f:
        f[f"{INDEX}/{split}"].visititems(
            lambda name, obj: index.append((name, obj)) if isinstance(obj, h5py.Dataset) else None)
    for name, ds in sorted(index, key=lambda item: item[0]):
        h.update(_string(name) + canonical(ds[()]))
    h.update(canonical(f[SPEC][()]))
    return h.hexdigest()


def write_digests(f: h5py.File, splits: Sequence[str] | None = None) -> None:
    """Store each split's digest (call once everything else of the split is written)."""
    for split in splits or SPLITS:
        f[split].attrs[Attr.DIGEST] = split_digest(f, split)
