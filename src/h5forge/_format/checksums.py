"""What a version's checksums cover, and how they are computed (formats 2 and 3).

- **Row checksum** (``/<split>/checksum``): covers every value a reader can return for that row:
  the hash of (the hash of its fields and annotation columns in the spec's order), then its id,
  source files and their hashes. Format 3 hashes rows with BLAKE3 (32 bytes, so the column keeps
  its 64 hex characters), format 2 with sha256: a row's values are hashed once, in the cleaning
  worker, and BLAKE3 does that several times faster while staying a cryptographic hash, so a
  deliberate change to a value cannot be hidden behind a colliding checksum. Two levels so that cleaning workers hash the sample arrays in
  parallel, and the writer adds the provenance it records (an append rewrites the source paths).
  It is a pure function of the row's stored values: a row copied to another version (an append's
  thin version, an export, a rebuild reusing unchanged samples) keeps its checksum.
- **Split digest** (attribute ``digest`` of each split group): sha256 of what a reader gets for
  the split as a whole: the split's attributes (count, statistics), the attributes of its
  datasets, every row index under ``/index/<split>``, and what defines the data in the spec the
  file stores (``data_definition``): the same inputs built into another folder or on another
  cluster give the same digest. The split's ``digest_rule`` attribute says which rule made it;
  files without one (rule 1) covered the whole stored spec and are still verified that way.

Values are hashed by their meaning, not their storage: numbers as little-endian bytes with their
dtype and shape, strings as UTF-8 with their length. A chunk compressed another way, or a
string stored fixed-length instead of variable-length, gives the same checksum.

Format 1 files checksum only the stored bytes of the field arrays; ``legacy_checksum`` verifies
them.
"""

from __future__ import annotations

import hashlib
import json
import struct
from typing import Any, Iterable, Iterator, Sequence

import blake3
import h5py
import numpy as np

from h5forge._format import arrays
from h5forge._format.dims import SCALE_ATTRS, datasets_below
from h5forge._format.mapped import rows_of
from h5forge._format.names import (
    BLAKE3_CHECKSUMS,
    DIAGNOSTICS,
    DIGEST_RULE,
    FILE_DIGEST_RULE,
    FORMAT_VERSION,
    IDS,
    INDEX,
    SOURCE_FILES,
    SOURCE_SHA256,
    SPEC,
    SPLITS,
    Attr,
)

PROVENANCE = (IDS, SOURCE_FILES, SOURCE_SHA256)  # after the fields, in this order
# dimension-scale bookkeeping (object references and ids, different in every copy of a file): it
# names axes and changes no value a reader returns
_SKIPPED_ATTRS = SCALE_ATTRS | {Attr.DIGEST}


def _string(value: str | bytes) -> bytes:
    data = value if isinstance(value, bytes) else str(value).encode("utf-8", "surrogatepass")
    return b"s" + struct.pack("<Q", len(data)) + data


_SCALAR_HEADS: dict[np.dtype, tuple[np.dtype, bytes]] = {}


def _scalar(value: np.generic) -> bytes:
    """``canonical`` of a numeric numpy scalar (an annotation column's value in a row), made without
    the array round trip: its dtype's little-endian form and head are looked up once per dtype."""
    dt = value.dtype
    if (known := _SCALAR_HEADS.get(dt)) is None:
        little = dt.newbyteorder("<")
        known = _SCALAR_HEADS[dt] = (little, b"n" + little.str.encode() + struct.pack("<B", 0))
    little, head = known
    return head + (value.tobytes() if dt == little else np.asarray(value, little).tobytes())


def _parts(value: Any) -> Iterator[bytes | memoryview]:
    if isinstance(value, (str, bytes)):
        yield _string(value)
        return
    if isinstance(value, np.generic) and value.dtype.kind in "biufc":
        yield _scalar(value)
        return
    arr = np.asarray(value)
    head = struct.pack("<B", arr.ndim) + struct.pack(f"<{arr.ndim}Q", *arr.shape)
    if arr.dtype.kind in "OSU":
        yield b"a" + head
        packed = _packed_strings(arr)
        if packed is not None:
            yield packed
            return
        yield from (_string(v) for v in arr.ravel().tolist())
        return
    if arr.dtype.kind not in "biufc":
        raise TypeError(f"cannot checksum a value of dtype {arr.dtype}")
    little = np.ascontiguousarray(arr.astype(arr.dtype.newbyteorder("<"), copy=False))
    yield b"n" + little.dtype.str.encode() + head
    yield little.reshape(-1).view(np.uint8).data  # as bytes, no copy of a sample array


# fewer strings than this are packed one by one (the array's set-up costs more than it saves)
PACK_STRINGS_FROM = 64


def _packed_strings(arr: np.ndarray) -> bytes | None:
    """Every ``_string`` of a fixed-width bytes array (hashes, digests: a catalog's, a split's sample
    keys) end to end, made a run at a time; None for other arrays. numpy drops trailing NULs from
    each value, as the one-by-one path hashes it: such a value is made alone, between runs."""
    if arr.dtype.kind != "S" or arr.size < PACK_STRINGS_FROM or arr.dtype.itemsize == 0:
        return None
    flat = np.ascontiguousarray(arr.reshape(-1))
    width = arr.dtype.itemsize
    short = np.flatnonzero(np.char.str_len(flat) != width).tolist()
    parts, at = [], 0
    for i in [*short, flat.size]:
        if i > at:
            run = np.empty(i - at, dtype=[("tag", "S1"), ("length", "<u8"), ("data", f"S{width}")])
            run["tag"], run["length"], run["data"] = b"s", width, flat[at:i]
            parts.append(run.tobytes())
        if i < flat.size:
            parts.append(_string(flat[i].tobytes().rstrip(b"\0")))
        at = i + 1
    return b"".join(parts)


def canonical(value: Any) -> bytes:
    """The bytes a value is hashed by: the same for a value in memory and read back from a file."""
    return b"".join(bytes(p) for p in _parts(value))


def row_hash(format_version: int = FORMAT_VERSION, data: bytes = b"") -> Any:
    """A new hash object for a row's checksum in ``format_version`` (BLAKE3 from format 3, else sha256)."""
    return blake3.blake3(data) if format_version >= BLAKE3_CHECKSUMS else hashlib.sha256(data)


def values_digest(values: Iterable[Any], format_version: int = FORMAT_VERSION) -> bytes:
    """The hash of a row's stored values (fields and annotation columns, in the spec's order). The
    costly part of a checksum: cleaning computes it in its worker processes."""
    h = row_hash(format_version)
    for v in values:
        for part in _parts(v):
            h.update(part)
    return h.digest()


def row_checksum(digest: bytes, row_id: Any, files: Any, hashes: Any, format_version: int = FORMAT_VERSION) -> str:
    """A row's checksum: its values' digest, then its id, source files and their hashes."""
    h = row_hash(format_version, digest)
    for v in (row_id, files, hashes):
        h.update(canonical(v))
    return h.hexdigest()


def file_format(f: h5py.File) -> int:
    """The file's format_version (1 when it has none)."""
    return int(f.attrs.get(Attr.FORMAT_VERSION, 1))


def stored_checksums(g: h5py.Group, kinds: dict, start: int, stop: int) -> list[str]:
    """Row checksums recomputed from what split group ``g`` holds in rows ``start:stop``, hashed as
    the file's format says."""
    return RowChecksums(g, kinds)(start, stop)


class RowChecksums:
    """``stored_checksums`` of one split group, its datasets opened once for many runs of rows."""

    def __init__(self, g: h5py.Group, kinds: dict):
        self.fmt = file_format(g.file)
        self.readers = [arrays.RowReader(g, path, kind.stored()) for path, kind in kinds.items()]
        self.provenance = [rows_of(g[name]) for name in PROVENANCE]

    def __call__(self, start: int, stop: int) -> list[str]:
        fmt, blocks = self.fmt, [read(start, stop) for read in self.readers]
        ids, files, hashes = (d[start:stop] for d in self.provenance)
        return [
            row_checksum(values_digest((b[i] for b in blocks), fmt), ids[i], files[i], hashes[i], fmt)
            for i in range(stop - start)
        ]


def legacy_checksum(values: Iterable[np.ndarray]) -> str:
    """Format 1: sha256 of the stored bytes of the checksummed fields, in field order."""
    h = hashlib.sha256()
    for v in values:
        h.update(np.ascontiguousarray(v).data)
    return h.hexdigest()


def _attrs(obj: h5py.HLObject, skipped: frozenset[str] | set[str] = _SKIPPED_ATTRS) -> bytes:
    names = sorted(k for k in obj.attrs.keys() if k not in skipped)
    return b"".join(_string(k) + canonical(obj.attrs[k]) for k in names)


# parts of a spec that say where a version was built and how, not what it holds: where it goes,
# how it is computed, checked and appended to, and where the raw folder sits (files are named
# relative to it). ``_ingest.incremental.inputs.rules_hash`` leaves out the same parts.
NOT_DATA = ("output", "compute", "verify", "append")
NOT_DATA_SOURCE = ("root", "inbox")
NOT_DATA_STORAGE = ("assemble",)  # how a version's files are laid out, not what they hold


def drop_how_built(data: dict) -> dict:
    """``data`` (a spec as JSON values) without what says where or how a version was built."""
    for key in NOT_DATA:
        data.pop(key, None)
    if isinstance(data.get("source"), dict):
        data["source"] = {k: v for k, v in data["source"].items() if k not in NOT_DATA_SOURCE}
    if isinstance(data.get("storage"), dict):
        data["storage"] = {k: v for k, v in data["storage"].items() if k not in NOT_DATA_STORAGE}
    return data


def data_definition(spec_json: str | bytes) -> bytes:
    """The stored spec without where or how the version was built, as canonical JSON (sorted keys)."""
    data = drop_how_built(json.loads(spec_json))
    return json.dumps(data, sort_keys=True, separators=(",", ":")).encode()


class UnknownDigestRule(ValueError):
    pass


# a rule this h5forge does not know: most likely a newer h5forge's file, which an older verify must
# not call damaged (a damaged rule attribute reads the same, and fails the check all the same)
NEWER = "a newer h5forge may have written it: verify it with that version"


def split_digest(f: h5py.File, split: str) -> str:
    """sha256 of the split's attributes, its datasets' attributes, its row indexes and the spec
    (all of it, or what defines the data, as the split's ``digest_rule`` says)."""
    h = hashlib.sha256()
    g = f[split]
    rule = int(g.attrs.get(Attr.DIGEST_RULE, 1))
    if rule not in (1, DIGEST_RULE):
        raise UnknownDigestRule(
            f"/{split} has {Attr.DIGEST_RULE} {rule}, not one this h5forge knows (1 to {DIGEST_RULE}); {NEWER}"
        )
    h.update(_attrs(g))
    for name, ds in sorted(datasets_below(g).items()):  # names are unique: sorted by name
        h.update(_string(name) + _attrs(ds))
    if f"{INDEX}/{split}" in f:
        for name, ds in sorted(datasets_below(f[f"{INDEX}/{split}"]).items()):
            h.update(_string(name) + canonical(ds[()]))
    spec = f[SPEC][()]
    h.update(canonical(spec if rule == 1 else data_definition(spec)))
    return h.hexdigest()


def write_digests(f: h5py.File, splits: Sequence[str] | None = None) -> None:
    """Store each split's digest under the current rule (call once everything else of the split is written)."""
    for split in splits or SPLITS:
        f[split].attrs[Attr.DIGEST_RULE] = DIGEST_RULE
        f[split].attrs[Attr.DIGEST] = split_digest(f, split)


# what the split digests leave out: the file's own attributes (name, version, codec, lineage,
# created_at, ...), its diagnostics and its inputs catalog
FILE_PARTS = (DIAGNOSTICS, "inputs")


def file_digest(f: h5py.File) -> str:
    """sha256 of the root attributes (but this digest), of every attribute and value under
    /diagnostics and /inputs, and (``file_digest_rule`` 2) of the stored spec as it is."""
    rule = int(f.attrs.get(Attr.FILE_DIGEST_RULE, 1))
    if rule not in (1, FILE_DIGEST_RULE):
        known = f"not one this h5forge knows (1 to {FILE_DIGEST_RULE})"
        raise UnknownDigestRule(f"the file has {Attr.FILE_DIGEST_RULE} {rule}, {known}; {NEWER}")
    h = hashlib.sha256(_attrs(f, _SKIPPED_ATTRS | {Attr.FILE_DIGEST}))
    for part in FILE_PARTS:
        if part not in f:
            continue
        g = f[part]
        h.update(_string(part) + _attrs(g))
        for name, ds in sorted(datasets_below(g).items()):  # names are unique: sorted by name
            h.update(_string(name) + _attrs(ds) + canonical(ds[()]))
    if rule >= 2 and SPEC in f:
        h.update(_string(SPEC) + canonical(f[SPEC][()]))
    return h.hexdigest()


def write_file_digest(f: h5py.File) -> None:
    """Store the file digest (call last, once nothing else of the file changes)."""
    f.attrs[Attr.FILE_DIGEST_RULE] = FILE_DIGEST_RULE
    f.attrs[Attr.FILE_DIGEST] = file_digest(f)
