"""Build against its peers, Prefect's cost, and the single writer's ceiling, in one run.

    python -m benchmarks.build_peers [--smoke] [--n 10000 --workers 2 --prefect-n 10000 --cli-n 600 --writer-n 1000]

What is measured and how: benchmarks/README.md, section "build_peers". The peers (mosaic-streaming's
MDSWriter, webdataset's ShardWriter) are installed into their own venv under build/ by this command
(never into the project's); --smoke skips them when that venv is missing and says so.
"""

import dataclasses
import importlib
import json
import multiprocessing as mp
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.common import (CACHE, REPO, cli, loadavg, log, machine, make_spec, ratio, raw_folder, sampled, save,
                               warm, write_spec)

PEERS_VENV = REPO / "build" / "bench-peers"
# the writers only: mosaic-streaming's package __init__ pulls in torchvision and transformers for its
# dataset classes, which MDSWriter does not use (see ``_bare_packages``); torch, numpy, Pillow and
# PyYAML come from the project's venv through a .pth file
PEERS_NO_DEPS = ["mosaicml-streaming==0.13.0", "webdataset==1.0.2"]
PEERS_DEPS = ["braceexpand==0.1.7", "brotli==1.2.1", "python-snappy==0.7.3", "tqdm==4.70.1", "xxhash>=3,<4",
              "zstd==1.5.7.2"]
PEERS = ("mosaic", "webdataset")


# ---- the peers, run in their own venv ----------------------------------------------------------

def ensure_peers(install: bool) -> Path | None:
    """The peers' interpreter, creating the venv when ``install``; None when it is not there."""
    py = PEERS_VENV / "bin" / "python"
    if (PEERS_VENV / ".complete").exists():
        return py
    if not install:
        return None
    log(f"installing the peers into {PEERS_VENV}")
    subprocess.run([sys.executable, "-m", "venv", str(PEERS_VENV)], check=True)
    site = subprocess.run([str(py), "-c", "import site; print(site.getsitepackages()[0])"], check=True,
                          capture_output=True, text=True).stdout.strip()
    ours = subprocess.run([sys.executable, "-c", "import site; print(site.getsitepackages()[0])"], check=True,
                          capture_output=True, text=True).stdout.strip()
    Path(site, "h5forge-venv.pth").write_text(ours + "\n")
    pip = [str(py), "-m", "pip", "install", "-q"]
    subprocess.run(pip + ["--no-deps", *PEERS_NO_DEPS], check=True)
    subprocess.run(pip + PEERS_DEPS, check=True)
    (PEERS_VENV / ".complete").write_text(" ".join(PEERS_NO_DEPS + PEERS_DEPS))
    return py


def _bare_packages(*names: str) -> None:
    """Register packages without running their __init__ (their submodules still import normally)."""
    import importlib.util
    import types
    for name in names:
        spec = importlib.util.find_spec(name)
        module = types.ModuleType(name)
        module.__path__, module.__spec__ = list(spec.submodule_search_locations), spec
        sys.modules[name] = module


def fit(path: str, size: int, mode: str | None) -> np.ndarray:
    """Decode a picture and centre-crop or pad it to size x size (one Pillow crop does both)."""
    from PIL import Image
    with Image.open(path) as im:
        im = im.convert(mode) if mode else im
        left, top = (im.width - size) // 2, (im.height - size) // 2
        return np.asarray(im.crop((left, top, left + size, top + size)))


def convert_part(peer: str, pairs: list[tuple[str, str, str]], out: str, size: int) -> float:
    """One process's share: decode + fit each image/mask pair and write it with the peer's writer."""
    c0 = time.process_time()
    if peer == "mosaic":
        from streaming.base.format.mds.writer import MDSWriter
        writer = MDSWriter(out=out, columns={"image": f"ndarray:uint8:{size},{size},3",
                                             "mask": f"ndarray:uint8:{size},{size}"})
        put = lambda key, img, mask: writer.write({"image": img, "mask": mask})  # noqa: E731
    else:
        import webdataset as wds
        os.makedirs(out, exist_ok=True)
        writer = wds.ShardWriter(os.path.join(out, "shard-%06d.tar"), maxcount=1000, verbose=0)
        put = lambda key, img, mask: writer.write({"__key__": key, "image.npy": img, "mask.npy": mask})  # noqa: E731
    for key, image, mask in pairs:
        put(key, fit(image, size, "RGB"), fit(mask, size, None))
    writer.finish() if peer == "mosaic" else writer.close()
    return time.process_time() - c0


def peer_child(peer: str, job: Path) -> None:
    """In the peers' venv: the conversion in ``workers`` fork processes, timed from pool start."""
    spec = json.loads(job.read_text())
    pairs, workers = spec["pairs"], spec["workers"]
    t0 = time.perf_counter()
    if peer == "mosaic":  # imported before the fork, as a conversion script would at its top
        _bare_packages("streaming", "streaming.base")
    importlib.import_module("streaming.base.format.mds.writer" if peer == "mosaic" else "webdataset")
    imports, t0 = time.perf_counter() - t0, time.perf_counter()
    with mp.get_context("fork").Pool(workers) as pool:
        cpu = pool.starmap(convert_part, [(peer, pairs[i::workers], f"{spec['out']}/part{i}", spec["size"])
                                          for i in range(workers)], chunksize=1)
    job.with_suffix(".out.json").write_text(json.dumps({"seconds": time.perf_counter() - t0, "worker_cpu": cpu,
                                                        "import_seconds": imports}))


def run_peer(py: Path, peer: str, pairs: list, work: Path, workers: int, size: int) -> dict:
    """The whole conversion command in a child process of the peers' venv (interpreter start and
    imports included, as they are for the h5forge CLI)."""
    out = work / f"peer-{peer}"
    shutil.rmtree(out, ignore_errors=True)
    job = work / f"job-{peer}.json"
    job.write_text(json.dumps({"pairs": pairs, "workers": workers, "size": size, "out": str(out)}))
    t0, load = time.perf_counter(), loadavg()
    proc = subprocess.Popen([str(py), "-m", "benchmarks.build_peers", "--peer", peer, "--job", str(job)], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    with sampled(proc.pid) as usage:
        output, wall = proc.communicate()[0], time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{peer} failed ({proc.returncode}):\n{output[-3000:]}")
    inner = json.loads(job.with_suffix(".out.json").read_text())
    n = len(pairs)
    size_bytes = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    shutil.rmtree(out, ignore_errors=True)
    return {"samples": n, "wall_seconds": round(wall, 2), "samples_per_second": round(n / wall, 1),
            "import_seconds": round(inner["import_seconds"], 2), "convert_seconds": round(inner["seconds"], 2),
            "cpu_ms_per_sample": round(1000 * usage["cpu_seconds"] / n, 3),
            "worker_cpu_ms_per_sample": round(1000 * sum(inner["worker_cpu"]) / n, 3), "output_bytes": size_bytes,
            "loadavg_before": load}


# ---- h5forge ---------------------------------------------------------------------------------

def h5forge_cli(spec, work: Path, url: str) -> dict:
    """`h5forge build` end to end against the running server (verify and publish included)."""
    from benchmarks.build import cli_build
    shutil.rmtree(spec.output.dir, ignore_errors=True)
    res = cli_build(spec, work, api_url=url)
    size_bytes = sum(p.stat().st_size for p in Path(spec.output.dir).glob("dataset_v*.h5"))
    shutil.rmtree(spec.output.dir, ignore_errors=True)
    n = res["samples"]
    return res | {"cpu_ms_per_sample": round(1000 * res["rss"]["cpu_seconds"] / n, 3), "output_bytes": size_bytes}


def side_by_side(args, raw: Path, pairs: list, work: Path, url: str, py: Path | None) -> dict:
    from benchmarks.build import decode_bound
    spec = make_spec(raw, work / "h5forge-out", args.size, compute={"workers": args.workers, "inline_below": 0})
    keyed = [(Path(i).stem, i, m) for i, m in pairs]
    rows: dict[str, list] = {"bound": [], "h5forge": [], **({p: [] for p in PEERS} if py else {})}
    for rep in range(args.reps):
        order = list(rows) if rep % 2 == 0 else list(rows)[::-1]
        for tool in order:
            if tool == "bound":
                r = decode_bound(pairs, args.workers)
            elif tool == "h5forge":
                r = h5forge_cli(spec, work, url)
            else:
                r = run_peer(py, tool, keyed, work, args.workers, args.size)
            rows[tool].append(r | {"rep": rep})
            log(f"rep {rep} {tool:10s} {r['samples_per_second']} samples/s, CPU {r.get('cpu_ms_per_sample')} ms/sample")
    best = {tool: max(rs, key=lambda r: r["samples_per_second"]) for tool, rs in rows.items()}
    bound = best["bound"]
    table = {tool: {"wall_seconds": r["wall_seconds"], "samples_per_second": r["samples_per_second"],
                    "cpu_ms_per_sample": r.get("cpu_ms_per_sample"),
                    "vs_decode_bound_wall": ratio(r["samples_per_second"], bound["samples_per_second"]),
                    "vs_decode_bound_cpu": ratio(bound["cpu_ms_per_sample"], r.get("cpu_ms_per_sample"))}
             for tool, r in best.items()}
    fastest_peer = min((t for t in PEERS if t in best), key=lambda t: best[t]["wall_seconds"], default=None)
    out = {"samples": len(pairs), "workers": args.workers, "size": args.size, "table_best_of_reps": table, "runs": rows}
    if fastest_peer:
        out["h5forge_wall_over_fastest_peer"] = ratio(best["h5forge"]["wall_seconds"], best[fastest_peer]["wall_seconds"])
        out["fastest_peer"] = fastest_peer
    else:
        out["peers_skipped"] = f"no peer venv at {PEERS_VENV} (run without --smoke to install it)"
    return out


# ---- Prefect's cost ------------------------------------------------------------------------------

def server_cpu(server: subprocess.Popen) -> float:
    """User+system CPU seconds of the Prefect server's process tree so far."""
    import psutil
    top = psutil.Process(server.pid)
    return sum(sum(p.cpu_times()[:2]) for p in [top, *top.children(recursive=True)])


def prefect_cost(args, raw: Path, raw_cli: Path, work: Path, url: str, home: Path, server: subprocess.Popen) -> dict:
    """The build as a flow against the running server vs the same steps as plain calls (child
    processes, benchmarks.orchestration's), in two baselines: ``steps`` makes everything the flow
    makes (the unchanged check, the reports' Markdown, the diff, the preview sheet and its artifact
    copy) without Prefect, so flow / steps is Prefect's own cost; ``plain`` is the bare build
    (discover, write, verify, publish, retention). The CLI on ``--cli-n`` samples against both.

    Wall times on a shared machine swing with its load; CPU seconds (each build's process tree
    after its imports, plus what the server spent meanwhile) are the steadier figure of a cost."""
    from benchmarks.build import cli_build
    from benchmarks.common import prefect_env
    from benchmarks.orchestration import run_child
    modes, runs = ("plain", "steps", "flow"), []
    for rep in range(args.prefect_reps):
        for mode in modes if rep % 2 == 0 else modes[::-1]:
            d = work / f"prefect-{rep}-{mode}"
            spec = write_spec(make_spec(raw, d / "out", args.size, compute={"workers": args.workers, "inline_below": 0}),
                              d / "spec.yaml")
            s0 = server_cpu(server)
            res = run_child(mode, spec, prefect_env(home / f"{mode}-client", PREFECT_API_URL=url))
            runs.append({"rep": rep, "mode": mode, "build_seconds": res["build_seconds"],
                         "build_cpu_seconds": res["build_cpu_seconds"], "server_cpu_seconds": round(server_cpu(server) - s0, 2),
                         "child_wall_seconds": res["child_wall_seconds"], "import_seconds": res["import_seconds"],
                         "samples": res["samples"], "clean_write_seconds": res["clean_write_seconds"],
                         "loadavg_before": res["loadavg_before"]})
            log(f"rep {rep} {mode:5s} build {res['build_seconds']} s (child {res['child_wall_seconds']} s)")
            shutil.rmtree(d, ignore_errors=True)
    best = {m: min(r["build_seconds"] for r in runs if r["mode"] == m) for m in modes}
    cpu = {m: round(sum(r["build_cpu_seconds"] + r["server_cpu_seconds"] for r in runs if r["mode"] == m) / args.prefect_reps, 2)
           for m in modes}
    per_rep = lambda a, b: [ratio(*(next(r["build_seconds"] for r in runs if r["rep"] == rep and r["mode"] == m)  # noqa: E731
                                    for m in (a, b))) for rep in range(args.prefect_reps)]
    cli_runs = []
    for rep in range(args.prefect_reps):
        d = work / f"cli-{rep}"
        spec = make_spec(raw_cli, d / "out", args.size, compute={"workers": args.workers, "inline_below": 0})
        row = {"rep": rep}
        for mode in ("plain", "steps"):
            s0 = server_cpu(server)
            base = run_child(mode, write_spec(spec, d / "spec.yaml"), prefect_env(home / f"{mode}-cli"))
            row |= {f"{mode}_child_wall_seconds": base["child_wall_seconds"], f"{mode}_build_seconds": base["build_seconds"],
                    f"{mode}_cpu_seconds": round(base["process_tree_cpu_seconds"] + server_cpu(server) - s0, 2)}
            shutil.rmtree(d / "out", ignore_errors=True)
        s0 = server_cpu(server)
        via_cli = cli_build(spec, d, api_url=url)
        row |= {"cli_wall_seconds": via_cli["wall_seconds"], "cli_phases_seconds": via_cli["phases_seconds"],
                "cli_cpu_seconds": round(via_cli["rss"]["cpu_seconds"] + server_cpu(server) - s0, 2),
                "cli_minus_plain_child_seconds": round(via_cli["wall_seconds"] - row["plain_child_wall_seconds"], 2),
                "cli_minus_steps_child_seconds": round(via_cli["wall_seconds"] - row["steps_child_wall_seconds"], 2)}
        cli_runs.append(row)
        log(f"CLI {via_cli['wall_seconds']} s vs plain calls {row['plain_child_wall_seconds']} s, the same steps "
            f"{row['steps_child_wall_seconds']} s ({len(list(raw_cli.glob('images/*')))} samples)")
        shutil.rmtree(d, ignore_errors=True)
    return {"samples": runs[0]["samples"], "flow_vs_plain": runs, "best_build_seconds": best,
            "flow_over_plain": ratio(best["flow"], best["plain"]),
            "flow_over_steps": ratio(best["flow"], best["steps"]),
            # build CPU (process tree after imports) + the server's CPU meanwhile, mean of the rounds
            "cpu_seconds": cpu, "flow_over_plain_cpu": ratio(cpu["flow"], cpu["plain"]),
            "flow_over_steps_cpu": ratio(cpu["flow"], cpu["steps"]),
            # each round's runs ran back to back: steadier than the best of each when the load moves
            "flow_over_plain_per_rep": per_rep("flow", "plain"), "flow_over_steps_per_rep": per_rep("flow", "steps"),
            "cli": cli_runs,
            "cli_overhead_seconds": min(r["cli_minus_plain_child_seconds"] for r in cli_runs),
            "cli_overhead_over_steps_seconds": min(r["cli_minus_steps_child_seconds"] for r in cli_runs),
            "cli_cpu_overhead_seconds": min(round(r["cli_cpu_seconds"] - r["plain_cpu_seconds"], 2) for r in cli_runs)}


# ---- the single writer ---------------------------------------------------------------------------

def writer_ceiling(args, raw: Path, pairs: list, work: Path) -> dict:
    """CPU per sample of each stage in one process, and the writer alone fed pre-compressed chunks."""
    from benchmarks.build import decode_pairs
    from h5forge.format.chunk_codec import EncodedRows
    from h5forge.ingest.clean import clean_batch, encode_rows
    from h5forge.ingest.discover import discover
    from h5forge.ingest.incremental.inputs import fingerprint
    from h5forge.ingest.writer import DatasetWriter
    from h5forge.kinds import stored_kinds
    from h5forge.store.verify import verify_file
    spec = make_spec(raw, work / "writer-out", args.size)
    inventory = discover(spec)
    inventory.samples = inventory.samples[:args.writer_n]
    refs, bs, kinds = inventory.samples, spec.compute.batch_size, stored_kinds(spec)
    inputs = fingerprint(spec, inventory)  # the build hashes the raw files before writing (not timed here)
    n, cpu = len(refs), time.process_time
    decode_pairs(pairs[:10])
    c0 = cpu()
    plain = [clean_batch(spec, raw, refs[i:i + bs], encode=False) for i in range(0, n, bs)]
    t = {"clean_batch_without_encode": cpu() - c0}
    c0 = cpu()
    encoded = [dataclasses.replace(b, arrays=encode_rows(spec, kinds, b.arrays)) for b in plain]
    t["encode_in_worker"] = cpu() - c0
    assert all(isinstance(b.arrays["images"], EncodedRows) for b in encoded), "codec not encodable in workers"
    c0, blobs = cpu(), [pickle.dumps(b, protocol=5) for b in encoded]
    t["ship_pickle_dumps"], c0 = cpu() - c0, cpu()
    received = [pickle.loads(b) for b in blobs]
    t["ship_pickle_loads"] = cpu() - c0
    t["bound_decode"] = decode_pairs(pairs[:n])[0]

    def write(batches, path: Path) -> tuple[float, float]:
        for _ in range(2):  # the first pass pays first-write costs (allocator, HDF5 caches)
            path.unlink(missing_ok=True)
            t0, c0 = time.perf_counter(), cpu()
            with DatasetWriter(path, spec, version=1, inputs=inputs) as w:
                for b in batches:
                    w.add(b)
                w.finish()
            wall, used = time.perf_counter() - t0, cpu() - c0
        return wall, used

    half = len(received) // 2
    _, half_cpu = write(received[:half], work / "chunks.h5")
    half_n = sum(len(b) for b in received[:half])
    wall_pre, t["writer_from_chunks"] = write(received, work / "chunks.h5")
    wall_compress, t["writer_compressing"] = write(plain, work / "plain.h5")
    c0 = cpu()
    report = verify_file(work / "chunks.h5")
    t["verify"] = cpu() - c0
    assert report.ok, report.errors
    ms = {k: round(1000 * v / n, 3) for k, v in t.items()}
    worker_ms = ms["clean_batch_without_encode"] + ms["encode_in_worker"] + ms["ship_pickle_dumps"]
    # per sample at scale: the second half's cost (the file's creation and summaries are paid once)
    marginal = round(1000 * (t["writer_from_chunks"] - half_cpu) / max(1, n - half_n), 3)
    writer_ms = marginal + ms["ship_pickle_loads"]
    projection = {}
    for w in (2, 8, 32, 64, 128):
        workers_rate, writer_rate = 1000 * w / worker_ms, 1000 / writer_ms
        projection[f"{w} workers"] = {"workers_samples_per_s": round(workers_rate), "writer_samples_per_s": round(writer_rate),
                                      "samples_per_s": round(min(workers_rate, writer_rate)),
                                      "limit": "writer" if writer_rate < workers_rate else "workers"}
    return {"samples": n, "cpu_ms_per_sample": ms,
            "bytes_shipped_per_sample": {"chunks": round(sum(map(len, blobs)) / n),
                                         "arrays": round(sum(len(pickle.dumps(b, protocol=5)) for b in plain) / n)},
            "writer_ingest_from_chunks": {"wall_seconds": round(wall_pre, 3), "samples_per_second": round(n / wall_pre, 1),
                                          "cpu_ms_per_sample": ms["writer_from_chunks"],
                                          "marginal_cpu_ms_per_sample": marginal,
                                          "fixed_cpu_seconds": round(t["writer_from_chunks"] - marginal * n / 1000, 3)},
            "writer_compressing": {"wall_seconds": round(wall_compress, 3), "samples_per_second": round(n / wall_compress, 1),
                                   "cpu_ms_per_sample": ms["writer_compressing"]},
            "per_sample_model": {"worker_ms": round(worker_ms, 3), "writer_ms": round(writer_ms, 3),
                                 "writer_share_of_worker": ratio(writer_ms, worker_ms),
                                 "writer_ms_is": "marginal writer CPU from chunks + pickle loads"},
            "projection": projection}


def main() -> None:
    if "--peer" in sys.argv:
        return peer_child(sys.argv[sys.argv.index("--peer") + 1], Path(sys.argv[sys.argv.index("--job") + 1]))
    args = cli(__doc__, dict(n=64, size=64, prefect_n=64, cli_n=64, writer_n=64, profile_n=32, reps=1, prefect_reps=1),
               n=10_000, size=224, workers=2, prefect_n=10_000, cli_n=600, writer_n=1000, profile_n=300, reps=1,
               prefect_reps=1, only="")
    from benchmarks.orchestration import ephemeral_start, start_prefect_server, stop
    py = ensure_peers(install=not args.smoke)
    work = Path(tempfile.mkdtemp(prefix="peers-", dir=CACHE))
    result: dict = {"machine": machine(), "args": vars(args), "loadavg_start": loadavg(), "ratios": {}}
    parts = args.only.split(",") if args.only else ["peers", "prefect", "writer"]
    try:
        raw = raw_folder(args.n, args.size)
        warm([raw])
        from h5forge.ingest.discover import discover
        refs = discover(make_spec(raw, work / "x", args.size)).samples
        pairs = [(str(raw / r.files["images"]), str(raw / r.files["masks"])) for r in refs]
        if "writer" in parts:
            result["writer"] = w = writer_ceiling(args, raw, pairs, work)
            # where the workers' CPU goes, per function of clean_batch (cProfile; build.py's profile)
            from benchmarks.build import profile_clean
            k = args.profile_n
            prof = profile_clean(make_spec(raw, work / "profile-out", args.size), refs[:k], pairs[:k], work)
            result["clean_profile"] = {key: prof[key] for key in ("samples", "cpu_ms_per_sample",
                                                                   "stages_cumulative_ms_per_sample_profiled")}
            result["ratios"] |= {"writer CPU ms/sample, chunks from the workers": w["writer_ingest_from_chunks"]["cpu_ms_per_sample"],
                                 "writer marginal CPU ms/sample, chunks": w["writer_ingest_from_chunks"]["marginal_cpu_ms_per_sample"],
                                 "writer CPU ms/sample, compressing itself": w["writer_compressing"]["cpu_ms_per_sample"],
                                 "writer ingest samples/s from chunks": w["writer_ingest_from_chunks"]["samples_per_second"]}
        if {"peers", "prefect"} & set(parts):
            url, server, started = start_prefect_server(home := work / "prefect-home")
            result["prefect_server_start_to_healthy_seconds"] = round(started, 2)
            try:
                if "peers" in parts:
                    result["peers"] = p = side_by_side(args, raw, pairs, work, url, py)
                    result["ratios"]["h5forge CLI / fastest peer (wall)"] = p.get("h5forge_wall_over_fastest_peer")
                    result["ratios"]["h5forge CLI / decode bound (speed)"] = p["table_best_of_reps"]["h5forge"]["vs_decode_bound_wall"]
                if "prefect" in parts:
                    result["prefect"] = c = prefect_cost(args, raw_folder(args.prefect_n, args.size),
                                                         raw_folder(args.cli_n, args.size), work, url, home, server)
                    result["ratios"] |= {"flow / plain calls": c["flow_over_plain"],
                                         "flow / the same steps as plain calls": c["flow_over_steps"],
                                         "CLI overhead beyond plain calls s": c["cli_overhead_seconds"],
                                         "CLI overhead beyond the same steps s": c["cli_overhead_over_steps_seconds"],
                                         "flow / plain calls, CPU": c["flow_over_plain_cpu"],
                                         "flow / the same steps, CPU": c["flow_over_steps_cpu"],
                                         "CLI CPU beyond plain calls s": c["cli_cpu_overhead_seconds"]}
            finally:
                stop([server])
            result["ephemeral"] = e = ephemeral_start(work)
            result["ratios"]["ephemeral server start s"] = e["ephemeral_server_start_seconds"]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    # a partial run (--only prefect) writes build_peers_prefect.*, never over the whole run's results
    save("build_peers" + (f"_{args.only.replace(',', '_')}" if args.only else ""), result | {"loadavg_end": loadavg()},
         args.smoke)


if __name__ == "__main__":
    main()
