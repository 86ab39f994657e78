"""Build benchmark: throughput against the Pillow-decode bound, peak RSS vs N, codec table.

    .venv/bin/python benchmarks/build.py                      # full run (10k, 50k, 2k codec subset)
    .venv/bin/python benchmarks/build.py --n 2000 --n-large 4000 --codec-n 500 --reps 1  # quick

Writes benchmarks/results/build.json and build.md and prints the ratios against the goals:
  1. build throughput >= 0.8 x the bound (Pillow decoding the same PNGs, image+mask, path -> numpy,
     in as many plain processes as the build's dask workers, the file list split evenly);
  2. peak RSS of the build at --n-large / at --n <= 1.2;
  3. file size vs raw array bytes, write time and random-read p50 for every codec in CODECS,
     and chunk_rows 1 vs 8 for the default codec.
Generated raw folders are cached under /tmp/h5forge-bench (H5FORGE_BENCH_CACHE) between runs.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import multiprocessing as mp
import os
import pstats
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (CACHE, REPO, RESULTS, RSSSampler, cpu_pressure, dir_bytes, loadavg, machine,  # noqa: E402
                     raw_folder)

DEMO_SPEC = REPO / "config" / "demo.yaml"
THROUGHPUT_GOAL = 0.8
RSS_GOAL = 1.2


# ---- spec / inventory ------------------------------------------------------------------------

def make_spec(raw: Path, out: Path, **storage):
    from h5forge.spec import load_spec, override

    spec = load_spec(DEMO_SPEC)
    spec = spec.model_copy(update={"source": spec.source.model_copy(update={"root": raw})})
    if storage:
        spec = spec.model_copy(update={"storage": spec.storage.model_copy(update=storage)})
    return override(spec, output=out)


def pair_paths(raw: Path) -> list[tuple[str, str]]:
    images = sorted((raw / "images").glob("*.png"))
    return [(str(p), str(raw / "masks" / p.name)) for p in images]


def warm_page_cache(raw: Path) -> float:
    """Read every raw file once so the bound and the build both start from a warm page cache."""
    t0 = time.perf_counter()
    for p in raw.rglob("*"):
        if p.is_file():
            with open(p, "rb") as fh:
                while fh.read(1 << 20):
                    pass
    return time.perf_counter() - t0


# ---- the bound: Pillow decode in plain processes ---------------------------------------------

def _decode_pairs(pairs: list[tuple[str, str]]) -> tuple[int, float, float]:
    from PIL import Image

    t0 = time.perf_counter()
    pixels = 0
    c0 = time.process_time()
    for img_path, mask_path in pairs:
        with Image.open(img_path) as im:
            a = np.asarray(im)
        with Image.open(mask_path) as m:
            b = np.asarray(m)
        pixels += a.size + b.size
    return pixels, time.process_time() - c0, time.perf_counter() - t0


def _noop(_: int) -> int:
    return os.getpid()


def decode_bound(pairs: list[tuple[str, str]], workers: int) -> dict:
    """Wall time for ``workers`` fresh processes to decode every pair (pool start excluded)."""
    shards = [pairs[i::workers] for i in range(workers)]  # even split, sizes mixed alike
    with mp.get_context("fork").Pool(workers) as pool:
        pool.map(_noop, range(workers * 4))  # processes up and imported before the clock starts
        t0 = time.perf_counter()
        results = pool.map(_decode_pairs, shards, chunksize=1)
        wall = time.perf_counter() - t0
    return {
        "samples": len(pairs),
        "workers": workers,
        "wall_seconds": round(wall, 3),
        "per_worker_seconds": [round(r[2], 3) for r in results],
        "samples_per_second": round(len(pairs) / wall, 1),
        "cpu_seconds": round(sum(r[1] for r in results), 2),
        "cpu_ms_per_sample": round(1000 * sum(r[1] for r in results) / len(pairs), 3),
        "ms_per_pair_per_process": round(1000 * max(r[2] for r in results) / max(map(len, shards)), 3),
    }


# ---- the build: write_version (clean + write), cluster start reported apart ------------------

class WriterTimer:
    """Time spent inside DatasetWriter.add/finish in the calling process (the single writer)."""

    def __init__(self):
        self.add_seconds = 0.0
        self.finish_seconds = 0.0

    def __enter__(self):
        from h5forge import writer as w

        self._w = w
        self._add, self._finish = w.DatasetWriter.add, w.DatasetWriter.finish
        timer = self

        def add(self_, batch):
            t0 = time.perf_counter()
            try:
                return timer._add(self_, batch)
            finally:
                timer.add_seconds += time.perf_counter() - t0

        def finish(self_, timings=None):
            t0 = time.perf_counter()
            try:
                return timer._finish(self_, timings)
            finally:
                timer.finish_seconds += time.perf_counter() - t0

        w.DatasetWriter.add, w.DatasetWriter.finish = add, finish
        return self

    def __exit__(self, *exc):
        self._w.DatasetWriter.add, self._w.DatasetWriter.finish = self._add, self._finish


def build_once(raw: Path, out: Path, workers: int, **storage) -> dict:
    from h5forge.ingest.build import write_version
    from h5forge.ingest.discover import discover
    from h5forge.store.versions import stage

    if out.exists():
        shutil.rmtree(out)
    spec = make_spec(raw, out, **storage)
    spec = spec.model_copy(update={"compute": spec.compute.model_copy(update={"workers": workers})})
    t0 = time.perf_counter()
    inventory = discover(spec)
    t_discover = time.perf_counter() - t0
    candidate = stage(out)
    load_before = loadavg()
    with RSSSampler() as rss, WriterTimer() as wt:
        t0 = time.perf_counter()
        summary = write_version(spec, inventory, candidate)
        wall = time.perf_counter() - t0
    timings = summary["timings"]
    n = summary["samples"]
    size = candidate.partial.stat().st_size
    candidate.discard()
    return {
        "samples": n,
        "rejected": summary["rejected"],
        "workers": workers,
        "discover_seconds": round(t_discover, 3),
        "cleaned_in": timings.get("cleaned_in"),
        "cluster_start_seconds": timings.get("cluster_start_seconds", 0.0),
        "clean_write_seconds": timings["clean_write_seconds"],
        "write_version_wall_seconds": round(wall, 3),
        # the headline: everything write_version does except starting the cluster (so the writer's
        # finish and the cluster's shutdown count); clean_write alone is reported beside it
        "build_seconds": round(wall - timings.get("cluster_start_seconds", 0.0), 3),
        "samples_per_second": round(n / (wall - timings.get("cluster_start_seconds", 0.0)), 1),
        "clean_write_samples_per_second": round(n / timings["clean_write_seconds"], 1),
        "writer_add_seconds": round(wt.add_seconds, 3),
        "writer_finish_seconds": round(wt.finish_seconds, 3),
        "compression_ratio": summary["compression_ratio"],
        "file_bytes": size,
        "cpu_ms_per_sample": round(1000 * rss.result()["cpu_seconds"] / n, 3),
        "cpu_pressure_after": cpu_pressure(),
        "rss": rss.result(),
        "loadavg_before": load_before,
        "loadavg_after": loadavg(),
    }


# ---- the whole flow through the CLI ----------------------------------------------------------

def cli_build(raw: Path, out: Path) -> dict:
    import h5py
    import yaml

    if out.exists():
        shutil.rmtree(out)
    spec_data = yaml.safe_load(DEMO_SPEC.read_text())
    spec_data["source"]["root"] = str(raw)
    spec_data["output"]["dir"] = str(out)
    spec_file = CACHE / "bench-spec.yaml"
    spec_file.write_text(yaml.safe_dump(spec_data, sort_keys=False))
    env = dict(os.environ)
    # a Prefect home of our own: no lock contention with other engineers' ephemeral servers
    home = CACHE / "prefect-home"
    fresh_db = not (home / "prefect.db").exists()
    env["PREFECT_HOME"] = str(home)
    cmd = [str(REPO / ".venv" / "bin" / "h5forge"), "build", str(spec_file), "--output", str(out)]
    load_before = loadavg()
    started = time.time()
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    with RSSSampler(proc.pid, interval=0.1) as rss:
        output, _ = proc.communicate()
        wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"h5forge build failed ({proc.returncode}):\n{output[-3000:]}")
    latest = out / "dataset_latest.h5"
    with h5py.File(os.path.realpath(latest), "r") as f:
        summary = json.loads(f["diagnostics"].attrs["summary"])
    n = summary["samples"]
    timings = summary["timings"]
    result = {
        "command": " ".join(["h5forge", "build", "SPEC.yaml", "--output", "DIR"]),
        "prefect_db_fresh": fresh_db,
        "samples": n,
        "wall_seconds": round(wall, 2),
        "samples_per_second": round(n / wall, 1),
        "cluster_start_seconds": timings.get("cluster_start_seconds"),
        "clean_write_seconds": timings.get("clean_write_seconds"),
        "clean_write_samples_per_second": round(n / timings["clean_write_seconds"], 1),
        "rest_seconds": round(wall - timings["clean_write_seconds"] - timings["cluster_start_seconds"], 2),
        "phases_seconds": cli_phases(output, started, started + wall),
        "rss": rss.result(),
        "loadavg_before": load_before,
        "loadavg_after": loadavg(),
    }
    shutil.rmtree(out)
    return result


def cli_phases(output: str, started: float, ended: float) -> dict:
    """Split the CLI wall time by the timestamps of Prefect's log lines (HH:MM:SS.mmm)."""
    import datetime as dt
    import re

    day = dt.datetime.fromtimestamp(started).date()
    marks: dict[str, float] = {}
    patterns = {
        "server_starting": r"Starting temporary server",
        "flow_begins": r"Beginning flow run",
        "clean_write_begins": r"Task run 'clean-and-write[^']*' - cleaning",
        "clean_write_ends": r"Task run 'clean-and-write[^']*' - Finished",
        "verify_ends": r"Task run 'verify[^']*' - Finished",
        "flow_ends": r"Flow run '[^']*' - Finished",
    }
    for line in output.splitlines():
        m = re.match(r"(\d\d):(\d\d):(\d\d\.\d+) \|", line)
        if not m:
            continue
        stamp = dt.datetime.combine(day, dt.time(int(m[1]), int(m[2]))).timestamp() + float(m[3])
        for key, pat in patterns.items():
            if key not in marks and re.search(pat, line):
                marks[key] = stamp
    order = ["start"] + [k for k in patterns if k in marks] + ["exit"]
    marks["start"], marks["exit"] = started, ended
    names = {"server_starting": "cli_imports", "flow_begins": "prefect_server_start",
             "clean_write_begins": "discover_stage_and_task_start", "clean_write_ends": "clean_and_write_task",
             "verify_ends": "verify", "flow_ends": "report_publish_retention", "exit": "server_stop_and_exit"}
    return {names[b]: round(marks[b] - marks[a], 2) for a, b in zip(order, order[1:])}


# ---- codecs ----------------------------------------------------------------------------------

def clean_subset(raw: Path, n: int, batch_size: int = 64):
    """Clean the first ``n`` samples once, in this process; the codec runs only write them."""
    from h5forge.ingest.clean import clean_batch
    from h5forge.ingest.discover import discover

    spec = make_spec(raw, CACHE / "unused")
    inventory = discover(spec)
    refs = inventory.samples[:n]
    return spec, [clean_batch(spec, raw, refs[i : i + batch_size]) for i in range(0, len(refs), batch_size)]


def codec_run(spec, batches, codec: str, chunk_rows: int, path: Path, reads: int, seed: int = 0) -> dict:
    import h5py

    from h5forge.ingest.writer import DatasetWriter

    spec = spec.model_copy(update={"storage": spec.storage.model_copy(update={"codec": codec,
                                                                               "chunk_rows": chunk_rows})})
    path.unlink(missing_ok=True)
    t0, c0 = time.perf_counter(), time.process_time()
    w = DatasetWriter(path, spec, 1)
    for b in batches:
        w.add(b)
    summary = w.finish()
    write_s, write_cpu = time.perf_counter() - t0, time.process_time() - c0
    n = summary["samples"]
    per_field = {}
    with h5py.File(path, "r") as f:
        for name in spec.fields:
            raw = stored = 0
            for split in ("train", "val", "test"):
                ds = f[split][name]
                raw += ds.size
                stored += ds.id.get_storage_size()
            per_field[name] = round(stored / raw, 4)
    # random single-sample reads (image + mask), default chunk cache, file in the page cache
    rng = np.random.default_rng(seed)
    with h5py.File(path, "r") as f:
        g = f["train"]
        count = g["images"].shape[0]
        idx = rng.integers(0, count, size=reads)
        lat = []
        for i in idx:
            t = time.perf_counter()
            g["images"][i]
            g["masks"][i]
            lat.append(time.perf_counter() - t)
        # sequential scan in chunk-aligned blocks of 64 rows
        t = time.perf_counter()
        for s in range(0, count, 64):
            g["images"][s : s + 64]
            g["masks"][s : s + 64]
        scan = time.perf_counter() - t
    lat_ms = np.array(lat) * 1000
    raw_bytes = summary["array_bytes_raw"]
    return {
        "codec": codec,
        "chunk_rows": chunk_rows,
        "samples": n,
        "raw_array_bytes": raw_bytes,
        "stored_array_bytes": summary["array_bytes_stored"],
        "file_bytes": path.stat().st_size,
        "ratio": round(summary["array_bytes_stored"] / raw_bytes, 4),
        "ratio_images": per_field["images"],
        "ratio_masks": per_field["masks"],
        "write_seconds": round(write_s, 3),
        "write_ms_per_sample": round(1000 * write_s / n, 3),
        "write_mb_per_second": round(raw_bytes / write_s / 1e6, 1),
        "write_cpu_ms_per_sample": round(1000 * write_cpu / n, 3),
        "read_p50_ms": round(float(np.percentile(lat_ms, 50)), 3),
        "read_p95_ms": round(float(np.percentile(lat_ms, 95)), 3),
        "scan_samples_per_second": round(count / scan, 1),
    }


def codec_table(raw: Path, n: int, reads: int, workdir: Path) -> dict:
    from h5forge.format.codecs import CODECS

    t0 = time.perf_counter()
    spec, batches = clean_subset(raw, n)
    clean_s = time.perf_counter() - t0
    png_bytes = sum(os.path.getsize(raw / p) for b in batches for files in b.files for p in files)
    codec_run(spec, batches, "none", 1, workdir / "warm-up.h5", 20)  # first-write costs off the table
    (workdir / "warm-up.h5").unlink()
    rows = []
    for codec in CODECS:
        rows.append(codec_run(spec, batches, codec, 1, workdir / f"codec-{codec}.h5", reads))
        print(f"  codec {codec:15s} ratio {rows[-1]['ratio']:.3f}  write {rows[-1]['write_seconds']:.2f} s "
              f"(CPU {rows[-1]['write_cpu_ms_per_sample']} ms/sample)  "
              f"read p50 {rows[-1]['read_p50_ms']:.2f} ms", flush=True)
        (workdir / f"codec-{codec}.h5").unlink()
    default = spec.storage.codec
    chunks = []
    for rows_per_chunk in (1, 8):
        chunks.append(codec_run(spec, batches, default, rows_per_chunk, workdir / "chunks.h5", reads))
        print(f"  {default} chunk_rows {rows_per_chunk}: read p50 {chunks[-1]['read_p50_ms']:.2f} ms, "
              f"scan {chunks[-1]['scan_samples_per_second']:.0f}/s", flush=True)
        (workdir / "chunks.h5").unlink()
    return {"samples": n, "clean_seconds_single_process": round(clean_s, 2), "png_bytes": png_bytes,
            "reads": reads, "default_codec": default, "codecs": rows, "chunk_rows": chunks}


# ---- profile ---------------------------------------------------------------------------------

def profile_clean(raw: Path, n: int, workers: int) -> dict:
    """Where the CPU goes, per sample, measured in CPU time (``time.process_time``) in one process,
    so the numbers hold on a busy box: the bound's decode, every stage of cleaning, the batch-level
    extras, shipping a batch result (pickle + unpickle), and the writer's add with the default codec.
    From them, the ratio a CPU-bound build on ``workers`` cores could reach:
    decode / (clean + ship + write), the writer's CPU taken from the same cores.
    """
    import hashlib
    import pickle

    from h5forge import clean as c
    from h5forge.ingest.discover import discover
    from h5forge.ingest.writer import DatasetWriter

    cpu = time.process_time
    spec = make_spec(raw, CACHE / "unused")
    refs = discover(spec).samples[:n]
    fimg, fmask = spec.fields["images"], spec.fields["masks"]
    pairs = [(str(raw / r.files["images"]), str(raw / r.files["masks"])) for r in refs]
    _decode_pairs(pairs[:50])  # warm imports
    stages = dict.fromkeys(["read_bytes", "sha256_raw", "decode_image", "decode_mask", "to_pixels",
                            "geometry_image", "mask_values", "geometry_mask", "chw_copy"], 0.0)
    for ref in refs:
        t = cpu()
        di = (raw / ref.files["images"]).read_bytes()
        dm = (raw / ref.files["masks"]).read_bytes()
        t1 = cpu(); stages["read_bytes"] += t1 - t
        hashlib.sha256(di).hexdigest(); hashlib.sha256(dm).hexdigest()
        t2 = cpu(); stages["sha256_raw"] += t2 - t1
        img = c._open(di, ref.files["images"], fimg.max_pixels)
        t3 = cpu(); stages["decode_image"] += t3 - t2
        msk = c._open(dm, ref.files["masks"], fmask.max_pixels)
        t4 = cpu(); stages["decode_mask"] += t4 - t3
        px = c.to_pixels(img, ref.files["images"], fimg.channels, fimg.fill)
        t5 = cpu(); stages["to_pixels"] += t5 - t4
        g = c.plan_geometry(*px.shape[:2], *fimg.size, fimg.larger, ref.files["images"])
        a = c.apply_geometry(px, g, fimg.fill, nearest=False)
        t6 = cpu(); stages["geometry_image"] += t6 - t5
        mv = c.mask_values(msk, ref.files["masks"])
        t7 = cpu(); stages["mask_values"] += t7 - t6
        b = c.apply_geometry(mv[..., None], g, 0, nearest=True)
        t8 = cpu(); stages["geometry_mask"] += t8 - t7
        np.ascontiguousarray(a.transpose(2, 0, 1)); np.ascontiguousarray(b.transpose(2, 0, 1))
        stages["chw_copy"] += cpu() - t8
    batches = [refs[i : i + spec.compute.batch_size] for i in range(0, len(refs), spec.compute.batch_size)]
    # the whole per-worker function, profiled
    prof = cProfile.Profile()
    t0 = cpu()
    prof.enable()
    out = [c.clean_batch(spec, raw, b) for b in batches]
    prof.disable()
    t_profiled = cpu() - t0
    t0 = cpu()
    out = [c.clean_batch(spec, raw, b) for b in batches]
    t_batch = cpu() - t0
    # the bound's work, same samples, same process
    t0 = cpu()
    _decode_pairs(pairs)
    t_bound = cpu() - t0
    t0 = cpu()
    for b in out:
        for i in range(len(b)):
            c.sample_checksum({k: v[i] for k, v in b.arrays.items()})
    t_checksum = cpu() - t0
    t0 = cpu()
    for b in out:
        c.pixel_histograms(b.arrays["images"], b.splits)
    t_hist = cpu() - t0
    t0 = cpu()
    blobs = [pickle.dumps(b, protocol=5) for b in out]
    t_dumps = cpu() - t0
    t0 = cpu()
    for blob in blobs:
        pickle.loads(blob)
    t_loads = cpu() - t0
    size = sum(map(len, blobs))
    del blobs
    # the single writer: DatasetWriter.add + finish of these batches, default codec and chunk rows
    path = CACHE / "profile-writer.h5"
    path.unlink(missing_ok=True)
    w = DatasetWriter(path, spec, 1)
    t0 = cpu()
    for b in out:
        w.add(b)
    w.finish()
    t_writer = cpu() - t0
    path.unlink()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(16)
    k = len(refs)
    ms = lambda s: round(1000 * s / k, 3)  # noqa: E731
    ship = t_dumps + t_loads
    model = t_bound / (t_batch + ship + t_writer)
    return {
        "samples": k,
        "clock": "process CPU time (time.process_time), one process",
        "ms_per_sample": {k_: ms(v) for k_, v in stages.items()}
        | {"sample_checksum (in clean_batch)": ms(t_checksum), "pixel_histograms (in clean_batch)": ms(t_hist)},
        "bound_decode_ms_per_sample": ms(t_bound),
        "clean_batch_ms_per_sample": ms(t_batch),
        "clean_batch_profiled_ms_per_sample": ms(t_profiled),
        "ship_result_ms_per_sample": ms(ship),
        "ship_pickle_dumps_ms": ms(t_dumps),
        "ship_pickle_loads_ms": ms(t_loads),
        "writer_ms_per_sample": ms(t_writer),
        "result_bytes_per_sample": round(size / k),
        "clean_over_bound": round(t_batch / t_bound, 3),
        "cpu_model_ratio": round(model, 3),
        "cpu_model_note": (f"if all {workers} cores are saturated and nothing else costs: build/bound = decode / "
                           "(clean_batch + pickle/unpickle of the result + writer add). Dask's own scheduling "
                           "and TCP costs come on top."),
        "cprofile_top": "\n".join(buf.getvalue().splitlines()[:44]),
    }


# ---- report ----------------------------------------------------------------------------------

def markdown(r: dict) -> str:
    m = r["machine"]
    L = [f"# Build benchmark ({r['finished_at']})", "",
         f"Command: `{r['command']}`  ",
         f"Machine: {m['cpu_count']} CPUs ({m['cpu_model']}), {m['memory_gib']} GiB, Python {m['python']}, "
         f"h5py {m['h5py']}, HDF5 {m['hdf5']}. Shared box: load average at start {m['loadavg']}, "
         f"at end {r['loadavg_end']}. CPU pressure (PSI) at start `{m.get('cpu_pressure')}`, at end "
         f"`{r.get('cpu_pressure_end')}`.", ""]
    if r.get("throughput"):
        L += markdown_throughput(r)
    return markdown_rest(r, L)


def markdown_throughput(r: dict) -> list[str]:
    t = r["throughput"]
    L = ["## 1. Build throughput vs the Pillow-decode bound", "",
         f"{t['samples']:,} generated good samples, 150-260 px RGB PNG + mask PNG -> 224x224, "
         f"codec `{t['codec']}`, chunk_rows {t['chunk_rows']}, {t['workers']} dask worker processes. "
         "Bound: the same image+mask PNGs decoded path -> numpy with Pillow in "
         f"{t['workers']} plain processes (`multiprocessing.Pool`, fork, file list split evenly, pool "
         "start excluded). Page cache warm for both. Bound and build run back to back, "
         f"{len(t['reps'])} repetition(s).", "",
         "Build time = `write_version` wall time minus cluster start (so the writer's finish and the "
         "cluster shutdown count); the clean+write loop alone (the pipeline's own `clean_write_seconds`) "
         "is shown beside it. Writer busy = time inside `DatasetWriter.add/finish` in the calling process.", "",
         "CPU ms/sample = user+system CPU of every process involved (bound: the pool workers' decode "
         "loops; build: writer + nannies + workers, sampled with psutil) per sample: the load of other "
         "jobs on the box barely moves it, so its ratio is the steadier one here. The build's CPU includes "
         "starting and stopping the cluster (two spawned processes importing dask and h5forge).", "",
         "| rep | bound samples/s | build samples/s | ratio | clean+write loop samples/s | ratio | "
         "bound CPU ms/sample | build CPU ms/sample | CPU ratio | "
         "cluster start s | build s | writer busy s | RSS sum MiB | load before |",
         "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for i, rep in enumerate(t["reps"]):
        b, w = rep["bound"], rep["build"]
        L.append(f"| {i + 1} | {b['samples_per_second']} | {w['samples_per_second']} | {rep['ratio']:.3f} | "
                 f"{w['clean_write_samples_per_second']} | {rep['ratio_clean_write_only']:.3f} | "
                 f"{b['cpu_ms_per_sample']} | {w['cpu_ms_per_sample']} | {rep['cpu_ratio']:.3f} | "
                 f"{w['cluster_start_seconds']} | {w['build_seconds']} | "
                 f"{w['writer_add_seconds'] + w['writer_finish_seconds']:.1f} | "
                 f"{w['rss']['peak_sum_mib']} | {w['loadavg_before'][0]} |")
    ok = "meets" if t["ratio_best"] >= THROUGHPUT_GOAL else "MISSES"
    L += ["", f"**Ratio build/bound (wall): median {t['ratio_median']:.3f}, best {t['ratio_best']:.3f} "
              f"(goal >= {THROUGHPUT_GOAL}: {ok}). CPU-time ratio: median {t['cpu_ratio_median']:.3f}.**", ""]
    if r.get("cli"):
        c = r["cli"]
        L += ["Whole flow through the CLI (`h5forge build SPEC.yaml --output DIR`: Prefect ephemeral server, "
              "discover, clean+write, full verify, publish):", "",
              f"- wall {c['wall_seconds']} s for {c['samples']:,} samples = {c['samples_per_second']} samples/s "
              f"end to end ({c['samples_per_second'] / t['bound_median']:.3f} of the bound); "
              f"Prefect DB fresh: {c['prefect_db_fresh']}",
              f"- inside it, clean+write {c['clean_write_seconds']} s ({c['clean_write_samples_per_second']} "
              f"samples/s), cluster start {c['cluster_start_seconds']} s, everything else (Prefect start-up, "
              f"discover, verify, publish) {c['rest_seconds']} s",
              "- phases from the Prefect log timestamps (s): "
              + ", ".join(f"{k} {v}" for k, v in c["phases_seconds"].items()), ""]
    return L


def markdown_rest(r: dict, L: list[str]) -> str:
    if r.get("rss"):
        s = r["rss"]
        L += ["## 2. Peak RSS vs N", "",
              "Sampled every 100 ms in a thread (process list refreshed every second): the writer process plus "
              "all descendants (dask nannies and workers).", "",
              "| samples | peak sum MiB | peak writer (main) MiB | peak largest child MiB | processes |",
              "|---|---|---|---|---|"]
        for key in ("small", "large"):
            x = s[key]
            L.append(f"| {x['samples']:,} | {x['rss']['peak_sum_mib']} | {x['rss']['peak_main_mib']} | "
                     f"{x['rss']['peak_max_child_mib']} | {x['rss']['processes_seen']} |")
        ok_sum = "meets" if s["ratio_sum"] <= RSS_GOAL else "MISSES"
        L += ["", f"**Ratio large/small: sum {s['ratio_sum']:.3f}, writer {s['ratio_main']:.3f}, largest child "
                  f"{s['ratio_child']:.3f} (goal <= {RSS_GOAL}: {ok_sum}).** Large-N build throughput "
                  f"{s['large']['samples_per_second']} samples/s.", ""]
    if r.get("codecs"):
        c = r["codecs"]
        L += ["## 3. Codecs", "",
              f"First {c['samples']:,} samples cleaned once, then written by the single writer with each codec "
              f"(chunk_rows 1). Raw array bytes {c['codecs'][0]['raw_array_bytes'] / 1e6:.0f} MB "
              f"(the source PNGs: {c['png_bytes'] / 1e6:.0f} MB). Read: {c['reads']} random train samples "
              "(image+mask) from a page-cached file, default chunk cache; scan: chunk-aligned blocks of 64.", "",
              "Write = the whole single-writer path (DatasetWriter.add + finish: stacking, HDF5 chunking, "
              "filter, metadata), wall and CPU time.", "",
              "| codec | stored/raw | images | masks | file MB | write ms/sample | write CPU ms/sample | write MB/s | "
              "read p50 ms | read p95 ms | scan samples/s |", "|---|---|---|---|---|---|---|---|---|---|---|"]
        for x in c["codecs"] + [dict(y, codec=f"{y['codec']} chunk_rows {y['chunk_rows']}") for y in c["chunk_rows"]]:
            L.append(f"| {x['codec']} | {x['ratio']:.3f} | {x['ratio_images']:.3f} | {x['ratio_masks']:.3f} | "
                     f"{x['file_bytes'] / 1e6:.0f} | {x['write_ms_per_sample']} | {x['write_cpu_ms_per_sample']} | "
                     f"{x['write_mb_per_second']} | "
                     f"{x['read_p50_ms']} | {x['read_p95_ms']} | {x['scan_samples_per_second']} |")
        L.append("")
    if r.get("profile"):
        p = r["profile"]
        L += ["## Where the time goes (CPU time per sample, one process)", "",
              f"{p['samples']} samples, {p['clock']}.", "",
              "| cost | CPU ms/sample |", "|---|---|",
              f"| bound: Pillow decode image+mask from path | {p['bound_decode_ms_per_sample']} |",
              f"| build: clean_batch (worker) | {p['clean_batch_ms_per_sample']} |",
              f"| build: ship the result (pickle + unpickle, {p['result_bytes_per_sample']:,} B/sample) | "
              f"{p['ship_result_ms_per_sample']} |",
              f"| build: writer add+finish (default codec, chunk_rows) | {p['writer_ms_per_sample']} |",
              "", f"CPU model: build/bound <= {p['cpu_model_ratio']} ({p['cpu_model_note']})", "",
              "Stages inside clean_batch:", "", "| stage | CPU ms/sample |", "|---|---|"]
        L += [f"| {k} | {v} |" for k, v in p["ms_per_sample"].items()]
        L += ["", "cProfile of clean_batch (tottime):", "", "```", p["cprofile_top"], "```", ""]
    return "\n".join(L) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=10_000, help="samples for throughput and the small RSS point")
    ap.add_argument("--n-large", type=int, default=50_000, help="samples for the large RSS point (0: skip)")
    ap.add_argument("--codec-n", type=int, default=2_000, help="samples for the codec table (0: skip)")
    ap.add_argument("--reads", type=int, default=500, help="random reads per codec")
    ap.add_argument("--reps", type=int, default=2, help="bound/build repetitions, interleaved")
    ap.add_argument("--workers", type=int, default=None, help="processes (default: the spec's compute.workers)")
    ap.add_argument("--no-cli", action="store_true", help="skip the whole-flow CLI run")
    ap.add_argument("--profile-n", type=int, default=1_000, help="samples profiled (0: skip)")
    ap.add_argument("--only", choices=["throughput", "rss", "codecs", "profile"], action="append",
                    help="run only these parts (repeatable); results of other parts are not written")
    args = ap.parse_args()
    parts = set(args.only or ["throughput", "rss", "codecs", "profile"])

    from h5forge.spec import load_spec

    base = load_spec(DEMO_SPEC)
    workers = args.workers or base.compute.workers
    CACHE.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="run-", dir=CACHE))
    result: dict = {"command": "python benchmarks/build.py " + " ".join(sys.argv[1:]), "machine": machine(),
                    "goals": {"throughput_ratio_min": THROUGHPUT_GOAL, "rss_ratio_max": RSS_GOAL}}
    try:
        raw = raw_folder(args.n)
        raw_large = raw_folder(args.n_large) if args.n_large and "rss" in parts else None
        print(f"warming page cache ({dir_bytes(raw) / 1e9:.2f} GB) ...", flush=True)
        warm_page_cache(raw)

        if "throughput" in parts or "rss" in parts:
            pairs = pair_paths(raw)
            reps = []
            for i in range(args.reps):
                bound = decode_bound(pairs, workers)
                build = build_once(raw, work / "out", workers)
                ratio = build["samples_per_second"] / bound["samples_per_second"]
                reps.append({"bound": bound, "build": build, "ratio": round(ratio, 4),
                             "cpu_ratio": round(bound["cpu_ms_per_sample"] / build["cpu_ms_per_sample"], 4),
                             "ratio_clean_write_only": round(build["clean_write_samples_per_second"]
                                                             / bound["samples_per_second"], 4)})
                print(f"rep {i + 1}: bound {bound['samples_per_second']:.0f}/s, build "
                      f"{build['samples_per_second']:.0f}/s (clean+write; cluster start "
                      f"{build['cluster_start_seconds']} s) -> ratio {ratio:.3f}; peak RSS sum "
                      f"{build['rss']['peak_sum_mib']} MiB; load {build['loadavg_before']}; CPU ms/sample bound "
                      f"{bound['cpu_ms_per_sample']} build {build['cpu_ms_per_sample']} -> CPU ratio "
                      f"{reps[-1]['cpu_ratio']:.3f}", flush=True)
            ratios = [r["ratio"] for r in reps]
            result["throughput"] = {
                "samples": len(pairs), "workers": workers, "codec": base.storage.codec,
                "chunk_rows": base.storage.chunk_rows, "reps": reps,
                "ratio_median": round(statistics.median(ratios), 4), "ratio_best": round(max(ratios), 4),
                "cpu_ratio_median": round(statistics.median(r["cpu_ratio"] for r in reps), 4),
                "bound_median": statistics.median(r["bound"]["samples_per_second"] for r in reps),
                "build_median": statistics.median(r["build"]["samples_per_second"] for r in reps),
            }
            print(f"THROUGHPUT build/bound: median {result['throughput']['ratio_median']:.3f}, best "
                  f"{result['throughput']['ratio_best']:.3f} (goal >= {THROUGHPUT_GOAL})", flush=True)
            if not args.no_cli and "throughput" in parts:
                print("whole flow through the CLI ...", flush=True)
                result["cli"] = cli_build(raw, work / "cli-out")
                c = result["cli"]
                print(f"CLI: {c['wall_seconds']} s end to end = {c['samples_per_second']}/s "
                      f"({c['samples_per_second'] / result['throughput']['bound_median']:.3f} of bound); "
                      f"clean+write {c['clean_write_seconds']} s, rest {c['rest_seconds']} s; phases {c['phases_seconds']}",
                      flush=True)

        if "rss" in parts and raw_large is not None:
            small = min((r["build"] for r in result["throughput"]["reps"]), key=lambda b: b["rss"]["peak_sum_mib"])
            print(f"warming page cache for the large folder ({dir_bytes(raw_large) / 1e9:.2f} GB) ...", flush=True)
            warm_page_cache(raw_large)
            large = build_once(raw_large, work / "out-large", workers)
            s, lg = small["rss"], large["rss"]
            result["rss"] = {
                "small": small, "large": large,
                "ratio_sum": round(lg["peak_sum_mib"] / s["peak_sum_mib"], 4),
                "ratio_main": round(lg["peak_main_mib"] / s["peak_main_mib"], 4),
                "ratio_child": round(lg["peak_max_child_mib"] / s["peak_max_child_mib"], 4),
            }
            print(f"RSS {large['samples']:,}/{small['samples']:,}: sum {result['rss']['ratio_sum']:.3f} "
                  f"({lg['peak_sum_mib']} / {s['peak_sum_mib']} MiB), writer {result['rss']['ratio_main']:.3f}, "
                  f"largest child {result['rss']['ratio_child']:.3f} (goal <= {RSS_GOAL}); large build "
                  f"{large['samples_per_second']}/s", flush=True)

        if "codecs" in parts and args.codec_n:
            print(f"codec table on {args.codec_n:,} samples ...", flush=True)
            result["codecs"] = codec_table(raw, args.codec_n, args.reads, work)

        if "profile" in parts and args.profile_n:
            print(f"profiling clean_batch on {args.profile_n:,} samples ...", flush=True)
            result["profile"] = profile_clean(raw, args.profile_n, workers)
            p = result["profile"]
            print(f"CPU ms/sample: bound decode {p['bound_decode_ms_per_sample']}, clean_batch "
                  f"{p['clean_batch_ms_per_sample']}, ship {p['ship_result_ms_per_sample']}, writer "
                  f"{p['writer_ms_per_sample']} -> CPU-model ratio {p['cpu_model_ratio']}; stages "
                  f"{p['ms_per_sample']}", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    result["loadavg_end"] = loadavg()
    result["cpu_pressure_end"] = cpu_pressure()
    result["finished_at"] = time.strftime("%Y-%m-%d %H:%M:%S")
    # a partial run (--only) never overwrites the committed results
    dest = RESULTS / "build" if not args.only else CACHE / "build-partial"
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    dest.with_suffix(".md").write_text(markdown(result))
    print(f"wrote {dest.with_suffix('.json')} and .md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
