"""Orchestration benchmark: 1 vs 2 dask workers, an external scheduler, Prefect flow vs plain calls.

    python -m benchmarks.orchestration [--smoke] [--n 5000 --reps 2 --overhead-n 10000 --overhead-reps 2]

What is measured and how: benchmarks/README.md, section "orchestration".
"""

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from benchmarks.common import (CACHE, REPO, cli, get, loadavg, log, machine, make_spec, med, prefect_env, ratio, raw_folder,
                               save, write_spec)

BIN = Path(sys.executable).parent
CONFIGS = ["LocalCluster(1)", "LocalCluster(2)", "external(2)"]


def spawn(cmd: list[str], logfile: Path, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen(cmd, stdout=open(logfile, "w"), stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                            start_new_session=True)


def free_port() -> int:
    with socket.create_server(("127.0.0.1", 0)) as s:
        return s.getsockname()[1]


def stop(procs: list[subprocess.Popen], timeout: float = 20) -> None:
    """SIGTERM, wait, then SIGKILL each process group (each was started in its own session)."""
    for p in reversed(procs):
        p.terminate()
    for p in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(timeout=timeout)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)
        p.wait()


def start_dask(logs: Path) -> tuple[str, list[subprocess.Popen], float]:
    """`dask scheduler` + 2 `dask worker --nworkers 1 --nthreads 1` on 127.0.0.1; logs in ``logs``."""
    from distributed import Client
    port, t0 = free_port(), time.perf_counter()
    address = f"tcp://127.0.0.1:{port}"
    procs = [spawn([str(BIN / "dask"), "scheduler", "--host", "127.0.0.1", "--port", str(port), "--no-dashboard",
                    "--idle-timeout", "3600"], logs / "scheduler.log")]
    try:
        procs += [spawn([str(BIN / "dask"), "worker", address, "--nworkers", "1", "--nthreads", "1", "--host", "127.0.0.1",
                         "--no-dashboard", "--death-timeout", "120", "--name", f"bench-w{i}"], logs / f"worker{i}.log")
                  for i in range(2)]
        with Client(address, timeout="60s") as client:
            client.wait_for_workers(2, timeout=120)
    except BaseException:
        stop(procs)
        raise
    return address, procs, time.perf_counter() - t0


def start_prefect_server(home: Path) -> tuple[str, subprocess.Popen, float]:
    import httpx
    port, t0 = free_port(), time.perf_counter()
    url = f"http://127.0.0.1:{port}/api"
    proc = spawn([str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(port), "--no-ui"],
                 home / "server.log", prefect_env(home))
    while proc.poll() is None and time.perf_counter() - t0 < 240:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return url, proc, time.perf_counter() - t0
        time.sleep(0.5)
    stop([proc])
    raise RuntimeError("prefect server did not start:\n" + (home / "server.log").read_text())


def run_child(mode: str, spec: Path, env: dict, pids: list[int] = ()) -> dict:
    """One build in a fresh interpreter (``python -m benchmarks.orchestration --child MODE``)."""
    result, t0 = spec.parent / f"result-{mode}.json", time.perf_counter()
    cmd = [sys.executable, "-m", "benchmarks.orchestration", "--child", mode, "--spec", str(spec), "--result", str(result),
           "--pids", ",".join(map(str, pids))]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=3600, cwd=REPO)
    if r.returncode != 0 or not result.exists():
        raise RuntimeError(f"child {mode} failed (rc {r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-6000:]}")
    return {**json.loads(result.read_text()), "child_wall_seconds": round(time.perf_counter() - t0, 2)}


class CpuWindow:
    """CPU seconds of this process (the writer) and of the dask workers (its descendants, and the trees of
    ``pids``: external processes) from the first cleaned batch to the last: two snapshots only."""

    def __init__(self, pids: list[int], total: int):
        self.pids, self.total, self.seen, self.samples, self.start, self.end, self.t = pids, total, 0, 0, None, {}, [0, 0]

    def snapshot(self) -> dict[int, tuple[str, float]]:
        out = {}
        for p, role in self.procs:
            with contextlib.suppress(psutil.NoSuchProcess):
                out[p.pid] = (role, sum(p.cpu_times()[:2]))
        return out

    def progress(self, n: int) -> None:
        self.seen += n
        if self.start is None:
            role = lambda p, r: "other" if "resource_tracker" in " ".join(p.cmdline()) else r  # noqa: E731
            me = psutil.Process()
            self.procs = [(me, "writer")] + [(c, role(c, "worker")) for c in me.children(recursive=True)]
            for top in (psutil.Process(pid) for pid in self.pids):  # scheduler, nannies: "other"
                self.procs += [(top, "other")] + [(c, role(c, "worker")) for c in top.children(recursive=True)]
            self.start, self.t[0] = self.snapshot(), time.perf_counter()
            return  # the first batch is outside the window
        self.samples += n
        if self.seen >= self.total:
            self.end, self.t[1] = self.snapshot(), time.perf_counter()

    def result(self) -> dict:
        used = [(role, cpu - self.start[pid][1]) for pid, (role, cpu) in self.end.items() if pid in self.start]
        writer, other = (sum(c for r, c in used if r == k) for k in ("writer", "other"))
        workers = sorted((round(c, 2) for r, c in used if r == "worker"), reverse=True)
        wall, n = self.t[1] - self.t[0], max(self.samples, 1)
        return {"window_seconds": round(wall, 2), "window_samples": self.samples, "writer_cpu_s": round(writer, 2),
                "workers_cpu_s": workers, "other_cpu_s": round(other, 2), "writer_cpu_ms_per_sample": round(1000 * writer / n, 3),
                "workers_cpu_ms_per_sample": round(1000 * sum(workers) / n, 3),
                "cores_busy": round((writer + sum(workers) + other) / wall, 2) if wall else None}


def flow_steps(spec_path: str, pids: list[int]):
    """What flows/build.py's build_dataset does, step for step, as plain calls: the same library
    work (the unchanged check, the rejection limit, the health report's, rejections' and splits'
    Markdown, the diff, the preview sheet and its artifact copy) without Prefect's engine, logging
    and API calls. ``flow`` against this is Prefect's own cost; ``plain`` is the bare build."""
    from dataclasses import replace

    from h5forge.format.names import version_name
    from h5forge.format.summary import bounded_rows
    from h5forge.ingest.build import publish_candidate, verify_candidate, write_version
    from h5forge.ingest.discover import discover
    from h5forge.ingest.incremental.rebuild import inputs_of, unchanged_since
    from h5forge.ingest.rejected import check_rejected
    from h5forge.spec import load_spec
    from h5forge.views.diff import diff_versions
    from h5forge.store.output import claim_output, preflight
    from h5forge.views.preview import artifact_data_uri, preview_path, write_preview
    from h5forge.store.versions import output_lock, retain, stage
    spec = load_spec(spec_path)
    preflight(spec)
    with output_lock(spec.output.dir, "benchmark"):
        claim_output(spec.output.dir, spec.name)
        inventory = discover(spec)
        inputs = inputs_of(spec, inventory)
        assert unchanged_since(spec.output.dir, inputs) is None, "the benchmark builds into an empty folder"
        candidate, window = stage(spec.output.dir), CpuWindow(pids, len(inventory.samples))
        summary = write_version(spec, inventory, candidate, window.progress, inputs=inputs)
        check_rejected(spec, inventory, summary, candidate)
        report = verify_candidate(candidate)
        texts = [replace(report, path=version_name(candidate.number)).to_markdown(), list(bounded_rows(summary.rejections))]
        published = publish_candidate(candidate, report)
        previous = candidate.out / version_name(candidate.parent) if candidate.parent else None
        if previous is not None and previous.is_file():
            texts.append(diff_versions(previous, candidate.final).to_markdown())
        sheet = write_preview(published, preview_path(candidate.out, candidate.number), n=16, compress_level=1)
        texts.append(artifact_data_uri(sheet.image))
        retain(spec.output.dir, spec.output.keep, spec.output.retire_after_seconds)
    return summary, window.result(), report.ok


def tree_cpu() -> float:
    """User+system CPU seconds of this process and of its children that have ended (the dask
    workers of a LocalCluster, once it is closed)."""
    import resource
    return sum(r.ru_utime + r.ru_stime for r in map(resource.getrusage, (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)))


def imported(out: dict, t0: float) -> float:
    """Marks the end of the imports (their wall and CPU apart from the build's); the build's clock."""
    out["import_seconds"], out["import_cpu_seconds"] = round(time.perf_counter() - t0, 2), round(tree_cpu(), 2)
    return time.perf_counter()


def child(mode: str, spec_path: str, result: Path, pids: list[int]) -> None:
    t0, out = time.perf_counter(), {"mode": mode, "loadavg_before": loadavg()[0]}
    if mode == "flow":
        from h5forge.flows.build import build_dataset
        t0 = imported(out, t0)
        summary = build_dataset(spec_path)
        out["health_ok"] = bool(get(summary, "path"))  # the flow raises VerificationFailed otherwise
    elif mode == "steps":
        import importlib
        for module in ("h5forge.ingest.build", "h5forge.views.preview", "h5forge.views.diff"):
            importlib.import_module(module)  # before the clock, as the other modes import theirs
        t0 = imported(out, t0)
        summary, out["cpu"], out["health_ok"] = flow_steps(spec_path, pids)
    else:
        from h5forge.ingest.build import publish_candidate, verify_candidate, write_version
        from h5forge.ingest.discover import discover
        from h5forge.spec import load_spec
        from h5forge.store.versions import output_lock, retain, stage
        t0 = imported(out, t0)
        spec = load_spec(spec_path)
        with output_lock(spec.output.dir, "benchmark"):
            inventory = discover(spec)
            window, candidate, t1 = CpuWindow(pids, len(inventory.samples)), stage(spec.output.dir), time.perf_counter()
            summary = write_version(spec, inventory, candidate, window.progress)
            out["write_version_seconds"] = round(time.perf_counter() - t1, 2)
            if mode == "plain":
                publish_candidate(candidate, report := verify_candidate(candidate))
                retain(spec.output.dir, spec.output.keep)
                out["health_ok"] = report.ok
            else:
                candidate.discard()
        out["cpu"] = window.result()
    tm = get(summary, "timings")
    out |= {"build_seconds": round(time.perf_counter() - t0, 2), "samples": sum(get(summary, "counts").values()),
            "clean_write_seconds": tm["clean_write_seconds"], "cluster_start_seconds": tm.get("cluster_start_seconds"),
            "cleaned_in": tm.get("cleaned_in"), "process_tree_cpu_seconds": round(tree_cpu(), 2)}
    out["build_cpu_seconds"] = round(out["process_tree_cpu_seconds"] - out["import_cpu_seconds"], 2)
    result.write_text(json.dumps(out | {"loadavg_after": loadavg()[0]}, indent=1))


def scaling(args, raw: Path, work: Path) -> dict:
    address, procs, started = start_dask(work)
    rec = {"external_cluster_start_seconds": round(started, 2), "runs": []}
    try:
        for rep in range(args.reps):
            for cfg in CONFIGS if rep % 2 == 0 else CONFIGS[::-1]:
                d, ext = work / f"scale-{rep}-{cfg.strip(')').replace('(', '')}", cfg.startswith("external")
                compute = {"inline_below": 0, **({"dask_address": address} if ext else {"workers": int(cfg[-2])})}
                spec = write_spec(make_spec(raw, d / "out", args.size, compute=compute), d / "spec.yaml")
                res = run_child("write", spec, {**os.environ, "OMP_NUM_THREADS": "1"}, [p.pid for p in procs] if ext else [])
                rec["runs"].append(row := {"rep": rep, "config": cfg, **{k: v for k, v in res.items() if k != "cpu"}, **res["cpu"],
                                           "samples_per_s": round(res["samples"] / res["clean_write_seconds"], 1)})
                log(f"rep {rep} {cfg:16s} {row['samples_per_s']} samples/s; CPU ms/sample writer "
                    f"{row['writer_cpu_ms_per_sample']}, workers {row['workers_cpu_ms_per_sample']}")
                shutil.rmtree(d / "out", ignore_errors=True)
    finally:
        stop(procs)
    return rec


def overhead(args, raw: Path, work: Path) -> tuple[dict, dict]:
    url, server, started = start_prefect_server(home := work / "prefect-home-server")
    rec = {"server_start_to_healthy_seconds": round(started, 2), "runs": []}
    try:
        for rep in range(args.overhead_reps):
            for mode in ("plain", "flow") if rep % 2 == 0 else ("flow", "plain"):
                d = work / f"overhead-{rep}-{mode}"
                spec = write_spec(make_spec(raw, d / "out", args.size, compute={"inline_below": 0}), d / "spec.yaml")
                env = prefect_env(home / f"{mode}-client", **({"PREFECT_API_URL": url} if mode == "flow" else {}))
                res = run_child(mode, spec, env)
                rec["runs"].append({"rep": rep, **res, "build_minus_clean_write_seconds":
                                    round(res["build_seconds"] - res["clean_write_seconds"], 2)})
                log(f"rep {rep} {mode:5s} build {res['build_seconds']} s (child wall {res['child_wall_seconds']} s)")
                shutil.rmtree(d / "out", ignore_errors=True)
    finally:
        stop([server])
    return rec, ephemeral_start(work)


def ephemeral_start(work: Path) -> dict:
    """A trivial flow twice in a fresh interpreter without PREFECT_API_URL: the first run starts the
    ephemeral server, so its start-up = first flow run - second."""
    code = ("import time; t = [time.perf_counter()]\nfrom prefect import flow\nt.append(time.perf_counter())\n"
            "@flow\ndef noop():\n    return 1\nnoop(); t.append(time.perf_counter())\nnoop(); t.append(time.perf_counter())\n"
            "print(*[round(b - a, 2) for a, b in zip(t, t[1:])])\n")
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-c", code], env=prefect_env(work / "prefect-home-ephemeral"),
                       capture_output=True, text=True, timeout=600, cwd=work)
    if r.returncode != 0:
        raise RuntimeError(f"ephemeral start-up failed:\n{r.stderr[-3000:]}")
    imp, first, second = map(float, r.stdout.split()[-3:])
    return {"child_wall_seconds": round(time.perf_counter() - t0, 2), "import_prefect_seconds": imp,
            "first_flow_run_seconds": first, "second_flow_run_seconds": second,
            "ephemeral_server_start_seconds": round(first - second, 2)}


def summarise(record: dict) -> dict:
    runs, cores = record.get("scaling", {}).get("runs", []), record["machine"]["cpu_count"]
    keys = ("samples_per_s", "clean_write_seconds", "cluster_start_seconds", "writer_cpu_ms_per_sample",
            "workers_cpu_ms_per_sample", "cores_busy")
    m = {c: {k: med(r[k] for r in runs if r["config"] == c) for k in keys} for c in CONFIGS if any(r["config"] == c for r in runs)}
    s: dict = {"scaling_medians": m, "ratios": {}}
    if "LocalCluster(1)" in m:
        s["ratios"] = {f"{c} / LocalCluster(1)": ratio(m[c]["samples_per_s"], m["LocalCluster(1)"]["samples_per_s"])
                       for c in CONFIGS[1:] if c in m}
        per_rep = [{r["config"]: r["samples_per_s"] for r in runs if r["rep"] == rep} for rep in sorted({r["rep"] for r in runs})]
        s["ratios"]["LocalCluster(2)/(1) per rep"] = [ratio(x.get("LocalCluster(2)"), x["LocalCluster(1)"]) for x in per_rep]

        def ceiling(x: dict, workers: int) -> float | None:
            w, c = x["writer_cpu_ms_per_sample"], x["workers_cpu_ms_per_sample"]
            return round(min(1000 / w, 1000 * workers / c, 1000 * cores / (w + c)), 1) if w and c else None

        c1, c2 = ceiling(m["LocalCluster(1)"], 1), ceiling(m.get("LocalCluster(2)", m["LocalCluster(1)"]), 2)
        s["cpu_budget"] = {"cores": cores, "ceiling_1_worker_samples_per_s": c1, "ceiling_2_workers_samples_per_s": c2,
                           "best_ratio_2_vs_1": ratio(c2, c1, 2),
                           "best_ratio_2_vs_1_at_1_worker_costs": ratio(ceiling(m["LocalCluster(1)"], 2), c1, 2)}
    if o := record.get("overhead", {}).get("runs", []):
        keys = ("build_seconds", "child_wall_seconds", "clean_write_seconds", "build_minus_clean_write_seconds")
        s["overhead_medians"] = om = {x: {k: med(r[k] for r in o if r["mode"] == x) for k in keys} for x in ("plain", "flow")}
        s["ratios"] |= {f"flow / plain ({k})": ratio(om["flow"][k], om["plain"][k]) for k in keys[:2]}
    return s


def main() -> None:
    args = cli(__doc__, dict(n=320, reps=1, overhead_n=128, overhead_reps=1, size=64), n=5000, reps=2, overhead_n=10_000,
               overhead_reps=2, size=224, only="", child="", spec="", result="", pids="")
    if args.child:
        return child(args.child, args.spec, Path(args.result), [int(p) for p in args.pids.split(",") if p])
    record: dict = {"machine": machine(), "args": {k: v for k, v in vars(args).items() if k not in ("spec", "result", "pids")}}
    work = Path(tempfile.mkdtemp(prefix="orch-", dir=CACHE))
    try:
        if args.only in ("", "scaling"):
            record["scaling"] = scaling(args, raw_folder(args.n, args.size), work)
        if args.only in ("", "overhead"):
            record["overhead"], record["ephemeral"] = overhead(args, raw_folder(args.overhead_n, args.size), work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    summary = summarise(record)
    ratios = {**summary.pop("ratios"), **summary.get("cpu_budget", {}),
              "ephemeral server start s": record.get("ephemeral", {}).get("ephemeral_server_start_seconds")}
    save("orchestration", {"ratios": ratios, **record, "summary": summary}, args.smoke)


if __name__ == "__main__":
    main()
