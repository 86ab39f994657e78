"""A candidate's files are written to the disk while verify reads them: the flush runs beside the
block, is over when the block ends, and a file it cannot flush is left to the publish's seal."""

import os
import threading
import time

from h5forge._store import versions


def test_the_flush_runs_beside_the_block_and_ends_with_it(tmp_path, monkeypatch):
    data = tmp_path / "dataset_v0001.h5.partial"
    data.write_bytes(b"x" * (1 << 20))
    started, flushed = threading.Event(), []

    def slow_fdatasync(fd: int) -> None:
        started.set()
        time.sleep(0.3)
        flushed.append(os.readlink(f"/proc/self/fd/{fd}"))

    monkeypatch.setattr(versions.os, "fdatasync", slow_fdatasync)
    with versions.flushing([tmp_path / "gone", data]):  # a missing file is no error here
        assert started.wait(60)  # the flush is under way while the block runs
        assert flushed == []
    assert flushed == [str(data)]  # and over when it ends
    versions.seal(data)
    assert data.stat().st_mode & 0o777 == 0o444
