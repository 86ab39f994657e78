"""End to end as a user runs production: `prefect server start`, `h5forge serve`, then
`prefect deployment run` for each deployment; results checked through the Prefect client."""

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from h5forge._store.verify import verify_file
from h5forge._store.versions import latest
from tests.helpers.data import age_files, drop_samples, write_spec_file
from tests.helpers.files import all_ids

pytestmark = pytest.mark.e2e

BIN = Path(sys.executable).parent


# how long a wait may last before it counts as a hang: on a machine shared by many processes a
# server or a flow run can take minutes, and a wait that ends early fails a healthy run
HANG = 900


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop(proc: subprocess.Popen, timeout: float = 120) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A real `prefect server start` on 127.0.0.1 and a free port, with its own PREFECT_HOME."""
    home = tmp_path_factory.mktemp("prefect-home")
    port = free_port()
    url = f"http://127.0.0.1:{port}/api"
    base = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env = {**base, "PREFECT_HOME": str(home), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    log = open(home / "server.log", "w")
    proc = subprocess.Popen([str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(port),
                             "--no-ui"], env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + HANG
        while True:
            try:
                if httpx.get(f"{url}/health", timeout=10).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.time() > deadline:
                raise RuntimeError("prefect server did not start:\n" + (home / "server.log").read_text())
            time.sleep(0.5)
        yield url, {**env, "PREFECT_API_URL": url, "PREFECT_RUNNER_POLL_FREQUENCY": "1"}
    finally:
        stop(proc)
        log.close()


def client_call(url: str, fn):
    """Run ``fn(client)`` with a Prefect client on ``url``."""
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    async def go():
        with temporary_settings(updates={PREFECT_API_URL: url}):
            async with get_client() as client:
                return await fn(client)

    return asyncio.run(go())


def deployment_run(env: dict, name: str, *params: str) -> subprocess.CompletedProcess:
    args = [str(BIN / "prefect"), "deployment", "run", name, "--watch", "--watch-interval", "1",
            "--watch-timeout", str(HANG)]
    for p in params:
        args += ["--param", p]
    return subprocess.run(args, env=env, capture_output=True, text=True, timeout=HANG + 60)


def test_serve_and_run_every_deployment(server, raw_demo, raw_new, tmp_path):  # noqa: F811
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    url, env = server
    out, inbox = tmp_path / "out", tmp_path / "inbox"
    spec_file = write_spec_file(raw_demo, out, tmp_path / "spec.yaml", inbox=inbox)
    serve_log = tmp_path / "serve.log"
    with open(serve_log, "w") as sink:
        served = subprocess.Popen([str(BIN / "h5forge"), "serve", str(spec_file), "--timezone", "Europe/Berlin",
                                   "--poll-seconds", "86400"], env=env, stdout=sink, stderr=subprocess.STDOUT,
                                  cwd=tmp_path)  # not the repo: entrypoints must not depend on the cwd
    try:
        deadline = time.time() + HANG
        while True:
            try:
                dep = client_call(url, lambda c: c.read_deployment_by_name("build-dataset/nightly"))
                break
            except Exception:
                if served.poll() is not None or time.time() > deadline:
                    raise AssertionError("serve did not register its deployments:\n" + serve_log.read_text())
                time.sleep(1)
        schedule = dep.schedules[0].schedule
        assert schedule.cron == "0 2 * * *" and schedule.timezone == "Europe/Berlin"
        assert dep.parameters["spec_path"] == str(spec_file.resolve())

        r = deployment_run(env, "build-dataset/nightly")
        assert r.returncode == 0, r.stdout + r.stderr + serve_log.read_text()
        assert "Completed" in r.stdout
        assert latest(out) == 1 and verify_file(out / "dataset_latest.h5", resample=0).ok
        arts = client_call(url, lambda c: c.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["demo-health", "demo-rejections"]))))
        assert {a.key for a in arts} == {"demo-health", "demo-rejections"}
        assert any("HEALTHY" in str(a.data) for a in arts if a.key == "demo-health")

        new_ids = drop_samples(raw_new, inbox, ["cell_000001", "cell_000002", "cell_000003"], rename="dep_")
        age_files(inbox)
        r = deployment_run(env, "append-samples/inbox", f"inbox={inbox}")
        assert r.returncode == 0, r.stdout + r.stderr + serve_log.read_text()
        assert latest(out) == 2
        assert set(new_ids) <= set(sum(all_ids(out / "dataset_latest.h5").values(), []))

        r = deployment_run(env, "verify-dataset/weekly")
        assert r.returncode == 0, r.stdout + r.stderr
        runs = [fr for fr in client_call(url, lambda c: c.read_flow_runs())
                if fr.deployment_id and fr.state.type.value != "SCHEDULED"]  # future cron runs
        assert [fr.state.type.value for fr in runs] == ["COMPLETED"] * 3
        assert len({fr.deployment_id for fr in runs}) == 3

        bad = deployment_run(env, "build-dataset/nightly", "wait_for_lock=soon")
        assert bad.returncode == 1 and "wait_for_lock" in bad.stdout + bad.stderr  # typed parameters
    finally:
        stop(served)
    assert served.returncode is not None


def test_watch_service_runs_the_append_deployment(server, raw_demo, raw_new, tmp_path):  # noqa: F811
    url, env = server
    out, inbox = tmp_path / "out", tmp_path / "inbox"
    spec_file = write_spec_file(raw_demo, out, tmp_path / "spec.yaml", inbox=inbox)
    inbox.mkdir()  # watch refuses an inbox that does not exist
    subprocess.run([str(BIN / "h5forge"), "build", str(spec_file)], env=env, check=True, capture_output=True)
    with open(tmp_path / "serve.log", "w") as sink:
        served = subprocess.Popen([str(BIN / "h5forge"), "serve", str(spec_file), "--poll-seconds", "86400",
                                   "--suffix", "-second"],
                                  env=env, stdout=sink, stderr=subprocess.STDOUT)
    deadline = time.time() + HANG
    while True:
        try:
            client_call(url, lambda c: c.read_deployment_by_name("append-samples/inbox-second"))
            break
        except Exception:
            assert time.time() < deadline and served.poll() is None, (tmp_path / "serve.log").read_text()
            time.sleep(1)
    with open(tmp_path / "watch.log", "w") as sink:
        watcher = subprocess.Popen([str(BIN / "h5forge"), "watch", str(spec_file), "--deployment",
                                    "append-samples/inbox-second"], env=env, stdout=sink, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + HANG
        while "watching" not in (tmp_path / "watch.log").read_text():
            assert time.time() < deadline and watcher.poll() is None, (tmp_path / "watch.log").read_text()
            time.sleep(0.5)
        drop_samples(raw_new, inbox, ["cell_000004", "cell_000005"], rename="evt_")
        deadline = time.time() + HANG
        while latest(out) != 2:
            assert time.time() < deadline, (tmp_path / "watch.log").read_text() + (tmp_path / "serve.log").read_text()
            time.sleep(1)
        runs = client_call(url, lambda c: c.read_flow_runs())
        names = {fr.name for fr in runs}
        assert any(name in (tmp_path / "watch.log").read_text() for name in names)
    finally:
        stop(watcher)
        stop(served)
    assert watcher.returncode == 0


def test_watch_refuses_a_deployment_that_is_missing_or_appends_another_dataset(server, raw_demo, tmp_path):
    """`watch A --deployment D` hands A's inbox to D: a D that does not exist, or that appends the dataset of
    another spec (A's samples would be published in B's versions), stops the command before it watches."""
    from h5forge.deployments.definitions import dataset_deployments

    url, env = server
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    spec_a = write_spec_file(raw_demo, tmp_path / "out-a", tmp_path / "a.yaml", inbox=inbox)
    spec_b = write_spec_file(raw_demo, tmp_path / "out-b", tmp_path / "b.yaml", inbox=tmp_path / "inbox-b")

    def watch(spec, deployment):
        return subprocess.run([str(BIN / "h5forge"), "watch", str(spec), "--deployment", deployment], env=env,
                              capture_output=True, text=True, timeout=HANG)

    nobody = free_port()
    r = subprocess.run([str(BIN / "h5forge"), "watch", str(spec_a), "--deployment", "append-samples/inbox"],
                       env={**env, "PREFECT_API_URL": f"http://127.0.0.1:{nobody}/api"}, capture_output=True, text=True,
                       timeout=HANG)
    assert r.returncode == 1 and r.stderr.strip().startswith(
        f"error: cannot reach the Prefect server at http://127.0.0.1:{nobody}/api: "), r.stdout + r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    r = watch(spec_a, "append-samples/nope")
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.strip() == f"error: no deployment 'append-samples/nope' on the Prefect server at {url}"

    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings(updates={PREFECT_API_URL: url}):
        for dep in dataset_deployments(spec_b, suffix="-b"):  # registered, as `h5forge serve` does
            dep.apply()
    r = watch(spec_a, "append-samples/inbox-b")
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.strip() == (f"error: the deployment 'append-samples/inbox-b' appends with the spec "
                                f"{spec_b.resolve()}, not {spec_a}; serve this spec's deployments "
                                "(h5forge serve, with --suffix) and name its append deployment")
    r = watch(spec_a, "build-dataset/nightly-b")
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.strip() == ("error: the deployment 'build-dataset/nightly-b' runs the flow 'build-dataset', "
                                "not append-samples")
    assert not (tmp_path / "out-a").exists() and not (tmp_path / "out-b").exists()


def test_a_deployment_run_refuses_relative_paths_and_serve_stores_absolute_ones(server, raw_demo, tmp_path):
    """A deployment run starts in the folder `serve` (or a worker) runs in, not the user's: a relative output
    would publish a dataset where nobody looks, and the run would say Completed."""
    url, env = server
    spec_file = write_spec_file(raw_demo, tmp_path / "out", tmp_path / "spec.yaml")
    serve_log = tmp_path / "serve.log"
    with open(serve_log, "w") as sink:
        served = subprocess.Popen([str(BIN / "h5forge"), "serve", "spec.yaml", "--output", "here", "--suffix", "-rel",
                                   "--poll-seconds", "86400"], env=env, stdout=sink, stderr=subprocess.STDOUT,
                                  cwd=tmp_path)
    try:
        deadline = time.time() + HANG
        while True:
            try:
                dep = client_call(url, lambda c: c.read_deployment_by_name("build-dataset/nightly-rel"))
                break
            except Exception:
                if served.poll() is not None or time.time() > deadline:
                    raise AssertionError("serve did not register its deployments:\n" + serve_log.read_text())
                time.sleep(1)
        assert dep.parameters["output"] == str(tmp_path / "here")  # as the user meant it, where serve started
        for name, param in [("build-dataset/nightly-rel", "output=relative-out"),
                            ("append-samples/inbox-rel", "inbox=relative-inbox"),
                            ("verify-dataset/weekly-rel", "spec_path=spec.yaml")]:
            r = deployment_run(env, name, param)
            assert r.returncode == 1, r.stdout + r.stderr + serve_log.read_text()
            key, value = param.split("=")
            assert (f"parameter {key}={value!r} is a relative path; a deployment run starts in the working folder "
                    f"of the process that runs it ({tmp_path}), not yours: give an absolute path") in serve_log.read_text()
        assert not (tmp_path / "relative-out").exists() and not (tmp_path / "relative-inbox").exists()
    finally:
        stop(served)
