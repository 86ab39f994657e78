"""Per-split statistics of a field: additive, so an append merges them without re-reading rows.

A kind with statistics is a ``Statistics``; the writer, thin versions, incremental reuse, verify,
``info`` and the readers ask ``isinstance(kind, Statistics)``. ``ClassCounts`` is the statistic
of the kinds that count something per class (a mask's pixels, boxes, labels).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
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
