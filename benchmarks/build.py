"""Build benchmark: throughput vs the Pillow-decode bound, peak RSS vs N, codecs, CPU per stage.

    python -m benchmarks.build [--smoke] [--n 10000 --n-large 50000 --codec-n 2000 --reps 2]

What is measured and how: benchmarks/README.md, section "build".
"""

import datetime as dt
import json
import multiprocessing as mp
import os
import pickle
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.common import (CACHE, clean_in_process, cli, cpu_pressure, get, loadavg, log, machine, make_spec,
                               prefect_env, profiled, random_read_latency, ratio, raw_folder, sampled, save, timed, warm,
                               write_file, write_spec)


def decode_pairs(pairs: list[tuple[str, str]]) -> tuple[float, float]:
    """The bound's work: decode image + mask with Pillow into numpy. Returns (CPU s, wall s)."""
    from PIL import Image
    t0, c0 = time.perf_counter(), time.process_time()
    for pair in pairs:
        for path in pair:
            with Image.open(path) as im:
                np.asarray(im)
    return time.process_time() - c0, time.perf_counter() - t0


def decode_bound(pairs: list[tuple[str, str]], workers: int) -> dict:
    with mp.get_context("fork").Pool(workers) as pool:
        pool.map(abs, range(workers * 4))  # processes up and imported before the clock starts
        t0 = time.perf_counter()
        res = pool.map(decode_pairs, [pairs[i::workers] for i in range(workers)], chunksize=1)
        wall = time.perf_counter() - t0
    cpu = sum(r[0] for r in res)
    return {"samples": len(pairs), "workers": workers, "wall_seconds": round(wall, 3),
            "per_worker_seconds": [round(r[1], 3) for r in res], "samples_per_second": round(len(pairs) / wall, 1),
            "cpu_seconds": round(cpu, 2), "cpu_ms_per_sample": round(1000 * cpu / len(pairs), 3)}


def build_once(spec) -> dict:
    """discover, stage, then write_version measured; the candidate is discarded."""
    from h5forge.ingest.build import write_version
    from h5forge.ingest.discover import discover
    from h5forge.ingest.writer import DatasetWriter
    from h5forge.store.versions import stage
    shutil.rmtree(spec.output.dir, ignore_errors=True)
    t0, inventory = time.perf_counter(), discover(spec)
    t_discover, candidate, load = time.perf_counter() - t0, stage(spec.output.dir), loadavg()
    with sampled() as rss, timed(DatasetWriter, "add", "finish") as busy:
        t0 = time.perf_counter()
        summary = write_version(spec, inventory, candidate)
        wall = time.perf_counter() - t0
    tm, n = get(summary, "timings"), get(summary, "samples")
    build_s, size = wall - tm.get("cluster_start_seconds", 0.0), candidate.partial.stat().st_size
    candidate.discard()
    return {"samples": n, "rejected": get(summary, "rejected"), "workers": spec.compute.workers,
            "discover_seconds": round(t_discover, 3), "cleaned_in": tm.get("cleaned_in"),
            "cluster_start_seconds": tm.get("cluster_start_seconds", 0.0), "clean_write_seconds": tm["clean_write_seconds"],
            "write_version_wall_seconds": round(wall, 3), "build_seconds": round(build_s, 3),
            "samples_per_second": round(n / build_s, 1), "clean_write_samples_per_second": round(n / tm["clean_write_seconds"], 1),
            "writer_busy_seconds": {k: round(v, 3) for k, v in busy.items()},
            "compression_ratio": get(summary, "compression_ratio"), "file_bytes": size,
            "cpu_ms_per_sample": round(1000 * rss["cpu_seconds"] / n, 3), "rss": rss,
            "loadavg_before": load, "loadavg_after": loadavg(), "cpu_pressure_after": cpu_pressure()}


PHASES = {"cli_imports": r"Starting temporary server", "prefect_server_start": r"Beginning flow run",
          "discover_stage_and_task_start": r"Task run 'clean-and-write[^']*' - cleaning",
          "clean_and_write_task": r"Task run 'clean-and-write[^']*' - Finished",
          "verify": r"Task run 'verify[^']*' - Finished", "report_publish_retention": r"Flow run '[^']*' - Finished"}


def cli_build(spec, work: Path, api_url: str | None = None) -> dict:
    """`h5forge build SPEC --output DIR` in a child process with a fresh Prefect home; ``api_url``: a
    running Prefect server's API (None: the CLI starts an ephemeral one)."""
    import h5py
    cmd = [str(Path(sys.executable).parent / "h5forge"), "build", str(write_spec(spec, work / "cli-spec.yaml")),
           "--output", str(spec.output.dir)]
    started, t0, load = time.time(), time.perf_counter(), loadavg()
    env = prefect_env(Path(tempfile.mkdtemp(prefix="prefect-", dir=work)), **({"PREFECT_API_URL": api_url} if api_url else {}))
    proc = subprocess.Popen(cmd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    with sampled(proc.pid) as rss:
        output, wall = proc.communicate()[0], time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"h5forge build failed ({proc.returncode}):\n{output[-3000:]}")
    with h5py.File(os.path.realpath(spec.output.dir / "dataset_latest.h5"), "r") as f:
        summary = json.loads(f["diagnostics"].attrs["summary"])
    marks, day = {"start": started}, dt.datetime.fromtimestamp(started).date()
    for line in output.splitlines():
        if m := re.match(r"(\d\d):(\d\d):(\d\d\.\d+) \|", line):
            stamp = dt.datetime.combine(day, dt.time(int(m[1]), int(m[2]))).timestamp() + float(m[3])
            marks |= {k: stamp for k, pat in PHASES.items() if k not in marks and re.search(pat, line)}
    marks["server_stop_and_exit"] = started + wall
    order, n, tm = sorted(marks, key=marks.get), summary["samples"], summary["timings"]
    return {"samples": n, "wall_seconds": round(wall, 2), "samples_per_second": round(n / wall, 1),
            "cluster_start_seconds": tm.get("cluster_start_seconds"), "clean_write_seconds": tm["clean_write_seconds"],
            "rest_seconds": round(wall - tm["clean_write_seconds"] - tm.get("cluster_start_seconds", 0), 2),
            "phases_seconds": {b: round(marks[b] - marks[a], 2) for a, b in zip(order, order[1:])},
            "rss": rss, "loadavg_before": load, "loadavg_after": loadavg()}


def codec_run(spec, batches, path: Path, reads: int, **storage) -> dict:
    import h5py
    spec = spec.model_copy(update={"storage": spec.storage.model_copy(update=storage)})
    t0, c0 = time.perf_counter(), time.process_time()
    summary = write_file(path, spec, batches)
    write_s, write_cpu = time.perf_counter() - t0, time.process_time() - c0
    n, raw, stored = get(summary, "samples"), get(summary, "array_bytes_raw"), get(summary, "array_bytes_stored")
    out = {**storage, "samples": n, "raw_array_bytes": raw, "stored_array_bytes": stored,
           "file_bytes": path.stat().st_size, "ratio": round(stored / raw, 4)}
    with h5py.File(path, "r") as f:
        for name in spec.fields:
            sizes = [(f[s][name].size, f[s][name].id.get_storage_size()) for s in ("train", "val", "test")]
            out[f"ratio_{name}"] = round(sum(b for _, b in sizes) / sum(a for a, _ in sizes), 4)
        im, ma = f["train"]["images"], f["train"]["masks"]
        lat = random_read_latency(lambda i: (im[i], ma[i]), im.shape[0], reads, 0)
        t = time.perf_counter()
        for s in range(0, im.shape[0], 64):
            im[s:s + 64], ma[s:s + 64]
        scan = im.shape[0] / (time.perf_counter() - t)
    path.unlink()
    return out | {"write_seconds": round(write_s, 3), "write_ms_per_sample": round(1000 * write_s / n, 3),
                  "write_mb_per_second": round(raw / write_s / 1e6, 1), "write_cpu_ms_per_sample": round(1000 * write_cpu / n, 3),
                  "read_p50_ms": round(lat["p50_us"] / 1000, 3), "read_p99_ms": round(lat["p99_us"] / 1000, 3),
                  "scan_samples_per_second": round(scan, 1)}


def codec_table(spec, refs, reads: int, work: Path) -> dict:
    from h5forge.format.codecs import CODECS
    t0, batches = time.perf_counter(), clean_in_process(spec, refs)
    clean_s = time.perf_counter() - t0
    codec_run(spec, batches, work / "codec.h5", 20, codec="none")  # first-write costs off the table
    rows = {c: codec_run(spec, batches, work / "codec.h5", reads, codec=c, chunk_rows=1) for c in CODECS}
    default = spec.storage.codec
    rows |= {f"{default} chunk_rows {k}": codec_run(spec, batches, work / "codec.h5", reads, codec=default, chunk_rows=k)
             for k in (1, 8)}
    for k, r in rows.items():
        log(f"  {k:22s} ratio {r['ratio']:.3f} write CPU {r['write_cpu_ms_per_sample']} ms/sample, p50 {r['read_p50_ms']} ms")
    png = sum((spec.source.root / p).stat().st_size for b in batches for files in b.files for p in files)
    return {"samples": len(refs), "clean_seconds_single_process": round(clean_s, 2), "png_bytes": png, "reads": reads,
            "codecs": rows}


def profile_clean(spec, refs, pairs, work: Path) -> dict:
    """CPU per sample, one process: clean_batch (the library's), pickle round trip, writer, bound."""
    decode_pairs(pairs[:20])  # warm imports
    cpu, t = time.process_time, {}
    c0, out = cpu(), clean_in_process(spec, refs)
    t["clean_batch"], c0 = cpu() - c0, cpu()
    _, stats, top = profiled(clean_in_process, spec, refs, top=20)
    t["clean_batch_profiled"], t["bound_decode"] = cpu() - c0, decode_pairs(pairs)[0]
    c0, blobs = cpu(), [pickle.dumps(b, protocol=5) for b in out]
    t["ship_pickle_dumps"], c0 = cpu() - c0, cpu()
    for blob in blobs:
        pickle.loads(blob)
    t["ship_pickle_loads"], c0 = cpu() - c0, cpu()
    write_file(work / "profile.h5", spec, out)
    t["writer"] = cpu() - c0
    ms = lambda s: round(1000 * s / len(refs), 3)  # noqa: E731
    stages = {f"{Path(file).name}:{fn}": ms(ct) for (file, _, fn), (_, _, _, ct, _) in stats.stats.items()
              if "h5forge" in file or re.search("read_bytes|sha256|hexdigest|ImagingDecoder|ascontiguous", fn)}
    ship = t["ship_pickle_dumps"] + t["ship_pickle_loads"]
    return {"samples": len(refs), "cpu_ms_per_sample": {k: ms(v) for k, v in t.items()},
            "result_bytes_per_sample": round(sum(map(len, blobs)) / len(refs)),
            "clean_over_bound": ratio(t["clean_batch"], t["bound_decode"]), "cpu_model_workers": spec.compute.workers,
            "cpu_model_ratio": ratio(t["bound_decode"], t["clean_batch"] + ship + t["writer"]),
            "stages_cumulative_ms_per_sample_profiled": dict(sorted(stages.items(), key=lambda x: -x[1])),
            "cprofile_top": top}


def main() -> None:
    from h5forge.ingest.discover import discover
    args = cli(__doc__, dict(n=200, n_large=400, codec_n=64, profile_n=64, reads=50, reps=1, size=64),
               n=10_000, n_large=50_000, codec_n=2_000, profile_n=1_000, reads=500, reps=2, size=224, no_cli=False)
    work = Path(tempfile.mkdtemp(prefix="build-", dir=CACHE))
    spec_for = lambda raw, out: make_spec(raw, work / out, args.size, compute={"inline_below": 0})  # noqa: E731
    result: dict = {"machine": machine(), "args": vars(args), "ratios": {}}
    try:
        warm([raw := raw_folder(args.n, args.size)])
        spec = spec_for(raw, "out")
        refs = discover(spec).samples
        pairs = [tuple(str(raw / r.files[k]) for k in ("images", "masks")) for r in refs]
        reps = []
        for i in range(args.reps):
            bound, build = decode_bound(pairs, spec.compute.workers), build_once(spec)
            reps.append({"bound": bound, "build": build,
                         "ratio": ratio(build["samples_per_second"], bound["samples_per_second"], 4),
                         "cpu_ratio": ratio(bound["cpu_ms_per_sample"], build["cpu_ms_per_sample"], 4),
                         "ratio_clean_write_only": ratio(build["clean_write_samples_per_second"], bound["samples_per_second"], 4)})
            log(f"rep {i + 1}: bound {bound['samples_per_second']}/s, build {build['samples_per_second']}/s, "
                f"ratio {reps[-1]['ratio']}, CPU ratio {reps[-1]['cpu_ratio']}")
        bound_med = statistics.median(r["bound"]["samples_per_second"] for r in reps)
        result["ratios"] |= {"build/bound wall, median": round(statistics.median(r["ratio"] for r in reps), 4),
                             "build/bound wall, best": max(r["ratio"] for r in reps),
                             "build/bound CPU, median": round(statistics.median(r["cpu_ratio"] for r in reps), 4)}
        result["throughput"] = {"samples": len(pairs), "workers": spec.compute.workers, "codec": spec.storage.codec,
                                "chunk_rows": spec.storage.chunk_rows, "bound_median": bound_med, "reps": reps}
        if not args.no_cli:
            result["cli"] = cli_build(spec_for(raw, "cli-out"), work)
            result["ratios"]["CLI end to end / bound"] = ratio(result["cli"]["samples_per_second"], bound_med)
        if args.n_large:
            warm([raw_large := raw_folder(args.n_large, args.size)])
            small = min((r["build"] for r in reps), key=lambda b: b["rss"]["peak_sum_mib"])
            result["rss"] = {"small": small, "large": (large := build_once(spec_for(raw_large, "out-large")))}
            result["ratios"] |= {f"RSS large/small, {k}": ratio(large["rss"][f"peak_{k}_mib"], small["rss"][f"peak_{k}_mib"])
                                 for k in ("sum", "main", "child")}
        if args.codec_n:
            result["codecs"] = codec_table(spec, refs[:args.codec_n], args.reads, work)
        if args.profile_n:
            result["profile"] = profile_clean(spec, refs[:args.profile_n], pairs[:args.profile_n], work)
            result["ratios"]["CPU model build/bound"] = result["profile"]["cpu_model_ratio"]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    save("build", result | {"cpu_pressure_end": cpu_pressure()}, args.smoke)


if __name__ == "__main__":
    main()
