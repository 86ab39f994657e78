"""What a person sees of the flow runs: `h5forge build` and `append` on a real pseudo-terminal
(screen rebuilt by a terminal emulator) and piped, as real subprocesses against the session's
Prefect server; and no telemetry notice on a first run."""

import collections
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.data import age_files, drop_samples, write_spec_file
from tests.helpers.terminal import in_terminal, user_env

H5FORGE = str(Path(sys.executable).parent / "h5forge")
NOTICE = "Prefect collects anonymous usage data"
LOG_LINE = re.compile(r"^\d\d:\d\d:\d\d\.\d{3} \| (\w+)\s*\| (.*)$")


def api_url() -> str:
    from prefect.settings import PREFECT_API_URL

    return PREFECT_API_URL.value()


def person(home: Path) -> dict:
    """A person's shell (tests/helpers/terminal.py) pointed at the session's Prefect server."""
    return user_env(home, PREFECT_API_URL=api_url())


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
    r = subprocess.run([H5FORGE, "build", dask_spec], capture_output=True, text=True, timeout=900,
                       env={**os.environ, "PREFECT_API_URL": api_url()})
    assert r.returncode == 0, r.stderr
    assert "\x1b" not in r.stdout + r.stderr  # no colour, no cursor movement
    assert_lines(messages(r.stderr, "clean-and-write"), CLEAN_AND_WRITE)
    logged = [LOG_LINE.match(line).group(2) for line in r.stderr.splitlines() if LOG_LINE.match(line)]
    twice = [line for line, n in collections.Counter(logged).items() if n > 1]
    assert not twice, f"printed twice: {twice}"
    assert "demo: published v0001" in r.stdout


@pytest.mark.e2e
def test_piped_append_logs_its_progress_once(prefect_server, dask_spec, raw_new, tmp_path):
    import h5forge

    h5forge.build(dask_spec)
    drop_samples(raw_new, tmp_path / "inbox", [f"cell_{i:06d}" for i in range(3)], rename="new_")
    age_files(tmp_path / "inbox")
    r = subprocess.run([H5FORGE, "append", dask_spec], capture_output=True, text=True, timeout=900,
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
    code, raw, screen = in_terminal([H5FORGE, "build", dask_spec], person(tmp_path / "home"))
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
    env = person(tmp_path / "home")
    # the notice exists: plain Prefect on a terminal under a new PREFECT_HOME prints it
    _, _, plain = in_terminal([sys.executable, "-c", "import prefect"], person(tmp_path / "home-plain"))
    assert NOTICE in "\n".join(plain)
    # h5forge, first run on a terminal, under a new PREFECT_HOME: it does not
    code, _, screen = in_terminal([H5FORGE, "verify", tmp_path / "missing.h5"], env)
    assert code == 1 and NOTICE not in "\n".join(screen)
    code, _, screen = in_terminal([sys.executable, "-c", "import h5forge._cli, h5forge.flows.build"], env)
    assert code == 0 and screen == []
    assert not (tmp_path / "home" / ".sdk_telemetry" / "notice_shown").exists()
