"""Publishing, the writer lock, retention and rollback, with real processes."""

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from h5forge._store.versions import LATEST, OutputBusy, latest, output_lock, published, retain, set_latest, stage
from tests.helpers.files import make_version


PY = sys.executable


READER = textwrap.dedent("""
    import os, sys, h5py, hdf5plugin
    link, progress, stop = sys.argv[1:4]
    opens = failures = 0
    while not os.path.exists(stop):
        try:
            with h5py.File(os.path.realpath(link), "r") as f:
                assert f.attrs["format"] == "h5forge"
                n = int(f["train"].attrs["count"])
                assert f["train/checksum"].shape[0] == n and f["train/images"].shape[0] == n
            opens += 1
        except Exception as e:
            failures += 1
            print("FAIL", type(e).__name__, e, flush=True)
        with open(progress + ".tmp", "w") as fh:
            fh.write(str(opens))
        os.replace(progress + ".tmp", progress)
    print("OPENS", opens, "FAILURES", failures, flush=True)
""")
PUBLISHES = 5  # versions published while the reader reads
HANG = 600  # seconds: bounds a reader that stopped reading, not how fast it reads


def opens_so_far(progress) -> int:
    return int(progress.read_text()) if progress.exists() else 0


def wait_for_opens(reader, progress, at_least: int) -> None:
    deadline = time.monotonic() + HANG
    while opens_so_far(progress) < at_least:
        if reader.poll() is not None:
            raise AssertionError(f"the reader exited ({reader.returncode}): {reader.stdout.read()}")
        assert time.monotonic() < deadline, f"the reader opened latest only {opens_so_far(progress)} times"
        time.sleep(0.01)


def test_reader_never_sees_a_missing_or_partial_latest(tmp_path, small_inventory, raw_demo):
    out = tmp_path / "out"
    make_version(out, small_inventory, raw_demo)
    progress, stop = tmp_path / "opens", tmp_path / "stop"
    reader = subprocess.Popen([PY, "-c", READER, str(out / LATEST), str(progress), str(stop)],
                              stdout=subprocess.PIPE, text=True)
    try:
        for k in range(PUBLISHES):  # each publish lands while the reader opens latest again and again
            wait_for_opens(reader, progress, 3 * k + 3)
            make_version(out, small_inventory, raw_demo)
        wait_for_opens(reader, progress, 3 * PUBLISHES + 3)
    finally:
        stop.touch()
    stdout, _ = reader.communicate(timeout=HANG)
    assert "FAILURES 0" in stdout, stdout
    assert int(stdout.split("OPENS")[1].split()[0]) >= 3 * PUBLISHES + 3
    assert os.readlink(out / LATEST) == f"dataset_v{1 + PUBLISHES:04d}.h5"  # relative target
    assert not [p for p in out.iterdir() if p.name.startswith(".dataset")]


def test_published_versions_are_read_only(tmp_path, small_inventory, raw_demo):
    out = tmp_path / "out"
    n = make_version(out, small_inventory, raw_demo)
    path = published(out)[n]
    assert path.stat().st_mode & 0o222 == 0


HOLDER = textwrap.dedent("""
    import sys, time
    from h5forge._store.versions import output_lock
    with output_lock(sys.argv[1], what="test-holder"):
        open(sys.argv[1] + "/.dataset_v0009.h5.partial", "w").write("half")
        print("held", flush=True)
        time.sleep(120)
""")


def test_a_second_writer_fails_clearly_and_a_killed_one_leaves_nothing(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    holder = subprocess.Popen([PY, "-c", HOLDER, str(out)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(OutputBusy) as err:
            with output_lock(out):
                pass
        assert f'"pid": {holder.pid}' in str(err.value) and "test-holder" in str(err.value)
        # a pid means something only on its host: a holder on another one (a shared folder) says where
        assert f'"host": "{socket.gethostname()}"' in str(err.value)
        assert "another h5forge run is writing to" in str(err.value)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    with output_lock(out):  # the kernel dropped the dead holder's lock
        assert not (out / ".dataset_v0009.h5.partial").exists()


def test_retention_keeps_newest_and_whatever_latest_points_at(tmp_path, small_inventory, raw_demo):
    out = tmp_path / "out"
    for _ in range(6):
        make_version(out, small_inventory, raw_demo)
    removed = retain(out, keep=3)
    assert sorted(p.name for p in removed) == [f"dataset_v000{i}.h5" for i in (1, 2, 3)]
    assert list(published(out)) == [4, 5, 6]
    set_latest(out, 4)  # rollback
    assert latest(out) == 4
    retain(out, keep=1)
    assert list(published(out)) == [4, 6]
    assert stage(out).number == 7  # numbers never reused


def test_a_lock_that_is_a_symlink_or_a_folder_is_refused_and_its_target_untouched(tmp_path):
    from h5forge.errors import UsageError

    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    out = tmp_path / "out"
    out.mkdir()
    (out / ".h5forge.lock").symlink_to(victim)
    with pytest.raises(UsageError, match="is not a regular file"):
        with output_lock(out):
            pass
    assert victim.read_text() == "precious"
    (out / ".h5forge.lock").unlink()
    (out / ".h5forge.lock").mkdir()
    with pytest.raises(UsageError, match="is not a regular file"):
        with output_lock(out):
            pass
