"""Per-split statistics of a field: additive, so an append merges them without re-reading rows.

A kind with statistics is a ``Statistics``; the writer, thin versions, incremental reuse, verify,
``info`` and the readers ask ``isinstance(kind, Statistics)``. ``ClassCounts`` is the statistic
of the kinds that count something per class (a mask's pixels, boxes, labels); ``FloatSums`` that
of the kinds that sum float values (a signal's), added exactly so that no merge order shows.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Iterable
from typing import Any, ClassVar

import h5py
import numpy as np


class Statistics(ABC):
    """The additive statistic of a block of stored rows (an array, or a Ragged for a ragged kind),
    written as split attributes."""

    @abstractmethod
    def counts(self, block: Any) -> np.ndarray | None:
        """The additive statistic of a block of stored rows, or None when the field keeps none."""

    @abstractmethod
    def write_stats(self, group: h5py.Group, counts: np.ndarray | None) -> None:
        """Split attributes derived from the split's counts (None: an empty split)."""

    @abstractmethod
    def stored_counts(self, group: h5py.Group) -> np.ndarray | None:
        """The split's counts, as ``write_stats`` wrote them (None: the field keeps none)."""

    def stats_attrs(self) -> tuple[str, ...]:
        """The split-group attributes ``write_stats`` writes (verify checks they exist)."""
        return ()

    def read_stats(self, group: h5py.Group) -> dict[str, np.ndarray]:
        """What a reader's conversion needs of the split's statistics (an image's mean and std)."""
        return {}

    def nonfinite(self, group: h5py.Group) -> int:
        """NaN/inf values the split group holds in this field (kept on purpose; the report counts them)."""
        return 0

    def saved_counts(self, saved: Any) -> np.ndarray:
        """Counts as a resume checkpoint saved them (``np.asarray(counts).tolist()``)."""
        return np.asarray(saved)


class ClassCounts(Statistics):
    """How many of something each class has in a split: the (K,) int64 split attribute
    ``<field>_<counted>``, K being ``n_classes`` (none when it is 0)."""

    name: str
    counted: ClassVar[str]  # what is counted, in the attribute's name: "class_pixels", ...

    @property
    @abstractmethod
    def n_classes(self) -> int:
        """K, the classes counted; 0 when the field counts none."""

    def _attr(self) -> str:
        return f"{self.name}_{self.counted}"

    def write_stats(self, group: h5py.Group, counts: np.ndarray | None) -> None:
        if self.n_classes:
            group.attrs[self._attr()] = np.zeros(self.n_classes, np.int64) if counts is None else counts

    def stored_counts(self, group: h5py.Group) -> np.ndarray | None:
        return np.asarray(group.attrs[self._attr()], np.int64) if self.n_classes else None

    def stats_attrs(self) -> tuple[str, ...]:
        return (self._attr(),) if self.n_classes else ()


# Every finite float64 is an integer multiple of 2**-1074, so sums kept as integers in that unit
# add and subtract exactly: the statistic then depends on the rows only, never on how batches,
# workers, appends or rebuilds group and merge them.
EXACT_BITS = 1074
# An infinite sum (of finite values whose float64 sum overflows) counts as this many units: no
# sum of finite rows reaches half of it, so a total rounds to an infinity only when infinities
# are left in it, and subtracting the row again removes its infinity exactly.
EXACT_INF = 1 << (EXACT_BITS + 1024 + 80)


def exact(value: float) -> int:
    """A float64 as an integer count of 2**-1074; an infinity (or NaN, which an exact sum never
    holds: a file of an earlier h5forge may) as ``EXACT_INF`` units of its sign."""
    if not math.isfinite(value):
        return -EXACT_INF if value < 0 else EXACT_INF
    p, q = float(value).as_integer_ratio()
    return p << (EXACT_BITS - (q.bit_length() - 1))


def rounded(units: int) -> float:
    """An exact sum rounded once to the nearest float64 (an infinity beyond float64's range)."""
    units = int(units)
    if abs(units) >= EXACT_INF // 2:
        return -math.inf if units < 0 else math.inf
    try:
        return units / (1 << EXACT_BITS)  # int / int rounds correctly
    except OverflowError:
        return -math.inf if units < 0 else math.inf


def exact_sum(values: Any) -> int:
    """The exact sum of float64 values in units of 2**-1074 (each infinity as ``EXACT_INF``). What
    is summed is a row's few sums, or the values of the rare row whose float64 sum overflows."""
    return sum(exact(x) for x in np.ravel(np.asarray(values, np.float64)).tolist())


class FloatSums(Statistics):
    """Statistics that are float64 sums over a split's rows (a signal's count, sum and sum of
    squares), kept exactly so that they do not depend on the order rows are merged in.

    Each row's sums are computed from the row alone (``row_sums``); rows, and then batches, splits
    and versions, are added as exact integers (``counts`` is an object array of them), rounded once
    when the split's attributes are written: ``<field>_sums`` (K,) float64, and
    ``<field>_sums_exact``, the exact sums as text, which thin versions and rebuilds add onto. A
    file without it (an earlier h5forge's) is read from its float sums."""

    name: str
    n_sums: ClassVar[int]  # K, the sums kept

    @abstractmethod
    def row_sums(self, block: Any) -> np.ndarray:
        """(n, K) float64: each row's sums, computed from that row's values alone (the same bits
        wherever the row sits in the block: ``np.add.reduceat`` sums each segment on its own)."""

    @abstractmethod
    def row_terms(self, block: Any, row: int) -> tuple[Any, ...]:
        """The K terms (numbers or arrays) whose sums ``row_sums`` gives for ``row``: added exactly
        when a float64 sum of them is not finite."""

    @abstractmethod
    def write_sums(self, group: h5py.Group, sums: np.ndarray) -> None:
        """The kind's split attributes derived from the rounded sums (zeros for an empty split)."""

    def _sums_attr(self, exact_text: bool = False) -> str:
        return f"{self.name}_sums" + ("_exact" if exact_text else "")

    def counts(self, block: Any) -> np.ndarray:
        sums = np.asarray(self.row_sums(block), np.float64).reshape(-1, self.n_sums)
        finite = np.isfinite(sums)
        total = [exact_sum(sums[finite[:, k], k]) for k in range(self.n_sums)]
        for row in np.flatnonzero(~finite.all(axis=1)).tolist():
            terms = self.row_terms(block, row)
            for k in np.flatnonzero(~finite[row]).tolist():
                total[k] += exact_sum(terms[k])
        return _units(total)

    def write_stats(self, group: h5py.Group, counts: np.ndarray | None) -> None:
        units = [0] * self.n_sums if counts is None else [int(u) for u in counts]
        sums = np.array([rounded(u) for u in units], np.float64)
        group.attrs[self._sums_attr()] = sums
        group.attrs[self._sums_attr(exact_text=True)] = " ".join(str(u) for u in units)
        self.write_sums(group, sums)

    def stored_counts(self, group: h5py.Group) -> np.ndarray:
        text = group.attrs.get(self._sums_attr(exact_text=True))
        if text is not None:
            return _units(int(u) for u in (text.decode() if isinstance(text, bytes) else str(text)).split())
        return _units(exact(v) for v in np.asarray(group.attrs[self._sums_attr()], np.float64).tolist())

    def saved_counts(self, saved: Any) -> np.ndarray:
        """Integers are exact units; floats (a checkpoint of an earlier h5forge) are the sums themselves."""
        return _units(exact(v) if isinstance(v, float) else int(v) for v in np.asarray(saved, object).tolist())


def _units(values: Iterable[int]) -> np.ndarray:
    """Exact sums as a (K,) object array, which ``+`` and ``-`` add exactly, element by element."""
    values = list(values)
    out = np.empty(len(values), object)
    out[:] = values
    return out
