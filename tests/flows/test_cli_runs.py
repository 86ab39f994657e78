"""The command line's Prefect side as a user runs it, against the session's Prefect server: a
`h5forge build` whose flow run rejects too much, and `doctor` finding the server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.data import REPO
from tests.ingest.test_inputs_trust import make_pairs, spec_data, write_spec
from tests.test_cli_inspect import lines, run as inspect_run

H5FORGE = str(Path(sys.executable).parent / "h5forge")

pytestmark = pytest.mark.e2e


@pytest.fixture
def api_url(prefect_server):
    from prefect.settings import PREFECT_API_URL

    return PREFECT_API_URL.value()


def cli(*args, api_url: str):
    return subprocess.run([H5FORGE, *map(str, args)], capture_output=True, text=True, timeout=900, cwd=REPO,
                          env={**os.environ, "PREFECT_API_URL": api_url})


def test_a_build_that_rejects_too_much_publishes_nothing_and_says_why(api_url, tmp_path):
    """The issue's case: the spec's glob misses most pictures; 24 of 36 samples are incomplete."""
    raw = tmp_path / "mixed"
    ids = [f"s{i:03d}" for i in range(36)]
    for k, suffix in enumerate((".png", ".jpg", ".tif")):
        make_pairs(raw, ids[k::3], suffix)
    (raw / "images" / "s000.png").write_bytes(b"not a picture")  # one cleaning rejection too
    out = tmp_path / "out"
    spec_path = write_spec(tmp_path / "spec.yaml", spec_data(raw, out))
    r = cli("build", spec_path, api_url=api_url)
    assert r.returncode == 1, r.stdout + r.stderr
    line = next(x for x in r.stderr.splitlines() if x.startswith("error:"))
    assert line.startswith("error: 25 of 36 inputs rejected (69 %), above max_rejected (10 % = 3); "
                           "nothing published. Most common reasons: 24 x incomplete sample: no file for images "
                           "(images/*.png); 1 x ")
    assert "see " in line and "quarantine" in line
    assert not list(out.glob("dataset_*.h5")) and not (out / "dataset_latest.h5").exists()
    assert not list(out.glob(".*.partial"))
    report = json.loads((out / "quarantine" / "dataset_v0001.rejections.json").read_text())
    assert len(report) == 25


def test_doctor_finds_a_running_prefect_api(api_url):
    url = api_url
    r = inspect_run("doctor", env={"PREFECT_API_URL": url})
    assert r.returncode == 0, r.stdout
    assert lines(r.stdout)["Prefect API"] == [f"{url} reachable"]
