"""The standing fault suite.

- SIGKILL at random moments: a real `h5forge build` (its version copied or mapped onto the
  workers' files: `storage.assemble` copy and mapped), a build taking over a killed build's file
  (under either), and `h5forge append` are killed after a random delay drawn over the length of a
  whole run. After each kill: latest verifies, no published file changed, and one clean rerun
  converges (exact counts, no duplicate ids, no stray files). 2 trials of each in the default run
  (``make test``), 20 of each in the `soak` run.
  (Readers across publishes and retention: tests/store/test_retention_readers.py.)

Each test prints its figures (trials run, converged, where the kills landed).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import h5py
import pytest
import yaml

from h5forge._format.names import RESUME_SUFFIX
from h5forge._store.verify import verify_file
from h5forge._store.versions import latest, published
from tests.helpers.code_on_disk import require_unchanged
from tests.helpers.data import age_files, drop_samples, write_spec_file
from tests.helpers.files import all_ids, make_raw, strays

pytestmark = [pytest.mark.e2e, pytest.mark.faults]

H5FORGE = str(Path(sys.executable).parent / "h5forge")
QUICK_TRIALS, SLOW_TRIALS = 2, 20  # of each kind of run, and of each way a build assembles its version
ASSEMBLE = ("copy", "mapped")


@pytest.fixture(scope="module")
def api_url(prefect_server):
    from prefect.settings import PREFECT_API_URL

    return PREFECT_API_URL.value()


@pytest.fixture(scope="module")
def raw_base(tmp_path_factory) -> Path:
    """40 good samples (every input is taken: exact counts are known)."""
    return make_raw(tmp_path_factory.mktemp("faultraw") / "raw", n=40, seed=11)


def published_hashes(out: Path) -> dict[str, str]:
    """Every published file (versions and the deltas they read) by name -> sha256."""
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(out.glob("dataset_v*.h5"))
            if not p.is_symlink()}


def ids_of(path: Path) -> list[str]:
    return sum(all_ids(path).values(), [])


def kill_after(args: list[str], env: dict, delay: float) -> str:
    """Run the CLI, SIGKILL it after ``delay`` s; how it ended ("killed" or "finished")."""
    proc = subprocess.Popen([H5FORGE, *args], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        proc.wait(timeout=delay)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=300)
        return "killed"
    assert proc.returncode == 0, proc.stderr.read().decode()[-3000:]
    return "finished"


def timed_run(args: list[str], env: dict) -> float:
    t0 = time.monotonic()
    res = subprocess.run([H5FORGE, *args], env=env, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    return time.monotonic() - t0


def check_after_kill(out: Path, before: dict[str, str]) -> None:
    """latest is a complete, verified version, and no published file changed or went away."""
    assert latest(out) is not None
    report = verify_file(out / "dataset_latest.h5", resample=0, latency_reads=0)
    assert report.ok, report.errors
    after = published_hashes(out)
    assert {k: after.get(k) for k in before} == before


@dataclass
class Trial:
    """One trial's own copy of the output folder (and inbox), and its spec."""

    out: Path
    spec_file: Path
    inbox: Path | None = None
    new_ids: list[str] = field(default_factory=list)


def sigkill_trials(command: str, n: int, api_url: str, fresh: Callable[[int], Trial],
                   rerun_converges: Callable[[Trial], None], seed: int, label: str = "",
                   undisturbed: Callable[[Trial], None] = lambda t: None) -> dict:
    """``n`` runs of ``h5forge <command>`` on fresh copies, each SIGKILLed after a random delay
    drawn over the length of a whole run (one undisturbed run measures it, and ``undisturbed``
    checks it); then the checks, and one clean rerun that must converge."""
    env = {**os.environ, "PREFECT_API_URL": api_url}
    first = fresh(-1)
    span = timed_run([command, str(first.spec_file)], env)  # how long one whole run takes here
    undisturbed(first)
    rng = random.Random(seed)
    figures = {"trials": 0, "killed": 0, "finished": 0, "published_before_kill": 0, "converged": 0,
               "run_seconds": round(span, 1)}
    for k in range(n):
        t = fresh(k)
        before = published_hashes(t.out)
        require_unchanged()
        figures[kill_after([command, str(t.spec_file)], env, rng.uniform(0.2, span))] += 1
        figures["trials"] += 1
        require_unchanged()  # the child and this process ran the same code
        check_after_kill(t.out, before)
        figures["published_before_kill"] += latest(t.out) == 2
        rerun_converges(t)
        assert verify_file(t.out / "dataset_latest.h5", resample=0, latency_reads=0).ok
        assert strays(t.out) == []
        figures["converged"] += 1
    print(f"{label or command} SIGKILL figures:", json.dumps(figures))
    return figures


# ---- build --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def build_base(api_url, raw_base, tmp_path_factory):
    """v1 built at one size; the trial spec asks for another, so every trial build has work to do."""
    from h5forge.flows.build import build_dataset

    tmp = tmp_path_factory.mktemp("buildbase")
    spec_file = write_spec_file(raw_base, tmp / "out", tmp / "spec.yaml")
    build_dataset(str(spec_file))
    data = yaml.safe_load(spec_file.read_text())
    data["fields"]["images"]["size"] = [96, 96]
    return tmp / "out", data


def with_assemble(spec_data: dict, assemble: str, out: Path) -> dict:
    """The trial spec writing to ``out``, its version assembled as ``assemble`` says."""
    return {**spec_data, "output": {**spec_data["output"], "dir": str(out)},
            "storage": {**spec_data.get("storage", {}), "assemble": assemble}}


def build_trials(n: int, api_url, base: tuple[Path, dict], tmp_path, assemble: str, seed: int, label: str = "",
                 undisturbed: Callable[[Trial], None] = lambda t: None) -> dict:
    """``n`` trials of a build of the trial spec, each on a copy of the output folder of ``base``
    (v1, and whatever a killed build left there), SIGKILLed at a random moment."""
    base_out, spec_data = base
    expected = sorted(ids_of(base_out / "dataset_latest.h5"))
    assert len(expected) == 40

    def fresh(k: int) -> Trial:
        out = tmp_path / f"t{k}" / "out"
        shutil.copytree(base_out, out, symlinks=True)
        spec_file = tmp_path / f"t{k}" / "spec.yaml"
        spec_file.write_text(yaml.safe_dump(with_assemble(spec_data, assemble, out)))
        return Trial(out, spec_file)

    def rerun_converges(t: Trial) -> None:
        from h5forge.flows.build import build_dataset

        build_dataset(str(t.spec_file))
        assert latest(t.out) == 2 and list(published(t.out)) == [1, 2]
        ids = ids_of(t.out / "dataset_latest.h5")
        assert sorted(ids) == expected and len(set(ids)) == len(ids) == 40

    return sigkill_trials("build", n, api_url, fresh, rerun_converges, seed, label or f"build ({assemble})",
                          undisturbed)


@pytest.mark.parametrize("assemble", ASSEMBLE)
def test_killed_builds_converge(api_url, build_base, tmp_path, assemble):
    figures = build_trials(QUICK_TRIALS, api_url, build_base, tmp_path, assemble, seed=20261130)
    assert figures["converged"] == figures["trials"] == QUICK_TRIALS


@pytest.mark.slow
@pytest.mark.soak
@pytest.mark.parametrize("assemble", ASSEMBLE)
def test_killed_builds_converge_many(api_url, build_base, tmp_path, assemble):
    figures = build_trials(SLOW_TRIALS, api_url, build_base, tmp_path, assemble, seed=20261130)
    assert figures["converged"] == figures["trials"] == SLOW_TRIALS
    assert figures["killed"] >= SLOW_TRIALS // 2  # most kills land inside the run


# ---- take-over ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def killed_build_base(api_url, build_base, tmp_path_factory) -> tuple[Path, dict]:
    """The base's output folder after an `h5forge build` of the trial spec that SIGKILLed itself at
    80 % of its inputs (small batches, a checkpoint after each): it holds a killed build's file whose
    durable rows the next build takes over in place, and the rest for it to clean. The killed build
    copies its rows into its file; a killed `mapped` build leaves no rows to take (its workers'
    files are discarded), and a `mapped` build takes over a copying one's file all the same."""
    base_out, spec_data = build_base
    tmp = tmp_path_factory.mktemp("killed")
    out = tmp / "out"
    shutil.copytree(base_out, out, symlinks=True)
    spec_file = tmp / "spec.yaml"
    small_batches = {**with_assemble(spec_data, "copy", out), "compute": {"batch_size": 4}}
    spec_file.write_text(yaml.safe_dump(small_batches))
    env = {**os.environ, "PREFECT_API_URL": api_url, "H5FORGE_KILL_AT": "build:at-80%",
           "H5FORGE_CHECKPOINT_SECONDS": "0"}
    res = subprocess.run([H5FORGE, "build", str(spec_file)], env=env, capture_output=True, text=True, timeout=900)
    assert res.returncode == -signal.SIGKILL, res.stderr[-3000:]
    state = next(p for p in out.iterdir() if p.name.endswith(RESUME_SUFFIX))
    durable = sum(json.loads(state.read_text())["counts"].values())
    assert 0 < durable < 40, durable  # rows to keep, and rows to clean
    return out, spec_data


def takes_over_in_place(t: Trial) -> None:
    """The undisturbed run kept the killed build's durable rows where they were and cleaned the rest."""
    from h5forge._format.summary import read_summary

    with h5py.File(t.out / "dataset_v0002.h5", "r") as f:
        timings = read_summary(f)["timings"]
    assert 0 < timings["resumed_in_place"] < 40 and timings["cleaned"] == 40 - timings["resumed_in_place"], timings


@pytest.mark.parametrize("assemble", ASSEMBLE)
def test_killed_take_overs_converge(api_url, killed_build_base, tmp_path, assemble):
    """The build that takes a killed build's file over is itself SIGKILLed at a random moment; the
    next one converges all the same."""
    figures = build_trials(QUICK_TRIALS, api_url, killed_build_base, tmp_path, assemble, seed=20261204,
                           label=f"take-over ({assemble})", undisturbed=takes_over_in_place)
    assert figures["converged"] == figures["trials"] == QUICK_TRIALS


@pytest.mark.slow
@pytest.mark.soak
@pytest.mark.parametrize("assemble", ASSEMBLE)
def test_killed_take_overs_converge_many(api_url, killed_build_base, tmp_path, assemble):
    figures = build_trials(SLOW_TRIALS, api_url, killed_build_base, tmp_path, assemble, seed=20261204,
                           label=f"take-over ({assemble})", undisturbed=takes_over_in_place)
    assert figures["converged"] == figures["trials"] == SLOW_TRIALS
    assert figures["killed"] >= SLOW_TRIALS // 2


# ---- append -------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def append_base(api_url, raw_base, tmp_path_factory):
    from h5forge.flows.build import build_dataset

    tmp = tmp_path_factory.mktemp("appendbase")
    spec_file = write_spec_file(raw_base, tmp / "out", tmp / "spec.yaml", inbox=tmp / "inbox")
    build_dataset(str(spec_file))
    return tmp / "out", yaml.safe_load(spec_file.read_text())


def append_trials(n: int, api_url, raw_new, append_base, tmp_path) -> dict:
    base_out, spec_data = append_base
    base_ids = ids_of(base_out / "dataset_latest.h5")
    drop = [f"cell_{i:06d}" for i in range(20)]

    def fresh(k: int) -> Trial:
        root = tmp_path / f"a{k}"
        out, inbox = root / "out", root / "inbox"
        shutil.copytree(base_out, out, symlinks=True)
        new_ids = drop_samples(raw_new, inbox, drop, rename="k_")
        age_files(inbox)
        spec_file = root / "spec.yaml"
        spec_file.write_text(yaml.safe_dump({**spec_data, "output": {**spec_data["output"], "dir": str(out)},
                                             "source": {**spec_data["source"], "inbox": str(inbox)}}))
        return Trial(out, spec_file, inbox, new_ids)

    def rerun_converges(t: Trial) -> None:
        from h5forge.flows.append import append_samples

        append_samples(str(t.spec_file))
        assert latest(t.out) == 2 and list(published(t.out)) == [1, 2]
        ids = ids_of(t.out / "dataset_latest.h5")
        assert sorted(ids) == sorted(base_ids + t.new_ids) and len(set(ids)) == len(ids)
        assert sorted(p.name for p in (t.inbox / "images").iterdir()) == []
        assert len(list((t.inbox / "processed" / "v0002" / "images").iterdir())) == len(drop)
        assert sorted(p.name for p in t.out.glob("*.h5")) == ["dataset_latest.h5", "dataset_v0001.h5",
                                                              "dataset_v0002.delta.h5", "dataset_v0002.h5"]

    return sigkill_trials("append", n, api_url, fresh, rerun_converges, seed=20261201)


def test_killed_appends_converge(api_url, raw_new, append_base, tmp_path):
    figures = append_trials(QUICK_TRIALS, api_url, raw_new, append_base, tmp_path)
    assert figures["converged"] == figures["trials"] == QUICK_TRIALS


@pytest.mark.slow
@pytest.mark.soak
def test_killed_appends_converge_many(api_url, raw_new, append_base, tmp_path):
    figures = append_trials(SLOW_TRIALS, api_url, raw_new, append_base, tmp_path)
    assert figures["converged"] == figures["trials"] == SLOW_TRIALS
    assert figures["killed"] >= SLOW_TRIALS // 2
