"""The Makefile's targets on a fresh machine: `make test` brings the command-line tools its tests run.

Each target runs for real with `make`, on a PATH of stand-ins that record what they were asked to do,
so that nothing is installed on the machine running the tests."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.helpers.data import REPO

MAKE = shutil.which("make")
pytestmark = pytest.mark.skipif(MAKE is None, reason="no make on this machine: the Makefile cannot run here")


def stand_in(bin_dir: Path, name: str, script: str) -> None:
    path = bin_dir / name
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(0o755)


def bare_path(tmp_path: Path, *tools: str) -> Path:
    """A folder of the tools a recipe may run, and none of HDF5's."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("sh", "id", *tools):
        os.symlink(shutil.which(tool), bin_dir / tool)  # type: ignore[arg-type]
    stand_in(bin_dir, "sudo", 'exec "$@"\n')
    return bin_dir


def make(target: str, bin_dir: Path) -> subprocess.CompletedProcess:
    return subprocess.run([MAKE, "-s", "-C", str(REPO), target], capture_output=True, text=True, timeout=120,
                          env={"PATH": str(bin_dir), "HOME": os.environ.get("HOME", "/")})


def test_make_test_installs_h5dump_where_it_is_missing(tmp_path):
    bin_dir = bare_path(tmp_path, "env", "chmod")
    asked = tmp_path / "apt-get.log"
    # apt-get's stand-in installs an h5dump that reports itself, where the real one would go
    stand_in(bin_dir, "apt-get", f'echo "$*" >> {asked}\n'
             f'[ "$1" = install ] && printf "#!/bin/sh\\necho h5dump\\n" > {bin_dir}/h5dump '
             f"&& chmod +x {bin_dir}/h5dump\nexit 0\n")
    done = make("test-tools", bin_dir)
    assert done.returncode == 0, done.stdout + done.stderr
    nginx = [] if os.access("/usr/sbin/nginx", os.X_OK) else ["nginx-light"]  # found outside PATH too
    assert asked.read_text().splitlines() == ["update -qq", " ".join(["install -y -qq hdf5-tools", *nginx])]
    assert (bin_dir / "h5dump").is_file()
    again = make("test-tools", bin_dir)  # found now: nothing is installed twice
    assert again.returncode == 0 and asked.read_text().count("install") == 1


def test_make_test_names_the_tools_where_it_cannot_install_them(tmp_path):
    done = make("test-tools", bare_path(tmp_path))  # no apt-get: not a Debian-like machine
    assert done.returncode != 0
    assert done.stdout.strip().startswith("error: the tests need h5dump and nginx: install hdf5-tools")


def test_the_test_targets_bring_the_tools():
    listed = subprocess.run([MAKE, "-C", str(REPO), "-pn", "test"], capture_output=True, text=True, timeout=120)
    rules = {line.split(":")[0]: line for line in listed.stdout.splitlines() if line.startswith(("test:", "test-quick:"))}
    assert "test-tools" in rules["test"].split(":", 1)[1].split()
    assert "test-tools" in rules["test-quick"].split(":", 1)[1].split()


def test_make_demo_ends_by_reading_a_batch_back_without_a_framework():
    demo = subprocess.run([MAKE, "--no-print-directory", "-C", str(REPO), "-n", "demo"], capture_output=True,
                          text=True, timeout=120).stdout.splitlines()
    assert demo[-1] == ".venv/bin/h5forge read data/demo/dataset_latest.h5 --batch-size 4"
