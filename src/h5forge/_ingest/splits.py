"""Stable split assignment: a sample's split depends only on its id, the seed and the ratios.
Samples that are parts of one file (the time points of a 4-D volume) take the split of the file's
id, which discovery passes here: a case never straddles train and test.

Adding samples never moves an existing one to another split, so a model never trains on what an
earlier version held out.
"""

from __future__ import annotations

import hashlib
from typing import Any

from h5forge._format.names import SPLITS, split_named


def unit_hash(sample_id: str, seed: str) -> float:
    """A uniform number in [0, 1) derived from the id (stable across runs, machines, Python versions)."""
    digest = hashlib.sha256(f"{seed}\x00{sample_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def assign_split(sample_id: str, splits: Any, columns: dict[str, Any] | None = None) -> str:
    """The split of one sample; from an annotation column when the spec names one."""
    if splits.column:
        value = (columns or {}).get(splits.column)
        if isinstance(value, str):  # a folder's name, as folders name splits (``valid``, ``train2017``)
            value = split_named(value) or value.lower()
        if value not in SPLITS:
            raise ValueError(f"split column {splits.column!r} is {value!r}; expected one of {', '.join(SPLITS)}")
        return value
    return ratio_split(sample_id, splits)


def ratio_split(sample_id: str, splits: Any) -> str:
    """The split the ratios give a sample (its id's hash against the cumulative ratios)."""
    u = unit_hash(sample_id, splits.seed)
    edge = 0.0
    last = "train"
    for name in SPLITS:
        ratio = splits.ratios.get(name, 0.0)
        if ratio <= 0:
            continue
        edge += ratio
        last = name
        if u < edge:
            return name
    return last
