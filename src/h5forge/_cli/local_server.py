"""The local Prefect server that ``h5forge build``, ``append`` and ``watch`` reuse when no server is
configured (no PREFECT_API_URL in the environment, the Prefect profile or prefect.toml).

The first command starts Prefect's own ``prefect server start`` (no UI, analytics off) in the
background and later commands reuse it, instead of each starting Prefect's temporary server and
waiting for it. h5forge adds only what Prefect lacks:

- a secret per server, which the server requires (Prefect's API auth string) and commands send;
- proof of ownership: the server binds a port of its own (port 0), and a command reuses or signals
  only the process recorded here: the same pid and start time, the user's own, h5forge's server
  command (or an earlier h5forge's, from before its internal modules had a leading underscore) on
  this PREFECT_HOME, holding the recorded port. (``prefect server stop`` signals the pid
  in its pid file unchecked; h5forge does not use it, nor ``--background``, whose pid file it is);
- an idle stop: the server stops itself once no command used it for H5FORGE_SERVER_IDLE_MINUTES.

State lives in ``<PREFECT_HOME>/h5forge-server/`` (0700): ``server.json`` (pid, start time, port,
Prefect version, home and secret; 0600), ``server.log``, ``users/<pid>`` for each command using the
server, and a lock that lets one command at a time find or start it. ``H5FORGE_LOCAL_SERVER=0``
leaves each command to Prefect's temporary server.

``python -m h5forge._cli.local_server <idle minutes>`` is the server process itself.
"""

from __future__ import annotations

import base64
import fcntl
import json
import math
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from importlib.metadata import version
from pathlib import Path
from typing import Callable, Iterator, Optional

import psutil

from h5forge.errors import H5forgeError, UsageError

IDLE_MINUTES = 30.0
STARTUP_SECONDS = 900.0  # migrating a fresh database takes minutes on a loaded machine: a bound on a hang
IDLE_CHECK_SECONDS = 10.0
# the server's command line; an h5forge from before its internal modules had a leading underscore
# started the same server from its package `cli`, and such a server is still this installation's
SERVER_COMMANDS = [["-m", f"h5forge.{package}.local_server"] for package in ("_cli", "cli")]
SERVER_COMMAND = SERVER_COMMANDS[0]
PREFECT_START = ["server", "start", "--host", "127.0.0.1", "--port", "0", "--no-ui", "--analytics-off"]


class ServerError(H5forgeError):
    """The local Prefect server did not start."""


@dataclass(frozen=True)
class Server:
    pid: int
    started: float  # the process's start time: with the pid, it names one process for good
    port: int
    prefect: str  # the Prefect version serving
    home: str  # the PREFECT_HOME it serves
    secret: str = field(repr=False)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api"


def prefect_home() -> Path:
    return Path(os.environ.get("PREFECT_HOME") or "~/.prefect").expanduser().absolute()


def state_dir() -> Path:
    return prefect_home() / "h5forge-server"


def idle_minutes() -> float:
    raw = os.environ.get("H5FORGE_SERVER_IDLE_MINUTES", str(IDLE_MINUTES))
    try:
        minutes = float(raw)
    except ValueError:
        minutes = math.nan
    if not (math.isfinite(minutes) and minutes > 0):
        raise UsageError(f"H5FORGE_SERVER_IDLE_MINUTES must be a positive number of minutes, not {raw!r}")
    return minutes


def recorded(folder: Optional[Path] = None) -> Optional[Server]:
    """The server the state file names, whether or not it still runs."""
    try:
        server = Server(**json.loads(((folder or state_dir()) / "server.json").read_text()))
    except (OSError, ValueError, TypeError):
        return None
    return server if isinstance(server.pid, int) and isinstance(server.secret, str) else None


def _listening_port(proc: psutil.Process) -> Optional[int]:
    ports = {
        c.laddr.port
        for c in proc.net_connections("tcp")
        if c.status == psutil.CONN_LISTEN and c.laddr.ip == "127.0.0.1"
    }
    return ports.pop() if len(ports) == 1 else None


def owned_process(server: Server) -> Optional[psutil.Process]:
    """The recorded server's process if it provably is the one this installation started."""
    try:
        proc = psutil.Process(server.pid)
        ours = (
            proc.create_time() == server.started
            and proc.uids().real == os.getuid()
            and proc.cmdline()[1:3] in SERVER_COMMANDS
            and proc.environ().get("PREFECT_HOME") == server.home == str(prefect_home())
            and _listening_port(proc) == server.port
        )
    except psutil.Error:
        return None
    return proc if ours else None


def _get(url: str, secret: Optional[str]) -> tuple[int, bytes]:
    request = urllib.request.Request(url)
    if secret is not None:  # as Prefect's client sends its auth string
        request.add_header("Authorization", "Basic " + base64.b64encode(secret.encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=30) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, b""
    except (OSError, ValueError):
        return 0, b""


def answers(server: Server) -> bool:
    """The server refuses a request without the secret and, given it, names its Prefect version."""
    url = f"{server.url}/admin/version"
    return _get(url, None)[0] == 401 and _get(url, server.secret) == (200, json.dumps(server.prefect).encode())


def running(folder: Optional[Path] = None) -> Optional[Server]:
    """The recorded server if it is this installation's (ownership checked before anything is
    sent to it), of this Prefect version, and answers with the secret."""
    server = recorded(folder)
    if server is None or server.prefect != version("prefect") or owned_process(server) is None:
        return None
    return server if answers(server) else None


@contextmanager
def _locked(folder: Path) -> Iterator[None]:
    _private_dir(folder)
    with open(folder / "lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _private_dir(folder: Path) -> None:
    try:
        folder.mkdir(parents=True, exist_ok=True)
        folder.chmod(0o700)
    except OSError as err:
        raise ServerError(f"cannot keep {folder} to yourself for the local Prefect server: {err}") from err


def _write_private(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def find_or_start(folder: Optional[Path] = None) -> tuple[Server, bool]:
    """The running local server, started first if none runs (then True)."""
    folder = folder or state_dir()
    with _locked(folder):
        server = running(folder)
        if server is not None:
            return server, False
        stop(folder)  # one of ours that does not answer or is of another Prefect version
        return _start(folder), True


def _start(folder: Path) -> Server:
    home = prefect_home()
    _private_dir(home)  # the database holds every run's parameters and logs
    secret = secrets.token_urlsafe(32)
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env.update(PREFECT_HOME=str(home), PREFECT_SERVER_API_AUTH_STRING=secret)  # environ: readable by the user only
    log = os.open(folder / "server.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        proc = subprocess.Popen(
            [sys.executable, *SERVER_COMMAND, str(idle_minutes())],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,  # not stopped by the terminal's Ctrl-C, nor by the command's exit
            umask=0o077,  # the database and everything else it writes: the user's only
            env=env,
        )
    finally:
        os.close(log)
    port = _bound_port(proc, folder)
    server = Server(proc.pid, psutil.Process(proc.pid).create_time(), port, version("prefect"), str(home), secret)
    _write_private(folder / "server.json", json.dumps(asdict(server)))
    deadline = time.monotonic() + 120  # it serves once bound; a loaded machine may delay the first answers
    while time.monotonic() < deadline:
        if answers(server):
            return server
        time.sleep(0.2)
    stop(folder)
    raise ServerError(f"the local Prefect server does not answer with its secret; see {folder / 'server.log'}")


def _bound_port(proc: subprocess.Popen, folder: Path) -> int:
    """The port the server bound, once its startup (the database's migrations) is done."""
    deadline = time.monotonic() + STARTUP_SECONDS
    watched = psutil.Process(proc.pid)
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = "\n".join((folder / "server.log").read_text(errors="replace").splitlines()[-15:])
            raise ServerError(f"the local Prefect server exited at start; its log ends with:\n{tail}")
        port = _listening_port(watched)
        if port is not None:
            return port
        time.sleep(0.2)
    proc.terminate()  # our own child, not yet reaped: no other process can hold its pid
    raise ServerError(f"the local Prefect server did not start within {STARTUP_SECONDS:.0f} s; see its log")


def stop(folder: Optional[Path] = None) -> Optional[Server]:
    """Stop the recorded server if it provably is ours; the server stopped, or None. A recorded
    process that is not (a stale file, a reused pid) is never signalled."""
    folder = folder or state_dir()
    server = recorded(folder)
    proc = owned_process(server) if server is not None else None
    if proc is not None:
        try:
            proc.terminate()  # psutil checks the pid still names the same process before signalling
            try:
                proc.wait(30)
            except psutil.TimeoutExpired:
                proc.kill()
        except psutil.NoSuchProcess:
            pass
    (folder / "server.json").unlink(missing_ok=True)
    return server if proc is not None else None


@contextmanager
def used(folder: Optional[Path] = None) -> Iterator[None]:
    """Mark the server in use by this process: it does not stop itself meanwhile."""
    users = (folder or state_dir()) / "users"
    _private_dir(users.parent)
    users.mkdir(exist_ok=True)
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
    """Run the block's flows against the configured server, else against the local one (found or
    started: then ``started(server)``), which the block marks as in use. H5FORGE_LOCAL_SERVER=0
    leaves the runs to Prefect's temporary server, started and stopped by this command alone."""
    if os.environ.get("H5FORGE_LOCAL_SERVER") == "0" or configured():
        yield
        return
    from prefect.settings import PREFECT_API_AUTH_STRING, PREFECT_API_URL, temporary_settings

    folder = state_dir()
    with used(folder):
        server, new = find_or_start(folder)
        if new:
            started(server)
        client = {"PREFECT_API_URL": server.url, "PREFECT_API_AUTH_STRING": server.secret}
        before = {k: os.environ.get(k) for k in client}
        os.environ.update(client)  # for the processes the runs start (dask workers)
        try:
            with temporary_settings(updates={PREFECT_API_URL: server.url, PREFECT_API_AUTH_STRING: server.secret}):
                yield
        finally:
            for k, v in before.items():
                os.environ.pop(k) if v is None else os.environ.update({k: v})


def _last_use(folder: Path, started: float) -> float:
    """When a command last used the server (it started at ``started``); now if one uses it."""
    users = folder / "users"
    for entry in users.iterdir() if users.exists() else ():
        if entry.name.isdigit() and psutil.pid_exists(int(entry.name)):
            return time.time()
        entry.unlink(missing_ok=True)  # a command killed before it could say it was done
    return max(started, _mtime(folder / "server.json"), _mtime(folder / "last-used"))


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def _stop_when_idle(folder: Path, minutes: float) -> None:
    started = time.time()
    while True:
        time.sleep(min(IDLE_CHECK_SECONDS, minutes * 30))
        if time.time() - _last_use(folder, started) > minutes * 60:
            print(f"h5forge: no command used this server for {minutes:g} min; stopping", flush=True)
            os.kill(os.getpid(), signal.SIGTERM)  # the server shuts down as on `h5forge server stop`
            return


def _serve(minutes: float) -> None:
    threading.Thread(target=_stop_when_idle, args=(state_dir(), minutes), daemon=True).start()
    from prefect.cli import app

    sys.argv = ["prefect", *PREFECT_START]
    app()


if __name__ == "__main__":
    _serve(float(sys.argv[1]))
