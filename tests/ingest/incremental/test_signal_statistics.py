"""A signal field's split statistics (float sums) are the same bits whatever route built the rows:
a fresh build in any batch size, an append chain, and the nightly rebuild that compacts it."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np

from h5forge._format.names import SPLITS
from h5forge.spec import DatasetSpec
from tests.helpers.data import age_files
from tests.kinds.test_signal import spec_data, write_edf


def split_attrs(path: Path) -> dict:
    """Every split's ids (as a set: an append puts its rows last) and attributes, digest included."""
    with h5py.File(path, "r") as f:
        return {
            split: (
                sorted(v.decode() for v in f[split]["ids"][()]),
                {k: np.asarray(v) for k, v in f[split].attrs.items() if k != "DIMENSION_LIST"},
            )
            for split in SPLITS
        }


def assert_same_statistics(a: Path, b: Path) -> None:
    left, right = split_attrs(a), split_attrs(b)
    for split in SPLITS:
        assert left[split][0] == right[split][0], split
        assert sorted(left[split][1]) == sorted(right[split][1]), split
        for k, v in left[split][1].items():
            assert v.dtype == right[split][1][k].dtype and np.array_equal(v, right[split][1][k]), f"{split}/{k}"


def signal_spec(root: Path, out: Path, inbox: Path | None = None, **compute) -> DatasetSpec:
    data = spec_data(root, out)
    del data["splits"]  # the default ratios: every split holds rows
    if inbox is not None:
        data["source"]["inbox"] = str(inbox)
    data["compute"] = {"workers": 1, **compute}
    return DatasetSpec.model_validate(data)


def recordings(folder: Path, n: int, seed: int, prefix: str = "r") -> None:
    (folder / "rec").mkdir(parents=True, exist_ok=True)
    for i in range(n):
        write_edf(folder / "rec" / f"{prefix}{i:02d}.edf", 1 + i % 4, seed=seed + i)


def test_a_fresh_build_stores_the_same_signal_statistics_in_any_batch_size(tmp_path):
    import h5forge

    recordings(tmp_path / "raw", 24, seed=1)
    one = h5forge.build(signal_spec(tmp_path / "raw", tmp_path / "one", batch_size=1))
    seven = h5forge.build(signal_spec(tmp_path / "raw", tmp_path / "seven", batch_size=7))
    assert_same_statistics(Path(one.path), Path(seven.path))


def test_appends_and_the_nightly_rebuild_store_the_statistics_of_a_fresh_build(tmp_path):
    """Three appends make a thin chain (old sums plus new), the rebuild takes its rows (the
    chain's sums, minus the rows not taken): both bit for bit a fresh build's, digests too."""
    import h5forge

    raw, inbox = tmp_path / "raw", tmp_path / "inbox"
    recordings(raw, 12, seed=1)
    spec = signal_spec(raw, tmp_path / "out", inbox)
    h5forge.build(spec)
    for k, seed in enumerate((40, 50, 60)):
        recordings(inbox, 5, seed=seed, prefix=f"in{k}_")
        age_files(inbox)
        result = h5forge.append(spec)
        assert result.added == 5, result
    thin = Path(result.path)
    nightly = h5forge.build(spec)
    assert nightly.timings["reused"] > 0, nightly.timings
    fresh = h5forge.build(signal_spec(raw, tmp_path / "fresh", inbox, batch_size=3))
    assert_same_statistics(Path(nightly.path), Path(fresh.path))
    thin_attrs, fresh_attrs = split_attrs(thin), split_attrs(Path(fresh.path))
    for split in SPLITS:  # the thin version holds the same rows: its sums are the same too
        assert thin_attrs[split][0] == fresh_attrs[split][0]
        for k, v in fresh_attrs[split][1].items():
            if k.startswith(("acc_", "volt_", "temp_")):
                assert np.array_equal(thin_attrs[split][1][k], v), f"{split}/{k}"
