"""What a person sees: `h5forge build` and `verify` on a real pseudo-terminal (screen rebuilt by a
terminal emulator) and piped, as real subprocesses against the session's Prefect server."""

import json
import os
import re
import select
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
import pyte

from tests.helpers.data import age_files, demo_spec, drop_samples, write_spec_file

H5FORGE = str(Path(sys.executable).parent / "h5forge")
COLS, ROWS = 160, 300  # tall enough that nothing scrolls off the emulated screen
NOTICE = "Prefect collects anonymous usage data"
LOG_LINE = re.compile(r"^\d\d:\d\d:\d\d\.\d{3} \| (\w+)\s*\| (.*)$")


def api_url() -> str:
    from prefect.settings import PREFECT_API_URL

    return PREFECT_API_URL.value()


def user_env(home: Path, **extra) -> dict:
    """A person's shell: no CI variable, no DO_NOT_TRACK (either would hide Prefect's notice),
    a PREFECT_HOME never used before, the session's Prefect server."""
    from prefect._internal.analytics.ci_detection import CI_ENV_VARS  # what Prefect treats as CI

    env = {k: v for k, v in os.environ.items()
           if k not in CI_ENV_VARS and k not in ("DO_NOT_TRACK", "COLUMNS", "LINES", "NO_COLOR", "FORCE_COLOR")}
    home.mkdir(parents=True, exist_ok=True)
    server = {"PREFECT_API_URL": api_url()} if api_url() else {}  # verify needs no server
    return {**env, "PREFECT_HOME": str(home), **server, "TERM": "xterm-256color", **extra}


def in_terminal(args: list, env: dict, timeout: float = 300) -> tuple[int, bytes, list[str]]:
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


def messages(text: str, task: str) -> list[str]:
    """The messages logged by the task run named ``task-xxx``, in order, timestamps removed."""
    out = []
    for line in text.splitlines():
        m = LOG_LINE.match(line)
        if m and m.group(2).startswith(f"Task run '{task}-"):
            out.append(m.group(2).split(" - ", 1)[1])
    return out


@pytest.fixture
def dask_spec(raw_demo, tmp_path):
    """The demo spec, cleaned on a 2-process LocalCluster in batches of 8 (several progress steps);
    the demo's defects are 10 of 50 inputs, so it may reject a quarter."""
    import yaml

    path = write_spec_file(raw_demo, tmp_path / "out", tmp_path / "spec.yaml", inline_below=0, batch_size=8)
    path.write_text(yaml.safe_dump({**yaml.safe_load(path.read_text()), "max_rejected": 0.25}))
    return path


# the demo fixture: 46 complete samples found, 6 of them rejected while cleaning; 8 per batch
CLEAN_AND_WRITE = [
    "cleaning 46 samples on a LocalCluster of 2 processes, 8 per batch",
    "starting 2 dask workers…",
    re.compile(r"2 dask workers ready after \d+\.\d s"),
    "clean+write: 8/46 (17 %)",
    "clean+write: 16/46 (34 %)",
    "clean+write: 24/46 (52 %)",
    "clean+write: 32/46 (69 %)",
    "clean+write: 40/46 (86 %)",
    "clean+write: 46/46 (100 %)",
    re.compile(r"wrote 40 samples \{'train': 30, 'val': 4, 'test': 6\}, 10 rejected, compression ratio 0\.\d{3}"),
    "Finished in state Completed()",
]


def assert_lines(got: list[str], want: list) -> None:
    assert len(got) == len(want), "\n".join(got)
    for g, w in zip(got, want):
        assert (w.fullmatch(g) if isinstance(w, re.Pattern) else g == w), f"{g!r} != {w!r}"


@pytest.mark.e2e
def test_piped_build_logs_plain_lines_each_once(prefect_server, dask_spec, tmp_path):
    r = subprocess.run([H5FORGE, "build", dask_spec], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PREFECT_API_URL": api_url()})
    assert r.returncode == 0, r.stderr
    assert "\x1b" not in r.stdout + r.stderr  # no colour, no cursor movement
    assert_lines(messages(r.stderr, "clean-and-write"), CLEAN_AND_WRITE)
    logged = [LOG_LINE.match(line).group(2) for line in r.stderr.splitlines() if LOG_LINE.match(line)]
    assert len(logged) == len(set(logged)), "a line was printed twice"
    assert "demo: published v0001" in r.stdout


@pytest.mark.e2e
def test_piped_append_logs_its_progress_once(prefect_server, dask_spec, raw_new, tmp_path):
    from h5forge.flows.build import build_dataset

    build_dataset(str(dask_spec))
    drop_samples(raw_new, tmp_path / "inbox", [f"cell_{i:06d}" for i in range(3)], rename="new_")
    age_files(tmp_path / "inbox")
    r = subprocess.run([H5FORGE, "append", dask_spec], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PREFECT_API_URL": api_url()})
    assert r.returncode == 0, r.stderr
    assert "\x1b" not in r.stdout + r.stderr
    assert_lines(messages(r.stderr, "write-delta"), [
        "starting 2 dask workers…",
        re.compile(r"2 dask workers ready after \d+\.\d s"),
        "clean+append: 3/3 (100 %)",
        re.compile(r"new samples \{.*\}, 0 duplicate\(s\), 0 rejected in all"),
        "Finished in state Completed()",
    ])


@pytest.mark.e2e
def test_terminal_build_shows_one_live_line_and_leaves_no_stale_bar(prefect_server, dask_spec, tmp_path):
    code, raw, screen = in_terminal([H5FORGE, "build", dask_spec], user_env(tmp_path / "home"))
    text = "\n".join(screen)
    assert code == 0, text
    # while it ran: the status line, then the bar, drawn in place
    assert "starting 2 dask workers…".encode() in raw and "━".encode() in raw
    # what stays on the screen: the log lines, once; no bar, no status, no progress lines, no notice
    assert "━" not in text and "starting 2 dask workers" not in text and "clean+write" not in text
    assert NOTICE not in text
    assert text.count("cleaning 46 samples on a LocalCluster of 2 processes, 8 per batch") == 1
    assert text.count("wrote 40 samples") == 1
    at = [i for i, line in enumerate(screen) if "Task run 'clean-and-write-" in line]
    assert len(at) == 3 and at == list(range(at[0], at[0] + 3))  # started, wrote, finished: adjacent lines
    assert re.search(r"file +│ .*/out/dataset_v0001\.h5", text)
    # the Prefect run log still has what only the live line showed
    assert_lines(run_log_messages("clean-and-write"), CLEAN_AND_WRITE)


def run_log_messages(task: str) -> list[str]:
    """What the newest flow run's task run ``task-xxx`` logged to the Prefect API, in order."""
    from prefect import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId, TaskRunFilter, TaskRunFilterName
    from prefect.client.schemas.sorting import FlowRunSort, LogSort

    with get_client(sync_client=True) as client:
        [run] = client.read_flow_runs(sort=FlowRunSort.START_TIME_DESC, limit=1)
        tasks = {t.id: t.name for t in client.read_task_runs(task_run_filter=TaskRunFilter(
            name=TaskRunFilterName(like_=task)))}
        logs = client.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(any_=[run.id])), sort=LogSort.TIMESTAMP_ASC)
    return [log.message for log in logs if tasks.get(log.task_run_id, "").startswith(f"{task}-")]


@pytest.mark.e2e
def test_no_telemetry_notice_on_a_first_run(prefect_server, tmp_path):
    env = user_env(tmp_path / "home")
    # the notice exists: plain Prefect on a terminal under a new PREFECT_HOME prints it
    _, _, plain = in_terminal([sys.executable, "-c", "import prefect"], user_env(tmp_path / "home-plain"))
    assert NOTICE in "\n".join(plain)
    # h5forge, first run on a terminal, under a new PREFECT_HOME: it does not
    code, _, screen = in_terminal([H5FORGE, "verify", tmp_path / "missing.h5"], env)
    assert code == 1 and NOTICE not in "\n".join(screen)
    code, _, screen = in_terminal([sys.executable, "-c", "import h5forge.cli, h5forge.flows.build"], env)
    assert code == 0 and screen == []
    assert not (tmp_path / "home" / ".sdk_telemetry" / "notice_shown").exists()


@pytest.fixture(scope="module")
def published(raw_demo, tmp_path_factory):
    """A version built without Prefect; its path through dataset_latest.h5."""
    from h5forge.ingest.build import publish_candidate, verify_candidate, write_version
    from h5forge.ingest.discover import discover
    from h5forge.store.versions import stage

    out = tmp_path_factory.mktemp("terminal") / "out"
    spec = demo_spec(raw_demo, out)
    candidate = stage(out)
    write_version(spec, discover(spec), candidate)
    publish_candidate(candidate, verify_candidate(candidate))
    return out / "dataset_latest.h5"


def test_verify_on_a_terminal_is_a_table(published, tmp_path):
    code, raw, screen = in_terminal([H5FORGE, "verify", published], user_env(tmp_path / "home"))
    assert code == 0
    assert b"\x1b[" in raw  # coloured
    assert screen[0] == "dataset_latest.h5 → dataset_v0001.h5: HEALTHY"
    cells = [re.split(r"\s{2,}", line.strip()) for line in screen[1:]]
    rows = {c[0]: c[1] for c in cells if len(c) == 2}
    assert rows["checksums"] == "ok (40 samples)"
    assert rows["sources"] == "ok (16 samples re-derived from their sources and compared, 0 sources changed or gone)"
    assert re.fullmatch(r"\d+\.\d MB", rows["file size"])
    assert rows["samples"] == "train 30, val 4, test 6 (40 in all)"
    text = "\n".join(screen)
    assert "```" not in text and "| check |" not in text and "#" not in text  # no raw Markdown


def test_verify_json_is_for_scripts(published):
    r = subprocess.run([H5FORGE, "verify", published, "--json"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["ok"] is True and report["errors"] == []
    assert report["checks"]["checksums"] == "ok (40 samples)"
    assert report["stats"]["counts"] == {"train": 30, "val": 4, "test": 6}
    assert report["stats"]["file_bytes"] == published.resolve().stat().st_size


def test_verify_of_a_broken_file_lists_the_reasons_plainly_when_piped(tmp_path):
    r = subprocess.run([H5FORGE, "verify", tmp_path / "nope.h5"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 1
    assert r.stdout.splitlines()[0] == "nope.h5: BROKEN"
    assert "✗ " + str(tmp_path / "nope.h5") + ": no such file" in r.stdout
    assert "\x1b" not in r.stdout
