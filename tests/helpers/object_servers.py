"""Real servers on 127.0.0.1 for the remote-read tests: nginx serving a folder (range requests,
ETags), an S3 endpoint, and a loopback proxy that injects latency, 5xx answers and dropped
connections.

The S3 endpoint is moto's server mode: a mock library's S3 implementation, the only S3 server that
installs from the registries this project uses (PyPI offers no real one; Debian's radosgw needs a
Ceph cluster). It speaks the S3 REST API over real HTTP, so s3fs and botocore run unchanged
against it, but it is not AWS: behaviours a real store adds (eventual listing, throttling) are not
exercised by it.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

START_TIMEOUT = 180.0  # seconds a server may take to answer on a machine at load 10


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_answering(url: str, proc: subprocess.Popen | None = None, timeout: float = START_TIMEOUT) -> None:
    """Poll ``url`` until any HTTP answer comes back (an error status counts: the server is up)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server for {url} exited with {proc.returncode}")
        try:
            urllib.request.urlopen(url, timeout=5).close()
            return
        except urllib.error.HTTPError:
            return
        except OSError:
            time.sleep(0.1)
    raise TimeoutError(f"no answer from {url} within {timeout:.0f} s")


def stop(proc: subprocess.Popen) -> None:
    """Stop a server this module started (its own process, by its id)."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(30)


NGINX_CONF = """
daemon off;
worker_processes 1;
pid {tmp}/nginx.pid;
error_log {tmp}/error.log warn;
events {{ worker_connections 256; }}
http {{
    access_log {tmp}/access.log;
    client_body_temp_path {tmp}/body;
    proxy_temp_path {tmp}/proxy;
    fastcgi_temp_path {tmp}/fastcgi;
    uwsgi_temp_path {tmp}/uwsgi;
    scgi_temp_path {tmp}/scgi;
    types {{ }}
    default_type application/octet-stream;
    keepalive_requests 100000;
    server {{
        listen 127.0.0.1:{port};
        root {root};
        location / {{ }}
    }}
}}
"""


def nginx_binary() -> str | None:
    return shutil.which("nginx") or next((p for p in ("/usr/sbin/nginx",) if os.path.exists(p)), None)


def served_folder() -> Path:
    """A new folder nginx's workers can read: run as root, nginx serves as ``nobody``, which cannot
    enter pytest's private temporary folders."""
    root = Path(tempfile.mkdtemp(prefix="h5forge-www-"))
    root.chmod(0o755)
    return root


@dataclass
class Nginx:
    root: Path
    port: int = 0
    proc: subprocess.Popen | None = None
    tmp: str = ""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def access_log(self) -> list[str]:
        return Path(self.tmp, "access.log").read_text().splitlines()

    def start(self) -> "Nginx":
        binary = nginx_binary()
        if binary is None:
            raise RuntimeError("nginx is not installed (apt-get install -y nginx-light)")
        self.tmp = tempfile.mkdtemp(prefix="h5forge-nginx-")
        self.port = free_port()
        conf = Path(self.tmp, "nginx.conf")
        conf.write_text(NGINX_CONF.format(tmp=self.tmp, port=self.port, root=self.root))
        self.proc = subprocess.Popen(
            [binary, "-c", str(conf), "-p", self.tmp, "-e", f"{self.tmp}/error.log"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_answering(self.url + "/", self.proc)
        return self

    def stop(self) -> None:
        if self.proc is not None:
            stop(self.proc)
        shutil.rmtree(self.tmp, ignore_errors=True)


@dataclass
class S3Server:
    """moto's S3 server (a mock's server mode: see the module's docstring)."""

    port: int = 0
    proc: subprocess.Popen | None = None
    env: dict[str, str] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> "S3Server":
        self.port = free_port()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_answering(self.url + "/", self.proc)
        # credentials the way a user gives them: the standard environment variables
        self.env = {
            "AWS_ACCESS_KEY_ID": "testing-key",
            "AWS_SECRET_ACCESS_KEY": "testing-secret-do-not-log",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_ENDPOINT_URL": self.url,
        }
        return self

    def make_bucket(self, name: str) -> None:
        import boto3

        boto3.client(
            "s3",
            endpoint_url=self.url,
            aws_access_key_id=self.env["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=self.env["AWS_SECRET_ACCESS_KEY"],
            region_name="us-east-1",
        ).create_bucket(Bucket=name)

    def stop(self) -> None:
        if self.proc is not None:
            stop(self.proc)


class FaultProxy:
    """A loopback HTTP proxy in front of ``upstream`` (host:port) that, per request, can delay the
    answer, answer 503, or drop the connection, as the test sets ``plan`` (one action per request,
    taken in order; when it is empty requests pass through). Counts requests it saw."""

    def __init__(self, upstream_port: int):
        self.upstream_port = upstream_port
        self.port = free_port()
        # ("delay", seconds) | ("503", 0) | ("200", 0) | ("drop", 0) | ("pass", 0)
        # | ("shift", bytes): asks upstream for each range that many bytes further on, so the answer
        # has the asked length and an honest Content-Range, but other bytes than were asked for
        self.plan: list[tuple[str, float]] = []
        self.requests = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> "FaultProxy":
        self._thread.start()
        if not self._ready.wait(START_TIMEOUT):
            raise TimeoutError("fault proxy did not start")
        return self

    def stop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(30)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(asyncio.start_server(self._serve, "127.0.0.1", self.port))
        self._ready.set()
        try:
            self._loop.run_forever()
        finally:
            server.close()
            pending = asyncio.all_tasks(self._loop)
            for task in pending:
                task.cancel()
            self._loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            self._loop.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                body = await reader.readexactly(length) if length else b""
                self.requests += 1
                action, arg = self.plan.pop(0) if self.plan else ("pass", 0.0)
                if action == "drop":
                    writer.close()
                    return
                if action == "503":
                    writer.write(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n")
                    await writer.drain()
                    continue
                if action == "200":  # a server that answers a Range with a whole (here: empty) body
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
                    await writer.drain()
                    continue
                if action == "delay":
                    await asyncio.sleep(arg)
                if action == "shift":
                    head = _shifted(head, int(arg))
                answer = await self._forward(head + body, head.startswith(b"HEAD "))
                writer.write(answer)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.close()

    async def _forward(self, request: bytes, head_only: bool) -> bytes:
        r, w = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        try:
            w.write(request)
            await w.drain()
            head = await r.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":", 1)[1])
            body = await r.readexactly(length) if length and not head_only else b""
            return head + body
        finally:
            w.close()


def _shifted(head: bytes, by: int) -> bytes:
    """A request head whose Range asks for each range ``by`` bytes further on."""

    def one(line: bytes) -> bytes:
        if not line.lower().startswith(b"range:"):
            return line
        spans = line.split(b"=", 1)[1].split(b",")
        moved = [b"%d-%d" % tuple(int(x) + by for x in span.strip().split(b"-")) for span in spans]
        return b"Range: bytes=" + b",".join(moved)

    return b"\r\n".join(one(line) for line in head.split(b"\r\n"))
