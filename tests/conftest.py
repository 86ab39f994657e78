"""Shared fixtures. Builds and appends go through the pipeline (``h5forge.build`` / ``h5forge.append``),
without Prefect; only tests/flows and tests/deployments run Prefect, on the session's one test
server (their conftest.py, tests/helpers/prefect_server.py).

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


TESTS = Path(__file__).resolve().parent
RUN_PREFECT = (TESTS / "flows", TESTS / "deployments")  # the only tests that start a Prefect server
# every other test points Prefect at a port nobody listens on: a flow run that slipped into one of
# them fails at once (connection refused) instead of starting a server of its own
NO_PREFECT_SERVER = "http://127.0.0.1:9/api"


def _sigterm_to_exit(signum, frame):  # a CI timeout's SIGTERM still runs fixture teardown
    sys.exit(128 + signum)


signal.signal(signal.SIGTERM, _sigterm_to_exit)


@pytest.fixture(scope="module", autouse=True)
def no_prefect_server_outside_flows(request):
    """Outside tests/flows and tests/deployments no test (nor a module's fixture: an autouse fixture
    runs first in its scope) may reach or start a Prefect server."""
    if any(request.node.path.is_relative_to(folder) for folder in RUN_PREFECT):
        yield
        return
    with pytest.MonkeyPatch.context() as env:
        env.setenv("PREFECT_API_URL", NO_PREFECT_SERVER)  # subprocesses, and a first import of prefect
        if "prefect.settings" not in sys.modules:
            yield
            return
        from prefect.settings import PREFECT_API_URL, temporary_settings  # prefect imported already

        with temporary_settings(updates={PREFECT_API_URL: NO_PREFECT_SERVER}):
            yield


@pytest.fixture(scope="session")
def raw_demo(tmp_path_factory) -> Path:
    """A raw folder of 40 good samples plus every kind of defect the demo knows."""
    from h5forge._demo import generate

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
    from h5forge._demo import generate

    root = tmp_path_factory.mktemp("rawnew") / "new"
    generate(root, n=72, seed=7, bad=False, workers=1)
    return root


@pytest.fixture(scope="module")
def small_inventory(raw_demo, tmp_path_factory):
    """The first 6 good samples of ``raw_demo``, discovered with the demo spec."""
    from h5forge._ingest.discover import discover

    spec = demo_spec(raw_demo, tmp_path_factory.mktemp("o"))
    inv = discover(spec)
    inv.samples = [s for s in inv.samples if s.id.startswith("cell_")][:6]
    return inv


@pytest.fixture
def build_spec():
    """``build_spec(dict) -> (path of the published version, its BuildResult)``, built by the pipeline.

    The small folders these tests build hold bad inputs on purpose, often more than the default
    ``max_rejected`` share, so unless ``dict`` sets one every input may be rejected (the limit has
    tests of its own: tests/ingest/test_inputs_trust.py)."""
    import h5forge
    from h5forge.spec import DatasetSpec

    def build(data: dict):
        result = h5forge.build(DatasetSpec.model_validate({"max_rejected": 1.0, **data}))
        assert result.version is not None and not result.unchanged, result
        return result.path, result

    return build


@pytest.fixture
def dataset(raw_demo, tmp_path):
    """A built v1 (the pipeline) and its spec file; the inbox is tmp_path/inbox."""
    import h5forge

    spec_file = write_spec_file(raw_demo, tmp_path / "out", tmp_path / "spec.yaml", inbox=tmp_path / "inbox")
    assert h5forge.build(spec_file).version == 1
    return spec_file, tmp_path / "out", tmp_path / "inbox"
