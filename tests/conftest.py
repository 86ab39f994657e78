"""Shared fixtures. Prefect runs against one session-wide test server (never one per test).

Plain helpers are in tests/helpers/ (``from tests.helpers.data import demo_spec, write_spec_file``); only fixtures live here.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
from pathlib import Path

import pytest

from tests.helpers.data import demo_spec, write_spec_file

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_TASKS_DEFAULT_NO_CACHE", "true")


def _sigterm_to_exit(signum, frame):  # a CI timeout's SIGTERM still runs fixture teardown
    sys.exit(128 + signum)


signal.signal(signal.SIGTERM, _sigterm_to_exit)


@pytest.fixture(scope="session")
def prefect_server():
    """A temporary Prefect API for flow tests (about 20 s to start on a fresh database)."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield


@pytest.fixture(scope="session")
def raw_demo(tmp_path_factory) -> Path:
    """A raw folder of 40 good samples plus every kind of defect the demo knows."""
    from h5forge.demo import generate

    root = tmp_path_factory.mktemp("raw") / "demo"
    generate(root, n=40, seed=1, bad=True, workers=1)
    return root


@pytest.fixture
def raw_copy(raw_demo, tmp_path) -> Path:
    dst = tmp_path / "raw"
    shutil.copytree(raw_demo, dst)
    return dst


@pytest.fixture(scope="session")
def raw_new(tmp_path_factory):
    """72 more good samples (other seed) to drop into an inbox."""
    from h5forge.demo import generate

    root = tmp_path_factory.mktemp("rawnew") / "new"
    generate(root, n=72, seed=7, bad=False, workers=1)
    return root


@pytest.fixture(scope="module")
def small_inventory(raw_demo, tmp_path_factory):
    """The first 6 good samples of ``raw_demo``, discovered with the demo spec."""
    from h5forge.ingest.discover import discover

    spec = demo_spec(raw_demo, tmp_path_factory.mktemp("o"))
    inv = discover(spec)
    inv.samples = [s for s in inv.samples if s.id.startswith("cell_")][:6]
    return inv


@pytest.fixture
def build_spec():
    """``build_spec(dict) -> (path of the published version, write summary)``."""
    from h5forge.ingest.build import publish_candidate, verify_candidate, write_version
    from h5forge.ingest.discover import discover
    from h5forge.spec import DatasetSpec
    from h5forge.store.versions import stage

    def build(data: dict):
        spec = DatasetSpec.model_validate(data)
        cand = stage(spec.output.dir)
        summary = write_version(spec, discover(spec), cand)
        report = verify_candidate(cand)
        assert report.ok, report.errors
        return publish_candidate(cand, report), summary

    return build


@pytest.fixture
def dataset(prefect_server, raw_demo, tmp_path):
    """A built v1 and its spec file; the inbox is tmp_path/inbox."""
    from h5forge.flows.build import build_dataset

    spec_file = write_spec_file(raw_demo, tmp_path / "out", tmp_path / "spec.yaml", inbox=tmp_path / "inbox")
    build_dataset(str(spec_file))
    return spec_file, tmp_path / "out", tmp_path / "inbox"
