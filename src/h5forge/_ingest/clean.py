"""Clean: turn raw samples into stored rows, or reject them with a reason.

What cleaning means for each field is its kind's business (``h5forge.kinds``). Here a batch of
samples becomes one block of rows per stored dataset, plus the raw files' hashes, each row's
values digest (the costly part of its checksum, hashed here in parallel; the writer completes it)
and the kinds' additive statistics. No exception escapes ``clean_batch`` for bad input.

Fixed-size fields with a codec ``h5forge._format.chunk_codec`` can encode leave here already
compressed, one chunk per row (``EncodedRows``): the workers compress in parallel and the single
writer only places the chunks (joined, for a field stored several samples per chunk).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np

from h5forge._format.checksums import values_digest
from h5forge._format.names import FORMAT_VERSION
from h5forge._format.chunk_codec import EncodedRows, encodable, joinable
from h5forge.kinds import FieldKind, decode_order, decode_sample, file_fields, stored_kinds
from h5forge.kinds.index import RowIndex
from h5forge.kinds.statistics import Statistics
from h5forge._samples import Reject, Rejection, SampleRef
from h5forge.spec import DatasetSpec


@dataclass
class CleanedBatch:
    """Cleaned samples of one batch, in input order, plus the rejections of that batch."""

    ids: list[str]
    splits: list[str]
    files: list[list[str]]  # per sample, raw file paths of the fields read from files
    arrays: dict[str, Any]  # dataset path -> (n, *shape) block of stored rows (or their chunks: EncodedRows)
    source_sha256: list[list[str]]  # per sample, hex digest per raw file
    digests: list[bytes]  # per sample, checksums.values_digest of its stored values
    stats: dict[str, dict[str, np.ndarray]]  # dataset path -> split -> additive statistic
    listed: dict[str, list[list]]  # indexed dataset path -> per sample, the values it is listed under
    rejections: list[Rejection]
    # a batch a worker wrote to a row file of its own (``h5forge._ingest.assemble``): where its
    # sample arrays are (those are then not in ``arrays``), and each row's checksum and sample key
    # as that file stores them
    row_file: dict | None = None
    checksums: np.ndarray | None = None
    keys: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.ids)

    def take(self, kinds: dict[str, FieldKind], keep: list[int], extra: list[Rejection]) -> "CleanedBatch":
        """The samples at ``keep`` only (the rest are accounted for by ``extra`` rejections)."""
        arrays = {path: a[keep] for path, a in self.arrays.items()}
        splits = [self.splits[i] for i in keep]
        values = {path: a.decoded() if isinstance(a, EncodedRows) else a for path, a in arrays.items()}
        return CleanedBatch(
            ids=[self.ids[i] for i in keep],
            splits=splits,
            files=[self.files[i] for i in keep],
            arrays=arrays,
            source_sha256=[self.source_sha256[i] for i in keep],
            digests=[self.digests[i] for i in keep],
            stats=split_stats(kinds, values, splits),
            listed={path: [rows[i] for i in keep] for path, rows in self.listed.items()},
            rejections=self.rejections + extra,
        )


def split_stats(
    kinds: dict[str, FieldKind],
    arrays: dict[str, np.ndarray],
    splits: list[str],
    row_counts: dict[str, np.ndarray] | None = None,
) -> dict[str, dict[str, np.ndarray]]:
    """Per dataset path and split, the additive statistic of the rows of each kind that keeps one
    (``Statistics``; summed from ``row_counts`` where a kind has them already)."""
    labels = np.asarray(splits)
    out: dict[str, dict[str, np.ndarray]] = {}
    for path, kind in kinds.items():
        if not isinstance(kind, Statistics):
            continue
        rows = (row_counts or {}).get(path)
        per_split = {
            s: kind.counts(arrays[path][labels == s]) if rows is None else rows[labels == s].sum(axis=0)
            for s in sorted(set(splits))
        }
        counted = {s: c for s, c in per_split.items() if c is not None}
        if counted:
            out[path] = counted
    return out


def clean_sample(
    spec: DatasetSpec,
    root: Path,
    ref: SampleRef,
    kinds: dict[str, FieldKind] | None = None,
    order: list[FieldKind] | None = None,
) -> tuple[dict[str, object], list[str]]:
    """Stored values by dataset path and the raw files' sha256; raises Reject."""
    kinds = stored_kinds(spec) if kinds is None else kinds
    decoded = decode_sample(kinds, Path(root), ref, order)
    hashes = [decoded[n].sha256 for n in file_fields(kinds)]  # a field read from a file has its sha256
    return {p: d.value for p, d in decoded.items()}, cast(list[str], hashes)


def encode_rows(spec: DatasetSpec, kinds: dict[str, FieldKind], arrays: dict[str, object]) -> dict[str, object]:
    """Each block of a fixed-size field under a codec whose row chunks the writer can store (one
    sample per chunk: an encodable codec; several: a joinable one), as its rows' chunks."""
    out = dict(arrays)
    for path, kind in kinds.items():
        st, block = kind.stored(), arrays[path]
        codec = st.codec_of(spec.storage.codec)
        if (
            st.bulk
            and not st.ragged
            and (joinable(codec) if spec.storage.chunk_rows > 1 else encodable(codec))
            and isinstance(block, np.ndarray)
            and block.dtype.isnative
            and not block.dtype.hasobject
            and np.prod(block.shape[1:]) > 0
        ):
            out[path] = EncodedRows.of(codec, block)
    return out


def clean_batch(
    spec: DatasetSpec,
    root: str | Path,
    refs: list[SampleRef],
    encode: bool = True,
    format_version: int = FORMAT_VERSION,
) -> CleanedBatch:
    """Clean ``refs`` in order; never raises for bad input. ``encode``: compress the rows that
    can be (``encode_rows``); False leaves every field an array for the writer to compress.
    ``format_version``: the format of the file the rows go to (it decides how they are hashed)."""
    root = Path(root)
    kinds = stored_kinds(spec)
    order = decode_order(kinds)
    files_of = file_fields(kinds)
    kept: list[tuple[SampleRef, dict[str, object], list[str]]] = []
    rejections: list[Rejection] = []
    for ref in refs:
        try:
            values, hashes = clean_sample(spec, root, ref, kinds, order)
        except Reject as rej:
            rejections.append(Rejection(ref.id, (rej.path,), rej.reason, stage="clean"))
            continue
        except Exception as err:  # a defect no rule foresaw still must not kill the run
            rejections.append(
                Rejection(ref.id, tuple(ref.files.values()), f"unexpected {type(err).__name__}: {err}", stage="clean")
            )
            continue
        kept.append((ref, values, hashes))
    arrays = {path: kind.stack([k[1][path] for k in kept]) for path, kind in kinds.items()}
    splits = [k[0].split for k in kept]
    indexed = {path: kind for path, kind in kinds.items() if isinstance(kind, RowIndex)}
    per_row = {path: kind.row_counts(arrays[path]) for path, kind in indexed.items()}
    return CleanedBatch(
        ids=[k[0].id for k in kept],
        splits=splits,
        files=[[k[0].file_of(name) for name in files_of] for k in kept],
        arrays=encode_rows(spec, kinds, arrays) if encode else arrays,  # digests and statistics use the arrays
        source_sha256=[k[2] for k in kept],
        digests=[values_digest((arrays[p][i] for p in kinds), format_version) for i in range(len(kept))],
        stats=split_stats(kinds, arrays, splits, per_row),
        listed={path: indexed[path].index_values(rows) for path, rows in per_row.items()},
        rejections=rejections,
    )
