"""Row index lists (``/index/<split>/<field>``): for each value, the rows listed under it (a mask's
rows by the classes they hold), so a reader can pick rows by value without reading them.

A kind with an index is a ``RowIndex``; cleaning, the writer, incremental reuse, thin versions
and verify ask ``isinstance(kind, RowIndex)``. Its statistic is the sum of its rows' counts.
"""

from __future__ import annotations

from abc import abstractmethod
from typing import Any

import numpy as np

from h5forge.kinds.statistics import Statistics


class RowIndex(Statistics):
    """Per row, an additive count per value (``row_counts``); a row is listed under each value it
    counts some of, and the split's statistic is the rows' sum."""

    @abstractmethod
    def row_counts(self, block: Any) -> np.ndarray:
        """(n, K) the count of each value in each row of a block of stored rows."""

    def counts(self, block: Any) -> np.ndarray:
        return self.row_counts(block).sum(axis=0).astype(np.int64)

    def index_values(self, row_counts: np.ndarray) -> list[list[int]]:
        """For each row, the values it is listed under: those it counts any of."""
        return [[int(c) for c in np.flatnonzero(row)] for row in row_counts]
