"""A large file's checksums are shared among processes: the same verdict, the same rows checked and
the same rows named as a check in one process, wherever in the file the damage is, and a thin
version (whose rows live in other files) is checked the same way."""

from __future__ import annotations

import os
from pathlib import Path

import h5py
import pytest

from h5forge._format.names import SPLITS
from h5forge._store import verify
from h5forge._store.verify import verify_file
from tests.helpers.files import make_raw
from tests.helpers.tamper import copy_writable, raw_pair, small_version, thin_version

QUICK = {"resample": 0, "latency_reads": 0}


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("parallel")
    path = root / "out" / "dataset_v0001.h5"
    small_version(path, make_raw(root / "raw", n=60, seed=11))
    os.chmod(path, 0o444)
    return path


@pytest.fixture
def small_threshold(monkeypatch):
    monkeypatch.setattr(verify, "PARALLEL_ROWS", 1)


def rows_of(path: Path) -> dict[str, int]:
    with h5py.File(path, "r") as f:
        return {s: int(f[s].attrs["count"]) for s in SPLITS}


def test_parts_cover_every_block_once_in_order():
    blocks = [("train", a, a + 4) for a in range(0, 40, 4)] + [("val", 0, 3), ("test", 0, 5)]
    verify.PARALLEL_ROWS, saved = 1, verify.PARALLEL_ROWS
    try:
        for workers in (1, 2, 3, 7, 50):
            parts = verify._shares(blocks, workers)
            assert [b for p in parts for b in p] == blocks
            assert len(parts) == min(workers, len(blocks)) and all(parts)
    finally:
        verify.PARALLEL_ROWS = saved
    assert verify._shares(blocks, 4) == [blocks], "a file under PARALLEL_ROWS is checked in one process"


def test_a_healthy_file_checked_in_processes_equals_one_process(good, small_threshold):
    one = verify_file(good, workers=1, **QUICK)
    many = verify_file(good, workers=3, **QUICK)
    assert one.ok and many.ok
    assert (one.stats["checksum_processes"], many.stats["checksum_processes"]) == (1, 3)
    assert many.stats["checksums_checked"] == one.stats["checksums_checked"] == sum(rows_of(good).values())
    assert many.checks["checksums"] == one.checks["checksums"]


@pytest.mark.parametrize("where", ["first", "last"])
def test_a_damaged_row_is_named_whichever_process_checks_it(good, tmp_path, small_threshold, where):
    path = copy_writable(good, tmp_path / "dataset_v0001.h5")
    split = "train" if where == "first" else next(s for s in reversed(SPLITS) if rows_of(good)[s])
    row = 0 if where == "first" else rows_of(good)[split] - 1
    with h5py.File(path, "r+") as f:
        image = f[split]["images"][row]
        f[split]["images"][row] = 255 - image
    one = verify_file(path, workers=1, **QUICK)
    many = verify_file(path, workers=3, **QUICK)  # one process a block here: train, val, test
    assert not one.ok and not many.ok and many.stats["checksum_processes"] == 3
    named = [e for e in many.errors if e.startswith(f"{split}[{row}] ")]
    assert named and named == [e for e in one.errors if e.startswith(f"{split}[{row}] ")]
    assert sorted(many.errors) == sorted(one.errors)


def test_a_thin_version_is_checked_in_processes(tmp_path, small_threshold):
    raw, raw_new = raw_pair(tmp_path)
    thin = thin_version(tmp_path / "out", raw, raw_new)
    one = verify_file(thin, workers=1, **QUICK)
    many = verify_file(thin, workers=2, **QUICK)
    assert one.ok and many.ok and many.stats["checksum_processes"] == 2
    assert many.stats["checksums_checked"] == one.stats["checksums_checked"] == sum(rows_of(thin).values())


def test_the_default_uses_the_cpus_this_process_may_use():
    assert verify.verify_workers() == max(1, min(16, len(os.sched_getaffinity(0))))


def _pool(n: int):
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    return ProcessPoolExecutor(n, mp_context=multiprocessing.get_context("forkserver"))


def test_checksums_shared_among_running_processes_name_the_rows_one_process_names(good, tmp_path, monkeypatch):
    """A build hands verify its dask workers: the rows are shared among them, this process checks
    none, and the verdict and the rows named are those of one process."""
    monkeypatch.setattr(verify, "EXECUTOR_ROWS", 1)
    path = copy_writable(good, tmp_path / "dataset_v0001.h5")
    with h5py.File(path, "r+") as f:
        f["train"]["images"][0] = 255 - f["train"]["images"][0]
    one = verify_file(path, workers=1, **QUICK)
    with _pool(2) as pool:
        shared = verify_file(path, workers=1, executor=(pool, 2), **QUICK)
    assert not one.ok and not shared.ok and shared.stats["checksum_processes"] == 2
    assert shared.stats["checksums_checked"] == one.stats["checksums_checked"] == sum(rows_of(good).values())
    assert sorted(shared.errors) == sorted(one.errors) and any(e.startswith("train[0] ") for e in shared.errors)


def test_processes_that_cannot_take_the_work_leave_every_row_checked(good, monkeypatch):
    monkeypatch.setattr(verify, "EXECUTOR_ROWS", 1)
    pool = _pool(2)
    pool.shutdown()  # takes no more work
    report = verify_file(good, workers=1, executor=(pool, 2), **QUICK)
    assert report.ok and report.stats["checksums_checked"] == sum(rows_of(good).values())
