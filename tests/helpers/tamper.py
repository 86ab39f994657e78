"""Tampering with real version files, and reading back everything a reader can return.

``data_regions`` lists the byte ranges of a file that hold stored values: every chunk of every
chunked dataset, every contiguous dataset, and every global heap collection (where HDF5 keeps the
bytes of variable-length strings: ids, paths, labels, the spec). ``reader_view`` reads a file the
way users do (``h5forge.read``), so a flip can be judged by what it changes for them.
"""

from __future__ import annotations

import os
import shutil
import struct
from pathlib import Path

import h5py
import numpy as np

from tests.helpers.files import spec_for


def raw_pair(root: Path) -> tuple[Path, Path]:
    """Two small raw folders: 12 samples for a version, 5 others (other ids) for a delta."""
    from tests.helpers.files import make_raw

    return make_raw(root / "raw", n=12, seed=3), make_raw(root / "raw_new", n=5, seed=4, prefix="new_")


def small_version(path: Path, raw: Path, *, size=(16, 16), codec: str = "zstd", chunk_rows: int = 1,
                  version: int = 1):
    """A small version file written by the real cleaner and writer (no Prefect); its write summary."""
    from h5forge._ingest.clean import clean_batch
    from h5forge._ingest.discover import discover
    from h5forge._ingest.writer import DatasetWriter

    path.parent.mkdir(parents=True, exist_ok=True)
    spec = spec_for(raw, path.parent, size, chunk_rows=chunk_rows, codec=codec)
    inv = discover(spec)
    with DatasetWriter(path, spec, version=version) as w:
        w.add(clean_batch(spec, inv.root, inv.samples))
        return w.finish()


def thin_version(folder: Path, raw: Path, raw_new: Path) -> Path:
    """dataset_v0002.h5: a thin version over dataset_v0001.h5 (from ``raw``) and a delta (``raw_new``)."""
    from h5forge.spec import spec_from_json
    from h5forge._store.thin import write_thin

    parent, delta = folder / "dataset_v0001.h5", folder / "dataset_v0002.delta.h5"
    small_version(parent, raw, version=1)
    summary = small_version(delta, raw_new, version=2)
    with h5py.File(delta, "r") as d:
        spec = spec_from_json(d["meta/spec"][()].decode())
    path = folder / "dataset_v0002.h5"
    write_thin(path, parent, delta, spec, 2, 1, summary)
    return path


def data_regions(path: Path) -> list[tuple[int, int]]:
    """(offset, size) of every stored-value region of the file at ``path``."""
    regions: list[tuple[int, int]] = []

    def visit(_name, obj):
        if not isinstance(obj, h5py.Dataset) or obj.is_virtual:
            return
        if obj.chunks:
            for i in range(obj.id.get_num_chunks()):
                info = obj.id.get_chunk_info(i)
                regions.append((int(info.byte_offset), int(info.size)))
        else:
            offset = obj.id.get_offset()
            if offset is not None:
                regions.append((int(offset), int(obj.id.get_storage_size())))

    with h5py.File(path, "r") as f:
        f.visititems(visit)
    data = path.read_bytes()
    at = data.find(b"GCOL")
    while at >= 0:
        if data[at + 4] == 1 and at + 16 <= len(data):
            size = struct.unpack("<Q", data[at + 8:at + 16])[0]
            if 16 < size <= len(data) - at:
                regions.append((at, size))
        at = data.find(b"GCOL", at + 4)
    return sorted(regions)


def region_offsets(path: Path) -> np.ndarray:
    """Every byte offset inside the data regions, once each."""
    return np.unique(np.concatenate([np.arange(o, o + n) for o, n in data_regions(path)]))


def copy_writable(src: Path, dst: Path) -> Path:
    """A writable copy, always a new file (HDF5 would take a rewritten file it still holds open for
    the old one)."""
    dst.unlink(missing_ok=True)
    shutil.copyfile(src, dst)
    os.chmod(dst, 0o644)
    return dst


def flip(path: Path, offset: int, mask: int = 0x01) -> None:
    with open(path, "r+b") as fh:
        fh.seek(offset)
        b = fh.read(1)
        fh.seek(offset)
        fh.write(bytes([b[0] ^ mask]))


def _plain(value):
    """Arrays, lists and scalars as nested tuples of Python values (comparable with ==, NaN-safe)."""
    if isinstance(value, dict):
        return tuple((k, _plain(v)) for k, v in sorted(value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(_plain(v) for v in value)
    if isinstance(value, np.ndarray):
        return (str(value.dtype), value.shape, value.tobytes() if value.dtype != object else _plain(value.tolist()))
    if isinstance(value, np.generic):
        return (str(value.dtype), value.tobytes())
    if hasattr(value, "values") and hasattr(value, "lengths"):  # a padded batch
        return (_plain(value.values), _plain(value.lengths))
    return value


def reader_view(path: Path) -> object:
    """Every value ``h5forge.read`` returns for the file: each split's fields and annotation columns
    (raw and as model values), ids, statistics and row indexes, plus the provenance columns.
    A read that fails is part of the view (as its error), never an exception."""
    from h5forge._format.codecs import ensure_filters
    from h5forge._format.layout import index_parts
    from h5forge._format import mapped
    from h5forge._format.names import INDEX, SOURCE_FILES, SOURCE_SHA256, SPLITS
    from h5forge.kinds import ReadOptions, stored_kinds
    from h5forge.read._reader import SplitReader, model_batch
    from h5forge.spec import spec_from_json

    ensure_filters()
    view = {}
    for split in SPLITS:
        try:
            with h5py.File(path, "r") as f:
                kinds = stored_kinds(spec_from_json(f["meta/spec"][()].decode()))
                provenance = (f[split][SOURCE_FILES][()], f[split][SOURCE_SHA256][()])
                indexes = {name: index_parts(g) for name, g in f[INDEX][split].items()} if INDEX in f else {}
            with SplitReader(path, split, fields=list(kinds)) as reader, \
                    SplitReader(path, split) as declared:  # declared: the fields a reader gets by default
                view[split] = {
                    "values": reader.read(range(len(reader))),
                    "model": model_batch(reader, range(len(reader)), ReadOptions(normalize=True)),
                    "ids": reader.ids(), "stats": {name: fi.stats for name, fi in reader.fields.items()},
                    "declared": list(declared.fields), "provenance": provenance, "index": indexes,
                }
        except Exception as err:  # noqa: BLE001 - a failing read is what the caller compares
            view[split] = ("error", type(err).__name__)
    # nothing of the files read stays known here: a verify forked from this process would inherit it, and
    # take a row file the caller replaced since (with a damaged copy, or the pristine one back) for a swap
    mapped._mappings.clear()
    mapped.SOURCES.close_all()
    return _plain(view)


# signatures of HDF5's metadata blocks: a fractal heap's direct block (FHDB) holds the attributes
# of an object with many of them (the root group's), after the object's header (OHDR) and its
# continuation chunks (OCHK)
BLOCKS = (b"OHDR", b"OCHK", b"FRHP", b"FHDB", b"FHIB", b"BTHD", b"BTLF", b"BTIN", b"GCOL", b"TREE", b"HEAP",
          b"SNOD", b"FSHD", b"FSSE")


def _block_at(data: bytes, at: int, limit: int = 4096) -> tuple[int, int]:
    """(offset, size) of the metadata block starting at ``at``: up to the next block's signature."""
    nxt = [p for sig in BLOCKS if (p := data.find(sig, at + 4, at + limit)) > 0]
    return at, (min(nxt) if nxt else min(len(data), at + limit)) - at


def _header(obj) -> tuple[int, int]:
    info = h5py.h5o.get_info(obj.id)
    return int(info.addr), int(info.hdr.space.total)


def _storage(ds: h5py.Dataset) -> list[tuple[int, int]]:
    if ds.chunks:
        return [(int((c := ds.id.get_chunk_info(i)).byte_offset), int(c.size)) for i in range(ds.id.get_num_chunks())]
    offset = ds.id.get_offset()
    return [] if offset is None else [(int(offset), int(ds.id.get_storage_size()))]


def metadata_regions(path: Path) -> dict[str, list[tuple[int, int]]]:
    """(offset, size) of the bytes of each part of a version file's metadata, by part: the root
    group's attributes (its header and the heap blocks that hold them), /inputs and /diagnostics
    (headers and values), /meta/spec (its header and the heap object holding its text), the
    attributes of each split's groups and datasets (their headers), and the row checksums."""
    from h5forge._format.names import DIAGNOSTICS, SPLITS

    data = path.read_bytes()
    parts: dict[str, list[tuple[int, int]]] = {k: [] for k in (
        "root attributes", "inputs", "diagnostics", "meta/spec", "dataset attributes", "checksums")}
    with h5py.File(path, "r") as f:
        parts["root attributes"].append(_header(f))
        at = data.find(b"FHDB")
        while at >= 0:
            parts["root attributes"].append(_block_at(data, at))
            at = data.find(b"FHDB", at + 4)
        for part in ("inputs", DIAGNOSTICS):
            if part not in f:
                continue
            parts[part if part == "inputs" else "diagnostics"].append(_header(f[part]))
            f[part].visititems(lambda _n, o, p=part: parts[p if p == "inputs" else "diagnostics"].extend(
                [_header(o), *(_storage(o) if isinstance(o, h5py.Dataset) else [])]))
        spec = f["meta/spec"]
        parts["meta/spec"].append(_header(spec))
        text = spec[()]
        if (at := data.find(text)) >= 0:
            parts["meta/spec"].append((at, len(text)))
        for split in SPLITS:
            if split not in f:
                continue
            parts["dataset attributes"].append(_header(f[split]))
            f[split].visititems(lambda _n, o: parts["dataset attributes"].append(_header(o)))
            parts["checksums"].extend(_storage(f[split]["checksum"]))
    return {k: sorted(v) for k, v in parts.items() if v}


def file_view(path: Path) -> object:
    """What ``reader_view`` returns, plus every attribute of every object (but the dimension-scale
    references) and every value under /inputs, /diagnostics and /meta: all a user can see of the
    file besides its stored rows' bytes. A read that fails is part of the view (as its error)."""
    from h5forge._format.codecs import ensure_filters

    ensure_filters()
    seen: dict[str, object] = {}

    def attrs(obj) -> object:
        return {k: _plain(obj.attrs[k]) for k in sorted(obj.attrs) if k not in ("DIMENSION_LIST", "REFERENCE_LIST")}

    def visit(name, obj):
        try:
            seen[name] = attrs(obj)
            if isinstance(obj, h5py.Dataset) and name.split("/")[0] in ("inputs", "diagnostics", "meta"):
                seen[name + "[()]"] = _plain(obj[()])
        except Exception as err:  # noqa: BLE001 - a failing read is what the caller compares
            seen[name] = ("error", type(err).__name__)

    try:
        with h5py.File(path, "r") as f:
            seen["/"] = attrs(f)
            f.visititems(visit)
    except Exception as err:  # noqa: BLE001
        seen["/"] = ("error", type(err).__name__)
    return (reader_view(path), _plain(seen))
