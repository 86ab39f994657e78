"""Orchestration benchmark: cleaning on 1 vs 2 dask workers, an external scheduler, and the cost of
running the build as a Prefect flow.

    .venv/bin/python benchmarks/orchestration.py                    # full run (5k scaling, 10k overhead)
    .venv/bin/python benchmarks/orchestration.py --n 400 --overhead-n 400 --reps 1   # smoke test

Writes benchmarks/results/orchestration.json and .md and prints the ratios against the goals:
  1. clean+write throughput (``clean_write_seconds``, cluster start excluded) on a LocalCluster of
     2 worker processes / 1 worker process >= 1.7; the same through an external `dask scheduler`
     with two `dask worker` processes (started and stopped here);
  2. wall time of the build as the Prefect flow `build_dataset` against a running
     `prefect server start` / as plain function calls <= 1.05 on 10,000 samples;
  3. apart: start-up of the ephemeral Prefect server (no server configured, fresh PREFECT_HOME).
Every build runs in its own child process; configurations are interleaved within a repetition and
their order alternates between repetitions. The child measures the CPU time of the writer process
(itself) and of every dask worker process over the same window, to show where the time goes.
Raw data: generated good samples cached under /tmp/h5forge-bench/orchestration/.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402
from _common import REPO, RESULTS, cpu_pressure, loadavg, machine  # noqa: E402

CACHE = _common.CACHE / "orchestration"
BIN = Path(sys.executable).parent
SCALING_GOAL = 1.7
OVERHEAD_GOAL = 1.05


# ---- data and specs ----------------------------------------------------------------------------

def raw_with(n: int) -> Path:
    """A raw folder of exactly ``n`` good samples: hard links into the cached 10k (or n) folder."""
    _common.CACHE = CACHE  # raw_folder caches under _common.CACHE: use our own subfolder
    full = _common.raw_folder(max(n, 10_000), bad=False)
    if n == max(n, 10_000):
        return full
    sub = CACHE / f"{full.name}-first{n}"
    if (sub / ".complete").exists():
        return sub
    shutil.rmtree(sub, ignore_errors=True)
    records = json.loads((full / "annotations.json").read_text())
    records = sorted(records, key=lambda r: r["id"])[:n]
    for folder in ("images", "masks"):
        (sub / folder).mkdir(parents=True)
        for r in records:
            os.link(full / folder / f"{r['id']}.png", sub / folder / f"{r['id']}.png")
    (sub / "annotations.json").write_text(json.dumps(records, indent=1))
    (sub / ".complete").write_text("{}")
    return sub


def write_spec(raw: Path, out: Path, path: Path, **compute) -> Path:
    import yaml

    data = yaml.safe_load((REPO / "config" / "demo.yaml").read_text())
    data["source"]["root"] = str(raw)
    data["source"]["inbox"] = str(path.parent / "inbox")
    data["output"]["dir"] = str(out)
    data["compute"] = {**data.get("compute", {}), **compute}
    path.write_text(yaml.safe_dump(data))
    return path


# ---- processes -----------------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop(procs: list[subprocess.Popen], timeout: float = 20) -> None:
    """SIGTERM, wait, then SIGKILL the process group (each was started in its own session)."""
    for p in reversed(procs):
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            print(f"  pid {p.pid} ignored SIGTERM for {timeout} s: killing", flush=True)
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait()


def start_dask(logs: Path) -> tuple[str, list[subprocess.Popen], float]:
    """`dask scheduler` + two `dask worker --nworkers 1 --nthreads 1` on 127.0.0.1."""
    from distributed import Client

    port = free_port()
    address = f"tcp://127.0.0.1:{port}"
    t0 = time.perf_counter()
    spawn = dict(stdin=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True)
    procs = [subprocess.Popen([str(BIN / "dask"), "scheduler", "--host", "127.0.0.1", "--port", str(port),
                               "--no-dashboard", "--idle-timeout", "3600"],
                              stdout=open(logs / "scheduler.log", "w"), **spawn)]
    try:
        for i in range(2):
            procs.append(subprocess.Popen(
                [str(BIN / "dask"), "worker", address, "--nworkers", "1", "--nthreads", "1", "--host",
                 "127.0.0.1", "--no-dashboard", "--death-timeout", "120", "--name", f"bench-w{i}"],
                stdout=open(logs / f"worker{i}.log", "w"), **spawn))
        with Client(address, timeout="60s") as client:
            client.wait_for_workers(2, timeout=120)
    except BaseException:
        stop(procs)
        raise
    return address, procs, time.perf_counter() - t0


def start_prefect_server(home: Path) -> tuple[str, subprocess.Popen, float]:
    import httpx

    port = free_port()
    url = f"http://127.0.0.1:{port}/api"
    env = {**prefect_free_env(), "PREFECT_HOME": str(home)}
    t0 = time.perf_counter()
    proc = subprocess.Popen([str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(port),
                             "--no-ui"], env=env, stdout=open(home / "server.log", "w"),
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    while True:
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return url, proc, time.perf_counter() - t0
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.perf_counter() - t0 > 240:
            stop([proc])
            raise RuntimeError("prefect server did not start:\n" + (home / "server.log").read_text())
        time.sleep(0.5)


def prefect_free_env() -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    return {**env, "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_TASKS_DEFAULT_NO_CACHE": "true",
            "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "240", "DO_NOT_TRACK": "1"}


def run_child(mode: str, spec: Path, env: dict, extra_pids: list[int] = ()) -> dict:
    """One build in a fresh interpreter; returns what the child measured plus its whole wall time."""
    result = spec.parent / f"result-{mode}.json"
    result.unlink(missing_ok=True)
    args = [sys.executable, __file__, "--child", mode, "--spec", str(spec), "--result", str(result)]
    if extra_pids:
        args += ["--pids", ",".join(map(str, extra_pids))]
    t0 = time.perf_counter()
    r = subprocess.run(args, env=env, capture_output=True, text=True, timeout=3600, cwd=spec.parent)
    wall = time.perf_counter() - t0
    if r.returncode != 0 or not result.exists():
        raise RuntimeError(f"child {mode} failed (rc {r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-6000:]}")
    data = json.loads(result.read_text())
    data["child_wall_seconds"] = round(wall, 2)
    return data


# ---- the child: one build, measured from inside ---------------------------------------------------

def _cpu(p: psutil.Process) -> float:
    t = p.cpu_times()
    return t.user + t.system


class CpuWindow:
    """CPU seconds of this process and of the dask workers between the first and the last batch.

    Workers: this process's descendants (LocalCluster) plus the trees of ``pids`` (external
    `dask worker` processes). The window opens when the first cleaned batch arrives (the cluster is
    up and warm: start-up imports do not count) and closes when the last one arrives (before the
    cluster shuts down). Only two snapshots are taken, so the writer is not slowed down.
    """

    def __init__(self, pids: list[int], total: int):
        self.pids = pids
        self.total = total
        self.seen = 0
        self.procs: list[tuple[psutil.Process, str]] = []
        self.start: dict[int, tuple[str, float]] | None = None
        self.end: dict[int, tuple[str, float]] = {}
        self.t = [0.0, 0.0]
        self.samples = 0

    def _find(self) -> None:
        me = psutil.Process()
        self.procs = [(me, "writer (main)")]
        for c in me.children(recursive=True):
            cmd = " ".join(c.cmdline())
            self.procs.append((c, "other" if "resource_tracker" in cmd else "LocalCluster worker"))
        for pid in self.pids:
            try:
                top = psutil.Process(pid)
                role = "scheduler" if "scheduler" in " ".join(top.cmdline()) else "dask worker (nanny)"
                self.procs.append((top, role))
                self.procs += [(c, "other" if "resource_tracker" in " ".join(c.cmdline()) else "dask worker")
                               for c in top.children(recursive=True)]
            except psutil.NoSuchProcess:
                continue

    def snapshot(self) -> dict[int, tuple[str, float]]:
        out = {}
        for p, role in self.procs:
            try:
                out[p.pid] = (role, _cpu(p))
            except psutil.NoSuchProcess:
                pass
        return out

    def progress(self, n: int) -> None:
        self.seen += n
        if self.start is None:
            self._find()
            self.start, self.t[0] = self.snapshot(), time.perf_counter()
            return  # the first batch is outside the window
        self.samples += n
        if self.seen >= self.total:
            self.end, self.t[1] = self.snapshot(), time.perf_counter()

    def result(self) -> dict:
        rows = []
        for pid, (role, cpu) in self.end.items():
            if pid in (self.start or {}):
                rows.append({"pid": pid, "role": role, "cpu_seconds": round(cpu - self.start[pid][1], 2)})
        wall = self.t[1] - self.t[0]
        writer = sum(r["cpu_seconds"] for r in rows if r["role"].startswith("writer"))
        workers = [r["cpu_seconds"] for r in rows if r["role"] in ("LocalCluster worker", "dask worker")]
        other = sum(r["cpu_seconds"] for r in rows) - writer - sum(workers)
        n = max(self.samples, 1)
        return {"window_seconds": round(wall, 2), "window_samples": self.samples,
                "writer_cpu_s": round(writer, 2), "workers_cpu_s": sorted(workers, reverse=True),
                "other_cpu_s": round(other, 2),  # scheduler, nannies
                "writer_cpu_ms_per_sample": round(1000 * writer / n, 3),
                "workers_cpu_ms_per_sample": round(1000 * sum(workers) / n, 3),
                "cores_busy": round((writer + sum(workers) + other) / wall, 2) if wall else None,
                "processes": rows}


def child(mode: str, spec_path: Path, result: Path, pids: list[int]) -> None:
    t_import = time.perf_counter()
    out: dict = {"mode": mode, "loadavg_before": loadavg()}
    if mode == "flow":
        from h5forge.flows.build import build_dataset

        out["import_seconds"] = round(time.perf_counter() - t_import, 2)
        t0 = time.perf_counter()
        summary = build_dataset(str(spec_path))
        out["build_seconds"] = round(time.perf_counter() - t0, 2)
        out["timings"] = summary["timings"]
        out["counts"] = summary["counts"]
        out["health_ok"] = bool(summary["path"])  # the flow raises VerificationFailed otherwise
    else:
        from h5forge.ingest.build import publish_candidate, verify_candidate, write_version
        from h5forge.ingest.discover import discover
        from h5forge.spec import load_spec
        from h5forge.store.versions import output_lock, retain, stage

        out["import_seconds"] = round(time.perf_counter() - t_import, 2)
        t0 = time.perf_counter()
        spec = load_spec(spec_path)
        with output_lock(spec.output.dir, "benchmark"):
            inventory = discover(spec)
            window = CpuWindow(pids, len(inventory.samples))
            candidate = stage(spec.output.dir)
            t1 = time.perf_counter()
            summary = write_version(spec, inventory, candidate, window.progress)
            out["write_version_seconds"] = round(time.perf_counter() - t1, 2)
            if mode == "plain":  # the whole build as plain calls, for the flow comparison
                report = verify_candidate(candidate)
                publish_candidate(candidate, report)
                retain(spec.output.dir, spec.output.keep)
                out["health_ok"] = report.ok
            else:
                candidate.discard()
        out["build_seconds"] = round(time.perf_counter() - t0, 2)
        out["timings"] = summary["timings"]
        out["counts"] = summary["counts"]
        out["cpu"] = window.result()
    out["loadavg_after"] = loadavg()
    result.write_text(json.dumps(out, indent=1))


# ---- the parent -----------------------------------------------------------------------------------

def ephemeral_startup(work: Path) -> dict:
    """A trivial flow with no server configured and a fresh PREFECT_HOME: the ephemeral server."""
    home = work / "prefect-home-ephemeral"
    home.mkdir()
    code = ("import time; t0 = time.perf_counter()\n"
            "from prefect import flow\n"
            "t1 = time.perf_counter()\n"
            "@flow\ndef noop():\n    return 1\n"
            "noop(); t2 = time.perf_counter()\n"
            "noop(); t3 = time.perf_counter()\n"
            "print(round(t1 - t0, 2), round(t2 - t1, 2), round(t3 - t2, 2))\n")
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-c", code], env={**prefect_free_env(), "PREFECT_HOME": str(home)},
                       capture_output=True, text=True, timeout=600, cwd=work)
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        return {"error": r.stderr[-2000:]}
    imp, first, second = map(float, r.stdout.split()[-3:])
    return {"child_wall_seconds": round(wall, 2), "import_prefect_seconds": imp,
            "first_flow_run_seconds": first, "second_flow_run_seconds": second,
            "ephemeral_server_start_seconds": round(first - second, 2)}


def scaling(args, work: Path, record: dict, save) -> None:
    raw = raw_with(args.n)
    configs = ["LocalCluster(1)", "LocalCluster(2)", "external(2)"]
    runs = record["scaling"]["runs"]
    logs = work / "dask-logs"
    logs.mkdir()
    address, procs, started = start_dask(logs)
    record["scaling"]["external_cluster_start_seconds"] = round(started, 2)
    try:
        for rep in range(args.reps):
            order = configs if rep % 2 == 0 else configs[::-1]
            for cfg in order:
                d = work / f"scale-{rep}-{cfg.replace('(', '').replace(')', '')}"
                d.mkdir()
                compute = {"inline_below": 0}
                if cfg.startswith("external"):
                    compute["dask_address"] = address
                else:
                    compute["workers"] = int(cfg[-2])
                spec = write_spec(raw, d / "out", d / "spec.yaml", **compute)
                env = {**os.environ, "OMP_NUM_THREADS": "1"}
                pids = [p.pid for p in procs] if cfg.startswith("external") else []
                la = loadavg()
                res = run_child("write", spec, env, pids)
                n = sum(res["counts"].values())
                tw = res["timings"]
                row = {"rep": rep, "config": cfg, "samples": n, "loadavg_before": la,
                       "clean_write_seconds": tw["clean_write_seconds"],
                       "cluster_start_seconds": tw.get("cluster_start_seconds"),
                       "cleaned_in": tw["cleaned_in"],
                       "samples_per_s": round(n / tw["clean_write_seconds"], 1),
                       "write_version_seconds": res["write_version_seconds"], "cpu": res["cpu"]}
                runs.append(row)
                print(f"  rep {rep} {cfg:16s} {row['samples_per_s']:7.1f} samples/s "
                      f"(clean+write {tw['clean_write_seconds']:.1f} s, cluster start "
                      f"{tw.get('cluster_start_seconds')} s; writer {res['cpu']['writer_cpu_ms_per_sample']} "
                      f"ms CPU/sample, workers {res['cpu']['workers_cpu_ms_per_sample']}; load {la[0]})",
                      flush=True)
                shutil.rmtree(d / "out", ignore_errors=True)
                save()
    finally:
        stop(procs)


def overhead(args, work: Path, record: dict, save) -> None:
    raw = raw_with(args.overhead_n)
    home = work / "prefect-home-server"
    home.mkdir()
    url, server, started = start_prefect_server(home)
    rec = record["overhead"]
    rec["server_start_to_healthy_seconds"] = round(started, 2)
    try:
        env_plain = {**prefect_free_env(), "PREFECT_HOME": str(home / "plain-client")}
        env_flow = {**prefect_free_env(), "PREFECT_HOME": str(home / "flow-client"), "PREFECT_API_URL": url}
        for rep in range(args.overhead_reps):
            order = ["plain", "flow"] if rep % 2 == 0 else ["flow", "plain"]
            for mode in order:
                d = work / f"overhead-{rep}-{mode}"
                d.mkdir()
                spec = write_spec(raw, d / "out", d / "spec.yaml")  # the default: LocalCluster(2)
                la = loadavg()
                res = run_child(mode, spec, env_plain if mode == "plain" else env_flow)
                row = {"rep": rep, "mode": mode, "samples": sum(res["counts"].values()), "loadavg_before": la,
                       "build_seconds": res["build_seconds"], "child_wall_seconds": res["child_wall_seconds"],
                       "import_seconds": res["import_seconds"], "health_ok": res["health_ok"],
                       "clean_write_seconds": res["timings"]["clean_write_seconds"],
                       "cluster_start_seconds": res["timings"].get("cluster_start_seconds")}
                rec["runs"].append(row)
                print(f"  rep {rep} {mode:5s} build {row['build_seconds']:.1f} s (child wall "
                      f"{row['child_wall_seconds']:.1f} s, imports {row['import_seconds']} s, clean+write "
                      f"{row['clean_write_seconds']} s; load {la[0]})", flush=True)
                shutil.rmtree(d / "out", ignore_errors=True)
                save()
    finally:
        stop([server])
    print("  ephemeral server start-up (fresh PREFECT_HOME, no PREFECT_API_URL) ...", flush=True)
    rec["ephemeral"] = ephemeral_startup(work)
    save()


def med(xs):
    xs = [x for x in xs if x is not None]
    return round(statistics.median(xs), 3) if xs else None


def summarise(record: dict) -> dict:
    s: dict = {}
    runs = record["scaling"]["runs"]
    if runs:
        by = {}
        for r in runs:
            by.setdefault(r["config"], []).append(r)
        for cfg, rs in by.items():
            s[cfg] = {"samples_per_s": med([r["samples_per_s"] for r in rs]),
                      "clean_write_seconds": med([r["clean_write_seconds"] for r in rs]),
                      "cluster_start_seconds": med([r["cluster_start_seconds"] for r in rs]),
                      "writer_cpu_ms_per_sample": med([r["cpu"]["writer_cpu_ms_per_sample"] for r in rs]),
                      "workers_cpu_ms_per_sample": med([r["cpu"]["workers_cpu_ms_per_sample"] for r in rs]),
                      "cores_busy": med([r["cpu"]["cores_busy"] for r in rs])}
        one = s.get("LocalCluster(1)", {}).get("samples_per_s")
        for cfg in ("LocalCluster(2)", "external(2)"):
            if one and cfg in s:
                s[f"ratio {cfg} / LocalCluster(1)"] = round(s[cfg]["samples_per_s"] / one, 3)
        # the same ratio per repetition (configs of one repetition ran back to back)
        per_rep = []
        for rep in sorted({r["rep"] for r in runs}):
            rr = {r["config"]: r["samples_per_s"] for r in runs if r["rep"] == rep}
            if "LocalCluster(1)" in rr and "LocalCluster(2)" in rr:
                per_rep.append(round(rr["LocalCluster(2)"] / rr["LocalCluster(1)"], 3))
        s["ratio LocalCluster(2)/(1) per rep"] = per_rep
    o = record["overhead"]["runs"]
    if o:
        p = [r for r in o if r["mode"] == "plain"]
        f = [r for r in o if r["mode"] == "flow"]
        s["plain build_seconds"] = med([r["build_seconds"] for r in p])
        s["flow build_seconds"] = med([r["build_seconds"] for r in f])
        s["plain child_wall_seconds"] = med([r["child_wall_seconds"] for r in p])
        s["flow child_wall_seconds"] = med([r["child_wall_seconds"] for r in f])
        s["plain clean_write_seconds"] = med([r["clean_write_seconds"] for r in p])
        s["flow clean_write_seconds"] = med([r["clean_write_seconds"] for r in f])
        if p and f:
            s["ratio flow / plain (build)"] = round(s["flow build_seconds"] / s["plain build_seconds"], 3)
            s["ratio flow / plain (child wall)"] = round(s["flow child_wall_seconds"] / s["plain child_wall_seconds"], 3)
            # outside clean+write: what the flow adds where the dask/writer noise is absent
            s["plain build minus clean+write s"] = round(s["plain build_seconds"] - s["plain clean_write_seconds"], 2)
            s["flow build minus clean+write s"] = round(s["flow build_seconds"] - s["flow clean_write_seconds"], 2)
    return s


def markdown(record: dict) -> str:
    s = record["summary"]
    m = record["machine"]
    L = [f"# Orchestration benchmark ({record['date']})", "",
         f"Command: `python benchmarks/orchestration.py {' '.join(record['argv'])}`  ",
         f"Machine: {m['cpu_count']} CPUs ({m['cpu_model']}), {m['memory_gib']} GiB, Python {m['python']}. "
         f"Shared box: load average at start {record['loadavg_start']}, at end {record.get('loadavg_end')}; "
         f"CPU pressure at start `{record['pressure_start']}`, at end `{record.get('pressure_end')}`.", ""]
    runs = record["scaling"]["runs"]
    if runs:
        L += ["## 1. Cleaning on 1 vs 2 dask workers", "",
              f"{runs[0]['samples']:,} generated good samples (150-260 px RGB PNG + mask -> 224x224; storage "
              f"{record['scaling'].get('storage')} from config/demo.yaml; code at {record['scaling'].get('git')}), "
              "batches of 64, 2 batches in flight per worker. Each build runs `discover -> stage -> "
              "write_version` in a fresh child process (no Prefect). Throughput = samples / `clean_write_seconds` "
              "(cluster start excluded; it is reported apart). Configurations interleaved, order reversed every "
              f"other repetition. External: `dask scheduler` + 2 × `dask worker --nworkers 1 --nthreads 1`, started "
              f"once ({record['scaling'].get('external_cluster_start_seconds')} s to 2 workers connected) and "
              "kept up across repetitions; started with dask's default settings, as a user would, so without "
              "the lean worker settings h5forge applies to its own LocalCluster (`LEAN_WORKERS`: no profiler, "
              "no malloc trim).", "",
              "CPU columns: CPU seconds per sample of the writer (the calling process: receiving batches, "
              "writing HDF5) and of all worker processes together, measured with psutil over the "
              "same window (first batch received to last); cores busy = all of that CPU / window wall time.", "",
              "| rep | config | samples/s | clean+write s | cluster start s | writer CPU ms/sample | "
              "workers CPU ms/sample | per worker CPU s | cores busy | load before |",
              "|---|---|---|---|---|---|---|---|---|---|"]
        for r in runs:
            c = r["cpu"]
            L.append(f"| {r['rep']} | {r['config']} | {r['samples_per_s']} | {r['clean_write_seconds']} | "
                     f"{r['cluster_start_seconds']} | {c['writer_cpu_ms_per_sample']} | "
                     f"{c['workers_cpu_ms_per_sample']} | {', '.join(map(str, c['workers_cpu_s']))} | "
                     f"{c['cores_busy']} | {r['loadavg_before'][0]} |")
        L += ["", "Medians:", "", "| config | samples/s | clean+write s | cluster start s | writer CPU ms/sample | "
              "workers CPU ms/sample | cores busy |", "|---|---|---|---|---|---|---|"]
        for cfg in ("LocalCluster(1)", "LocalCluster(2)", "external(2)"):
            if cfg in s:
                x = s[cfg]
                L.append(f"| {cfg} | {x['samples_per_s']} | {x['clean_write_seconds']} | {x['cluster_start_seconds']} | "
                         f"{x['writer_cpu_ms_per_sample']} | {x['workers_cpu_ms_per_sample']} | {x['cores_busy']} |")
        r2 = s.get("ratio LocalCluster(2) / LocalCluster(1)")
        rx = s.get("ratio external(2) / LocalCluster(1)")
        L += ["", f"**2 workers / 1 worker (median throughput): LocalCluster {r2}, external scheduler {rx} "
              f"(goal >= {SCALING_GOAL}: {'meets' if r2 and r2 >= SCALING_GOAL else 'MISSES'}).** "
              f"Per repetition (LocalCluster): {s.get('ratio LocalCluster(2)/(1) per rep')}. "
              "On a shared box under heavy CPU pressure (see PSI above) the wall-clock ratios mostly measure "
              "how much CPU the other jobs left each configuration (cores busy column); the CPU budget below "
              "is the steadier evidence.", ""]
        L += record.get("analysis", [])
    o = record["overhead"]["runs"]
    if o:
        L += ["", "## 2. Prefect flow vs plain function calls", "",
              f"{o[0]['samples']:,} samples, LocalCluster(2), storage {record['overhead'].get('storage')}, code at "
              f"{record['overhead'].get('git')}. Plain: `load_spec -> output_lock -> discover -> stage "
              "-> write_version -> verify_candidate -> publish_candidate -> retain` in a child process without Prefect. "
              "Flow: `flows.build.build_dataset(spec)` in a child process with `PREFECT_API_URL` pointing at a "
              f"`prefect server start` on 127.0.0.1 (fresh PREFECT_HOME; healthy after "
              f"{record['overhead'].get('server_start_to_healthy_seconds')} s, running during both variants). "
              "Build s = the build call inside the child (imports excluded); child wall = the whole child "
              "process (interpreter, imports, build, exit).", "",
              "| rep | mode | build s | child wall s | imports s | clean+write s | cluster start s | build − clean+write s | health ok | load before |",
              "|---|---|---|---|---|---|---|---|---|---|"]
        for r in o:
            L.append(f"| {r['rep']} | {r['mode']} | {r['build_seconds']} | {r['child_wall_seconds']} | "
                     f"{r['import_seconds']} | {r['clean_write_seconds']} | {r['cluster_start_seconds']} | "
                     f"{round(r['build_seconds'] - r['clean_write_seconds'], 2)} | {r['health_ok']} | "
                     f"{r['loadavg_before'][0]} |")
        ratio = s.get("ratio flow / plain (build)")
        L += ["", f"**Flow / plain, median build time: {ratio} (goal <= {OVERHEAD_GOAL}: "
              f"{'meets' if ratio and ratio <= OVERHEAD_GOAL else 'MISSES'}); whole child process: "
              f"{s.get('ratio flow / plain (child wall)')}.** Outside clean+write the plain build spends "
              f"{s.get('plain build minus clean+write s')} s, the flow {s.get('flow build minus clean+write s')} s "
              "(medians): that difference is the orchestration's own cost, free of the clean+write noise. "
              "Part of it grows with the dataset: Prefect walks every task parameter (to find upstream futures "
              "and resolve them), and the `Inventory` of 10,000 samples passed to `clean-and-write` took 1.8 s "
              "(collect inputs) + 1.2-1.6 s (resolve) on this box; `prefect.utilities.annotations.quote(inventory)` "
              "skips the walk.", ""]
        e = record["overhead"].get("ephemeral")
        if e:
            L += ["### Ephemeral server start-up (apart)", "",
                  "A trivial flow in a fresh interpreter with no `PREFECT_API_URL` and a fresh PREFECT_HOME "
                  "(what `h5forge build` does when no server is configured):", "",
                  f"- {json.dumps(e)}", ""]
    return "\n".join(L) + "\n"


def analysis(record: dict) -> list[str]:
    """Why 2 workers do (not) give 1.7x: a CPU budget from the measured CPU time per sample.

    CPU ms per sample barely moves with the load of other jobs (wall time does), so the ceiling of
    each configuration on an otherwise idle machine follows from it: every process is limited by
    its own CPU per sample (one core each), and all of them together by the number of cores.
    """
    s = record["summary"]
    one, two = s.get("LocalCluster(1)"), s.get("LocalCluster(2)")
    if not one or not two:
        return []
    cores = record["machine"]["cpu_count"]

    def ceiling(x: dict, workers: int) -> float:
        w, c = x["writer_cpu_ms_per_sample"], x["workers_cpu_ms_per_sample"]
        return min(1000 / w, 1000 * workers / c, 1000 * cores / (w + c))

    c1, c2 = ceiling(one, 1), ceiling(two, 2)
    c2_at_1 = ceiling(one, 2)  # 2 workers if each sample cost what it cost with 1 worker (less contention)
    w1, k1 = one["writer_cpu_ms_per_sample"], one["workers_cpu_ms_per_sample"]
    w2, k2 = two["writer_cpu_ms_per_sample"], two["workers_cpu_ms_per_sample"]
    lines = ["### Where the time goes", "",
             f"CPU per sample (medians): 1 worker: writer {w1} ms + worker {k1} ms; 2 workers: writer {w2} ms + "
             f"workers {k2} ms together. On an otherwise idle {cores}-core machine each process is limited to one "
             f"core and all of them together to {cores} cores, so the ceilings are: 1 worker "
             f"min(1000/{w1}, 1000/{k1}, {cores}000/{round(w1 + k1, 2)}) = {round(c1, 1)} samples/s (the worker "
             f"is the limit); 2 workers min(1000/{w2}, 2000/{k2}, {cores}000/{round(w2 + k2, 2)}) = {round(c2, 1)} "
             f"samples/s (the {cores} cores are the limit). **Best possible ratio here: {round(c2 / c1, 2)}** "
             f"(goal {SCALING_GOAL}): with the writer needing a share of the same {cores} cores, 2 workers "
             f"cannot reach {SCALING_GOAL}x on this machine even when it is idle (with the 1-worker CPU costs "
             f"for both, i.e. no extra contention from the second worker: {round(c2_at_1 / c1, 2)}). "
             "Measured cores busy: 1 worker "
             f"{one['cores_busy']}, 2 workers {two['cores_busy']} of {cores} (the rest went to other jobs on "
             "the shared box; see the load average).", ""]
    ext = s.get("external(2)")
    if ext:
        lines += [f"Writer-process CPU per sample: LocalCluster(2) {w2} ms vs external(2) "
                  f"{ext['writer_cpu_ms_per_sample']} ms. A LocalCluster runs its scheduler and the worker "
                  "nannies inside the calling process, so they share the writer's process and GIL; an external "
                  "scheduler takes that work elsewhere.", ""]
    return lines


def rerender() -> None:
    """Rewrite the summary and orchestration.md from orchestration.json (no new measurement)."""
    path = RESULTS / "orchestration.json"
    record = json.loads(path.read_text())
    record["summary"] = summarise(record)
    record["analysis"] = analysis(record)
    path.write_text(json.dumps(record, indent=1))
    (RESULTS / "orchestration.md").write_text(markdown(record))
    print(f"rewrote {RESULTS / 'orchestration.md'}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=5000, help="samples for the 1 vs 2 workers comparison")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--overhead-n", type=int, default=10_000)
    ap.add_argument("--overhead-reps", type=int, default=2)
    ap.add_argument("--only", choices=["scaling", "overhead"])
    ap.add_argument("--report", action="store_true", help="rewrite the .md from the .json, measure nothing")
    ap.add_argument("--child", choices=["write", "plain", "flow"], help=argparse.SUPPRESS)
    ap.add_argument("--spec", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--pids", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.report:
        return rerender()
    if args.child:
        return child(args.child, args.spec, args.result, [int(p) for p in args.pids.split(",") if p])

    RESULTS.mkdir(parents=True, exist_ok=True)
    import yaml

    git = subprocess.run(["git", "-C", str(REPO), "describe", "--always", "--dirty"], capture_output=True,
                         text=True).stdout.strip()
    storage = yaml.safe_load((REPO / "config" / "demo.yaml").read_text())["storage"]
    record = {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "argv": sys.argv[1:], "machine": machine(),
              "loadavg_start": loadavg(), "pressure_start": cpu_pressure(),
              "scaling": {"runs": [], "git": git, "storage": storage},
              "overhead": {"runs": [], "git": git, "storage": storage}}
    previous = RESULTS / "orchestration.json"
    if args.only and previous.exists():  # keep the other part's last results
        other = "overhead" if args.only == "scaling" else "scaling"
        record[other] = json.loads(previous.read_text())[other]

    def save():
        record["summary"] = summarise(record)
        record["analysis"] = analysis(record)
        (RESULTS / "orchestration.json").write_text(json.dumps(record, indent=1))
        (RESULTS / "orchestration.md").write_text(markdown(record))

    work = Path(tempfile.mkdtemp(prefix="orch-", dir=CACHE if CACHE.exists() else None))
    try:
        if args.only in (None, "scaling"):
            print(f"1 vs 2 workers, {args.n:,} samples, {args.reps} repetition(s):", flush=True)
            scaling(args, work, record, save)
        if args.only in (None, "overhead"):
            print(f"flow vs plain calls, {args.overhead_n:,} samples, {args.overhead_reps} repetition(s):", flush=True)
            overhead(args, work, record, save)
    finally:
        record["loadavg_end"] = loadavg()
        record["pressure_end"] = cpu_pressure()
        save()
        shutil.rmtree(work, ignore_errors=True)
    s = record["summary"]
    print("\nratios:")
    for k in ("ratio LocalCluster(2) / LocalCluster(1)", "ratio external(2) / LocalCluster(1)",
              "ratio LocalCluster(2)/(1) per rep", "ratio flow / plain (build)", "ratio flow / plain (child wall)"):
        if k in s:
            print(f"  {k}: {s[k]}")
    print(f"  goals: 2 workers >= {SCALING_GOAL}x one; flow <= {OVERHEAD_GOAL}x plain")
    print(f"  load average start {record['loadavg_start']}, end {record['loadavg_end']}")
    print(f"results: {RESULTS / 'orchestration.md'}")


if __name__ == "__main__":
    main()
