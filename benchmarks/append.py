"""Append benchmark: cost of appending vs dataset size, disk of thin versions, reads of a thin version.

    python -m benchmarks.append [--smoke] [--n-small 10000 --n-large 100000 --repeats 5 --read-n 10000]

What is measured and how: benchmarks/README.md, section "append".
"""

import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import h5py
import numpy as np
import torch

from benchmarks.common import (CACHE, append_lib, cli, code_key, get, loadavg, log, machine, make_spec, med, prefect_env,
                               profiled, random_read_latency, ratio, raw_folder, save, timed, warm, write_spec)

WORK = CACHE / "append"
CHAIN = 5


def build_base(raw: Path, n: int, size: int) -> tuple[Path, dict]:
    """A published one-version output folder built from ``raw`` (cached)."""
    from h5forge.ingest.build import publish_candidate, verify_candidate, write_version
    from h5forge.ingest.discover import discover
    from h5forge.store.versions import stage
    spec = make_spec(raw, WORK, size)
    out = WORK / f"base-n{n}-{size}px-{spec.storage.codec}-{raw.name}-{code_key()}"  # rebuilt when the library changes
    if (out / ".bench-complete").exists():
        return out, {"raw": str(raw), **json.loads((out / ".bench-complete").read_text())}
    shutil.rmtree(out, ignore_errors=True)
    spec, t0, cand = make_spec(raw, out, size), time.perf_counter(), stage(out)
    summary, t1 = write_version(spec, discover(spec), cand), time.perf_counter()
    publish_candidate(cand, verify_candidate(cand))
    info = {"samples": get(summary, "samples"), "raw": str(raw), "codec": spec.storage.codec,
            "build_seconds": round(t1 - t0, 1), "verify_seconds": round(time.perf_counter() - t1, 1),
            "file_bytes": (out / "dataset_v0001.h5").stat().st_size}
    (out / ".bench-complete").write_text(json.dumps(info))
    return out, info


def copy_base(base: Path, dst: Path) -> Path:
    """Version files hard-linked (published files are read-only, never modified); the rest copied."""
    shutil.rmtree(dst, ignore_errors=True)
    return shutil.copytree(base, dst, symlinks=True, ignore=shutil.ignore_patterns(".bench-*"),
                           copy_function=lambda s, d: os.link(s, d) if s.endswith(".h5") else shutil.copy2(s, d))


def fill_inbox(src: Path, inbox: Path, start: int, count: int, prefix: str) -> Path:
    """Samples start..start+count of ``src`` into ``inbox`` with ``<id>.json`` sidecars, backdated."""
    shutil.rmtree(inbox, ignore_errors=True)
    for rec in json.loads((src / "annotations.json").read_text())[start:start + count]:
        new = prefix + rec["id"]
        for folder in ("images", "masks"):
            (inbox / folder).mkdir(parents=True, exist_ok=True)
            shutil.copy(src / folder / f"{rec['id']}.png", inbox / folder / f"{new}.png")
        (inbox / f"{new}.json").write_text(json.dumps({**rec, "id": new}))
    for p in inbox.rglob("*"):
        os.utime(p, (time.time() - 3600,) * 2)
    return inbox


def append_steps(spec, out: Path, inbox: Path, expect: int) -> dict:
    """The library steps as flows/append.py composes them, each timed."""
    from h5forge.store.reports import write_quarantine
    from h5forge.store.versions import output_lock, retain
    ap, steps, c0, t0 = append_lib(), {}, time.process_time(), time.perf_counter()

    def step(name: str, fn, *a):
        t = time.perf_counter()
        try:
            return fn(*a)
        finally:
            steps[name] = steps.get(name, 0.0) + time.perf_counter() - t

    with timed(ap, "known_samples") as inner, output_lock(out, "append benchmark"):
        steps["lock"] = time.perf_counter() - t0
        step("recover", ap.recover, out)
        scan = step("scan", ap.scan_inbox, spec, inbox)
        cand = step("stage", ap.stage_append, out)
        summary = step("write_delta", ap.write_delta, spec, scan, cand)
        rejections = get(summary, "rejections")
        step("reports", write_quarantine, out, cand.number, rejections)
        merged = step("thin", ap.write_thin_version, spec, cand, summary)
        report = step("verify", ap.verify_append, cand)  # writes the health report
        step("publish", lambda: ap.publish_append(cand, report, ap.plan_moves(spec, scan, rejections, cand.number)))
        step("retention", retain, out, spec.output.keep)
    if get(summary, "samples") != expect or not report.ok:
        raise RuntimeError(f"append added {get(summary, 'samples')} (expected {expect}), ok={report.ok}: "
                           f"{report.errors[:3]} {rejections[:3]}")
    steps["write_delta"] -= inner["known_samples"]
    return {"total_seconds": round(time.perf_counter() - t0, 4), "cpu_seconds": round(time.process_time() - c0, 4),
            "steps": {k: round(v, 4) for k, v in {"known_samples": inner["known_samples"], **steps}.items()},
            "version": cand.number, "segments": get(merged, "segments"), "delta_bytes": cand.delta.stat().st_size,
            "thin_bytes": cand.version.final.stat().st_size}


def trial(base, src, size, n_new, profile=False):
    out, inbox, load = copy_base(base[0], WORK / "trial-out"), fill_inbox(src, WORK / "trial-inbox", 0, n_new, "new_"), loadavg()
    spec = make_spec(base[1]["raw"], out, size)
    if profile:
        return profiled(append_steps, spec, out, inbox, n_new, top=14)[2]
    return {**append_steps(spec, out, inbox, n_new), "loadavg_before": load[0]}


def part_time(bases: dict, src: Path, args) -> dict:
    trial(bases["small"], src, args.size, args.append)  # warm-up: imports, first-use costs
    trials = {k: [] for k in bases}
    for r in range(args.repeats):
        for key, base in bases.items():
            trials[key].append(t := trial(base, src, args.size, args.append))
            log(f"round {r + 1}/{args.repeats} {key:5s} {t['total_seconds']:.3f} s (CPU {t['cpu_seconds']:.3f}) {t['steps']}")
    res = {"bases": {k: {"samples": base[1]["samples"], "base_file_bytes": base[1]["file_bytes"],
                         "median_seconds": med(t["total_seconds"] for t in trials[k]),
                         "median_cpu_seconds": med(t["cpu_seconds"] for t in trials[k]),
                         "min_seconds": min(t["total_seconds"] for t in trials[k]),
                         "thin_bytes": trials[k][0]["thin_bytes"], "delta_bytes": trials[k][0]["delta_bytes"]}
                     for k, base in bases.items()},
           "steps_median": {k: {s: med(t["steps"][s] for t in trials[k]) for s in trials[k][0]["steps"]} for k in bases},
           "trials": {k: [{"seconds": t["total_seconds"], "cpu": t["cpu_seconds"], "load": t["loadavg_before"]}
                          for t in trials[k]] for k in bases}}
    s, lg = res["bases"]["small"], res["bases"]["large"]
    res["ratios"] = {"large_vs_small": ratio(lg["median_seconds"], s["median_seconds"]),
                     "cpu": ratio(lg["median_cpu_seconds"], s["median_cpu_seconds"]),
                     "min": ratio(lg["min_seconds"], s["min_seconds"]),
                     **{f"step {k}": ratio(v, res["steps_median"]["small"][k], 2) if res["steps_median"]["small"][k] > 1e-4
                        else None for k, v in res["steps_median"]["large"].items()}}
    if not args.no_profile:
        res["profile"] = {k: trial(base, src, args.size, args.append, profile=True) for k, base in bases.items()}
    if not args.no_flow:
        res["flow"] = flow_runs(bases, src, args.size, args.append)
    return res


def flow_runs(bases: dict, src: Path, size: int, n_new: int) -> dict:
    """The Prefect flow once per base, in this process (ephemeral server started by a trivial flow)."""
    os.environ.update(prefect_env(Path(tempfile.mkdtemp(prefix="prefect-", dir=WORK))))
    from prefect import flow
    from h5forge.flows.append import append_samples

    @flow(name="bench-noop")
    def noop() -> int:
        return 1

    t = [time.perf_counter()]
    for _ in range(2):
        t.append(noop() and time.perf_counter())
    res = {"server_start_and_first_flow_seconds": round(t[1] - t[0], 2), "empty_flow_seconds": round(t[2] - t[1], 2),
           "server_start_seconds": round((t[1] - t[0]) - (t[2] - t[1]), 2)}
    for key, (base, info) in bases.items():
        out, inbox = copy_base(base, WORK / "trial-out"), fill_inbox(src, WORK / "trial-inbox", 0, n_new, "new_")
        path = write_spec(make_spec(info["raw"], out, size, source={"inbox": inbox}), WORK / "flow-spec.yaml")
        t0, r = time.perf_counter(), append_samples(str(path))
        res[f"{key}_seconds"] = round(time.perf_counter() - t0, 3)
        assert get(r, "added") == n_new, f"flow added {get(r, 'added')}: {r}"
    res["ratio"] = ratio(res.get("large_seconds"), res["small_seconds"])
    return res


def make_chain(base: Path, info: dict, src: Path, size: int, n_new: int, out: Path) -> tuple[Path, dict]:
    """``base`` + CHAIN appends of ``n_new`` distinct new samples each; the sizes of every file."""
    copy_base(base, out)
    spec = make_spec(info["raw"], out, size)
    seconds = [append_steps(spec, out, fill_inbox(src, WORK / "chain-inbox", (k + 1) * n_new, n_new, "add_"), n_new)
               ["total_seconds"] for k in range(CHAIN)]
    files = {p.name: p.stat().st_size for p in sorted(out.glob("*.h5")) if not p.is_symlink()}
    base_b = files["dataset_v0001.h5"]
    deltas = sum(v for k, v in files.items() if ".delta." in k)
    thins = [v for k, v in files.items() if ".delta." not in k and k != "dataset_v0001.h5"]
    total = sum(files.values())
    return out, {"base_samples": info["samples"], "size": size, "appends": CHAIN, "per_append": n_new, "files": files,
                 "base_bytes": base_b, "delta_bytes": deltas, "thin_bytes": sum(thins), "total_h5_bytes": total,
                 "folder_disk_bytes": sum(p.stat().st_blocks * 512 for p in out.rglob("*") if p.is_file() and not p.is_symlink()),
                 "total_over_base": round(total / base_b, 4), "minus_new_over_base": round((total - deltas) / base_b, 4),
                 "overhead_fraction": round((total - base_b - deltas) / base_b, 4), "append_seconds": seconds,
                 "base_bytes_per_sample": round(base_b / info["samples"], 1),
                 "thin_bytes_per_base_sample": round(max(thins) / info["samples"], 1)}


class Segments:
    """A thin version's train rows read straight from its segment files (no virtual datasets)."""

    def __init__(self, path: Path):
        from h5forge.store.thin import segments_of
        real = Path(os.path.realpath(path))
        segs = [s for s in segments_of(real) if s["counts"]["train"]]
        self.files = [h5py.File(real.parent / s["file"], "r") for s in segs]
        self.ds = [(f["train"]["images"], f["train"]["masks"]) for f in self.files]
        self.starts = np.cumsum([0] + [s["counts"]["train"] for s in segs])
        self.n = int(self.starts[-1])

    def rows(self, a: int, b: int):
        parts, k = [], int(np.searchsorted(self.starts, a, side="right") - 1)
        while a < b:
            (im, ma), o, stop = self.ds[k], self.starts[k], min(b, int(self.starts[k + 1]))
            parts.append((im[a - o:stop - o], ma[a - o:stop - o]))
            a, k = stop, k + 1
        return parts[0] if len(parts) == 1 else tuple(np.concatenate(x) for x in zip(*parts))


def read_round(configs: dict, loaders: dict, args, r: int) -> dict:
    row = {"loadavg": loadavg()[0], **{f"loader_{k}": round(loaders[k].run(), 1) for k in loaders}}
    seg, files = Segments(configs["thin"]), [h5py.File(p, "r") for p in configs.values()]
    readers = {k: (f["train"]["images"], f["train"]["masks"]) for k, f in zip(configs, files)}
    readers = {k: (im.shape[0], lambda a, b, im=im, ma=ma: (im[a:b], ma[a:b]), lambda i, im=im, ma=ma: (im[i], ma[i]))
               for k, (im, ma) in readers.items()} | {"segments": (seg.n, seg.rows, lambda i: seg.rows(i, i + 1))}
    for k, (n, rows, one) in readers.items():
        m, t = min(n, args.seq_limit or n), time.perf_counter()
        for s in range(0, m, args.batch):
            rows(s, min(m, s + args.batch))
        row[f"h5seq_{k}"] = round(m / (time.perf_counter() - t), 1)
        row[f"h5rand_{k}"] = random_read_latency(one, n, args.reads, r)
    for f in files + seg.files:
        f.close()
    for k, p in configs.items():  # open, the two train datasets, the first and the last row
        t = []
        for _ in range(20):
            t0 = time.perf_counter()
            with h5py.File(p, "r") as f:
                im, ma = f["train"]["images"], f["train"]["masks"]
                im[0], ma[0], im[-1], ma[-1]
            t.append(time.perf_counter() - t0)
        row[f"open_{k}_ms"] = round(1000 * statistics.median(t), 2)
    return row


def part_read(thin: Path, args) -> dict:
    from h5forge.read.torch import H5Dataset
    from h5forge.store.thin import export, segments_of
    from benchmarks.read import Runner
    real = Path(os.path.realpath(thin))
    (WORK / "export").mkdir(exist_ok=True)
    fresh = export(real, WORK / "export" / real.name)
    with h5py.File(real, "r") as a, h5py.File(fresh, "r") as b:  # same content: ids and a few rows
        assert a["train"]["ids"][()].tolist() == b["train"]["ids"][()].tolist()
        n = a["train"]["images"].shape[0]
        assert all(np.array_equal(a["train"]["images"][i], b["train"]["images"][i]) for i in (0, n // 2, n - 1))
    configs = {"thin": real, "fresh": fresh}
    warm([*real.parent.glob("*.h5"), fresh])
    datasets = {k: H5Dataset(p, "train", ("images", "masks")) for k, p in configs.items()}
    loaders = {k: Runner(lambda d=d: d.loader(batch_size=args.batch, num_workers=args.workers, shuffle=True, seed=0))
               for k, d in datasets.items()}
    rounds = []
    for r in range(args.read_repeats):
        rounds.append(read_round(configs, loaders, args, r))
        log(f"read round {r + 1}: " + ", ".join(f"{k} {v}" for k, v in rounds[-1].items() if not isinstance(v, dict)))
    for d in datasets.values():
        d.close()
    m = {k: med(x[k] for x in rounds) for k in rounds[0] if not isinstance(rounds[0][k], dict)}
    m |= {f"{k}_{q}_us": med(x[k][f"{q}_us"] for x in rounds) for k in rounds[0] if k[:6] == "h5rand" for q in ("p50", "mean")}
    versions = {p.name: p for p in sorted(real.parent.glob("dataset_v*.h5")) if ".delta." not in p.name} | {"export": fresh}
    with h5py.File(real, "r") as f:
        im, ma = f["train"]["images"], f["train"]["masks"]
        profile = profiled(random_read_latency, lambda i: (im[i], ma[i]), n, min(args.reads, 1000), 9, top=8)[2]
    return {"train_samples": n, "segments": len(segments_of(real)), "thin_bytes": real.stat().st_size,
            "fresh_bytes": fresh.stat().st_size,
            "ratios": {"loader": ratio(m["loader_thin"], m["loader_fresh"]),
                       "h5py_sequential": ratio(m["h5seq_thin"], m["h5seq_fresh"]),
                       "h5py_random": ratio(m["h5rand_fresh_p50_us"], m["h5rand_thin_p50_us"]),
                       "h5py_random_mean": ratio(m["h5rand_fresh_mean_us"], m["h5rand_thin_mean_us"]),
                       "segments_sequential_vs_fresh": ratio(m["h5seq_segments"], m["h5seq_fresh"]),
                       "segments_random_vs_fresh": ratio(m["h5rand_fresh_p50_us"], m["h5rand_segments_p50_us"])},
            "medians": m, "rounds": rounds, "cpu_us_per_random_read": cpu_per_read(versions, min(args.reads, 1000)),
            "profile_random_thin": profile}


def cpu_per_read(files: dict[str, Path], reads: int) -> dict:
    """CPU µs per random image+mask read on rows every version has, best of 5 passes interleaved."""
    groups = {k: h5py.File(p, "r")["train"] for k, p in files.items()}
    n = min(min(g["images"].shape[0] for g in groups.values()), 8000)
    idx = [int(i) for i in np.random.default_rng(3).integers(0, n, reads)]
    best = dict.fromkeys(files, float("inf"))
    for p in range(6):  # the first pass warms up
        for k, g in groups.items():
            im, ma, c0 = g["images"], g["masks"], time.process_time()
            for i in idx:
                im[i], ma[i]
            best[k] = min(best[k], (time.process_time() - c0) / reads * 1e6) if p else best[k]
    return {k: {"segments": len(json.loads(g.file.attrs.get("segments", "[0]"))), "cpu_us": round(best[k], 1)}
            for k, g in groups.items()}  # the files close with their last reference


def main() -> None:
    args = cli(__doc__, dict(n_small=100, n_large=300, append=20, repeats=1, read_n=120, read_size=64, read_repeats=1,
                             reads=100, seq_limit=0),
               n_small=10_000, n_large=100_000, append=100, size=64, repeats=5, read_n=10_000, read_size=224,
               read_repeats=3, reads=2000, seq_limit=4000, workers=2, batch=32, no_flow=False, no_profile=False)
    torch.set_num_threads(1)
    WORK.mkdir(parents=True, exist_ok=True)
    t_run, mach = time.perf_counter(), machine()
    src = raw_folder((CHAIN + 1) * args.append, args.size, seed=7)  # the samples appended (distinct content)
    bases = {k: build_base(raw_folder(n, args.size), n, args.size) for k, n in (("small", args.n_small), ("large", args.n_large))}
    result: dict = {"machine": mach, "args": vars(args), "base_builds": {k: b[1] for k, b in bases.items()}}
    result["time"] = part_time(bases, src, args)
    chain, result["disk"] = make_chain(*bases["small"], src, args.size, args.append, WORK / "chain-disk")
    if (args.read_n, args.read_size) != (args.n_small, args.size):
        base = build_base(raw_folder(args.read_n, args.read_size), args.read_n, args.read_size)
        read_src = raw_folder((CHAIN + 1) * args.append, args.read_size, seed=7)
        chain, result["disk_read"] = make_chain(*base, read_src, args.read_size, args.append, WORK / "chain-read")
        result["base_builds"]["read"] = base[1]
    result["read"] = part_read(chain / "dataset_latest.h5", args)
    t, d = result["time"], result["disk"]
    result["ratios"] = {"time large/small": t["ratios"]["large_vs_small"], "CPU large/small": t["ratios"]["cpu"],
                        "flow large/small": t.get("flow", {}).get("ratio"), "disk (total - deltas)/base": d["minus_new_over_base"],
                        **{f"read thin/fresh, {k}": v for k, v in result["read"]["ratios"].items()}}
    save("append", result | {"run_seconds": round(time.perf_counter() - t_run, 1)}, args.smoke)


if __name__ == "__main__":
    main()
