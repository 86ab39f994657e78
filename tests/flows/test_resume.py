"""A real `h5forge build` process SIGKILLed at 80 % of its samples: the next build takes its file over
with the rows it had made durable and publishes exactly what an uninterrupted build publishes; a
build of the same inputs after that publishes nothing."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from h5forge._format.names import RESUMABLE, RESUME_SUFFIX
from h5forge._store.versions import latest, published
from tests.helpers.data import write_spec_file
from tests.helpers.files import make_raw, strays
from tests.ingest.incremental.test_rebuild import assert_same

pytestmark = pytest.mark.e2e

H5FORGE = str(Path(sys.executable).parent / "h5forge")


@pytest.fixture
def api_url(prefect_server):
    from prefect.settings import PREFECT_API_URL

    return PREFECT_API_URL.value()


def test_a_killed_build_resumes_and_equals_an_uninterrupted_one(api_url, tmp_path):
    from h5forge.flows.build import build_dataset

    raw = make_raw(tmp_path / "raw", n=120, seed=4)
    out = tmp_path / "out"
    spec_file = write_spec_file(raw, out, tmp_path / "spec.yaml", batch_size=8)
    env = {**os.environ, "PREFECT_API_URL": api_url, "H5FORGE_KILL_AT": "build:at-80%",
           "H5FORGE_CHECKPOINT_SECONDS": "0"}  # a checkpoint after every batch: the kill loses none
    child = subprocess.run([H5FORGE, "build", str(spec_file)], env=env, capture_output=True, text=True, timeout=900)
    assert child.returncode == -signal.SIGKILL, child.stdout + child.stderr
    assert latest(out) is None and published(out) == {}  # nothing half-done is visible
    partials = sorted(p.name for p in out.iterdir() if p.name.endswith((".partial", ".partial" + RESUME_SUFFIX)))
    assert partials == [".dataset_v0001.h5.partial", ".dataset_v0001.h5.partial" + RESUME_SUFFIX]
    inode = (out / partials[0]).stat().st_ino

    resumed = build_dataset(str(spec_file))
    assert resumed.version == 1
    # 12 batches of 8 were durable when the process died (96 of 120 inputs), kept in place in the
    # killed build's file (published as the version); only the rest is cleaned
    assert resumed.timings["resumed_in_place"] == 96 and resumed.timings["cleaned"] == 24
    assert "resumed_rows" not in resumed.timings and Path(resumed.path).stat().st_ino == inode
    assert not (out / RESUMABLE).exists() and not (out / (RESUMABLE + RESUME_SUFFIX)).exists()
    assert strays(out) == []

    fresh = build_dataset(str(write_spec_file(raw, tmp_path / "fresh", tmp_path / "fresh.yaml", batch_size=8)))
    assert_same(Path(resumed.path), Path(fresh.path))  # every checksum, value and statistic

    again = subprocess.run([H5FORGE, "build", str(spec_file)], env={**os.environ, "PREFECT_API_URL": api_url},
                           capture_output=True, text=True, timeout=900)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "unchanged since v0001" in again.stdout
    assert list(published(out)) == [1] and latest(out) == 1


def test_a_short_build_checkpoints_by_progress_and_leaves_its_hashes(api_url, tmp_path):
    """No checkpoint by time (an hour apart): the ones after each 5 % of the inputs make the rows
    durable, and log the raw-file hashes learnt since the last, which spare the next build from
    reading those files again."""
    import time

    from h5forge.flows.build import build_dataset
    from h5forge._ingest.incremental.hash_cache import RACY_SECONDS

    raw = make_raw(tmp_path / "raw", n=120, seed=4)
    time.sleep(RACY_SECONDS)  # the inputs are older than the racy window, as a nightly's are
    out = tmp_path / "out"
    spec_file = write_spec_file(raw, out, tmp_path / "spec.yaml", batch_size=8)
    env = {**os.environ, "PREFECT_API_URL": api_url, "H5FORGE_KILL_AT": "build:at-80%",
           "H5FORGE_CHECKPOINT_SECONDS": "3600"}
    child = subprocess.run([H5FORGE, "build", str(spec_file)], env=env, capture_output=True, text=True, timeout=900)
    assert child.returncode == -signal.SIGKILL, child.stdout + child.stderr

    resumed = build_dataset(str(spec_file))
    # 5 % of 120 inputs is less than a batch of 8: a checkpoint after every batch, 96 rows durable
    assert resumed.timings["resumed_in_place"] == 96 and resumed.timings["cleaned"] == 24
    # the hashes of the 96 samples done were logged at their checkpoints: the image and mask of
    # the 24 others are the only raw files read before cleaning
    assert resumed.timings["hashed_files"] == 2 * (120 - 96)
    fresh = build_dataset(str(write_spec_file(raw, tmp_path / "fresh", tmp_path / "fresh.yaml", batch_size=8)))
    assert_same(Path(resumed.path), Path(fresh.path))
