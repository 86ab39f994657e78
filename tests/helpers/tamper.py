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
    from h5forge.ingest.clean import clean_batch
    from h5forge.ingest.discover import discover
    from h5forge.ingest.writer import DatasetWriter

    path.parent.mkdir(parents=True, exist_ok=True)
    spec = spec_for(raw, path.parent, size, chunk_rows=chunk_rows, codec=codec)
    inv = discover(spec)
    with DatasetWriter(path, spec, version=version) as w:
        w.add(clean_batch(spec, inv.root, inv.samples))
        return w.finish()


def thin_version(folder: Path, raw: Path, raw_new: Path) -> Path:
    """dataset_v0002.h5: a thin version over dataset_v0001.h5 (from ``raw``) and a delta (``raw_new``)."""
    from h5forge.spec import spec_from_json
    from h5forge.store.thin import write_thin

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
    from h5forge.format.codecs import ensure_filters
    from h5forge.format.layout import index_parts
    from h5forge.format.names import INDEX, SOURCE_FILES, SOURCE_SHA256, SPLITS
    from h5forge.kinds import ReadOptions, stored_kinds
    from h5forge.read.reader import SplitReader, model_batch
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
    return _plain(view)
