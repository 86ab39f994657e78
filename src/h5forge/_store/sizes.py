"""A version's array sizes, raw and as stored, over every file holding its rows: the one source of
its compression ratio, for the summary a version stores in ``/diagnostics``, for ``verify`` and
for ``info``. A thin version's rows are in its parent's files and its deltas, so its figure is
theirs together; an export's is its own recompressed copy's."""

from __future__ import annotations

import os
from typing import Any
from dataclasses import dataclass
from pathlib import Path

import h5py

from h5forge._format.names import SPLITS
from h5forge._format.row_files import row_files_of
from h5forge.kinds import FieldKind


@dataclass(frozen=True)
class ArraySizes:
    """Bytes of the sample arrays (the fields stored with the spec's codec)."""

    raw: int
    stored: int
    split_stored: dict[str, int]

    @property
    def ratio(self) -> float:
        return round(self.stored / self.raw, 4) if self.raw else 1.0

    def summary(self) -> dict[str, Any]:
        """The fields of a ``WriteSummary`` these sizes give."""
        return {
            "array_bytes_raw": self.raw,
            "array_bytes_stored": self.stored,
            "split_bytes": self.split_stored,
            "compression_ratio": self.ratio,
        }

    def __add__(self, other: "ArraySizes") -> "ArraySizes":
        return ArraySizes(
            self.raw + other.raw,
            self.stored + other.stored,
            {s: self.split_stored.get(s, 0) + other.split_stored.get(s, 0) for s in SPLITS},
        )


def own_sizes(f: h5py.File, kinds: dict[str, FieldKind]) -> ArraySizes:
    """The sizes of the rows ``f`` holds itself (a full version, a delta, an export)."""
    raw, split_stored = 0, {s: 0 for s in SPLITS}
    for split in SPLITS:
        for path, kind in kinds.items():
            if not kind.stored().bulk:
                continue
            ds = f[split][path]
            if ds.is_virtual:  # its rows are in other files
                continue
            raw += ds.size * ds.dtype.itemsize
            split_stored[split] += ds.id.get_storage_size()
    return ArraySizes(int(raw), int(sum(split_stored.values())), split_stored)


def version_sizes(path: str | Path, kinds: dict[str, FieldKind]) -> ArraySizes:
    """The sizes of every row of the version at ``path``: over each file that holds some (a
    missing one counts nothing; verify reports it)."""
    return row_files_sizes(Path(os.path.realpath(path)).parent, row_files_of(Path(path)), kinds)


def row_files_sizes(folder: Path, row_files: list[dict], kinds: dict[str, FieldKind]) -> ArraySizes:
    """The sizes of the rows of ``row_files`` (files in ``folder``), as a thin version maps them."""
    total = ArraySizes(0, 0, {s: 0 for s in SPLITS})
    for row_file in row_files:
        row_path = folder / row_file["file"]
        if not row_path.is_file():
            continue
        with h5py.File(row_path, "r") as sf:
            total = total + own_sizes(sf, kinds)
    return total
