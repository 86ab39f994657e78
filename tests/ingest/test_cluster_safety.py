"""The LocalCluster h5forge starts lets no other local process in, and ``compute.workers`` is
bounded by what the machine can hold."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from h5forge.errors import SpecError
from h5forge._ingest.parallel import dask_client
from h5forge.spec import DatasetSpec, parse_spec, workers_this_machine_holds
from tests.helpers.data import demo_spec

OUTSIDER = """
import sys
from distributed import Client
try:
    client = Client(sys.argv[1], timeout=sys.argv[2])
    print("ran:", client.run_on_scheduler(lambda: "code on the scheduler"))
except Exception as err:
    print("refused:", type(err).__name__)
"""


def _outsider(address: str, wait: str = "10s") -> str:
    """What a process without the run's credentials gets from ``address``; ``wait`` bounds its
    connection attempt (a refused one may take all of it)."""
    done = subprocess.run([sys.executable, "-c", OUTSIDER, address, wait], capture_output=True, text=True,
                          timeout=900)
    return done.stdout.strip()


def test_another_local_process_cannot_run_code_on_the_local_cluster():
    with dask_client(None, 1) as client:
        address = client.scheduler.address
        assert address.startswith("tls://127.0.0.1:"), address
        assert client.submit(sum, [1, 2], pure=False).result() == 3  # the build's own client works
        # without the run's credentials: neither plain TCP nor TLS gets in
        assert _outsider(address).startswith("refused:")
        assert _outsider(address.replace("tls://", "tcp://")).startswith("refused:")


def test_an_insecure_local_cluster_is_the_users_choice_and_reachable():
    """compute.secure: false (a single-user machine): the outsider's probe does get in, which is
    what the default prevents."""
    with dask_client(None, 1, secure=False) as client:
        # a long wait: on a loaded machine a connection that is let in may take a while
        assert _outsider(client.scheduler.address, wait="300s") == "ran: code on the scheduler"


def test_workers_beyond_what_the_machine_holds_are_refused_with_the_bound(raw_demo, tmp_path):
    data = demo_spec(raw_demo, tmp_path / "out").model_dump(mode="json")
    most = workers_this_machine_holds()
    data["compute"]["workers"] = most
    assert DatasetSpec.model_validate(data).compute.workers == most
    data["compute"]["workers"] = 1_000_000
    with pytest.raises(SpecError, match=rf"compute\.workers.*1000000.*at most {most}"):
        _validated(data)
    data["compute"]["dask_address"] = "tcp://127.0.0.1:8786"  # an external cluster: its workers are its own
    assert _validated(data).compute.workers == 1_000_000


def _validated(data: dict) -> DatasetSpec:
    return parse_spec(data, Path("."))
