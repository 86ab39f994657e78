"""The one Prefect test server of a test session, for tests/flows and tests/deployments only (their
conftest.py files expose it as the ``prefect_server`` fixture; no other test can ask for it).

It starts on first use and stops when the session ends. A fresh server migrates a new SQLite
database before it answers, which on a machine shared by many processes can take minutes, so the
wait is long: it only bounds a server that never comes up. How long the start took is printed.
"""

from __future__ import annotations

import os
import time
from contextlib import ExitStack

import pytest

STARTUP_TIMEOUT = 900  # seconds; a bound on a hang, not an expectation

_running: ExitStack | None = None


def load() -> str:
    return " ".join(open("/proc/loadavg").read().split()[:3]) if os.path.exists("/proc/loadavg") else "unknown"


def start(config: pytest.Config) -> None:
    """Start the session's server unless it runs already; it stops at the end of the session."""
    global _running
    if _running is not None:
        return
    from prefect.testing.utilities import prefect_test_harness

    stack, started = ExitStack(), time.monotonic()
    try:
        stack.enter_context(prefect_test_harness(server_startup_timeout=STARTUP_TIMEOUT))
    except BaseException as err:
        stack.close()
        raise RuntimeError(f"the Prefect test server did not start: gave up after {time.monotonic() - started:.0f} s "
                           f"(limit {STARTUP_TIMEOUT} s, load average {load()}): {err}") from err
    took = time.monotonic() - started
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    capture = config.pluginmanager.get_plugin("capturemanager")
    line = f"Prefect test server started in {took:.1f} s (load average {load()})"
    if reporter is not None and capture is not None:
        with capture.global_and_fixture_disabled():  # on the terminal, not in a test's captured output
            reporter.write_line(line)
    _running = stack
    config.add_cleanup(stop)


def stop() -> None:
    global _running
    if _running is not None:
        stack, _running = _running, None
        stack.close()
