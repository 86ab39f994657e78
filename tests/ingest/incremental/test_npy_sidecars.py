"""A ``.npy`` channel's rate is in the ``<stem>.json`` beside it, so that sidecar decides the
stored values as much as the array does (``resample: true`` converts a recording at another rate).
A rebuild after only the sidecar changed cleans the recording again, also when the hash cache
knows the array; an append moves the sidecar to ``processed/`` with its array, so the nightly
rebuild reads the rate the append read. Each published latest equals a fresh full build."""

from __future__ import annotations

import json
from pathlib import Path

import h5py
import numpy as np
import pytest

import h5forge
from h5forge.read._reader import SplitReader
from h5forge.spec import DatasetSpec


def recording(folder: Path, name: str, n: int, rate: float, seed: int) -> np.ndarray:
    folder.mkdir(parents=True, exist_ok=True)
    values = np.random.default_rng(seed).normal(size=n).astype(np.float32)
    np.save(folder / f"{name}.npy", values)
    (folder / f"{name}.json").write_text(json.dumps({"rate": rate}))
    return values


def spec_of(tmp: Path, out: str = "out") -> DatasetSpec:
    return DatasetSpec.model_validate(
        {
            "name": "npy",
            "source": {"root": str(tmp / "raw"), "inbox": str(tmp / "inbox")},
            "output": {"dir": str(tmp / out)},
            "splits": {"ratios": {"train": 1.0}},
            "fields": {"eeg": {"kind": "signal", "files": "eeg/*.npy", "rate": 100, "resample": True}},
            "append": {"settle_seconds": 0},
            "max_rejected": 1.0,
        }
    )


def rows(path) -> dict[str, np.ndarray]:
    reader = SplitReader(path, "train")
    with h5py.File(path, "r") as f:
        ids = [i.decode() for i in f["train/ids"][()]]
    return {sid: np.asarray(reader.read_one(i)["eeg"]) for i, sid in enumerate(ids)}


def assert_as_fresh(tmp: Path, spec: DatasetSpec, fresh: str) -> dict[str, np.ndarray]:
    published = rows(Path(spec.output.dir) / "dataset_latest.h5")
    result = h5forge.build(spec_of(tmp, fresh))
    want = rows(result.path)
    assert sorted(published) == sorted(want)
    for sid in want:
        assert np.array_equal(published[sid], want[sid]), sid
    return published


@pytest.mark.parametrize("cached", [False, True], ids=["hashed", "hash-cache"])
def test_a_changed_rate_sidecar_cleans_its_recording_again(tmp_path, monkeypatch, cached):
    if cached:  # the hash cache trusts the array's state at once (no 2 s wait for it)
        monkeypatch.setattr("h5forge._ingest.incremental.hash_cache.RACY_SECONDS", -10.0)
    for i in range(3):
        recording(tmp_path / "raw" / "eeg", f"rec_{i}", 200, 100, seed=i)
    spec = spec_of(tmp_path)
    first = h5forge.build(spec)
    assert len(rows(first.path)["rec_0"]) == 200

    # the same array, now said to be recorded at 200 Hz: resampled to 100 Hz it is half as long
    (tmp_path / "raw" / "eeg" / "rec_0.json").write_text(json.dumps({"rate": 200}))
    again = h5forge.build(spec)
    assert not again.unchanged, "only the sidecar changed, and it decides the stored values"
    published = assert_as_fresh(tmp_path, spec, "fresh")
    assert len(published["rec_0"]) == 100
    assert np.array_equal(published["rec_1"], rows(first.path)["rec_1"])


def test_an_appended_recording_keeps_its_rate_sidecar(tmp_path):
    recording(tmp_path / "raw" / "eeg", "rec_0", 200, 100, seed=0)
    recording(tmp_path / "inbox" / "eeg", "rec_new", 200, 200, seed=1)  # at 200 Hz
    spec = spec_of(tmp_path)
    h5forge.build(spec)
    h5forge.append(spec)
    appended = rows(Path(spec.output.dir) / "dataset_latest.h5")
    assert len(appended["rec_new"]) == 100
    moved = sorted(p.relative_to(tmp_path / "inbox").as_posix() for p in (tmp_path / "inbox").rglob("*.*"))
    assert moved == ["processed/v0002/eeg/rec_new.json", "processed/v0002/eeg/rec_new.npy"]

    assert_as_fresh(tmp_path, spec, "fresh")
    h5forge.build(spec)  # the nightly rebuild reads processed/: the same values
    rebuilt = assert_as_fresh(tmp_path, spec, "fresh2")
    assert np.array_equal(rebuilt["rec_new"], appended["rec_new"])
