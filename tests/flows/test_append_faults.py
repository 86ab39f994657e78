"""Crash injection: a real `h5forge append` process is SIGKILLed at each point, then a rerun converges."""

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from h5forge._store.verify import verify_file
from h5forge._store.versions import latest, published
from tests.helpers.data import age_files, drop_samples, write_spec_file
from tests.helpers.files import all_ids, strays

pytestmark = pytest.mark.e2e

H5FORGE = str(Path(sys.executable).parent / "h5forge")


@pytest.fixture
def api_url(prefect_server):
    from prefect.settings import PREFECT_API_URL

    return PREFECT_API_URL.value()


def child_env(api_url: str, **extra) -> dict:
    return {**os.environ, "PREFECT_API_URL": api_url, **extra}


POINTS = ["append:before-write", "append:mid-write", "append:before-publish", "append:before-move",
          "append:mid-move"]


@pytest.fixture(scope="module")
def base_version(prefect_server, raw_demo, tmp_path_factory):
    from h5forge.flows.build import build_dataset

    tmp = tmp_path_factory.mktemp("base")
    build_dataset(str(write_spec_file(raw_demo, tmp / "out", tmp / "spec.yaml")))
    return tmp / "out"


@pytest.mark.parametrize("point", POINTS)
def test_killed_append_converges_on_rerun(point, api_url, base_version, raw_demo, raw_new, tmp_path):  # noqa: F811
    from h5forge.flows.append import append_samples

    out, inbox = tmp_path / "out", tmp_path / "inbox"
    shutil.copytree(base_version, out, symlinks=True)
    spec_file = write_spec_file(raw_demo, out, tmp_path / "spec.yaml", inbox=inbox)
    base_ids = sum(all_ids(out / "dataset_v0001.h5").values(), [])
    new_ids = drop_samples(raw_new, inbox, [f"cell_{i:06d}" for i in range(70)], rename="k_")
    age_files(inbox)

    child = subprocess.run([H5FORGE, "append", str(spec_file)], env=child_env(api_url, H5FORGE_KILL_AT=point),
                           capture_output=True, text=True, timeout=900)
    assert child.returncode == -signal.SIGKILL, child.stdout + child.stderr
    # whatever the crash point, latest is a complete, verified version
    assert latest(out) in (1, 2)
    assert verify_file(out / "dataset_latest.h5", resample=0, latency_reads=0).ok

    rerun = append_samples(str(spec_file))
    if point in ("append:before-move", "append:mid-move"):
        assert rerun.version is None  # published before the crash; the rerun only finished the moves
    ids = sum(all_ids(out / "dataset_latest.h5").values(), [])
    assert sorted(ids) == sorted(base_ids + new_ids)  # none lost, none twice
    assert latest(out) == 2 and list(published(out)) == [1, 2]
    assert verify_file(out / "dataset_latest.h5", resample=0).ok
    assert sorted(p.name for p in (inbox / "images").iterdir()) == []
    assert len(list((inbox / "processed" / "v0002" / "images").iterdir())) == 70
    assert not (inbox / "quarantine").exists()
    assert strays(out) == []
    assert sorted(p.name for p in out.glob("*.h5")) == ["dataset_latest.h5", "dataset_v0001.h5",
                                                        "dataset_v0002.delta.h5", "dataset_v0002.h5"]


def test_watch_service_appends_files_dropped_after_it_started(api_url, raw_demo, raw_new, tmp_path):  # noqa: F811
    from h5forge.flows.build import build_dataset

    out, inbox = tmp_path / "out", tmp_path / "inbox"
    spec_file = write_spec_file(raw_demo, out, tmp_path / "spec.yaml", inbox=inbox)
    build_dataset(str(spec_file))
    early = drop_samples(raw_new, inbox, ["cell_000000"], rename="early_")  # dropped while it was down
    log = tmp_path / "watch.log"
    with open(log, "w") as sink:
        watcher = subprocess.Popen([H5FORGE, "watch", str(spec_file)], env=child_env(api_url),
                                   stdout=sink, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for(lambda: latest(out) == 2, 900, watcher, log)
        assert set(early) <= set(sum(all_ids(out / "dataset_latest.h5").values(), []))
        later = drop_samples(raw_new, inbox, ["cell_000001", "cell_000002"], rename="later_")
        wait_for(lambda: latest(out) == 3, 900, watcher, log)
        assert set(later) <= set(sum(all_ids(out / "dataset_latest.h5").values(), []))
    finally:
        watcher.send_signal(signal.SIGTERM)
        watcher.wait(timeout=300)
    output = log.read_text()
    assert watcher.returncode == 0, output
    assert "stopped" in output
    assert not list((inbox / "images").iterdir())


def wait_for(condition, seconds, proc, log):
    deadline = time.time() + seconds
    while time.time() < deadline:
        if condition():
            return
        if proc.poll() is not None:
            raise AssertionError(f"the watch service exited:\n{log.read_text()}")
        time.sleep(0.5)
    raise AssertionError(f"timed out; the service said:\n{log.read_text()}")
