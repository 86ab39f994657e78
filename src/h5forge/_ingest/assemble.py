"""Mapped versions: assembled from the cleaning workers' own row files (``storage.assemble: mapped``).

Each worker writes the batch it cleaned as a small h5forge file of its own, in the version's
layout (``DatasetWriter``: the same chunks, statistics, sample keys, catalog), into the version's
rows folder ``dataset_vNNNN.rows/`` beside the version file, and hands back only the small
columns: ids, provenance, checksums, sample keys, statistics, rejections. The publisher writes
those into the version file and maps every sample array onto the workers' files with virtual
datasets, one mapping per batch and split (a run of consecutive rows), in the deterministic order:
it places no chunk. The version lists its files in its ``row_files`` attribute, as a thin version
does, so verify, the readers, export, appends, rebuilds, retention and rollback treat it as one.

A worker writes under a temporary name and renames the file when it is complete: a worker killed
mid-write leaves a partial file nobody references (dask runs the batch again under a new name),
removed when the version is finished. Rows a rebuild takes from earlier files are copied into a
self-contained version (``_ingest.incremental.reuse``): that is the compaction of a mapped one.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from dataclasses import dataclass, replace
from pathlib import Path

import h5py
import numpy as np

from h5forge.errors import UsageError
from h5forge._format.arrays import Ragged
from h5forge._format.catalog import ROW_BITS, Catalog
from h5forge._format.layout import SMALL_ROWS
from h5forge._format.names import CHECKSUM, FORMAT_VERSION, SPLITS, Attr, partial_name, rows_folder_name
from h5forge._format.row_files import map_virtual
from h5forge._format.summary import WriteSummary
from h5forge._ingest.clean import CleanedBatch, clean_batch
from h5forge._ingest.incremental.inputs import Inputs, rules_hash
from h5forge._ingest.writer import DatasetWriter
from h5forge._samples import SampleRef
from h5forge.spec import DatasetSpec
from h5forge._store.sizes import ArraySizes


@dataclass(frozen=True)
class RowFileTarget:
    """Where the cleaning workers write their files, and what the files record."""

    folder: str
    version: int
    rules: str
    format_version: int = FORMAT_VERSION


class RowFileWriter(DatasetWriter):
    """A worker's file of rows: the version's layout, statistics, indexed fields' row lists, sample
    keys and catalog, without what only a file read as a version needs (digests, diagnostics, axis
    names, annotation-column indexes: the version file has its own). Its small columns are chunked
    by the batch: a file holds one batch, and a chunk HDF5 cannot compress (strings, hashes) takes
    its whole size on disk however few rows it holds."""

    publishes = False

    def __init__(self, path: Path, spec: DatasetSpec, *args, rows: int, **kwargs):
        self.small_rows = max(1, min(SMALL_ROWS, rows))
        super().__init__(path, spec, *args, **kwargs)
        self.catalog: Catalog | None = None

    def _catalog(self) -> Catalog:
        self.catalog = super()._catalog()
        return self.catalog


def clean_to_file(spec: DatasetSpec, root: str, refs: list[SampleRef], target: RowFileTarget) -> CleanedBatch:
    """On a worker: clean ``refs``, write the rows to a new file in the target folder, return the
    small columns and the file's place."""
    batch = clean_batch(spec, root, refs, format_version=target.format_version)
    return write_row_file(batch, spec, target) if len(batch) else batch


def write_row_file(batch: CleanedBatch, spec: DatasetSpec, target: RowFileTarget) -> CleanedBatch:
    """``batch`` written to a file of its own; returned without its sample arrays, with the file's
    name, counts and sizes, and each row's checksum and sample key as the file stores them."""
    folder = Path(target.folder)
    name = f"{uuid.uuid4().hex}.h5"
    partial = folder / partial_name(name)
    inputs = Inputs(rules=target.rules, key="")
    w = RowFileWriter(
        partial, spec, target.version, rows=len(batch), inputs=inputs, format_version=target.format_version
    )
    with w:
        batch = replace(batch, checksums=w.provenance_rows(batch)[CHECKSUM], keys=w._sample_keys(batch))
        w.add(batch)
        summary = w.finish()
        bulk = {path: kind.stored() for path, kind in w.kinds.items() if kind.stored().bulk}
    os.replace(partial, folder / name)
    labels = np.asarray(batch.splits)
    elements = {  # a ragged field's values per split: what its mapping spans
        split: {
            path: int(block.lengths[labels == split].sum())
            for path, block in batch.arrays.items()
            if path in bulk and isinstance(block, Ragged)
        }
        for split in SPLITS
    }
    catalog = w.catalog  # the file's, rows in its own numbering: the publisher's is theirs together
    assert catalog is not None  # made by finish
    row_file = {
        "file": name,
        "catalog": (catalog.content, catalog.content_at, catalog.ids),
        "counts": dict(summary.counts),
        "elements": elements,
        "raw": summary.array_bytes_raw,
        "stored": summary.split_bytes,
    }
    small = {path: block for path, block in batch.arrays.items() if path not in bulk}
    return replace(batch, arrays=small, digests=[], row_file=row_file)


class MappedWriter(DatasetWriter):
    """The version file of a mapped build: the small columns written here, the sample arrays
    mapped onto the workers' row files when it finishes. It takes no row with its arrays (a
    version holds one kind of row: ``_ingest.build.Route`` writes a copy when rows are reused)."""

    def __init__(
        self,
        path: str | Path,
        spec: DatasetSpec,
        version: int,
        parent_version: int | None = None,
        inputs: Inputs | None = None,
        format_version: int = FORMAT_VERSION,
    ):
        super().__init__(path, spec, version, parent_version, inputs, format_version)
        self.folder = self.path.parent / rows_folder_name(version)
        shutil.rmtree(self.folder, ignore_errors=True)  # a killed run's, under the same number
        self.folder.mkdir()
        rules = inputs.rules if inputs is not None else rules_hash(spec, format_version)
        self.row_files_to = RowFileTarget(str(self.folder), version, rules, format_version)
        self.row_files: list[dict] = []
        self._catalogs: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # the workers' files'

    def __exit__(self, exc_type, exc, tb) -> None:
        if not self._finished:
            shutil.rmtree(self.folder, ignore_errors=True)
        super().__exit__(exc_type, exc, tb)

    def add(self, batch: CleanedBatch) -> int:
        if batch.row_file is None:  # a batch whose every sample was rejected
            if len(batch):
                raise RuntimeError("a mapped version got rows with their arrays")
            return super().add(batch)
        if not (self.folder / batch.row_file["file"]).is_file():
            raise UsageError(
                f"storage.assemble: mapped: the file a dask worker wrote, {self.folder / batch.row_file['file']}, "
                "is not visible from this machine; the workers and this process must share the output "
                "folder (or use storage.assemble: copy)"
            )
        row_file = dict(batch.row_file)
        content, at, ids = row_file.pop("catalog")
        for k, split in enumerate(SPLITS):  # the file's rows of each split follow the ones before
            at = np.where((at >> ROW_BITS) == k, at + self.next_row(split), at)
        self._catalogs.append((content, at, ids))
        self.row_files.append(row_file)
        return super().add(batch)

    def add_stored(self, split, values, copy_chunks, listed) -> None:
        raise RuntimeError("a mapped version got rows with their arrays")

    def checkpoint(self) -> dict:
        """No row is durable in the version file before it is finished (its sample arrays are
        mapped then): a killed build's file is never taken over."""
        return {
            **super().checkpoint(),
            "counts": {s: 0 for s in SPLITS},
            "stats": {},
            "listed": {s: {} for s in SPLITS},
        }

    def finish(self, timings: dict[str, float] | None = None) -> WriteSummary:
        if self.row_files:
            for split in SPLITS:
                self._flush(split, final=True)
            listed = self._map_arrays()
            self.file.attrs.update({Attr.ROW_FILES: json.dumps(listed), Attr.SELF_CONTAINED: False})
        summary = super().finish(timings)
        self._remove_unreferenced()
        return summary

    def _catalog(self) -> Catalog:
        """The workers' catalogs together, as ``catalog_from_rows`` makes it from the rows: the
        same raw content twice keeps the order of its rows."""
        if not self.row_files:
            return super()._catalog()
        content, at, ids = (np.concatenate(parts) for parts in zip(*self._catalogs))
        rows = np.argsort(at, kind="stable")
        content, at = content[rows], at[rows]
        order = np.argsort(content, kind="stable")
        return Catalog(content[order], at[order], np.sort(ids))

    def _listed(self) -> list[dict]:
        """The row files as the version's attribute lists them: paths relative to its folder."""
        return [{"file": f"{self.folder.name}/{s['file']}", "counts": s["counts"]} for s in self.row_files]

    def _map_arrays(self) -> list[dict]:
        """Every sample array of every split: a virtual dataset over the row files, in order."""
        listed = self._listed()
        with h5py.File(self.folder / self.row_files[0]["file"], "r") as first:
            for split in SPLITS:
                g = self._groups[split]
                for path, kind in self.kinds.items():
                    st = kind.stored()
                    if not st.bulk:
                        continue
                    for name in st.datasets(path):
                        lengths = None
                        if st.ragged and name == path:
                            lengths = [s["elements"][split][path] for s in self.row_files]
                        self._direct.pop((split, name), None)
                        del g[name]  # empty: its rows are the row files'
                        map_virtual(g, name, first[split][name], listed, split, lengths)
        return listed

    def _summary(self, timings: dict[str, float]) -> WriteSummary:
        summary = super()._summary(timings)
        if not self.row_files:
            return summary
        parts = (ArraySizes(s["raw"], sum(s["stored"].values()), s["stored"]) for s in self.row_files)
        sizes = sum(parts, ArraySizes(0, 0, {s: 0 for s in SPLITS}))
        return summary.with_(row_files=len(self.row_files), **sizes.summary())

    def _remove_unreferenced(self) -> None:
        """Files no row of the version is in: a killed worker's, a batch all of whose samples
        were rejected."""
        kept = {s["file"] for s in self.row_files}
        for p in self.folder.iterdir():
            if p.name not in kept:
                p.unlink(missing_ok=True)
