"""An expected failure of ``h5forge build`` is one ``error:`` line on the terminal, without Prefect's
traceback; the traceback stays in the run's log on the server, and ``--debug`` shows it."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.data import write_spec_file

pytestmark = pytest.mark.e2e  # the CLI's flow runs on the session's real Prefect server

H5FORGE = str(Path(sys.executable).parent / "h5forge")


@pytest.fixture
def api_url(prefect_server) -> str:
    from prefect.settings import PREFECT_API_URL

    return PREFECT_API_URL.value()


def _build(spec: Path, api_url: str, *flags: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PREFECT_API_URL": api_url}
    return subprocess.run([H5FORGE, *flags, "build", str(spec)], capture_output=True, text=True, env=env,
                          timeout=900)


def _run_logs(api_url: str) -> list[str]:
    from prefect.client.orchestration import get_client

    async def fetch() -> list[str]:
        async with get_client() as client:
            runs = await client.read_flow_runs(limit=1, sort="START_TIME_DESC")
            from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

            logs = await client.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(any_=[runs[0].id])))
            return [log.message for log in logs]

    return asyncio.run(fetch())


def test_too_many_rejected_inputs_is_one_line_and_the_traceback_stays_in_the_run_log(raw_demo, tmp_path, api_url):
    spec = write_spec_file(raw_demo, tmp_path / "out", tmp_path / "spec.yaml")
    spec.write_text(spec.read_text().replace("max_rejected: 0.25", "max_rejected: 0.01"))
    done = _build(spec, api_url)
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "above max_rejected" in errors[0], done.stderr
    assert "Finished in state Failed" not in done.stderr
    logs = _run_logs(api_url)
    assert any("TooManyRejected" in m for m in logs), logs[-5:]
    debug = _build(spec, api_url, "--debug")
    assert debug.returncode == 1 and "Traceback" in debug.stderr and "TooManyRejected" in debug.stderr


def test_nothing_to_build_with_a_temporary_server_is_one_line_and_no_shutdown_traceback(tmp_path):
    """With neither PREFECT_API_URL nor the local server (H5FORGE_LOCAL_SERVER=0) the command runs
    its flow on a temporary server it starts and stops itself: the error is still one line, and stopping the server prints no traceback (a
    CancelledError of its shutdown once did)."""
    raw = tmp_path / "raw"
    for folder in ("images", "masks"):
        (raw / folder).mkdir(parents=True)
    (raw / "annotations.json").write_text("[]")
    spec = write_spec_file(raw, tmp_path / "out", tmp_path / "spec.yaml")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")}
    env["PREFECT_HOME"] = str(tmp_path / "prefect-home")
    env["H5FORGE_LOCAL_SERVER"] = "0"  # the per-command temporary server, not the reused local one
    done = subprocess.run([H5FORGE, "build", str(spec)], capture_output=True, text=True, env=env, timeout=900)
    assert done.returncode == 1, done.stderr
    assert "Starting temporary server" in done.stderr  # the case under test
    assert "Traceback" not in done.stderr and "CancelledError" not in done.stderr, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert errors == [f"error: no complete sample under {raw} (0 input(s) rejected; see the quarantine report)"]
