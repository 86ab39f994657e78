"""The local Prefect server that `h5forge build` starts when no server is configured, and that the
next command reuses (h5forge/cli/local_server.py): real builds on a real server, each test under a
PREFECT_HOME of its own, every server it started stopped at its end."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from h5forge.cli import local_server
from tests.helpers.data import REPO, write_spec_file

H5FORGE = str(Path(sys.executable).parent / "h5forge")
GONE_WITHIN = 120  # seconds; a bound on a hang

pytestmark = pytest.mark.e2e


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A PREFECT_HOME of the test's own and no configured server; the local server stopped at the end."""
    home = tmp_path / "prefect-home"
    home.mkdir()
    monkeypatch.setenv("PREFECT_HOME", str(home))
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    yield home
    local_server.stop(home / "h5forge-server")


def cli(*args, home: Path, **extra):
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    return subprocess.run([H5FORGE, *map(str, args)], capture_output=True, text=True, timeout=900, cwd=REPO,
                          env={**env, "PREFECT_HOME": str(home), **extra})


def recorded(home: Path) -> dict:
    return json.loads((home / "h5forge-server" / "server.json").read_text())


def gone(pid: int) -> bool:
    deadline = time.monotonic() + GONE_WITHIN
    while local_server.alive(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    return not local_server.alive(pid)


def test_a_build_starts_the_server_the_next_build_reuses_and_server_stop_stops_it(raw_demo, tmp_path, home):
    spec = write_spec_file(raw_demo, tmp_path / "out", tmp_path / "spec.yaml")
    first = cli("build", spec, home=home)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "started a local Prefect server at http://127.0.0.1:" in first.stderr
    server = recorded(home)
    assert server["url"] == f"http://127.0.0.1:{server['port']}/api"
    assert local_server.alive(server["pid"])
    assert local_server.healthy(local_server.Server(server["pid"], server["port"]))
    assert "published v0001" in first.stdout

    second = cli("build", spec, home=home)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "started a local Prefect server" not in second.stderr
    assert recorded(home) == server  # the same process, on the same port
    assert "unchanged since v0001" in second.stdout
    assert not list((home / "h5forge-server" / "users").iterdir())  # neither build holds it any more

    status = cli("server", "status", home=home)
    assert status.returncode == 0 and f"pid {server['pid']}, {server['url']} (answers)" in status.stdout

    stop = cli("server", "stop", home=home)
    assert stop.returncode == 0
    assert stop.stdout.strip() == f"stopped the local Prefect server (pid {server['pid']}, {server['url']})"
    assert gone(server["pid"])
    assert not (home / "h5forge-server" / "server.json").exists()
    assert cli("server", "status", home=home).stdout.startswith("no local Prefect server runs")
    assert cli("server", "stop", home=home).stdout.strip() == "no local Prefect server was running"


def test_a_stale_pid_file_is_replaced_and_an_idle_server_stops_itself(home, monkeypatch):
    folder = home / "h5forge-server"
    folder.mkdir()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (folder / "server.json").write_text(json.dumps({"pid": dead.pid, "port": 9, "url": "http://127.0.0.1:9/api"}))
    monkeypatch.setenv("H5FORGE_SERVER_IDLE_MINUTES", "0.01")  # idle after 0.6 s without a command
    server, started = local_server.find_or_start(folder)
    assert started and server.pid != dead.pid
    assert recorded(home) == {"pid": server.pid, "port": server.port, "url": server.url}
    assert local_server.running(folder) == server
    assert local_server.find_or_start(folder) == (server, False)
    assert gone(server.pid)  # nobody used it: it stopped itself
    assert not (folder / "server.json").exists()
    assert "no command used this server for 0.01 min; stopping" in (folder / "server.log").read_text()


def test_no_local_server_when_one_is_configured_or_it_is_turned_off(home, monkeypatch):
    started = []
    monkeypatch.setenv("H5FORGE_LOCAL_SERVER", "0")  # Prefect's temporary server, as before
    with local_server.for_flow_run(started.append):
        assert "PREFECT_API_URL" not in os.environ
    monkeypatch.delenv("H5FORGE_LOCAL_SERVER")
    monkeypatch.setenv("PREFECT_API_URL", "http://127.0.0.1:9/api")  # the user's own server
    with local_server.for_flow_run(started.append):
        assert os.environ["PREFECT_API_URL"] == "http://127.0.0.1:9/api"
    assert started == [] and not (home / "h5forge-server" / "server.json").exists()
