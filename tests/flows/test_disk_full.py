"""A full disk, for real: the output folder on a small tmpfs, `h5forge build` and `h5forge append`
run as subprocesses (their flow runs, on the session's Prefect server). Each exits 1 with one line naming the device and the file, never crashes
(it used to end in a segfault, exit 139), leaves no partial file, moves no latest and no inbox file."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from h5forge._store.versions import latest, published
from tests.helpers.data import age_files, drop_samples, write_spec_file
from tests.helpers.files import strays
from tests.helpers.tmpfs import mounted_tmpfs

pytestmark = pytest.mark.e2e

H5FORGE = str(Path(sys.executable).parent / "h5forge")
LEFT_FREE = 256 << 10  # bytes left on the tmpfs before the run that fills it


@pytest.fixture(scope="module")
def raw_good(tmp_path_factory):
    """30 good samples (no defects: every input is taken)."""
    from tests.helpers.files import make_raw

    return make_raw(tmp_path_factory.mktemp("rawgood") / "raw", n=30, seed=5)


@pytest.fixture
def small_fs(tmp_path):
    """A 16 MiB tmpfs (CI runs as root); unmounted afterwards."""
    with mounted_tmpfs(tmp_path) as mnt:
        yield mnt


def fill(mnt: Path, leave: int = LEFT_FREE) -> None:
    """A ballast file that leaves ``leave`` bytes free."""
    st = os.statvfs(mnt)
    free = st.f_bavail * st.f_frsize
    with open(mnt / "ballast", "wb") as fh:
        fh.write(b"\0" * max(0, free - leave))
        fh.flush()
        os.fsync(fh.fileno())


def tree_hashes(folder: Path) -> dict[str, str]:
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def run_cli(args: list[str]) -> subprocess.CompletedProcess:
    from prefect.settings import PREFECT_API_URL

    env = {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value()}
    return subprocess.run([H5FORGE, *args], env=env, capture_output=True, text=True, timeout=900)


def assert_clean_failure(res: subprocess.CompletedProcess, mnt: Path, out: Path) -> None:
    assert res.returncode == 1, f"exit {res.returncode}\n{res.stdout}\n{res.stderr[-3000:]}"
    errors = [line for line in res.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, res.stderr[-3000:]
    m = re.match(r"error: no space left on (\S+) \(tmpfs\) while writing (\S+?);", errors[0])
    assert m, errors[0]
    assert m.group(1) == str(mnt)
    assert Path(m.group(2)).parent == out and Path(m.group(2)).name.startswith(".dataset_v0002")
    assert "Segmentation fault" not in res.stderr
    assert strays(out) == []


def test_build_on_a_full_disk_exits_1_with_one_line_and_changes_nothing(prefect_server, raw_good, small_fs, tmp_path):
    import h5forge

    out = small_fs / "out"
    spec_file = write_spec_file(raw_good, out, tmp_path / "spec.yaml")
    h5forge.build(spec_file)  # v1 fits
    data = yaml.safe_load(spec_file.read_text())
    data["fields"]["images"]["size"] = [192, 192]  # a new field rule: the next build has work to do
    spec_file.write_text(yaml.safe_dump(data))
    before = tree_hashes(out)
    fill(small_fs)

    res = run_cli(["build", str(spec_file)])

    assert_clean_failure(res, small_fs, out)
    assert latest(out) == 1 and list(published(out)) == [1]
    after = tree_hashes(out)
    assert {k: v for k, v in after.items() if k.endswith(".h5")} == {k: v for k, v in before.items() if k.endswith(".h5")}
    # once there is room again the same command publishes v2
    (small_fs / "ballast").unlink()
    again = run_cli(["build", str(spec_file)])
    assert again.returncode == 0, again.stderr[-3000:]
    assert latest(out) == 2


def test_append_on_a_full_disk_exits_1_and_leaves_the_inbox_as_it_was(prefect_server, raw_good, raw_new, small_fs,
                                                                       tmp_path):
    import h5forge

    out, inbox = small_fs / "out", tmp_path / "inbox"
    spec_file = write_spec_file(raw_good, out, tmp_path / "spec.yaml", inbox=inbox)
    h5forge.build(spec_file)
    drop_samples(raw_new, inbox, [f"cell_{i:06d}" for i in range(60)], rename="n_")
    age_files(inbox)
    inbox_before, out_before = tree_hashes(inbox), tree_hashes(out)
    fill(small_fs)

    res = run_cli(["append", str(spec_file)])

    assert_clean_failure(res, small_fs, out)
    assert latest(out) == 1 and list(published(out)) == [1]
    assert tree_hashes(inbox) == inbox_before
    assert sorted(p.name for p in out.glob("*.h5")) == ["dataset_latest.h5", "dataset_v0001.h5"]
    assert tree_hashes(out)["dataset_v0001.h5"] == out_before["dataset_v0001.h5"]


def test_append_whose_thin_version_does_not_fit_exits_1_with_one_line_and_leaves_no_delta(prefect_server, raw_good,
                                                                                          raw_new, small_fs, tmp_path):
    """The space runs out while the thin version is written, after the delta fitted (this crashed
    the process in HDF5, exit 139, leaving the partial thin version and the delta). Where that
    is: an undisturbed plain append of the same inbox, measured in a child process
    (tests/helpers/full_disk.py), from a copy of the folder restored before each run."""
    import h5forge
    from tests.helpers.full_disk import restore

    out, inbox = small_fs / "out", small_fs / "inbox"
    spec_file = write_spec_file(raw_good, out, tmp_path / "spec.yaml", inbox=inbox)
    h5forge.build(spec_file)
    drop_samples(raw_new, inbox, [f"cell_{i:06d}" for i in range(30)], rename="n_")
    age_files(inbox)
    snapshot = tmp_path / "snapshot"
    shutil.copytree(small_fs, snapshot, symlinks=True)
    measured = tmp_path / "measured.json"
    res = subprocess.run([sys.executable, "-m", "tests.helpers.full_disk", "append", str(spec_file), str(small_fs),
                          str(snapshot), str(measured)], capture_output=True, text=True, timeout=900,
                         cwd=Path(__file__).resolve().parents[2])
    assert res.returncode == 0, res.stderr[-3000:]
    (before, after), = [(b, a) for name, b, a in json.loads(measured.read_text())["steps"] if name == "write-thin-version"]
    assert after - before > 8 * 4096  # room to land inside it
    restore(small_fs, snapshot)
    inbox_before = tree_hashes(inbox)
    fill(small_fs, (before + (after - before) // 2) // 4096 * 4096)

    res = run_cli(["append", str(spec_file)])

    assert_clean_failure(res, small_fs, out)
    assert re.search(r"while writing \S+/\.dataset_v0002\.h5\.partial;", res.stderr), res.stderr[-3000:]
    assert latest(out) == 1 and sorted(p.name for p in out.glob("*.h5")) == ["dataset_latest.h5", "dataset_v0001.h5"]
    assert tree_hashes(inbox) == inbox_before
    (small_fs / "ballast").unlink()
    again = run_cli(["append", str(spec_file)])
    assert again.returncode == 0, again.stderr[-3000:]
    assert latest(out) == 2 and not any(inbox.glob("*.json"))
