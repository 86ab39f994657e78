"""A health report's figures as (name, value) rows a person reads: sizes with units, counts by split.

The report keeps the raw numbers (``stats``, and its JSON for scripts); the Markdown report, the
Prefect artifacts and the terminal table all show these rows.
"""

from __future__ import annotations

from typing import Any

from rich.filesize import decimal


def size(n_bytes: int | float) -> str:
    """``3790393`` -> ``3.8 MB`` (powers of 1000, as disk tools show them)."""
    return decimal(int(n_bytes))


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{split} {n}" for split, n in counts.items()) + f" ({sum(counts.values())} in all)"


def _reads(r: dict) -> str:
    return f"{r['reads']} of {r['split']}: p50 {r['p50']} ms, p99 {r['p99']} ms"


_LABELS: dict[str, tuple[str, Any]] = {  # stats key -> (row name, formatter)
    "version": ("version", lambda v: f"v{int(v):04d}"),
    "counts": ("samples", _counts),
    "codec": ("codec", str),
    "compression_ratio": ("stored / raw array bytes", lambda r: f"{r:.3f}"),
    "file_bytes": ("file size", size),
    "checksums_checked": ("checksums recomputed", lambda n: f"{n} samples"),
    "checksum_processes": ("processes recomputing them", str),
    "random_read_ms": ("random reads", _reads),
    "nonfinite": ("NaN/inf values kept", lambda kept: ", ".join(f"{p} {n}" for p, n in kept.items())),
}


def figure_rows(stats: dict) -> list[tuple[str, str]]:
    """Known figures first, in a fixed order, each in words and units; any other key as it is."""
    rows = [(label, fmt(stats[key])) for key, (label, fmt) in _LABELS.items() if stats.get(key) is not None]
    rows += [(key, str(value)) for key, value in stats.items() if key not in _LABELS]
    return rows
