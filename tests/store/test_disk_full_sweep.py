"""A full disk at every write of a build and of an append (plain pipeline, no Prefect), for real:
the output folder and the inbox on a small tmpfs, filled to leave N bytes free.

An undisturbed run is measured first: the bytes it has used before it opens each file for
writing, and before and after each step. The sweep then leaves just that many bytes free (the
file's first page fails) and some inside each growing step (HDF5 writes, which Python does not see
open). After each failure: one line (DiskFull, or after publishing the inbox-move error that says
the version is published), latest unchanged before publish and HEALTHY, no temporary file left;
then, with the space back, the same run converges to the undisturbed run's result. Every run is a
child process (tests/helpers/full_disk.py): a crash of HDF5 shows as its exit status.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import yaml

from tests.helpers.data import age_files, drop_samples, write_spec_file
from tests.helpers.files import make_raw
from tests.helpers.tmpfs import mounted_tmpfs

PAGE = 4096


@pytest.fixture(scope="module")
def tmpfs(tmp_path_factory):
    """A 16 MiB tmpfs (CI runs as root); unmounted afterwards."""
    with mounted_tmpfs(tmp_path_factory.mktemp("full")) as mnt:
        yield mnt


@pytest.fixture(scope="module")
def setup(tmpfs, tmp_path_factory):
    """v1 built on the tmpfs and an inbox there holding 12 new samples and one broken input; the
    folder copied aside (the snapshot each run starts from); a spec that appends, and one whose
    changed field rule makes the build write v2 (keep 1, no minimum age: retention then removes v1)."""
    import h5forge

    base = tmp_path_factory.mktemp("sweep")
    raw, new = make_raw(base / "raw", n=24, seed=5), make_raw(base / "new", n=12, seed=7)
    out, inbox = tmpfs / "out", tmpfs / "inbox"
    spec = write_spec_file(raw, out, base / "append.yaml", inbox=inbox)
    h5forge.build(spec)
    drop_samples(new, inbox, [f"cell_{i:06d}" for i in range(12)], rename="n_")
    shutil.copy(inbox / "masks" / "n_cell_000000.png", inbox / "masks" / "n_bad.png")
    (inbox / "images" / "n_bad.png").write_bytes(b"not a png")
    (inbox / "n_bad.json").write_text((inbox / "n_cell_000000.json").read_text().replace("n_cell_000000", "n_bad"))
    age_files(inbox)
    data = yaml.safe_load(spec.read_text())
    data["fields"]["images"]["size"] = [80, 80]
    data["output"].update(keep=1, retire_after_seconds=0)
    build_spec = base / "build.yaml"
    build_spec.write_text(yaml.safe_dump(data))
    snapshot = base / "snapshot"
    shutil.copytree(tmpfs, snapshot, symlinks=True)
    return {"build": build_spec, "append": spec, "mnt": tmpfs, "snapshot": snapshot, "base": base}


def child(setup, mode: str, leaves: list[int]):
    dest = setup["base"] / f"{mode}-{len(leaves)}-{uuid.uuid4().hex[:6]}.json"
    args = [str(setup[mode]), str(setup["mnt"]), str(setup["snapshot"]), str(dest), *map(str, leaves)]
    res = subprocess.run(
        [sys.executable, "-m", "tests.helpers.full_disk", mode, *args],
        capture_output=True,
        text=True,
        timeout=1200,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert res.returncode == 0, f"{mode} at {leaves}: exit {res.returncode}\n{res.stderr[-3000:]}"
    assert "Traceback" not in res.stderr, res.stderr[-3000:]
    return json.loads(dest.read_text())


def page_down(n: int) -> int:
    return n // PAGE * PAGE


def kind_of(path: str) -> tuple[str, str]:
    """Files written alike count once in the default sweep: a report's .json and .md, the reason
    files of the inbox's quarantine."""
    p = Path(path)
    name = p.name.removesuffix(".tmp")
    if name.endswith(".reason"):
        return ("inbox quarantine", "reason")
    return (p.parent.name, name.rsplit(".", 1)[0] if name.count(".") > 1 else name)


def thresholds(measured: dict, dense: bool) -> list[int]:
    """Bytes to leave free: just what the run used before each file it writes, and points inside
    every step that grows (its HDF5 writes). The default takes one file of each kind (``kind_of``);
    ``dense`` takes every file, quarter points of the steps and a point every 16 pages."""
    points, kinds = set(), set()
    for path, used in sorted(measured["opens"].items(), key=lambda kv: kv[1]):
        if dense or kind_of(path) not in kinds:
            points.add(page_down(used))
            kinds.add(kind_of(path))
    fractions = (0.25, 0.5, 0.75) if dense else (0.5,)
    for _name, before, after in measured["steps"]:
        if after - before > 4 * PAGE:
            points |= {page_down(before + int(f * (after - before))) for f in fractions}
    if dense:
        peak = max([measured["used"], *measured["opens"].values(), *(after for _, _, after in measured["steps"])])
        points |= set(range(0, page_down(peak), 16 * PAGE))  # the peak: retention frees space at the end
    return sorted(points)


def same_but_reports(outcome: dict, warnings: list[str]) -> dict:
    """``outcome`` without the reports of the published version the run said it had no room for
    (the preview sheet, the health report): they are made after the publish, and a full disk
    skips them with a warning."""
    full = [w for w in warnings if "No space left on device" in w]
    skipped = []
    if any(w.startswith("no preview: ") for w in full):
        skipped.append("reports/dataset_v0002.preview.png")
    if any(w.startswith("the health report of the published version was not made: ") for w in full):
        skipped += ["reports/dataset_v0002.health.json", "reports/dataset_v0002.health.md"]
    return {**outcome, "out_files": [n for n in outcome["out_files"] if n not in skipped]}


def check_point(point: dict, reference: dict, mnt: Path, before_latest: int) -> None:
    where = f"{point['leave']} bytes free"
    after, rerun = point["after_failure"], point["after_rerun"]
    assert after["healthy"], (where, after["errors"])
    error = point["error"]
    published = error is not None and error[0] == "InboxMoveFailed"
    # after publishing, the journal of the inbox moves stays for the rerun to finish them
    assert after["strays"] == ([".append-journal.json"] if published else []), (where, after["strays"])
    if error is None:  # it fitted (the space ran out after the last write, or in the preview)
        assert same_but_reports(after, point["warnings"]) == same_but_reports(reference, point["warnings"]), where
    else:
        kind, message = error[0], error[1]
        assert len(error) == 2, (where, error)  # an H5forgeError, not an unexpected one
        assert "\n" not in message, (where, message)
        if kind == "DiskFull":
            m = re.match(r"no space left on (\S+) \(tmpfs\) while writing (\S+); nothing was published", message)
            assert m, (where, message)
            assert m.group(1) == str(mnt) and Path(m.group(2)).is_relative_to(mnt), (where, message)
            assert not Path(m.group(2)).is_dir(), (where, message)  # a file, not just a folder
            assert after["latest"] == before_latest, where
            h5 = {n for n in after["out_files"] if n.endswith(".h5") or n.endswith(".partial")}
            assert h5 == {"dataset_latest.h5", "dataset_v0001.h5"}, (where, h5)  # no delta, no partial
        else:  # the version was published, then the inbox could not be tidied: it says so
            assert kind == "InboxMoveFailed", (where, error)
            assert re.match(r"dataset_v\d{4}\.h5 is published, but \d+ inbox file\(s\) could not be", message), (where, message)
            assert "No space left on device" in message and after["latest"] == reference["latest"], where
    got, expected = same_but_reports(rerun, point["warnings"]), same_but_reports(reference, point["warnings"])
    assert got == expected, (where, {k: (got[k], expected[k]) for k in got if got[k] != expected[k]})


def sweep(setup, mode: str, dense: bool) -> int:
    measured = child(setup, mode, [])
    reference = measured["outcome"]
    assert reference["healthy"] and reference["latest"] == 2 and reference["strays"] == []
    leaves = thresholds(measured, dense)
    points = child(setup, mode, leaves)
    assert [p["leave"] for p in points] == leaves
    for point in points:
        check_point(point, reference, setup["mnt"], 1)
    return sum(p["error"] is not None for p in points)


def test_append_on_a_disk_filling_at_each_write_fails_in_one_line_and_a_rerun_converges(setup):
    failed = sweep(setup, "append", dense=False)
    assert failed >= 6  # delta, quarantine list, thin version, reports, journal, inbox moves


def test_build_on_a_disk_filling_at_each_write_fails_in_one_line_and_a_rerun_converges(setup):
    failed = sweep(setup, "build", dense=False)
    assert failed >= 2  # staged version, quarantine list (the reports come after the publish)


@pytest.mark.soak
@pytest.mark.parametrize("mode", ["append", "build"])
def test_dense_sweep_of_the_free_space(setup, mode):
    assert sweep(setup, mode, dense=True) >= 10


def test_a_thin_version_is_built_in_memory_and_written_once(tmp_path):
    """Nothing is at the thin version's path while HDF5 builds it; the file appears whole at the end."""
    import h5py

    from h5forge._store.thin import built_in_memory

    target = tmp_path / ".dataset_v0002.h5.partial"
    with built_in_memory(target) as f:
        f.attrs["x"] = 7
        assert not target.exists()
    with h5py.File(target, "r") as f:
        assert f.attrs["x"] == 7
