"""A command on a real pseudo-terminal, its screen rebuilt by a terminal emulator, in a person's
shell environment."""

from __future__ import annotations

import os
import select
import struct
import subprocess
import time
from pathlib import Path

import pyte

COLS, ROWS = 160, 300  # tall enough that nothing scrolls off the emulated screen
TIMEOUT = 900  # seconds: bounds a command that never ends, not how long one may take


def user_env(home: Path, **extra) -> dict:
    """A person's shell: no CI variable, no DO_NOT_TRACK (either would hide Prefect's notice), a
    PREFECT_HOME never used before."""
    from prefect._internal.analytics.ci_detection import CI_ENV_VARS  # what Prefect treats as CI

    env = {k: v for k, v in os.environ.items()
           if k not in CI_ENV_VARS and k not in ("DO_NOT_TRACK", "COLUMNS", "LINES", "NO_COLOR", "FORCE_COLOR")}
    home.mkdir(parents=True, exist_ok=True)
    return {**env, "PREFECT_HOME": str(home), "TERM": "xterm-256color", **extra}


def in_terminal(args: list, env: dict, timeout: float = TIMEOUT) -> tuple[int, bytes, list[str]]:
    """Run ``args`` with a pseudo-terminal as stdin/stdout/stderr; return the exit code, every
    byte it wrote, and the final screen as a VT100 emulator shows it (trailing blanks removed)."""
    import fcntl
    import pty
    import termios

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", ROWS, COLS, 0, 0))
    proc = subprocess.Popen([str(a) for a in args], stdin=slave, stdout=slave, stderr=slave, env=env,
                            start_new_session=True)
    os.close(slave)
    chunks, deadline = [], time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if select.select([master], [], [], 1.0)[0]:
                try:
                    data = os.read(master, 65536)
                except OSError:  # EIO: every writer closed the terminal
                    break
                if not data:
                    break
                chunks.append(data)
            elif proc.poll() is not None and not select.select([master], [], [], 0.2)[0]:
                break
        code = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)
    raw = b"".join(chunks)
    screen = pyte.Screen(COLS, ROWS)
    pyte.ByteStream(screen).feed(raw)
    lines = [line.rstrip() for line in screen.display]
    while lines and not lines[-1]:
        lines.pop()
    return code, raw, lines
