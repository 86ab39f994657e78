"""The parts of a spec that do not depend on the layout: the header (where the spec came from, the
notes, the source root relative to the spec's folder) and the footer (splits, storage, output,
compute), each key commented with its alternatives."""

from __future__ import annotations

import os
from pathlib import Path


from h5forge._init.text import SpecText, scalar

MAX_REJECTED = 0.1  # the share of rejected inputs the written spec allows (max_rejected)
# the stored bytes of the samples one chunk holds: fewer, larger chunks make the file's chunk index
# and the reader's small, while a row is still read alone (benchmarks/results/read_masks_chunks.md)
CHUNK_BYTES = 64 << 10
MAX_CHUNK_ROWS = 4096  # storage.chunk_rows' limit


def chunk_rows(nbytes: int) -> int:
    """Samples per chunk: the largest power of two of them that ``CHUNK_BYTES`` holds; 1 for a
    sample of more than half that (or none: no fixed-size array)."""
    if nbytes <= 0:
        return 1
    return min(MAX_CHUNK_ROWS, 1 << max(0, (CHUNK_BYTES // nbytes).bit_length() - 1))


def header(t: SpecText, raw: Path, spec_path: Path, name: str, notes: list[str], ids: str | None = None) -> None:
    t.comment(0, f"h5forge spec inferred by `h5forge init` from {raw}")
    t.comment(0, "Relative paths are resolved against this file's folder. Review, then `h5forge build` it.")
    for note in notes:
        t.comment(0, f"note: {note}")
    t(0, f"name: {name}")
    t(0, "description: ''")
    t(0, "source:")
    t(1, f"root: {scalar(os.path.relpath(raw, spec_path.parent.resolve()))}")
    if ids == "path":
        t(1, "ids: path", "a sample's id is its path below the class or case folders, without suffix")
        t.more("(cat/0001, case01/image), so one file name in two folders does not collide")


def footer(
    t: SpecText,
    spec_path: Path,
    name: str,
    split_column: str | None = None,
    batch_size: int | None = None,
    nbytes: int = 0,
) -> None:
    """``nbytes``: a sample's stored bytes (``sample_bytes``), which ``chunk_rows`` is chosen from."""
    t(0, "splits:")
    if split_column:
        t(
            1,
            f"column: {split_column}",
            "from the split folders (training, validation, valid, testing, train2017 understood)",
        )
        t(1, "ratios: {train: 0.8, val: 0.1, test: 0.1}", "for a picture outside the split folders")
    else:
        t(1, "ratios: {train: 0.8, val: 0.1, test: 0.1}", "stable: a sample's split depends on its id only")
    out_dir = os.path.relpath(Path.cwd() / "data" / name, spec_path.parent.resolve())
    t(0, "storage:")
    t(1, "codec: lz4", "lz4 (fast) | zstd-1 (smaller) | gzip-1 (portable) | none ... (docs/codecs.md)")
    if nbytes:
        t(1, f"chunk_rows: {chunk_rows(nbytes)}", f"samples per HDF5 chunk: as many as {CHUNK_BYTES >> 10} KB holds,")
        t.more(f"a power of two; 1 above {CHUNK_BYTES >> 11} KB a sample (here {nbytes / 1024:.3g} KB)")
    else:
        t(1, "chunk_rows: 1", "samples per HDF5 chunk (ragged arrays chunk their elements)")
    t(0, "output:")
    t(1, f"dir: {scalar(out_dir)}")
    t(1, "keep: 5", "published versions kept")
    t(
        0,
        f"max_rejected: {MAX_REJECTED:g}",
        "more rejected inputs than this share ('10%') or count (12): nothing is published",
    )
    t(0, "compute:")
    t(1, "workers: 2", "LocalCluster processes; or dask_address: tcp://host:8786")
    if batch_size:
        t(1, f"batch_size: {batch_size}", "samples per dask task: a case is large, so a few at a time")
