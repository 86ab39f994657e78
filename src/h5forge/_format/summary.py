"""The diagnostics a version file carries: its write summary and the table of rejected inputs."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from typing import Sequence

import h5py
import numpy as np

from h5forge._format.layout import STR
from h5forge._format.names import DIAGNOSTICS, REJECTION_COLUMNS, REJECTIONS, Attr
from h5forge._samples import Rejection, rejected_count


@dataclass(frozen=True)
class WriteSummary:
    """What a written version holds and what it cost."""

    counts: dict[str, int]
    samples: int
    array_bytes_raw: int
    array_bytes_stored: int
    split_bytes: dict[str, int]
    compression_ratio: float
    codec: str
    chunk_rows: int
    timings: dict = field(default_factory=dict)
    rejections: tuple[Rejection, ...] = ()
    row_files: int = 1  # files holding the rows (more than one for a thin version)
    # rows of each split verify checks against their checksums (None: all); the write decides it
    # from how its rows came (``rebuild.Written``), and the file does not store it
    checksum_sample: int | None = None

    @property
    def rejected(self) -> int:
        """Rejected inputs (an entry may summarise several)."""
        return rejected_count(self.rejections)

    def with_(self, **changes) -> "WriteSummary":
        return replace(self, **changes)

    def to_json(self) -> str:
        """The summary as stored in the file (the rejections have their own table)."""
        data = asdict(self)
        data.pop("rejections")
        data.pop("checksum_sample")
        data["rejected"] = self.rejected
        return json.dumps(data)


TABLE_ROWS = 1000  # rejected inputs a table lists one by one (in a version file, a report, an artifact)


def bounded_rows(rejections: Sequence[Rejection], limit: int = TABLE_ROWS) -> list[dict[str, str]]:
    """The first ``limit`` rejections as rows, then one row counting the rest (the quarantine
    report's JSON lists them all)."""
    rows = [r.as_dict() for r in rejections[:limit]]
    rest = sum(r.count for r in rejections[limit:])
    if rest:
        rows.append(
            {"sample_id": "", "path": "", "reason": f"... and {rest} more (see the quarantine report)", "stage": ""}
        )
    return rows


def write_diagnostics(f: h5py.File, summary: WriteSummary) -> None:
    d = f.require_group(DIAGNOSTICS)
    d.attrs[Attr.SUMMARY] = summary.to_json()
    width = len(REJECTION_COLUMNS)
    table = np.array([[r[c] for c in REJECTION_COLUMNS] for r in bounded_rows(summary.rejections)], dtype=object)
    f.create_dataset(REJECTIONS, data=table.reshape(-1, width), dtype=STR, maxshape=(None, width), chunks=(256, width))
    f[REJECTIONS].attrs[Attr.COLUMNS] = list(REJECTION_COLUMNS)


def read_summary(f: h5py.File) -> dict:
    """The stored summary as a dict ({} when the file has none)."""
    return json.loads(f[DIAGNOSTICS].attrs.get(Attr.SUMMARY, "{}")) if DIAGNOSTICS in f else {}
