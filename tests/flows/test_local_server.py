"""The local Prefect server that `h5forge build` starts when no server is configured, and that the
next command reuses (h5forge/_cli/local_server.py): real servers, each under a PREFECT_HOME of its own,
every server a test started stopped at its end. Waits are for events (a process gone, a file
appended), bounded generously."""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import psutil
import pytest

from h5forge._cli import local_server
from h5forge._store.versions import latest
from tests.helpers.data import REPO, drop_samples, write_spec_file
from tests.helpers.files import all_ids

H5FORGE = str(Path(sys.executable).parent / "h5forge")
GONE_WITHIN = 120  # seconds; a bound on a hang

pytestmark = pytest.mark.e2e


def _use_home(monkeypatch, home: Path) -> Path:
    home.mkdir(exist_ok=True)
    monkeypatch.setenv("PREFECT_HOME", str(home))
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    return home


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A PREFECT_HOME of the test's own and no configured server; the local server stopped at the end."""
    home = _use_home(monkeypatch, tmp_path / "prefect-home")
    yield home
    local_server.stop(home / "h5forge-server")


@pytest.fixture(scope="module")
def running_home(tmp_path_factory):
    """A PREFECT_HOME whose local server runs, for the tests that only look at it; stopped at the end."""
    home = tmp_path_factory.mktemp("running") / "prefect-home"
    with pytest.MonkeyPatch.context() as env:
        _use_home(env, home)
        server, started = local_server.find_or_start()
        assert started
        yield home, server
        local_server.stop()


@pytest.fixture
def in_running_home(running_home, monkeypatch):
    home, server = running_home
    _use_home(monkeypatch, home)
    return home, server


@pytest.fixture
def unrelated():
    """A live process that is not the server, and that writes down every signal it receives."""
    proc = subprocess.Popen([sys.executable, "-c", SIGNAL_RECORDER], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "ready\n"
    yield proc
    proc.kill()
    proc.wait()


# every catchable signal blocked and taken in turn: the kernel hands over pending standard signals
# (SIGTERM among them) before real-time ones, so once SIGRTMIN is read, all sent before it were read
SIGNAL_RECORDER = """
import signal
watched = set(signal.Signals) - {signal.SIGKILL, signal.SIGSTOP}
signal.pthread_sigmask(signal.SIG_BLOCK, watched)
print("ready", flush=True)
while True:
    print(signal.sigwaitinfo(watched).si_signo, flush=True)
"""


def signals_received(proc: subprocess.Popen) -> list[int]:
    """The signals the recorder received until now (it is alive: SIGKILL cannot be recorded)."""
    os.kill(proc.pid, signal.SIGRTMIN)
    got = []
    while (line := proc.stdout.readline()) != f"{int(signal.SIGRTMIN)}\n":
        assert line, "the recorder died"
        got.append(int(line))
    return got


def cli(*args, home: Path, **extra):
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    return subprocess.run([H5FORGE, *map(str, args)], capture_output=True, text=True, timeout=900, cwd=REPO,
                          env={**env, "PREFECT_HOME": str(home), **extra})


def recorded(home: Path) -> dict:
    return json.loads((home / "h5forge-server" / "server.json").read_text())


def gone(pid: int) -> bool:
    try:
        psutil.Process(pid).wait(GONE_WITHIN)
    except psutil.NoSuchProcess:
        pass
    except psutil.TimeoutExpired:
        return False
    return True


def api(server: local_server.Server, path: str, secret: str | None, body: dict | None = None) -> tuple[int, object]:
    request = urllib.request.Request(server.url + path, data=None if body is None else json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    if secret is not None:
        request.add_header("Authorization", "Basic " + base64.b64encode(secret.encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, None


def record(folder: Path, **fields) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "server.json").write_text(json.dumps(fields))


def test_a_build_starts_the_server_the_next_build_reuses_and_server_stop_stops_it(raw_demo, tmp_path, home):
    spec = write_spec_file(raw_demo, tmp_path / "out", tmp_path / "spec.yaml")
    first = cli("build", spec, home=home)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "started a local Prefect server at http://127.0.0.1:" in first.stderr
    server = recorded(home)
    listening = [c.laddr for c in psutil.Process(server["pid"]).net_connections("tcp") if c.status == "LISTEN"]
    assert listening == [("127.0.0.1", server["port"])]  # the recorded port is the server's own
    # no port chosen before the server bound it (a port on its command line could be taken first)
    assert str(server["port"]) not in psutil.Process(server["pid"]).cmdline()
    assert "published v0001" in first.stdout

    second = cli("build", spec, home=home)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "started a local Prefect server" not in second.stderr
    assert recorded(home) == server  # the same process, on the same port, with the same secret
    assert "unchanged since v0001" in second.stdout
    assert not list((home / "h5forge-server" / "users").iterdir())  # neither build holds it any more

    status = cli("server", "status", home=home)
    url = f"http://127.0.0.1:{server['port']}/api"
    assert status.returncode == 0 and f"pid {server['pid']}, {url}, Prefect {server['prefect']} (answers)" in status.stdout

    stop = cli("server", "stop", home=home)
    assert stop.returncode == 0
    assert stop.stdout.strip() == f"stopped the local Prefect server (pid {server['pid']}, {url})"
    assert gone(server["pid"])
    assert not (home / "h5forge-server" / "server.json").exists()
    assert cli("server", "status", home=home).stdout.startswith("no local Prefect server runs")
    assert cli("server", "stop", home=home).stdout.strip() == "no local Prefect server was running"


def test_the_api_refuses_a_request_without_the_secret_and_the_servers_files_are_the_users_only(in_running_home):
    home, server = in_running_home
    runs = "/flow_runs/filter"
    assert api(server, runs, None, {}) == (401, None)
    assert api(server, runs, "not-the-secret", {}) == (401, None)
    assert api(server, runs, server.secret, {})[0] == 200
    assert "PREFECT_SERVER_API_AUTH_STRING" not in " ".join(psutil.Process(server.pid).cmdline())
    folder = home / "h5forge-server"
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in (home, folder, folder / "server.json",
                                                              folder / "server.log", home / "prefect.db")}
    assert modes == {"prefect-home": 0o700, "h5forge-server": 0o700, "server.json": 0o600,
                     "server.log": 0o600, "prefect.db": 0o600}


def test_a_server_recorded_under_another_prefect_home_is_neither_reused_nor_signalled(in_running_home, tmp_path,
                                                                                       monkeypatch):
    home, server = in_running_home
    other = _use_home(monkeypatch, tmp_path / "other-home")
    shutil.copytree(home / "h5forge-server", other / "h5forge-server", ignore=shutil.ignore_patterns("lock"))
    assert local_server.running() is None
    assert local_server.stop() is None
    monkeypatch.setenv("PREFECT_HOME", str(home))
    assert local_server.running() == server  # still running, and still its own home's


def test_a_server_recorded_with_another_prefect_version_is_not_reused(in_running_home):
    home, server = in_running_home
    state = home / "h5forge-server" / "server.json"
    kept = state.read_text()
    try:
        state.write_text(json.dumps({**json.loads(kept), "prefect": "2.20.0"}))
        assert local_server.running() is None
    finally:
        state.write_text(kept)
    assert local_server.running() == server


def test_a_fake_server_answering_health_is_not_trusted_and_gets_no_request(home, tmp_path):
    seen = tmp_path / "requests.log"
    fake = subprocess.Popen([sys.executable, "-c", FAKE_SERVER, str(seen)], stdout=subprocess.PIPE, text=True)
    try:
        port = int(fake.stdout.readline())
        url = f"http://127.0.0.1:{port}/api/health"
        assert urllib.request.urlopen(url, timeout=30).status == 200  # it answers as a healthy server would
        seen.write_text("")
        record(home / "h5forge-server", pid=fake.pid, started=psutil.Process(fake.pid).create_time(), port=port,
               prefect=local_server.version("prefect"), home=str(home), secret="s")
        assert local_server.running() is None
        assert local_server.stop() is None
        assert fake.poll() is None  # not signalled
        assert seen.read_text() == ""  # nothing sent to it, the secret least of all
    finally:
        fake.kill()
        fake.wait()


def test_a_server_started_before_the_rename_is_still_ours_to_stop(home, tmp_path):
    """An h5forge from before its internal modules had a leading underscore started its server as
    ``python -m`` with the module in the package's earlier name, ``cli``: after an upgrade,
    ``h5forge server stop`` stops it."""
    earlier = tmp_path / "earlier"
    (earlier / "h5forge" / "cli").mkdir(parents=True)
    (earlier / "h5forge" / "__init__.py").write_text("")
    (earlier / "h5forge" / "cli" / "__init__.py").write_text("")
    (earlier / "h5forge" / "cli" / "local_server.py").write_text(FAKE_SERVER)
    seen = tmp_path / "requests.log"
    command = local_server.SERVER_COMMANDS[-1]  # -m, the module in the package's earlier name
    assert command != local_server.SERVER_COMMAND
    fake = subprocess.Popen([sys.executable, *command, str(seen)], cwd=earlier, stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(earlier)})
    try:
        port = int(fake.stdout.readline())
        assert psutil.Process(fake.pid).cmdline()[1:3] == command
        record(home / "h5forge-server", pid=fake.pid, started=psutil.Process(fake.pid).create_time(), port=port,
               prefect=local_server.version("prefect"), home=str(home), secret="s")
        server = local_server.recorded(home / "h5forge-server")
        assert local_server.owned_process(server) is not None
        assert local_server.stop() == server
        assert fake.wait(GONE_WITHIN) is not None
    finally:
        fake.kill()
        fake.wait()


FAKE_SERVER = """
import sys
from http.server import BaseHTTPRequestHandler, HTTPServer
class Yes(BaseHTTPRequestHandler):
    def do_GET(self):
        with open(sys.argv[1], "a") as f:
            f.write(self.path + " " + str(self.headers.get("Authorization")) + "\\n")
        self.send_response(200); self.end_headers(); self.wfile.write(b'"3.9.1"')
    do_POST = do_GET
    def log_message(self, *args): pass
server = HTTPServer(("127.0.0.1", 0), Yes)
print(server.server_address[1], flush=True)
server.serve_forever()
"""


def test_a_stale_record_naming_a_live_unrelated_process_is_never_signalled(home, unrelated, monkeypatch):
    folder = home / "h5forge-server"
    record(folder, pid=unrelated.pid, started=psutil.Process(unrelated.pid).create_time(), port=9,
           prefect=local_server.version("prefect"), home=str(home), secret="s")
    stop = cli("server", "stop", home=home)
    assert stop.returncode == 0 and stop.stdout.strip() == "no local Prefect server was running"
    assert cli("server", "status", home=home).stdout.startswith("no local Prefect server runs")
    record(folder, pid=unrelated.pid, started=psutil.Process(unrelated.pid).create_time(), port=9,
           prefect=local_server.version("prefect"), home=str(home), secret="s")
    monkeypatch.setattr(local_server, "_start", lambda folder: "a new server")  # what a build does next
    assert local_server.find_or_start(folder) == ("a new server", True)
    assert signals_received(unrelated) == []


def test_a_stale_record_is_replaced_and_an_idle_server_stops_itself(home, unrelated, monkeypatch):
    folder = home / "h5forge-server"
    record(folder, pid=unrelated.pid, started=psutil.Process(unrelated.pid).create_time(), port=9,
           prefect=local_server.version("prefect"), home=str(home), secret="s")
    monkeypatch.setenv("H5FORGE_SERVER_IDLE_MINUTES", "0.01")  # idle after 0.6 s without a command
    with local_server.used(folder):
        server, started = local_server.find_or_start(folder)
        assert started and server.pid != unrelated.pid
        assert local_server.running(folder) == server
        assert local_server.find_or_start(folder) == (server, False)
    assert gone(server.pid)  # nobody used it since: it stopped itself
    assert signals_received(unrelated) == []
    assert "no command used this server for 0.01 min; stopping" in (folder / "server.log").read_text()
    assert local_server.running(folder) is None


@pytest.mark.parametrize("value", ["abc", "-1", "nan"])
def test_a_bad_idle_setting_is_one_error_line(value, raw_demo, tmp_path, home):
    spec = write_spec_file(raw_demo, tmp_path / "out", tmp_path / "spec.yaml")
    for args in (("build", spec), ("server", "status")):
        done = cli(*args, home=home, H5FORGE_SERVER_IDLE_MINUTES=value)
        assert done.returncode == 2, done.stderr
        assert done.stderr.splitlines() == [
            f"error: H5FORGE_SERVER_IDLE_MINUTES must be a positive number of minutes, not {value!r}"
        ]
    assert not (home / "h5forge-server" / "server.json").exists()


def test_a_prefect_home_that_cannot_be_kept_private_is_one_error_line(raw_demo, tmp_path):
    spec = write_spec_file(raw_demo, tmp_path / "out", tmp_path / "spec.yaml")
    (tmp_path / "a-file").write_text("")
    home = tmp_path / "a-file" / "home"  # no folder can be made there
    done = cli("build", spec, home=home)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert [line for line in done.stderr.splitlines() if line.startswith("error:")] == [
        f"error: cannot keep {home / 'h5forge-server'} to yourself for the local Prefect server: "
        f"[Errno 20] Not a directory: '{home / 'h5forge-server'}'"
    ]


def test_watch_runs_its_appends_on_the_local_server(in_running_home, raw_demo, raw_new, tmp_path):
    import h5forge

    home, server = in_running_home
    out, inbox = tmp_path / "out", tmp_path / "inbox"
    spec = write_spec_file(raw_demo, out, tmp_path / "spec.yaml", inbox=inbox)
    h5forge.build(spec)
    dropped = drop_samples(raw_new, inbox, ["cell_000000"], rename="new_")
    log = tmp_path / "watch.log"
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    with open(log, "w") as sink:
        watcher = subprocess.Popen([H5FORGE, "watch", str(spec)], env={**env, "PREFECT_HOME": str(home)},
                                   stdout=sink, stderr=subprocess.STDOUT, cwd=REPO)
    try:
        deadline = time.monotonic() + 900
        while latest(out) != 2 and watcher.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
    finally:
        watcher.send_signal(signal.SIGTERM)
        watcher.wait(timeout=300)
    output = log.read_text()
    assert latest(out) == 2, output
    assert set(dropped) <= set(sum(all_ids(out / "dataset_latest.h5").values(), []))
    assert "Starting temporary server" not in output and "started a local Prefect server" not in output, output
    status, flows = api(server, "/flows/filter", server.secret, {})
    assert status == 200 and "append-samples" in {f["name"] for f in flows}


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
