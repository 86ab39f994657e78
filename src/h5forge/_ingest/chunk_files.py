"""Chunk files: a cleaning worker writes its batch's compressed chunks to a file of its own in the
output folder's chunk folder (``.chunks/``) and hands back only their places, so the chunks never
travel through the dask connection (pickled, and TLS-encrypted on a LocalCluster) to the writer.

The writer reads a batch's file once, places the chunks as they are (``write_direct_chunk``, in
the deterministic order) and deletes it. A worker killed mid-write leaves a file nobody
references: dask runs its batch again, under a new name, and the folder is removed when the run
ends (or, after a SIGKILL of the whole run, by the next run's lock). A worker that cannot write
the folder, or whose file the writer cannot find (a cluster without storage shared with this
machine), falls back to sending the chunks as before.
"""

from __future__ import annotations

import contextlib
import shutil
import uuid
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from h5forge._format.chunk_codec import EncodedRows
from h5forge._format.names import FORMAT_VERSION, CHUNKS_DIR
from h5forge._ingest.clean import CleanedBatch, clean_batch
from h5forge._samples import SampleRef
from h5forge.spec import DatasetSpec

SUFFIX = ".chunks"


@dataclass
class ChunkFileRows:
    """Where a block of encoded rows sits in a chunk file: ``sizes[i]`` bytes of row ``i`` from
    ``offsets[i]``; what a worker returns in place of ``EncodedRows``."""

    codec: str
    shape: tuple[int, ...]
    dtype: np.dtype
    file: str  # name inside the chunk folder
    offsets: np.ndarray
    sizes: np.ndarray

    def __len__(self) -> int:
        return len(self.sizes)


def chunks_folder(spec: DatasetSpec) -> Path:
    return Path(spec.output.dir) / CHUNKS_DIR


def remove_folder(folder: Path) -> None:
    shutil.rmtree(folder, ignore_errors=True)


def write_chunk_file(batch: CleanedBatch, folder: Path) -> CleanedBatch:
    """``batch`` with its encoded rows written to one new file in ``folder`` and replaced by their
    places; the batch unchanged when it has none or the file cannot be written."""
    encoded = {path: block for path, block in batch.arrays.items() if isinstance(block, EncodedRows)}
    if not encoded or not len(batch):
        return batch
    name = uuid.uuid4().hex + SUFFIX
    path = folder / name
    places: dict[str, ChunkFileRows] = {}
    try:
        with open(path, "xb") as fh:
            at = 0
            for key, block in encoded.items():
                sizes = np.fromiter((len(c) for c in block.chunks), np.int64, len(block.chunks))
                offsets = at + np.concatenate(([0], np.cumsum(sizes)[:-1])).astype(np.int64)
                fh.writelines(block.chunks)
                at += int(sizes.sum())
                places[key] = ChunkFileRows(block.codec, block.shape, block.dtype, name, offsets, sizes)
    except OSError:  # not writable from this worker (full, read-only, not shared): send the chunks
        with contextlib.suppress(OSError):  # a read-only folder refuses the unlink as well
            path.unlink(missing_ok=True)
        return batch
    return replace(batch, arrays={**batch.arrays, **places})


def read_chunk_file(batch: CleanedBatch, folder: Path) -> CleanedBatch | None:
    """``batch`` with the rows of its chunk file as ``EncodedRows`` (slices of one read of the
    file, which is then deleted); None when the file is not there whole (written elsewhere)."""
    placed = {path: block for path, block in batch.arrays.items() if isinstance(block, ChunkFileRows)}
    if not placed:
        return batch
    (name,) = {block.file for block in placed.values()}
    path = folder / name
    try:
        data = memoryview(path.read_bytes())
    except OSError:
        return None
    if len(data) != sum(int(block.sizes.sum()) for block in placed.values()):
        return None
    path.unlink(missing_ok=True)

    def rows_of(block: ChunkFileRows) -> EncodedRows:
        chunks: list[bytes | memoryview] = [
            data[o : o + s] for o, s in zip(block.offsets.tolist(), block.sizes.tolist())
        ]
        return EncodedRows(block.codec, block.shape, block.dtype, chunks)

    return replace(batch, arrays={**batch.arrays, **{key: rows_of(block) for key, block in placed.items()}})


def clean_to_chunk_file(
    spec: DatasetSpec, root: str, refs: list[SampleRef], folder: str, format_version: int = FORMAT_VERSION
) -> CleanedBatch:
    """On a worker: clean ``refs`` and write their encoded rows to a chunk file in ``folder``."""
    return write_chunk_file(clean_batch(spec, root, refs, format_version=format_version), Path(folder))


def make_folder(spec: DatasetSpec) -> Path | None:
    """The run's chunk folder, empty; None when it cannot be made (workers then send chunks)."""
    folder = chunks_folder(spec)
    remove_folder(folder)
    try:
        folder.mkdir(parents=True)
    except OSError:
        return None
    return folder
