"""The build against its peers (webdataset's and mosaic-streaming's writers, Pillow's decode alone),
Prefect's cost, and the build's scaling in workers and samples. Method: benchmarks/README.md,
"build_peers"; the peers' venv (build/bench-peers) is made by this command.
"""

import importlib
import importlib.util
import json
import multiprocessing as mp
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.common import BIN, CACHE, REPO, child_json, cli, figures, folder_bytes, interleaved, loadavg, log
from benchmarks.common import make_spec, med, own_cpu, parts, peers_venv, prefect_env, ratio, raw_folder, rounds
from benchmarks.common import run_sampled, sampled, save, small_pictures, start_prefect_server, stop, tree_cpu, warm
from benchmarks.common import write_spec

PEERS_VENV = REPO / "build" / "bench-peers"
# the writers only, without their dependencies: mosaic-streaming's package __init__ pulls in
# torchvision and transformers for its dataset classes, which MDSWriter does not use; torch, numpy,
# Pillow and PyYAML come from the project's venv through a .pth file
PEERS_NO_DEPS = ["mosaicml-streaming==0.13.0", "webdataset==1.0.2"]
PEERS_DEPS = "braceexpand==0.1.7 brotli==1.2.1 python-snappy==0.7.3 tqdm==4.70.1 xxhash>=3,<4 zstd==1.5.7.2".split()
PEERS = ("mosaic", "webdataset")
PARTS = ("peers", "prefect", "scaling", "batch")
RATIOS = {  # the figures each part leads its results with, and where in them each one is
    "clean+write, 2 workers / 1": "scaling.two_over_one_worker",
    "peak RSS, n-large / n": "scaling.rss_large_over_small",
    "CPU per sample, {picked} samples a task / 64": "batch.cpu_picked_over_64",
    "h5forge CLI / fastest peer (wall)": "peers.h5forge_wall_over_fastest_peer",
    "h5forge CLI / decode bound (speed)": "peers.table_best_of_reps.h5forge.vs_decode_bound_wall",
    "flow / h5forge.build": "prefect.flow_over_plain",
    "flow / h5forge.build, CPU": "prefect.flow_over_plain_cpu",
    "CLI overhead beyond h5forge.build s": "prefect.cli_overhead_seconds",
}


def decode_pairs(pairs: list[tuple[str, str]]) -> float:
    """The bound's work: decode image + mask with Pillow into numpy. Returns its CPU seconds."""
    from PIL import Image

    c0 = time.process_time()
    for path in (p for pair in pairs for p in pair):
        with Image.open(path) as im:
            np.asarray(im)
    return time.process_time() - c0


def decode_bound(pairs: list[tuple[str, str]], workers: int) -> dict:
    with mp.get_context("fork").Pool(workers) as pool:
        pool.map(abs, range(workers * 4))  # processes up and imported before the clock starts
        t0 = time.perf_counter()
        res = pool.map(decode_pairs, [pairs[i::workers] for i in range(workers)], chunksize=1)
        wall = time.perf_counter() - t0
    return {
        "wall_seconds": round(wall, 3),
        "samples_per_second": round(len(pairs) / wall, 1),
        "cpu_ms_per_sample": round(1000 * sum(res) / len(pairs), 3),
    }


def fit(path: str, size: int, mode: str | None) -> np.ndarray:
    """Decode a picture and centre-crop or pad it to size x size (one Pillow crop does both)."""
    from PIL import Image

    with Image.open(path) as im:
        im = im.convert(mode) if mode else im
        left, top = (im.width - size) // 2, (im.height - size) // 2
        return np.asarray(im.crop((left, top, left + size, top + size)))


def convert_part(peer: str, pairs: list[tuple[str, str, str]], out: str, size: int) -> None:
    """One process's share: decode + fit each image/mask pair and write it with the peer's writer."""
    if peer == "mosaic":
        from streaming.base.format.mds.writer import MDSWriter

        columns = {"image": f"ndarray:uint8:{size},{size},3", "mask": f"ndarray:uint8:{size},{size}"}
        writer = MDSWriter(out=out, columns=columns)
        put = lambda key, img, mask: writer.write({"image": img, "mask": mask})  # noqa: E731
    else:
        import webdataset as wds

        os.makedirs(out, exist_ok=True)
        writer = wds.ShardWriter(os.path.join(out, "shard-%06d.tar"), maxcount=1000, verbose=0)
        put = lambda key, img, mask: writer.write({"__key__": key, "image.npy": img, "mask.npy": mask})  # noqa: E731
    for key, image, mask in pairs:
        put(key, fit(image, size, "RGB"), fit(mask, size, None))
    writer.finish() if peer == "mosaic" else writer.close()


def peer_child(peer: str, job: str) -> None:
    """In the peers' venv: the conversion in ``workers`` fork processes."""
    spec = json.loads(Path(job).read_text())
    pairs, workers = spec["pairs"], spec["workers"]
    if peer == "mosaic":  # register the packages without their __init__ (see PEERS_NO_DEPS)
        import types

        for name in ("streaming", "streaming.base"):
            found, module = importlib.util.find_spec(name), types.ModuleType(name)
            module.__path__, module.__spec__ = list(found.submodule_search_locations), found
            sys.modules[name] = module
    importlib.import_module("streaming.base.format.mds.writer" if peer == "mosaic" else "webdataset")
    with mp.get_context("fork").Pool(workers) as pool:
        pool.starmap(
            convert_part,
            [(peer, pairs[i::workers], f"{spec['out']}/part{i}", spec["size"]) for i in range(workers)],
            chunksize=1,
        )


def command_speed(cmd: list, n: int, out: Path, pattern: str, **popen) -> dict:
    """A command writing ``n`` samples into ``out`` (emptied before and after): wall, samples/s, the CPU of its
    process tree (interpreter start and imports included), and the bytes of the files ``pattern`` names."""
    shutil.rmtree(out, ignore_errors=True)
    wall, cpu = run_sampled(cmd, **popen)
    size = folder_bytes(out, pattern)
    shutil.rmtree(out, ignore_errors=True)
    return {
        "wall_seconds": round(wall, 2),
        "samples_per_second": round(n / wall, 1),
        "cpu_seconds": cpu,
        "cpu_ms_per_sample": round(1000 * cpu / n, 3),
        "output_bytes": size,
    }


def run_peer(py: Path, peer: str, pairs: list, work: Path, workers: int, size: int) -> dict:
    """The conversion command in the peers' venv."""
    out, job = work / f"peer-{peer}", work / f"job-{peer}.json"
    job.write_text(json.dumps({"pairs": pairs, "workers": workers, "size": size, "out": str(out)}))
    cmd = [str(py), "-m", "benchmarks.build_peers", "--child", "peer_child", peer, str(job)]
    res = command_speed(cmd, len(pairs), out, "*", cwd=REPO)
    return {k: v for k, v in res.items() if k != "cpu_seconds"}


def cli_build(spec, work: Path, api_url: str) -> dict:
    """`h5forge build SPEC --output DIR` against the server at ``api_url``, a fresh PREFECT_HOME."""
    out, n = Path(spec.output.dir), len(list(Path(spec.source.root).glob("images/*")))
    cmd = [str(BIN / "h5forge"), "build", str(write_spec(spec, work / "cli-spec.yaml")), "--output", str(out)]
    env = prefect_env(Path(tempfile.mkdtemp(prefix="prefect-", dir=work)), PREFECT_API_URL=api_url)
    return command_speed(cmd, n, out, "dataset_v*.h5", env=env)


def peers_part(args, raw: Path, pairs: list, work: Path, url: str, py: Path | None) -> dict:
    from h5forge._init.sections import chunk_rows
    from h5forge.kinds import sample_bytes

    spec = make_spec(raw, work / "h5forge-out", args.size, args.workers)
    # the samples per chunk `h5forge init` writes for pictures of this size (1 at 224², 16 at 32²)
    spec = spec.model_copy(
        update={"storage": spec.storage.model_copy(update={"chunk_rows": chunk_rows(sample_bytes(spec))})}
    )
    keyed = [(Path(i).stem, i, m) for i, m in pairs]
    run = {
        "bound": lambda: decode_bound(pairs, args.workers),
        "h5forge": lambda: cli_build(spec, work, url),
        **{p: lambda p=p: run_peer(py, p, keyed, work, args.workers, args.size) for p in (PEERS if py else ())},
    }
    rows = rounds(run, args.reps, lambda tool, rep: run[tool]() | {"rep": rep, "loadavg_after": loadavg()[0]})
    best = {tool: max(rs, key=lambda r: r["samples_per_second"]) for tool, rs in rows.items()}
    table = {
        tool: {
            "wall_seconds": r["wall_seconds"],
            "samples_per_second": r["samples_per_second"],
            "cpu_ms_per_sample": r["cpu_ms_per_sample"],
            "vs_decode_bound_wall": ratio(r["samples_per_second"], best["bound"]["samples_per_second"]),
            "vs_decode_bound_cpu": ratio(best["bound"]["cpu_ms_per_sample"], r["cpu_ms_per_sample"]),
        }
        for tool, r in best.items()
    }
    out = {"samples": len(pairs), "workers": args.workers, "size": args.size, "table_best_of_reps": table, "runs": rows}
    if py:
        fastest = min(PEERS, key=lambda t: best[t]["wall_seconds"])
        out |= {
            "fastest_peer": fastest,
            "h5forge_wall_over_fastest_peer": ratio(best["h5forge"]["wall_seconds"], best[fastest]["wall_seconds"]),
        }
    else:
        out["peers_skipped"] = f"no peer venv at {PEERS_VENV} (run without --smoke to install it)"
    return out


def build_child(mode: str, spec_path: str) -> dict:
    """One build in this fresh interpreter, ``h5forge.build`` or the build-dataset flow, after the imports."""
    t0 = time.perf_counter()
    if mode == "flow":
        from h5forge.flows.build import build_dataset as run
    else:
        from h5forge._pipeline import build as run
    out = {"import_seconds": round(time.perf_counter() - t0, 2)}
    t0, c0 = time.perf_counter(), own_cpu()
    res = run(spec_path)
    return out | {
        "build_seconds": round(time.perf_counter() - t0, 2),
        "build_cpu_seconds": round(own_cpu() - c0, 2),
        "samples": sum(res.counts.values()),
        "clean_write_seconds": res.timings["clean_write_seconds"],
    }


def run_child(mode: str, spec: Path, env: dict) -> dict:
    t0 = time.perf_counter()
    res = child_json("build_peers", "--child", "build_child", mode, spec, env=env)
    return res | {"child_wall_seconds": round(time.perf_counter() - t0, 2)}


def prefect_part(args, work: Path, url: str, home: Path, server) -> dict:
    raw, runs = raw_folder(args.prefect_n, args.size), []
    for rep, mode in interleaved(["plain", "flow", "cli"], args.prefect_reps):
        d, s0 = work / f"prefect-{rep}-{mode}", tree_cpu(server.pid)
        spec = make_spec(raw, d / "out", args.size, args.workers)
        if mode == "cli":
            res = cli_build(spec, d, url)
        else:
            env = prefect_env(home / f"{mode}-client", PREFECT_API_URL=url)
            res = run_child(mode, write_spec(spec, d / "spec.yaml"), env)
        runs.append(res | {"rep": rep, "mode": mode, "server_cpu_seconds": round(tree_cpu(server.pid) - s0, 2)})
        log(f"rep {rep} {mode:5s} {res}")
        shutil.rmtree(d, ignore_errors=True)

    def of(mode: str, key: str) -> list:  # CPU: the child's and the server's meanwhile
        server = "server_cpu_seconds" if key == "build_cpu_seconds" else None
        return [r[key] + r.get(server, 0) for r in runs if r["mode"] == mode]

    return {
        "samples": args.prefect_n,
        "runs": runs,
        "flow_over_plain": ratio(min(of("flow", "build_seconds")), min(of("plain", "build_seconds"))),
        "flow_over_plain_per_rep": list(map(ratio, of("flow", "build_seconds"), of("plain", "build_seconds"))),
        "flow_over_plain_cpu": ratio(med(of("flow", "build_cpu_seconds")), med(of("plain", "build_cpu_seconds"))),
        # the CLI's whole process against h5forge.build's (interpreter start and imports in both)
        "cli_overhead_seconds": round(min(of("cli", "wall_seconds")) - min(of("plain", "child_wall_seconds")), 2),
    }


def scaling_part(args, work: Path) -> dict:
    """``h5forge.build`` in this process on 1 and 2 workers, and at --n-large: clean+write speed, peak RSS."""
    import h5forge

    configs = {
        "n_1worker": (args.n, 1),
        "n_2workers": (args.n, 2),
        **({"n_large_2workers": (args.n_large, 2)} if args.n_large else {}),
    }

    def build(name: str, rep: int) -> dict:
        n, workers = configs[name]
        spec = make_spec(raw_folder(n, args.size), work / "scale-out", args.size, workers)
        shutil.rmtree(work / "scale-out", ignore_errors=True)
        with sampled() as usage:
            res = h5forge.build(spec)
        return {"samples_per_s": round(n / res.timings["clean_write_seconds"], 1), **usage}

    runs = rounds(configs, args.reps, build)
    best = {
        k: {"samples_per_s": max(r["samples_per_s"] for r in v), "peak_rss_mib": min(r["peak_rss_mib"] for r in v)}
        for k, v in runs.items()
    }
    return {
        "best": best,
        "runs": runs,
        "two_over_one_worker": ratio(best["n_2workers"]["samples_per_s"], best["n_1worker"]["samples_per_s"]),
        "rss_large_over_small": ratio(
            best.get("n_large_2workers", {}).get("peak_rss_mib"), best["n_2workers"]["peak_rss_mib"]
        ),
    }


def batch_part(args, work: Path) -> dict:
    """``h5forge.build`` in this process on ``--workers`` workers, 64 samples a task (the former default)
    against the number the build picks (``batch_samples``): CPU per sample of the process tree, speed."""
    import h5forge
    from h5forge._ingest.parallel import batch_samples

    spec = make_spec(raw_folder(args.n, args.size), work / "batch-out", args.size, args.workers)
    picked = batch_samples(spec, args.n)

    def build(size: int, rep: int) -> dict:
        shutil.rmtree(work / "batch-out", ignore_errors=True)
        compute = spec.compute.model_copy(update={"batch_size": size})
        with sampled() as usage:
            res = h5forge.build(spec.model_copy(update={"compute": compute}))
        return {
            "cpu_ms_per_sample": round(1000 * usage["cpu_seconds"] / args.n, 3),
            "samples_per_s": round(args.n / res.timings["clean_write_seconds"], 1),
        }

    runs = rounds(dict.fromkeys([64, picked]), args.reps, build)
    cpu = {size: med(r["cpu_ms_per_sample"] for r in rs) for size, rs in runs.items()}
    return {
        "picked": picked,
        "runs": {str(k): v for k, v in runs.items()},
        "cpu_ms_per_sample_median": {str(k): v for k, v in cpu.items()},
        "cpu_picked_over_64": ratio(cpu[picked], cpu[64]),
    }


def main() -> None:
    args = cli(
        __doc__,
        dict(n=64, size=64, prefect_n=64, n_large=128, prefect_reps=1),
        n=10_000,
        size=224,
        workers=2,
        prefect_n=10_000,
        n_large=50_000,
        reps=1,
        prefect_reps=2,
        only=",".join(PARTS),
    )
    only = parts(args.only, PARTS)
    py = (
        peers_venv(PEERS_VENV, not args.smoke, ["--no-deps", *PEERS_NO_DEPS], PEERS_DEPS, pth=True)
        if "peers" in only
        else None
    )
    work = Path(tempfile.mkdtemp(prefix="peers-", dir=CACHE))
    result: dict = {}
    try:
        warm([raw := raw_folder(args.n, args.size)])
        pairs = sorted((str(p), str(raw / "masks" / p.name)) for p in (raw / "images").glob("*.png"))
        if "scaling" in only:
            result["scaling"] = scaling_part(args, work)
        if "batch" in only:
            result["batch"] = batch_part(args, work)
        if {"peers", "prefect"} & set(only):
            url, server, started = start_prefect_server(home := work / "prefect-home")
            result["prefect_server_start_to_healthy_seconds"] = round(started, 2)
            try:
                if "peers" in only:
                    result["peers"] = peers_part(args, raw, pairs, work, url, py)
                if "prefect" in only:
                    result["prefect"] = prefect_part(args, work, url, home, server)
            finally:
                stop(server)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    picked = result.get("batch", {}).get("picked")  # the batch size the build picked names its figure
    ratios = {k.format(picked=picked): v for k, v in figures(result, RATIOS).items()}
    # a partial run (--only prefect) writes build_peers_prefect.*, never over the whole run's results
    name = "build_peers" if set(only) == set(PARTS) else "build_peers_" + "_".join(only)
    save(name + small_pictures(args), {"ratios": ratios, **result})


if __name__ == "__main__":
    main()
