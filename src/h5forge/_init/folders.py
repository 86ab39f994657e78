"""A raw folder as ``init`` looks at it: visible entries only (no dot files, no ``__MACOSX`` from
a zip made on a Mac), sub-folders recognised by name in any case, and even samples of long lists,
so a large collection is judged by a spread of its files rather than by its first ones."""

from __future__ import annotations

from pathlib import Path


def visible(p: Path) -> bool:
    return not p.name.startswith(".") and p.name != "__MACOSX"


def subdirs(d: Path) -> list[Path]:
    try:
        return sorted(p for p in d.iterdir() if p.is_dir() and visible(p))
    except OSError:
        return []


def files_in(d: Path, suffixes: tuple[str, ...]) -> list[Path]:
    """The files directly in ``d`` with one of ``suffixes`` (in any case), sorted."""
    try:
        return sorted(p for p in d.iterdir() if p.suffix.lower() in suffixes and visible(p) and p.is_file())
    except OSError:
        return []


def named(raw: Path, names: tuple[str, ...]) -> list[Path]:
    """The sub-folders of ``raw`` named one of ``names`` (any case), in ``names`` order."""
    by_lower = {d.name.lower(): d for d in subdirs(raw)}
    return [by_lower[n] for n in names if n in by_lower]


def sample(items: list, n: int) -> list:
    """Up to ``n`` items spread evenly over the (sorted) list: deterministic, not just the first."""
    if len(items) <= n:
        return list(items)
    return [items[i * len(items) // n] for i in range(n)]
