"""The single writer of one version file: batched, chunk-aligned appends with bounded memory.

Samples arrive in a deterministic order; each is buffered in its split until a whole number of
chunks is ready, then written with one resize + slice assignment per dataset. Memory held here is
at most ``write_rows`` samples per split.
"""

from __future__ import annotations

import getpass
import json
import platform
import socket
import time
from datetime import datetime, timezone
from pathlib import Path

import h5py
import numpy as np

from h5forge import __version__
from h5forge.ingest.clean import CleanedBatch
from h5forge.format.codecs import CODECS, codec_options, ensure_filters
from h5forge.ingest.discover import Rejection
from h5forge.format.layout import FORMAT, FORMAT_VERSION, HEX, REJECTION_COLUMNS, SPLITS, STR
from h5forge.spec import DatasetSpec, ImageField

SMALL_ROWS = 1024  # rows per chunk of the per-sample columns (ids, hashes, annotations)
SMALL_CODEC = {"compression": "gzip", "compression_opts": 1}  # portable; these are tiny
_COLUMN_DTYPES = {"str": STR, "int": np.int64, "float": np.float64, "bool": np.bool_}


class _SplitBuffer:
    def __init__(self) -> None:
        self.arrays: dict[str, list[np.ndarray]] = {}
        self.rows: dict[str, list] = {}
        self.n = 0

    def clear(self) -> None:
        self.arrays.clear()
        self.rows.clear()
        self.n = 0


class DatasetWriter:
    """Create ``path`` and append cleaned samples to it; ``finish`` writes the summaries."""

    def __init__(self, path: str | Path, spec: DatasetSpec, version: int, parent_version: int | None = None):
        ensure_filters()
        self.path = Path(path)
        self.spec = spec
        self.fields = list(spec.fields)
        self.columns = dict(spec.annotations.columns)
        chunk = spec.storage.chunk_rows
        self.write_rows = chunk * max(1, -(-64 // chunk))  # >= 64 rows, whole chunks
        self.counts = {s: 0 for s in SPLITS}
        self.histograms: dict[str, dict[str, np.ndarray]] = {}
        self.rejections: list[Rejection] = []
        self.started = time.perf_counter()
        self._buffers = {s: _SplitBuffer() for s in SPLITS}
        self.file = h5py.File(self.path, "w")
        self._create(version, parent_version)

    # ---- structure ---------------------------------------------------------------------------
    def _create(self, version: int, parent_version: int | None) -> None:
        spec, f = self.spec, self.file
        f.attrs.update({
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "name": spec.name,
            "description": spec.description,
            "version": version,
            "parent_version": parent_version if parent_version is not None else -1,
            "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "creator": f"{getpass.getuser()}@{socket.gethostname()}",
            "h5forge_version": __version__,
            "h5py_version": h5py.version.version,
            "hdf5_version": h5py.version.hdf5_version,
            "python_version": platform.python_version(),
            "codec": spec.storage.codec,
            "codec_needs": CODECS[spec.storage.codec].needs,
            "fields": self.fields,
        })
        f.create_dataset("meta/spec", data=spec.to_json(), dtype=STR)
        opts = codec_options(spec.storage.codec)
        chunk = spec.storage.chunk_rows
        nf = len(self.fields)
        for split in SPLITS:
            g = f.create_group(split)
            g.attrs["fields"] = self.fields
            for name in self.fields:
                shape = spec.field_shape(name)
                g.create_dataset(name, shape=(0, *shape), maxshape=(None, *shape), dtype=np.uint8,
                                 chunks=(chunk, *shape), **opts)
            g.create_dataset("ids", shape=(0,), maxshape=(None,), dtype=STR, chunks=(SMALL_ROWS,))
            g.create_dataset("source_files", shape=(0, nf), maxshape=(None, nf), dtype=STR, chunks=(SMALL_ROWS, nf))
            g.create_dataset("source_sha256", shape=(0, nf), maxshape=(None, nf), dtype=HEX,
                             chunks=(SMALL_ROWS, nf), **SMALL_CODEC)
            g.create_dataset("checksum", shape=(0,), maxshape=(None,), dtype=HEX, chunks=(SMALL_ROWS,), **SMALL_CODEC)
            g["source_sha256"].attrs["fields"] = self.fields
            for col, kind in self.columns.items():
                dtype = _COLUMN_DTYPES[kind]
                g.create_dataset(f"meta/{col}", shape=(0,), maxshape=(None,), dtype=dtype, chunks=(SMALL_ROWS,),
                                 **({} if dtype == STR else SMALL_CODEC))

    # ---- data --------------------------------------------------------------------------------
    def add(self, batch: CleanedBatch) -> int:
        """Buffer a cleaned batch; writes whole chunks as they fill. Returns samples accepted."""
        self.rejections.extend(batch.rejections)
        for field, per_split in batch.histograms.items():
            acc = self.histograms.setdefault(field, {})
            for split, hist in per_split.items():
                acc[split] = acc.get(split, 0) + hist
        for i, split in enumerate(batch.splits):
            buf = self._buffers[split]
            for name in self.fields:
                buf.arrays.setdefault(name, []).append(batch.arrays[name][i])
            rows = buf.rows
            rows.setdefault("ids", []).append(batch.ids[i])
            rows.setdefault("source_files", []).append(batch.files[i])
            rows.setdefault("source_sha256", []).append(batch.source_sha256[i])
            rows.setdefault("checksum", []).append(batch.checksums[i])
            for col in self.columns:
                rows.setdefault(f"meta/{col}", []).append(batch.columns[i][col])
            buf.n += 1
            if buf.n >= self.write_rows:
                self._flush(split)
        return len(batch)

    def _flush(self, split: str) -> None:
        buf = self._buffers[split]
        if buf.n == 0:
            return
        g = self.file[split]
        start, stop = self.counts[split], self.counts[split] + buf.n
        for name in self.fields:
            _extend(g[name], start, stop, np.stack(buf.arrays[name]))
        for key, values in buf.rows.items():
            dset = g[key]
            data = np.asarray(values, dtype=object if dset.dtype == STR else dset.dtype)
            _extend(dset, start, stop, data)
        self.counts[split] = stop
        buf.clear()

    def add_rejections(self, rejections: list[Rejection]) -> None:
        self.rejections.extend(rejections)

    # ---- summaries ---------------------------------------------------------------------------
    def finish(self, timings: dict[str, float] | None = None) -> dict:
        """Flush, write split statistics, index arrays and diagnostics; close. Returns a summary."""
        for split in SPLITS:
            self._flush(split)
        f = self.file
        for split in SPLITS:
            g = f[split]
            g.attrs["count"] = self.counts[split]
            for name, spec_field in self.spec.fields.items():
                if isinstance(spec_field, ImageField):
                    hist = self.histograms.get(name, {}).get(split)
                    if hist is None:
                        hist = np.zeros((spec_field.channels, 256), dtype=np.int64)
                    write_channel_stats(g, name, np.asarray(hist, dtype=np.int64))
            self._write_index(split)
        summary = self._diagnostics(timings or {})
        f.flush()
        f.close()
        return summary

    def _write_index(self, split: str) -> None:
        for col in self.spec.annotations.index_by:
            values = self.file[split][f"meta/{col}"][()]
            write_index(self.file, split, col, values)

    def _diagnostics(self, timings: dict[str, float]) -> dict:
        f = self.file
        d = f.require_group("diagnostics")
        raw = stored = 0
        split_bytes = {}
        for split in SPLITS:
            split_bytes[split] = 0
            for name in self.fields:
                ds = f[split][name]
                raw += ds.size * ds.dtype.itemsize
                split_bytes[split] += ds.id.get_storage_size()
            stored += split_bytes[split]
        timings = {**timings, "write_seconds": round(time.perf_counter() - self.started, 3)}
        summary = {
            "counts": dict(self.counts),
            "samples": sum(self.counts.values()),
            "rejected": len(self.rejections),
            "array_bytes_raw": int(raw),
            "array_bytes_stored": int(stored),
            "split_bytes": split_bytes,
            "compression_ratio": round(stored / raw, 4) if raw else 1.0,
            "codec": self.spec.storage.codec,
            "chunk_rows": self.spec.storage.chunk_rows,
            "timings": timings,
        }
        d.attrs["summary"] = json.dumps(summary)
        table = np.array([[getattr(r, c) for c in REJECTION_COLUMNS] for r in self.rejections], dtype=object)
        d.create_dataset("rejections", data=table.reshape(-1, len(REJECTION_COLUMNS)), dtype=STR,
                         maxshape=(None, len(REJECTION_COLUMNS)), chunks=(256, len(REJECTION_COLUMNS)))
        d["rejections"].attrs["columns"] = list(REJECTION_COLUMNS)
        return summary

    def abort(self) -> None:
        """Close without summaries (the caller deletes the file)."""
        try:
            self.file.close()
        except Exception:
            pass


def _extend(dset: h5py.Dataset, start: int, stop: int, data: np.ndarray) -> None:
    dset.resize(stop, axis=0)
    dset[start:stop] = data


def write_channel_stats(group: h5py.Group, field: str, hist: np.ndarray) -> None:
    """Per-channel mean/std of values/255 from exact 8-bit histograms (C, 256)."""
    levels = np.arange(256, dtype=np.float64) / 255.0
    n = hist.sum(axis=1).astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(n > 0, (hist * levels).sum(axis=1) / n, 0.0)
        var = np.where(n > 0, (hist * levels**2).sum(axis=1) / n - mean**2, 0.0)
    group.attrs[f"{field}_mean"] = mean.astype(np.float64)
    group.attrs[f"{field}_std"] = np.sqrt(np.maximum(var, 0.0))
    group.attrs[f"{field}_histogram"] = hist


def write_index(f: h5py.File, split: str, column: str, values: np.ndarray) -> None:
    """CSR-style index of rows by column value (see layout.py)."""
    keys = np.array([v.decode() if isinstance(v, bytes) else v for v in values], dtype=object)
    g = f.require_group(f"index/{split}/{column}")
    for name in ("values", "offsets", "rows"):
        if name in g:
            del g[name]
    if keys.size == 0:
        uniq, rows, offsets = np.zeros(0, dtype=object), np.zeros(0, np.int64), np.zeros(1, np.int64)
    else:
        order = np.argsort(keys.astype(str) if keys.dtype == object else keys, kind="stable")
        sorted_keys = keys[order]
        boundaries = [0] + [i for i in range(1, len(sorted_keys)) if sorted_keys[i] != sorted_keys[i - 1]]
        uniq = sorted_keys[boundaries]
        offsets = np.array(boundaries + [len(sorted_keys)], dtype=np.int64)
        rows = order.astype(np.int64)
    if uniq.dtype == object and all(isinstance(u, str) for u in uniq):
        g.create_dataset("values", data=uniq, dtype=STR)
    else:
        g.create_dataset("values", data=np.asarray(uniq.tolist()))
    g.create_dataset("offsets", data=offsets)
    g.create_dataset("rows", data=rows)
