"""The local Prefect server that ``h5forge build`` and ``h5forge append`` reuse when no server is
configured (no PREFECT_API_URL in the environment or the Prefect profile).

Without a configured server, each Prefect process starts a temporary server of its own and waits
for it (a dozen seconds on a quiet machine, a minute under load). Instead the first command starts
one server in the background, on 127.0.0.1 and a free port, and leaves it running; the next command
finds it (its process alive and ``/api/health`` answering) and runs at once. It is Prefect's own
server app, as the temporary one is (no UI), on the same database under PREFECT_HOME.

Its state lives in ``<PREFECT_HOME>/h5forge-server/``: ``server.json`` (pid, port, url), its log,
``users/<pid>`` for each command using it, and a lock that lets one command at a time find or start
it. The server stops itself once no command has used it for ``H5FORGE_SERVER_IDLE_MINUTES``
(30 by default) and none is running; ``h5forge server stop`` stops it at once.
``H5FORGE_LOCAL_SERVER=0`` turns it off: each command starts Prefect's temporary server again.

``python -m h5forge.cli.local_server <port> <idle minutes>`` is the server process itself.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Optional

from h5forge.errors import H5forgeError

IDLE_MINUTES = 30.0  # unless H5FORGE_SERVER_IDLE_MINUTES says otherwise
# a fresh database is migrated before the server answers: minutes on a loaded machine; this only
# bounds a server that never comes up
STARTUP_TIMEOUT = float(os.environ.get("H5FORGE_SERVER_STARTUP_TIMEOUT", "900"))
IDLE_CHECK_SECONDS = 10.0


class ServerError(H5forgeError):
    """The local Prefect server did not start."""


@dataclass(frozen=True)
class Server:
    pid: int
    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api"


def state_dir() -> Path:
    home = os.environ.get("PREFECT_HOME") or str(Path.home() / ".prefect")
    return Path(home).expanduser() / "h5forge-server"


def _state_file(folder: Path) -> Path:
    return folder / "server.json"


def idle_minutes() -> float:
    return float(os.environ.get("H5FORGE_SERVER_IDLE_MINUTES", IDLE_MINUTES))


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie (exited, not reaped by its parent) no longer serves
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def healthy(server: Server, timeout: float = 5.0) -> bool:
    try:
        with urllib.request.urlopen(f"{server.url}/health", timeout=timeout) as r:
            return r.status == 200
    except (OSError, urllib.error.URLError, ValueError):
        return False


def recorded(folder: Optional[Path] = None) -> Optional[Server]:
    """The server the state file names, whether or not it still runs."""
    path = _state_file(folder or state_dir())
    try:
        data = json.loads(path.read_text())
        return Server(int(data["pid"]), int(data["port"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def running(folder: Optional[Path] = None) -> Optional[Server]:
    """The recorded server if its process lives and it answers."""
    server = recorded(folder)
    if server is not None and alive(server.pid) and healthy(server):
        return server
    return None


@contextmanager
def _locked(folder: Path) -> Iterator[None]:
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _log_tail(folder: Path, lines: int = 15) -> str:
    try:
        return "\n".join((folder / "server.log").read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def _start(folder: Path) -> Server:
    port = _free_port()
    log = open(folder / "server.log", "ab")
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "h5forge.cli.local_server", str(port), str(idle_minutes())],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,  # not stopped by the terminal's Ctrl-C, nor by the command's exit
            close_fds=True,
            env={k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"},
        )
    finally:
        log.close()
    server = Server(proc.pid, port)
    _state_file(folder).write_text(json.dumps({"pid": server.pid, "port": port, "url": server.url}))
    deadline = time.monotonic() + STARTUP_TIMEOUT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            _state_file(folder).unlink(missing_ok=True)
            raise ServerError(
                f"the local Prefect server exited at start (code {proc.returncode}); its log, "
                f"{folder / 'server.log'}, ends with:\n{_log_tail(folder)}"
            )
        if healthy(server, timeout=2.0):
            return server
        time.sleep(0.2)
    stop(folder)
    raise ServerError(
        f"the local Prefect server did not answer within {STARTUP_TIMEOUT:.0f} s; see {folder / 'server.log'}"
    )


def find_or_start(folder: Optional[Path] = None) -> tuple[Server, bool]:
    """The running local server, started first if none runs (then True)."""
    folder = folder or state_dir()
    with _locked(folder):
        server = running(folder)
        if server is not None:
            return server, False
        old = recorded(folder)
        if old is not None and alive(old.pid):  # alive but not answering: a hung server
            _terminate(old.pid)
        _state_file(folder).unlink(missing_ok=True)
        return _start(folder), True


def _terminate(pid: int, wait: float = 30.0) -> None:
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + wait
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if alive(pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def stop(folder: Optional[Path] = None) -> Optional[Server]:
    """Stop the recorded server; the server that was stopped, or None if none ran."""
    folder = folder or state_dir()
    server = recorded(folder)
    if server is None:
        return None
    was_alive = alive(server.pid)
    if was_alive:
        _terminate(server.pid)
    _state_file(folder).unlink(missing_ok=True)
    return server if was_alive else None


@contextmanager
def used(folder: Optional[Path] = None) -> Iterator[None]:
    """Mark the server in use by this process: it does not stop itself meanwhile."""
    users = (folder or state_dir()) / "users"
    users.mkdir(parents=True, exist_ok=True)
    mine = users / str(os.getpid())
    mine.touch()
    try:
        yield
    finally:
        mine.unlink(missing_ok=True)
        (users.parent / "last-used").touch()


def configured() -> bool:
    """A Prefect server is configured (environment, profile or prefect.toml): use it, start none."""
    if os.environ.get("PREFECT_API_URL"):
        return True
    from prefect.settings import get_current_settings

    return bool(get_current_settings().api.url)


@contextmanager
def for_flow_run(started: Callable[[Server], None]) -> Iterator[None]:
    """Run the block's flow against the configured server, else against the local one (found or
    started: then ``started(server)``), which the block marks as in use. H5FORGE_LOCAL_SERVER=0
    leaves the run to Prefect's temporary server, started and stopped by this command alone."""
    if os.environ.get("H5FORGE_LOCAL_SERVER") == "0" or configured():
        yield
        return
    from prefect.settings import PREFECT_API_URL, temporary_settings

    folder = state_dir()
    server, new = find_or_start(folder)
    if new:
        started(server)
    os.environ["PREFECT_API_URL"] = server.url  # for the processes the run starts (dask workers)
    try:
        with used(folder), temporary_settings(updates={PREFECT_API_URL: server.url}):
            yield
    finally:
        os.environ.pop("PREFECT_API_URL", None)


def _last_use(folder: Path) -> float:
    """When a command last used the server; now if one uses it."""
    users = folder / "users"
    last = 0.0
    for entry in users.iterdir() if users.exists() else ():
        try:
            pid = int(entry.name)
        except ValueError:
            continue
        if alive(pid):
            return time.time()
        entry.unlink(missing_ok=True)  # a command killed before it could say it was done
    for marker in (folder / "last-used", _state_file(folder)):
        try:
            last = max(last, marker.stat().st_mtime)
        except OSError:
            pass
    return last


def _stop_when_idle(folder: Path, port: int, minutes: float) -> None:
    # idle time counts from when the server first answers: a migration at start is not idleness
    me = Server(os.getpid(), port)
    while not healthy(me):
        time.sleep(1.0)
    ready = time.time()
    while True:
        time.sleep(IDLE_CHECK_SECONDS)
        if time.time() - max(ready, _last_use(folder)) > minutes * 60:
            print(f"h5forge: no command used this server for {minutes:g} min; stopping", flush=True)
            _forget(folder)
            os.kill(os.getpid(), signal.SIGTERM)  # uvicorn shuts down as on `h5forge server stop`
            return


def _serve(port: int, minutes: float) -> None:
    # the settings Prefect gives its temporary server: no UI, its services as when ephemeral
    os.environ.update({"PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1", "PREFECT__SERVER_FINAL": "1"})
    import prefect
    import uvicorn

    folder = state_dir()
    threading.Thread(target=_stop_when_idle, args=(folder, port, minutes), daemon=True).start()
    # on SIGTERM uvicorn shuts down, then dies of the signal: no code of ours runs after it
    uvicorn.run(
        "prefect.server.api.server:create_app",
        factory=True,
        app_dir=str(Path(prefect.__file__).parent.parent),
        host="127.0.0.1",
        port=port,
        log_level="warning",
        lifespan="on",
    )
    _forget(folder)


def _forget(folder: Path) -> None:
    """Remove the state file if it names this process."""
    server = recorded(folder)
    if server is not None and server.pid == os.getpid():
        _state_file(folder).unlink(missing_ok=True)


if __name__ == "__main__":
    _serve(int(sys.argv[1]), float(sys.argv[2]))
