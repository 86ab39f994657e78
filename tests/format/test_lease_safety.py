"""Lease files give another local user no way in: nothing under ``readers/`` is writable by others,
and a link put in a lease's place is removed, never followed or chmodded through (issue: a
symlink ``readers/dataset_v0002.h5.lease -> /victim`` made the victim world-writable)."""

from __future__ import annotations

import os
import stat
import shutil
import tempfile
from pathlib import Path

from h5forge._format.leases import acquire, lease_path, prepare, release


def _mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_a_published_lease_and_its_folder_are_writable_by_the_writer_alone(tmp_path):
    version = tmp_path / "dataset_v0001.h5"
    version.write_bytes(b"")
    prepare(version)
    lease = lease_path(version)
    assert lease.is_file() and not lease.is_symlink()
    assert _mode(lease) & 0o022 == 0, oct(_mode(lease))
    assert _mode(lease.parent) & 0o022 == 0 and not _mode(lease.parent) & stat.S_ISVTX, oct(_mode(lease.parent))


def test_a_link_in_a_leases_place_is_replaced_and_its_target_left_alone(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("secret")
    victim.chmod(0o600)
    version = tmp_path / "out" / "dataset_v0002.h5"
    version.parent.mkdir()
    version.write_bytes(b"")
    lease = lease_path(version)
    lease.parent.mkdir()
    lease.parent.chmod(0o1777)  # a folder made by an older release: anyone could add a link
    lease.symlink_to(victim)
    prepare(version)
    assert _mode(victim) == 0o600 and victim.read_text() == "secret"
    assert lease.is_file() and not lease.is_symlink()
    assert _mode(lease.parent) & 0o022 == 0  # the older folder's mode is tightened too
    assert acquire(version)  # a reader locks the new lease
    release(version)


def test_a_linked_readers_folder_is_not_followed(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    version = tmp_path / "out" / "dataset_v0001.h5"
    version.parent.mkdir()
    version.write_bytes(b"")
    (version.parent / "readers").symlink_to(elsewhere, target_is_directory=True)
    prepare(version)
    assert list(elsewhere.iterdir()) == []
    assert lease_path(version).is_file() and not lease_path(version).parent.is_symlink()


def test_a_reader_without_write_access_still_locks_the_lease():
    """As another user (``nobody``, in a forked child): the lease is locked through a read-only
    descriptor, and nothing can be added to ``readers/``."""
    assert os.geteuid() == 0, "this check switches to user nobody: run the suite as root (CI does)"
    top = Path(tempfile.mkdtemp(prefix="h5forge-lease-"))  # pytest's tmp folders are closed to others
    try:
        top.chmod(0o755)
        version = top / "dataset_v0001.h5"
        version.write_bytes(b"")
        prepare(version)
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: become nobody, then try both
            os.close(read_end)
            try:
                os.setgid(65534)
                os.setuid(65534)
                locked = acquire(version)
                try:
                    os.symlink("/etc/passwd", lease_path(version).parent / "x.lease")
                    added = True
                except PermissionError:
                    added = False
                os.write(write_end, f"{locked} {added}".encode())
            finally:
                os._exit(0)
        os.close(write_end)
        with os.fdopen(read_end) as pipe:
            answer = pipe.read()
        os.waitpid(pid, 0)
        assert answer.split() == ["True", "False"], answer
    finally:
        shutil.rmtree(top)
