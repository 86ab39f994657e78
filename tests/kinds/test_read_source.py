"""A raw file is read whole and bounded: the bytes and sha256 of what it holds, whatever size its
stat reports (a file that grows while read, a procfs file that reports none), and never more than
the field's limit."""

import hashlib
import io
from pathlib import Path

import pytest

from h5forge.kinds.base import read_at_most, read_bounded, read_source
from h5forge.samples import Reject

PROC_STATUS = Path("/proc/self/status")


@pytest.mark.parametrize("size", [0, 1, 4095, 4096, 4097, 100_000])
def test_read_source_returns_the_whole_file_and_its_hash(tmp_path, size):
    data = bytes(range(256)) * (size // 256) + b"x" * (size % 256)
    (tmp_path / "f.bin").write_bytes(data)
    got, sha = read_source(tmp_path, "f.bin", max_bytes=100_000)
    assert got == data and sha == hashlib.sha256(data).hexdigest()


def test_a_file_larger_than_its_stat_said_is_read_whole_up_to_the_limit():
    data = b"y" * 10_000
    assert read_at_most(io.BufferedReader(io.BytesIO(data)), 100, max_bytes=50_000) == data  # grew since fstat
    assert read_at_most(io.BufferedReader(io.BytesIO(data)), 0, max_bytes=50_000) == data  # no size reported
    # never more than the limit and one byte, whatever the stale size
    assert read_at_most(io.BufferedReader(io.BytesIO(data)), 100, max_bytes=5_000) == data[:5_001]
    assert read_at_most(io.BufferedReader(io.BytesIO(data)), 9_999, max_bytes=5_000) == data[:5_001]


@pytest.mark.skipif(not PROC_STATUS.exists(), reason="needs procfs")
def test_a_procfs_file_that_reports_no_size_is_read_whole_or_refused():
    assert PROC_STATUS.stat().st_size == 0
    data, _ = read_source(PROC_STATUS.parent, PROC_STATUS.name, max_bytes=1 << 20)
    assert data.startswith(b"Name:") and b"VmRSS" in data
    with pytest.raises(Reject, match="grew past"):
        read_source(PROC_STATUS.parent, PROC_STATUS.name, max_bytes=16)
    assert b"VmRSS" in read_bounded(PROC_STATUS, 1 << 20)
    with pytest.raises(ValueError, match="grew past"):
        read_bounded(PROC_STATUS, 16)
