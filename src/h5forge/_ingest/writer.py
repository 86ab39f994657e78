"""The single writer of one version file: batched, chunk-aligned appends with bounded memory.

Samples arrive in a deterministic order. A fixed-size sample field's rows are written as soon as
they fill whole chunks (the rest of a chunk waits for its rows); the small columns (and ragged
fields) of each split wait until at least a block of rows is ready, then are written with one
resize + slice assignment per dataset. Memory held here is at most one block plus one batch per
split. What is stored, and how, is each field kind's call.

    with DatasetWriter(path, spec, version=3, parent_version=2) as writer:
        for batch in batches:
            writer.add(batch)
        summary = writer.finish(timings)
A writer left by an exception (or without ``finish``) deletes its file.
"""

from __future__ import annotations

import getpass
import os
import platform
import socket
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

import h5py
import numpy as np

from h5forge import __version__
from h5forge._format import arrays
from h5forge._format.arrays import Ragged
from h5forge._format.catalog import KEY, Catalog, catalog_from_rows, create_sample_keys, sample_keys_path, write_catalog
from h5forge._format.checksums import row_checksum, write_digests, write_file_digest
from h5forge._format.chunk_codec import EncodedRows, accepts, append_chunks
from h5forge._format.codecs import CODECS, codec_options, ensure_filters
from h5forge._format.dims import name_axes
from h5forge._format.layout import SMALL_ROWS, STR, provenance_layout, small_options, write_index, write_index_lists
from h5forge._format.names import (
    CHECKSUM,
    FORMAT,
    FORMAT_VERSION,
    IDS,
    SOURCE_FILES,
    SOURCE_SHA256,
    SPEC,
    SPLITS,
    Attr,
    block_rows,
    column_path,
)
from h5forge._format.summary import WriteSummary, write_diagnostics
from h5forge._ingest.clean import CleanedBatch
from h5forge._ingest.incremental.inputs import Inputs, sample_key
from h5forge.kinds import FieldKind, file_fields, sample_bytes, stored_kinds
from h5forge.kinds.index import RowIndex
from h5forge.kinds.statistics import Statistics
from h5forge._samples import Rejection
from h5forge.spec import DatasetSpec
from h5forge._store.disk_full import as_disk_full, discard_h5
from h5forge._store.sizes import own_sizes


def _gather(pairs: list[tuple], n: int):
    """The rows ``rows`` of each block, end to end. Sample arrays are copied row by row into one
    new array: one copy (fancy indexing then concatenating would copy twice)."""
    encoded = [isinstance(block, EncodedRows) for block, _ in pairs]
    if any(encoded) and not all(encoded):  # rows of batches encoded and not: as arrays, in order
        pairs = [(block.decoded() if enc else block, rows) for (block, rows), enc in zip(pairs, encoded)]
    first = pairs[0][0]
    if isinstance(first, EncodedRows):
        return EncodedRows.concat([block[rows] for block, rows in pairs])
    if isinstance(first, Ragged):
        return Ragged.concat([block[rows] for block, rows in pairs])
    if first.dtype == object:
        return np.concatenate([block[rows] for block, rows in pairs])
    out = np.empty((n, *first.shape[1:]), first.dtype)
    at = 0
    for block, rows in pairs:
        if len(rows) and rows[-1] - rows[0] == len(rows) - 1:  # consecutive rows (rows taken from a file): one slice
            out[at : at + len(rows)] = block[rows[0] : rows[-1] + 1]
            at += len(rows)
            continue
        for i in rows:
            out[at] = block[i]
            at += 1
    return out


def _rest(data: Any, take: int, n: int) -> list[tuple]:
    """The buffer of rows ``take:n`` of ``data`` once the first ``take`` are written (an array's
    copied, so the blocks they came from are freed)."""
    rest = data[take:]
    return [(rest.copy() if isinstance(rest, np.ndarray) else rest, np.arange(n - take))] if take < n else []


@dataclass
class Durable:
    """The rows of each split a killed build's file at the writer's path holds, durable, that the
    writer continues after (``h5forge._ingest.incremental.take_over`` cut the file back to
    them), with their statistics and index values."""

    counts: dict[str, int]
    stats: dict[str, dict[str, np.ndarray]]
    listed: dict[str, dict[str, list]]


FLUSH_SECONDS = 1.0  # between the file's flushes while rows are written (each writes the metadata)
FIXED_WRITE_BYTES = 4 << 20  # a fixed-size field's buffered rows are written once they hold this much


class DatasetWriter:
    """Create ``path`` and append cleaned samples to it; ``finish`` writes the summaries.

    With ``durable``, the file at ``path`` is a killed build's, already cut back to those rows:
    the writer takes it over and appends after them."""

    # False for a file whose rows a version maps (a worker's row file): no digests, diagnostics,
    # axis names or annotation-column indexes, which only a file read as a version needs
    publishes = True
    small_rows: int | None = None  # rows per chunk of the small columns; None: the format's default

    def __init__(
        self,
        path: str | Path,
        spec: DatasetSpec,
        version: int,
        parent_version: int | None = None,
        inputs: "Inputs | None" = None,
        format_version: int = FORMAT_VERSION,
        durable: Durable | None = None,
    ):
        ensure_filters()
        self.format_version = format_version  # an append's delta keeps its parent's (one hash per version)
        self.path = Path(path)
        self.spec = spec
        self.kinds: dict[str, FieldKind] = stored_kinds(spec)
        self.fields = list(spec.fields)
        self.file_fields = file_fields(self.kinds)
        self.write_rows = block_rows(spec.storage.chunk_rows)
        self.counts = {s: 0 for s in SPLITS}
        self.stats: dict[str, dict[str, np.ndarray]] = {}
        self.rejections: list[Rejection] = []
        self.started = time.perf_counter()
        self._buffers: dict[str, dict[str, list[tuple]]] = {s: {} for s in SPLITS}  # (block, rows) pairs
        self._buffered = {s: 0 for s in SPLITS}
        self._flush_due = 0.0  # time.monotonic() of the next block's flush
        self._indexed: dict[str, dict[str, list]] = {
            s: {p: [] for p, k in self.kinds.items() if isinstance(k, RowIndex)} for s in SPLITS
        }
        self._finished = False
        self._direct: dict[tuple, tuple] = {}  # (split, path) -> (dataset, takes workers' chunks; None: not yet asked)
        self._bulk = [path for path, kind in self.kinds.items() if kind.stored().bulk]
        self._fixed = {path for path in self._bulk if not self.kinds[path].stored().ragged}
        self._fixed_row_bytes = sample_bytes(spec)  # the fixed-size fields' stored bytes of one row
        self.inputs = inputs  # the build's input hashes: each row's sample key, the file's input key
        # freed file space is never reused, so after a SIGKILL every row written before the last
        # checkpoint is still where the flushed metadata says (a resumed build continues after them)
        if durable is None:
            self.file = _create_file(self.path)
            self._create(version, parent_version)
        else:
            self.file = _open_file(self.path)
            self._header(version, parent_version)
            self.counts = dict(durable.counts)
            self.stats = {p: dict(per) for p, per in durable.stats.items()}
            for split, per in durable.listed.items():
                for path, listed in per.items():
                    self._indexed[split][path].extend(listed)
        self._groups: dict[str, h5py.Group] = {split: self.file[split] for split in SPLITS}
        # the sample datasets keep HDF5's default chunk cache (rows arrive in blocks smaller than
        # a chunk) and stay open until the file closes: their cached chunks are written by the
        # explicit flush of each block, never by a dropped handle
        names: list[str] = []
        self.file.visititems(lambda name, obj: names.append(name) if isinstance(obj, h5py.Dataset) else None)
        self._held: list[h5py.Dataset] = [_open_cached(self.file, name) for name in names]

    def __enter__(self) -> "DatasetWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if not self._finished:
            discard_h5(self.file, self.path)  # emptied first: closes cleanly even on a full disk
            full = as_disk_full(exc, self.path) if exc is not None else None
            if full is not None:
                raise full from None

    # ---- structure ---------------------------------------------------------------------------
    def _provenance(self) -> dict[str, tuple[tuple[int, ...], object]]:
        return provenance_layout(len(self.file_fields))

    def _header(self, version: int, parent_version: int | None) -> None:
        """The file's attributes and stored spec (rewritten when a resumed build takes a file over)."""
        spec, f = self.spec, self.file
        f.attrs.update(
            {
                Attr.FORMAT: FORMAT,
                Attr.FORMAT_VERSION: self.format_version,
                Attr.NAME: spec.name,
                Attr.DESCRIPTION: spec.description,
                Attr.VERSION: version,
                Attr.PARENT: parent_version if parent_version is not None else -1,
                Attr.CREATED: datetime.now(timezone.utc).isoformat(timespec="seconds"),
                Attr.CREATOR: f"{getpass.getuser()}@{socket.gethostname()}",
                "h5forge_version": __version__,
                "h5py_version": h5py.version.version,
                "hdf5_version": h5py.version.hdf5_version,
                "python_version": platform.python_version(),
                Attr.CODEC: spec.storage.codec,
                Attr.CODEC_NEEDS: "; ".join(dict.fromkeys(CODECS[c].needs for c in self._codecs())),
                Attr.FIELDS: self.fields,
            }
        )
        if SPEC in f:
            del f[SPEC]
        f.create_dataset(SPEC, data=spec.to_json(), dtype=STR)

    def _create(self, version: int, parent_version: int | None) -> None:
        spec, f = self.spec, self.file
        self._header(version, parent_version)
        chunk = spec.storage.chunk_rows
        for split in SPLITS:
            g = f.create_group(split)
            g.attrs[Attr.FIELDS] = self.fields
            for path, kind in self.kinds.items():
                st = kind.stored()
                options = codec_options(st.codec_of(spec.storage.codec)) if st.bulk else small_options(st.dtype)
                ds = arrays.create(g, path, st, st.chunk(chunk, self.small_rows or SMALL_ROWS), options)
                ds.attrs.update({Attr.KIND: kind.kind, **kind.dataset_attrs()})
            for key, (shape, dtype) in self._provenance().items():
                rows = (self.small_rows or SMALL_ROWS, *shape)
                g.create_dataset(key, (0, *shape), dtype, maxshape=(None, *shape), chunks=rows, **small_options(dtype))
            g[SOURCE_SHA256].attrs[Attr.FIELDS] = self.file_fields
        create_sample_keys(f, *((self.small_rows,) if self.small_rows else ()))

    def _codecs(self) -> list[str]:
        """Every codec the file's sample arrays use: the spec's, and any a field kind picks."""
        return [self.spec.storage.codec, *(c for c in (k.stored().codec for k in self.kinds.values()) if c)]

    # ---- data --------------------------------------------------------------------------------
    def add(self, batch: CleanedBatch) -> int:
        """Buffer a cleaned batch; writes whole blocks as they fill. Returns samples accepted."""
        self.rejections.extend(batch.rejections)
        for path, per_split in batch.stats.items():
            for split, counts in per_split.items():
                self.add_stats(path, split, counts)
        labels = np.asarray(batch.splits)
        provenance = self.provenance_rows(batch)
        keys = batch.keys if batch.keys is not None else self._sample_keys(batch)  # once per batch
        for split in sorted(set(batch.splits)):
            rows = np.flatnonzero(labels == split)
            blocks = {**batch.arrays, **provenance, sample_keys_path(split): keys}
            self._buffer(split, blocks, rows, {p: [batch.listed[p][i] for i in rows] for p in self._indexed[split]})
        return len(batch)

    def _buffer(self, split: str, blocks: dict[str, Any], rows: np.ndarray, listed: dict[str, list]) -> None:
        """Buffer ``rows`` of each dataset's block (copied once, when written) and their index values;
        writes whole chunks of the fixed fields once they hold ``FIXED_WRITE_BYTES`` (many short runs
        of small rows make one write) and whole blocks."""
        buf = self._buffers[split]
        for path, block in blocks.items():
            buf.setdefault(path, []).append((block, rows))
        for path, values in listed.items():
            self._indexed[split][path].extend(values)
        self._buffered[split] += rows.size
        waiting = self._fixed & buf.keys()
        if waiting and sum(len(r) for _, r in buf[next(iter(waiting))]) * self._fixed_row_bytes >= FIXED_WRITE_BYTES:
            for path in waiting:
                self._write_fixed(split, path, final=False)
        if self._buffered[split] >= self._block(split):
            self._flush(split, final=False)

    def provenance_rows(self, batch: CleanedBatch) -> dict[str, np.ndarray]:
        """The batch's ids, source files, their hashes and row checksums, as stored."""
        nf = len(self.file_fields)
        provenance = {
            IDS: np.asarray(batch.ids, dtype=object),
            SOURCE_FILES: np.asarray(batch.files, dtype=object).reshape(len(batch), nf),
            SOURCE_SHA256: np.asarray(batch.source_sha256, dtype="S64").reshape(len(batch), nf),
        }
        if batch.checksums is not None:  # made where the rows were written (a worker's row file)
            provenance[CHECKSUM] = batch.checksums
            return provenance
        # completed here, with the provenance as stored (an append rewrites source paths after cleaning)
        ids, files, hashes = provenance[IDS], provenance[SOURCE_FILES], provenance[SOURCE_SHA256]
        sums = [row_checksum(d, ids[i], files[i], hashes[i], self.format_version) for i, d in enumerate(batch.digests)]
        provenance[CHECKSUM] = np.asarray(sums, dtype="S64")
        return provenance

    def _block(self, split: str) -> int:
        """Rows to buffer before a write: a block of sample rows while ragged sample arrays wait in
        the buffer; else one whole chunk of the small columns (each compressed chunk of ids, hashes,
        keys is then written once, not rewritten every block)."""
        buf = self._buffers[split]
        return self.write_rows if any(buf.get(path) for path in self._bulk if path not in self._fixed) else SMALL_ROWS

    def _flush(self, split: str, final: bool) -> None:
        """Write the buffered rows of ``split``: whole chunks only, unless ``final`` (the few rows of
        a partial chunk stay for the next write, so no compressed chunk is written twice)."""
        n = self._buffered[split]
        take = n if final else n - n % self.spec.storage.chunk_rows
        if final:  # a fixed field's rows wait for their chunk on a count of their own, which may
            # be non-zero when the small columns have nothing left (the field ends inside a chunk)
            for path in self._fixed & self._buffers[split].keys():
                self._write_fixed(split, path, final=True)
        if take == 0:
            return
        g = self.file[split]
        buf = self._buffers[split]
        for path, pairs in buf.items():
            if path in self._fixed:
                self._write_fixed(split, path, final)
                continue
            data = _gather(pairs, n)
            arrays.extend(g, path, data[:take])
            buf[path] = _rest(data, take, n)
        self.counts[split] += take
        self._buffered[split] = n - take
        if time.monotonic() >= self._flush_due:  # a full disk raises here, as an error the run reports
            self.file.flush()
            self._flush_due = time.monotonic() + FLUSH_SECONDS

    def _write_fixed(self, split: str, path: str, final: bool) -> None:
        """Write the buffered rows of a fixed-size sample field up to the last chunk boundary of
        its dataset they reach (all of them when ``final``); the rest wait for the rows that
        complete their chunk, so no compressed chunk is written twice."""
        pairs = self._buffers[split].get(path)
        if not pairs:
            return
        n = sum(len(rows) for _, rows in pairs)
        ds = self._dataset(split, path)
        take = n if final else n - (ds.shape[0] + n) % ds.chunks[0]
        if take <= 0:
            return
        data = _gather(pairs, n)
        if isinstance(data, EncodedRows):
            self._write_chunks(split, path, data[:take])
        else:
            arrays.extend(self._groups[split], path, data[:take])
        self._buffers[split][path] = _rest(data, take, n)

    def _dataset(self, split: str, path: str) -> h5py.Dataset:
        """A sample dataset, and whether it takes the workers' chunks as they are (``_write_chunks``),
        looked up once (opening by name costs per call)."""
        key = (split, path)
        if key not in self._direct:
            self._direct[key] = (self._groups[split][path], None)
        return self._direct[key][0]

    def _write_chunks(self, split: str, path: str, rows: EncodedRows) -> None:
        """Rows a cleaning worker compressed, one chunk each: placed as they are, or joined into
        chunks of several rows, from a chunk boundary of the dataset on. A dataset whose layout or
        filters are not what the chunks were made for gets the decoded rows instead, and so do the
        rows that complete a partial last chunk (a checkpoint writes one) or start one."""
        key, ds = (split, path), self._dataset(split, path)
        direct = self._direct[key][1]
        if direct is None:
            direct = accepts(ds, rows.codec, rows.shape, rows.dtype)
            self._direct[key] = (ds, direct)
        k = ds.chunks[0]
        head = min(-ds.shape[0] % k, len(rows)) if direct else len(rows)
        whole = (len(rows) - head) // k * k
        if head:
            arrays.extend(self._groups[split], path, rows[:head].decoded())
        if whole:
            append_chunks(ds, rows[head : head + whole].joined(k), rows=k)
        if head + whole < len(rows):
            arrays.extend(self._groups[split], path, rows[head + whole :].decoded())

    def _sample_keys(self, batch: CleanedBatch) -> np.ndarray:
        """Each row's sample key: the build's, or made from what the batch holds (an append)."""
        known = self.inputs.samples if self.inputs is not None else {}
        columns = {k.annotation_column: p for p, k in self.kinds.items() if k.annotation_column}

        def made(i: int, sid: str):
            values = {c: batch.arrays[p][i] for c, p in columns.items()}
            return sample_key(sid, batch.splits[i], batch.files[i], batch.source_sha256[i], values)

        return np.array([known.get(sid) or made(i, sid) for i, sid in enumerate(batch.ids)], dtype=KEY)

    def add_stored(
        self, split: str, values: dict[str, Any], copy_chunks: Callable[[h5py.Group], None], listed: dict[str, list]
    ) -> None:
        """Rows taken from another file (nightly reuse, resume), after the rows added so far:
        ``values``, every dataset's rows as stored (buffered as cleaned rows are, so many short runs
        cost one write per block), but the datasets ``copy_chunks(split group)`` appends to as their
        compressed chunks, one row each (such a dataset never holds buffered rows). Their
        statistics come through ``add_stats``."""
        for path in self._fixed & self._buffers[split].keys():  # the rows before them, first
            self._write_fixed(split, path, final=False)
        copy_chunks(self.file[split])
        self._buffer(split, values, np.arange(len(values[IDS])), listed)

    def next_row(self, split: str) -> int:
        """The row number the next sample of ``split`` will get."""
        return self.counts[split] + self._buffered[split]

    def add_stats(self, path: str, split: str, counts: np.ndarray) -> None:
        acc = self.stats.setdefault(path, {})
        acc[split] = acc[split] + counts if split in acc else counts

    def checkpoint(self) -> dict:
        """Write every buffered row and flush the file: what is returned (rows per split, their
        statistics and index values) describes rows that survive a SIGKILL from here on."""
        for split in SPLITS:
            self._flush(split, final=True)
        self.file.flush()
        return {
            "counts": dict(self.counts),
            "stats": {p: {s: np.asarray(c).tolist() for s, c in per.items()} for p, per in self.stats.items()},
            "listed": {s: {p: list(v) for p, v in per.items()} for s, per in self._indexed.items()},
        }

    def add_rejections(self, rejections: list[Rejection]) -> None:
        self.rejections.extend(rejections)

    # ---- summaries ---------------------------------------------------------------------------
    def finish(self, timings: dict[str, float] | None = None) -> WriteSummary:
        """Flush, write split statistics, index arrays and diagnostics; close. Returns the summary."""
        f = self.file
        for split in SPLITS:
            self._flush(split, final=True)
            g = f[split]
            short = {p: g[p].shape[0] for p in self._fixed if g[p].shape[0] != self.counts[split]}
            if short:  # rows and their ids out of step: never published
                raise RuntimeError(f"{split}: {short} rows written, not {self.counts[split]}")
            g.attrs[Attr.COUNT] = self.counts[split]
            for path, kind in self.kinds.items():
                if isinstance(kind, Statistics):
                    kind.write_stats(g, self.stats.get(path, {}).get(split))
            for col in self.spec.annotations.index_by if self.publishes else ():
                write_index(f, split, col, g[column_path(col)][()])
            for path, listed in self._indexed[split].items():
                write_index_lists(f, split, path, listed)
            if self.publishes:
                name_axes(g, self.counts[split])
        write_catalog(f, self._catalog(), *((self.inputs.key, self.inputs.rules) if self.inputs else ()))
        summary = self._summary(timings or {})
        if self.publishes:
            write_digests(f)
            write_diagnostics(f, summary)
            write_file_digest(f)
        f.flush()
        self._held, self._direct, self._groups = [], {}, {}
        f.close()
        self._finished = True
        return summary

    def _catalog(self) -> Catalog:
        """The inputs catalog of every row written (what an append checks exactly-once against)."""
        return catalog_from_rows(self.file)

    def _summary(self, timings: dict[str, float]) -> WriteSummary:
        sizes = own_sizes(self.file, self.kinds)
        return WriteSummary(
            counts=dict(self.counts),
            samples=sum(self.counts.values()),
            **sizes.summary(),
            codec=self.spec.storage.codec,
            chunk_rows=self.spec.storage.chunk_rows,
            timings={**timings, "write_seconds": round(time.perf_counter() - self.started, 3)},
            rejections=tuple(self.rejections),
        )


def _file_access() -> h5py.h5p.PropFAID:
    fapl = h5py.h5p.create(h5py.h5p.FILE_ACCESS)
    fapl.set_libver_bounds(h5py.h5f.LIBVER_EARLIEST, h5py.h5f.LIBVER_LATEST)
    mdc, slots, _, w0 = fapl.get_cache()
    fapl.set_cache(mdc, slots, 0, w0)
    fapl.set_sieve_buf_size(0)
    return fapl


def _open_file(path: Path) -> h5py.File:
    """A killed build's file, opened for writing with the access ``_create_file`` gives a new one
    (its creation properties, freed space never reused among them, are the file's own)."""
    return h5py.File(h5py.h5f.open(os.fsencode(path), h5py.h5f.ACC_RDWR, fapl=_file_access()))


def _create_file(path: Path) -> h5py.File:
    """A new file for the writer, as ``h5py.File(path, "w", fs_strategy="none")`` makes it, but
    with neither a chunk cache nor a sieve buffer by default: a dataset created after the sample
    datasets (statistics, indexes, the catalog, written whole by ``finish``) then writes its data
    in the call that writes it, where a full disk raises. Buffered, the data would be written when
    the dataset's last handle is dropped, where an error (ENOSPC) can only be printed by h5py, and
    the library is then left in a state that crashes it at the next flush (segmentation fault)."""
    fapl = _file_access()
    fcpl = h5py.h5p.create(h5py.h5p.FILE_CREATE)
    fcpl.set_obj_track_times(False)
    fcpl.set_file_space_strategy(h5py.h5f.FSPACE_STRATEGY_NONE, False, 1)
    return h5py.File(h5py.h5f.create(os.fsencode(path), h5py.h5f.ACC_TRUNC, fapl=fapl, fcpl=fcpl))


def _open_cached(f: h5py.File, name: str) -> h5py.Dataset:
    """``f[name]`` opened with HDF5's default chunk cache (the file's own default is none)."""
    _, slots, nbytes, w0 = h5py.h5p.create(h5py.h5p.FILE_ACCESS).get_cache()
    dapl = h5py.h5p.create(h5py.h5p.DATASET_ACCESS)
    dapl.set_chunk_cache(slots, nbytes, w0)
    return h5py.Dataset(h5py.h5d.open(f.id, name.encode(), dapl))
