"""FloatSums (kinds/statistics.py): a signal's float sums added exactly, whatever the grouping."""

from __future__ import annotations

import json
import math

import h5py
import numpy as np
import pytest

from h5forge._format.arrays import Ragged
from h5forge.kinds import stored_kinds
from h5forge.kinds.statistics import EXACT_BITS, exact, rounded
from h5forge.spec import DatasetSpec


def signal_kind(tmp_path, dtype="float32"):
    (tmp_path / "raw").mkdir(exist_ok=True)
    spec = DatasetSpec.model_validate(
        {
            "name": "s",
            "source": {"root": str(tmp_path / "raw")},
            "output": {"dir": str(tmp_path / "out")},
            "fields": {"volt": {"kind": "signal", "files": "*.npy", "rate": 100, "dtype": dtype}},
        }
    )
    return stored_kinds(spec)["volt"]


def rows(seed: int, n: int, dtype="float32") -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.normal(0, 50, rng.integers(1, 400)).astype(dtype) for _ in range(n)]


@pytest.fixture
def group():
    with h5py.File("sums.h5", "w", driver="core", backing_store=False) as f:
        yield f.create_group("val")


def test_exact_units_round_trip_every_float():
    for v in (0.0, -0.0, 1.0, 0.1, -76.854894926887, 5e-324, 1.7976931348623157e308, -2.2250738585072014e-308):
        assert rounded(exact(v)) == v
    assert exact(5e-324) == 1 and exact(1.0) == 1 << EXACT_BITS
    assert rounded(exact(math.inf)) == math.inf and rounded(exact(-math.inf)) == -math.inf


def test_any_grouping_and_merge_order_gives_the_same_bits(tmp_path, group):
    kind = signal_kind(tmp_path)
    data = rows(1, 60)
    whole = kind.counts(Ragged.of(data, (), np.float32))
    rng = np.random.default_rng(2)
    for _ in range(5):
        cuts = np.sort(rng.choice(np.arange(1, 60), 7, replace=False))
        parts = [kind.counts(Ragged.of(list(p), (), np.float32)) for p in np.split(np.array(data, object), cuts)]
        rng.shuffle(parts)
        total = parts[0]
        for p in parts[1:]:
            total = total + p
        assert total.tolist() == whole.tolist()
    kind.write_stats(group, whole)
    assert kind.stored_counts(group).tolist() == whole.tolist()  # read back exactly, from the text
    # a rebuild's sums: the whole minus rows not taken equals the rows taken, counted afresh
    less = whole - kind.counts(Ragged.of(data[10:25], (), np.float32))
    assert less.tolist() == (kind.counts(Ragged.of(data[:10] + data[25:], (), np.float32))).tolist()
    # a resume checkpoint saves them as JSON and restores them exactly
    assert kind.saved_counts(json.loads(json.dumps(np.asarray(whole).tolist()))).tolist() == whole.tolist()


def test_the_float_statistics_are_the_exact_sums_rounded_once(tmp_path, group):
    kind = signal_kind(tmp_path)
    data = rows(3, 20)
    kind.write_stats(group, kind.counts(Ragged.of(data, (), np.float32)))
    v = [r.astype(np.float64) for r in data]
    sums = [math.fsum(len(r) for r in v), sum(exact(r.sum()) for r in v), sum(exact(np.square(r).sum()) for r in v)]
    expected = [float(sums[0]), rounded(sums[1]), rounded(sums[2])]
    assert group.attrs["volt_sums"].tolist() == expected
    assert group.attrs["volt_count"] == sum(len(r) for r in data)
    assert group.attrs["volt_mean"] == expected[1] / expected[0]


def test_a_file_without_exact_sums_is_added_onto_from_its_float_sums(tmp_path, group):
    """A version an earlier h5forge wrote has only <field>_sums: an append adds onto those floats."""
    kind = signal_kind(tmp_path)
    group.attrs["volt_sums"] = np.array([3.0, 0.1, 2.5])
    old = kind.stored_counts(group)
    assert [rounded(u) for u in old] == [3.0, 0.1, 2.5]
    new = kind.counts(Ragged.of([np.array([1.0, 2.0], np.float32)], (), np.float32))
    kind.write_stats(group, old + new)
    assert group.attrs["volt_sums"].tolist() == [5.0, 3.1, 7.5]
    assert "volt_sums_exact" in group.attrs
    # a checkpoint an earlier h5forge saved holds the sums as floats
    assert [rounded(u) for u in kind.saved_counts([3.0, 0.1, 2.5])] == [3.0, 0.1, 2.5]


def test_sums_beyond_float64_are_infinite_and_leave_when_their_row_does(tmp_path, group):
    kind = signal_kind(tmp_path, "float64")
    huge, small = np.array([1e200, -3e200, 1e300]), np.array([1.5, 2.5])
    both = kind.counts(Ragged.of([huge, small], (), np.float64))
    kind.write_stats(group, both)
    assert group.attrs["volt_sums"][2] == math.inf and group.attrs["volt_std"] != 0.0
    rest = both - kind.counts(Ragged.of([huge], (), np.float64))
    assert rest.tolist() == kind.counts(Ragged.of([small], (), np.float64)).tolist()
    kind.write_stats(group, rest)
    assert group.attrs["volt_sums"].tolist() == [2.0, 4.0, 8.5]


def test_an_empty_split_stores_zeros(tmp_path, group):
    kind = signal_kind(tmp_path)
    kind.write_stats(group, None)
    assert group.attrs["volt_sums"].tolist() == [0.0, 0.0, 0.0] and group.attrs["volt_sums_exact"] == "0 0 0"
    assert (group.attrs["volt_count"], group.attrs["volt_mean"], group.attrs["volt_std"]) == (0, 0.0, 0.0)
