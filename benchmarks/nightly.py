"""Nightly rebuild benchmark: a full build vs a rebuild of unchanged inputs, vs a rebuild after a 1 %
change, vs the build after a SIGKILL at 80 % of a full build; and an append onto a large vs a small
dataset (the inputs catalog every version carries).

    python -m benchmarks.nightly [--smoke] [--n 3000 --size 224 --rounds 2] [--append-small 2000 --append-large 20000]
    python -m benchmarks.nightly --only append --append-small 10000 --append-large 100000   # -> nightly_append

What is measured and how: benchmarks/README.md, section "nightly".
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np
import psutil

from benchmarks.common import (CACHE, REPO, cli, loadavg, log, machine, make_spec, med, ratio, raw_folder, save,
                               write_spec)

WORK = CACHE / "nightly"
SPLITS = ("train", "val", "test")


def build(spec) -> dict:
    """The build flow's steps as plain calls (flows/build.py without Prefect), each timed."""
    from h5forge.ingest.build import publish_candidate, verify_candidate, write_version
    from h5forge.ingest.discover import discover
    from h5forge.ingest.incremental.rebuild import inputs_of, unchanged_since
    from h5forge.store.versions import output_lock, stage

    steps, t0 = {}, time.perf_counter()

    def step(name, fn, *a, **k):
        t = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            steps[name] = round(time.perf_counter() - t, 3)

    with output_lock(spec.output.dir):
        inventory = step("discover", discover, spec)
        inputs = step("hash", inputs_of, spec, inventory)  # as the build: up front only when comparable
        same = step("unchanged_check", unchanged_since, spec.output.dir, inputs)
        result = {"samples": len(inventory.samples), "unchanged_since": same}
        if same is None:
            cand = stage(spec.output.dir)
            summary = step("write", write_version, spec, inventory, cand, inputs=inputs)
            report = step("verify", verify_candidate, cand)
            assert report.ok, report.errors
            result["path"] = step("publish", publish_candidate, cand, report)
            t = summary.timings
            result.update(version=cand.number, stored=summary.samples,
                          **{k: t.get(k) for k in ("reused", "cleaned", "resumed_rows", "reused_chunks_copied",
                                                   "reused_rows_rewritten", "cleaned_in", "cluster_start_seconds")})
    result.update(seconds=round(time.perf_counter() - t0, 3), steps=steps)
    return result


def link_copy(src: Path, dst: Path) -> Path:
    """A raw folder hard-linked (changed files are replaced, never written in place)."""
    shutil.rmtree(dst, ignore_errors=True)
    return shutil.copytree(src, dst, copy_function=os.link, ignore=shutil.ignore_patterns(".complete"))


def change(raw: Path, spare: Path, k: int) -> dict:
    """``k`` pictures changed (inverted), ``k`` samples removed, ``k`` added from ``spare``."""
    from PIL import Image, ImageOps

    records = json.loads((raw / "annotations.json").read_text())
    step = max(1, len(records) // (2 * k + 1))
    picked = [r["id"] for r in records[::step]][: 2 * k]
    changed, removed = picked[0::2], picked[1::2]
    for sid in changed:
        path = raw / "images" / f"{sid}.png"
        with Image.open(path) as img:
            inverted = ImageOps.invert(img.convert("RGB"))
        path.unlink()  # hard-linked to the cached raw folder
        inverted.save(path)
    for sid in removed:
        for folder in ("images", "masks"):
            (raw / folder / f"{sid}.png").unlink()
    extra = json.loads((spare / "annotations.json").read_text())[:k]
    for rec in extra:
        for folder in ("images", "masks"):
            shutil.copy(spare / folder / f"{rec['id']}.png", raw / folder / f"new_{rec['id']}.png")
    records = [r for r in records if r["id"] not in set(removed)] + [{**r, "id": f"new_{r['id']}"} for r in extra]
    (raw / "annotations.json").unlink()
    (raw / "annotations.json").write_text(json.dumps(records))
    return {"changed": len(changed), "removed": len(removed), "added": len(extra)}


def same_content(a: str, b: str) -> dict:
    """Ids, checksums (every value of a row) and split statistics of two versions, compared."""
    diffs = []
    with h5py.File(a, "r") as f, h5py.File(b, "r") as g:
        for s in SPLITS:
            for name in ("ids", "checksum"):
                if not np.array_equal(f[s][name][()], g[s][name][()]):
                    diffs.append(f"{s}/{name}")
            for key, value in f[s].attrs.items():
                if key not in ("digest", "DIMENSION_LIST") and not np.array_equal(value, g[s].attrs[key]):
                    diffs.append(f"{s}@{key}")
        rows = sum(int(f[s].attrs["count"]) for s in SPLITS)
    return {"identical": not diffs, "rows_compared": rows, "differences": diffs}


def killed_build(spec_file: Path) -> dict:
    """A build in a child process, SIGKILLed by the library's fault hook at 80 % of its samples;
    its dask worker processes are ended after it (by pid)."""
    env = {**os.environ, "H5FORGE_KILL_AT": "build:at-80%"}
    t0 = time.perf_counter()
    child = subprocess.Popen([sys.executable, "-m", "benchmarks.nightly", "--child-build", str(spec_file)],
                             cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen: dict[int, psutil.Process] = {}
    while child.poll() is None:
        try:
            seen.update({p.pid: p for p in psutil.Process(child.pid).children(recursive=True)})
        except psutil.NoSuchProcess:
            pass
        time.sleep(0.2)
    output = child.stdout.read()
    for p in seen.values():  # workers of the killed build's LocalCluster
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    if child.returncode != -signal.SIGKILL:
        raise RuntimeError(f"the build was not killed (exit {child.returncode}):\n{output[-2000:]}")
    return {"seconds_until_killed": round(time.perf_counter() - t0, 3)}


def round_trip(raw0: Path, spare: Path, args, r: int) -> dict:
    from h5forge.ingest.incremental.hash_cache import RACY_SECONDS

    raw = link_copy(raw0, WORK / "raw")
    time.sleep(RACY_SECONDS)  # a nightly's inputs are older than the racy window (the links moved their ctime)
    out = WORK / "out"
    shutil.rmtree(out, ignore_errors=True)
    spec = make_spec(raw, out, args.size)
    res = {"full": build(spec)}
    log(f"round {r}: full build {res['full']['seconds']} s {res['full']['steps']}")
    res["unchanged"] = build(spec)
    log(f"round {r}: unchanged rebuild {res['unchanged']['seconds']} s, unchanged since v{res['unchanged']['unchanged_since']}")
    res["change"] = change(raw, spare, max(1, round(args.n * args.change / 3)))
    res["one_percent"] = build(spec)
    log(f"round {r}: 1 % changed {res['one_percent']['seconds']} s {res['one_percent']['steps']}, "
        f"reused {res['one_percent']['reused']}, cleaned {res['one_percent']['cleaned']}")
    ref_out = WORK / "reference"
    shutil.rmtree(ref_out, ignore_errors=True)
    res["reference_full"] = build(make_spec(raw, ref_out, args.size))
    res["one_percent_vs_full_rebuild"] = same_content(res["one_percent"]["path"], res["reference_full"]["path"])

    resume_out = WORK / "resume"
    shutil.rmtree(resume_out, ignore_errors=True)
    spec_file = write_spec(make_spec(raw, resume_out, args.size), WORK / "resume.yaml")
    res["killed"] = killed_build(spec_file)
    res["resumed"] = build(make_spec(raw, resume_out, args.size))
    log(f"round {r}: killed after {res['killed']['seconds_until_killed']} s; resumed build {res['resumed']['seconds']} s "
        f"{res['resumed']['steps']}, {res['resumed']['resumed_rows']} rows taken over")
    res["resumed_vs_full_rebuild"] = same_content(res["resumed"]["path"], res["reference_full"]["path"])
    return res


def append_scaling(args) -> dict:
    """Goal: appending to a large dataset costs what appending to a small one costs. 100 new samples
    onto a --append-large and a --append-small base (benchmarks/append.py's bases and steps),
    interleaved, medians; ``known_samples`` is the exactly-once lookup, the step the inputs catalog
    replaced (it read every id and raw-file hash of the parent)."""
    from benchmarks.append import WORK as APPEND_WORK, append_steps, build_base, copy_base, fill_inbox

    APPEND_WORK.mkdir(parents=True, exist_ok=True)
    src = raw_folder(args.append_new, 64, seed=7)
    bases = {k: build_base(raw_folder(n, 64), n, 64) for k, n in (("small", args.append_small),
                                                                  ("large", args.append_large))}
    trials = {k: [] for k in bases}
    for r in range(args.append_repeats + 1):  # the first round warms up
        for key, (base, info) in bases.items():
            out = copy_base(base, APPEND_WORK / "trial-out")
            inbox = fill_inbox(src, APPEND_WORK / "trial-inbox", 0, args.append_new, "new_")
            load = loadavg()[0]
            t = append_steps(make_spec(info["raw"], out, 64), out, inbox, args.append_new) | {"loadavg_before": load}
            if r:
                trials[key].append(t)
            log(f"append round {r} {key}: {t['total_seconds']} s, known_samples {t['steps']['known_samples']} s")
    res = {k: {"samples": bases[k][1]["samples"], "base_file_bytes": bases[k][1]["file_bytes"],
               "catalog_bytes": catalog_bytes(bases[k][0] / "dataset_v0001.h5"),
               "median_seconds": med(t["total_seconds"] for t in v), "min_seconds": min(t["total_seconds"] for t in v),
               "median_cpu_seconds": med(t["cpu_seconds"] for t in v),
               "median_known_samples_seconds": med([t["steps"]["known_samples"] for t in v], 5),
               "steps_median": {s: med(t["steps"][s] for t in v) for s in v[0]["steps"]},
               "trials": [{"seconds": t["total_seconds"], "cpu": t["cpu_seconds"], "load": t["loadavg_before"]}
                          for t in v]} for k, v in trials.items()}
    res["ratio_large_vs_small"] = ratio(res["large"]["median_seconds"], res["small"]["median_seconds"])
    res["min_ratio_large_vs_small"] = ratio(res["large"]["min_seconds"], res["small"]["min_seconds"])
    res["cpu_ratio_large_vs_small"] = ratio(res["large"]["median_cpu_seconds"], res["small"]["median_cpu_seconds"])
    res["known_samples_ratio"] = ratio(res["large"]["median_known_samples_seconds"],
                                       res["small"]["median_known_samples_seconds"])
    small, large = res["small"]["steps_median"], res["large"]["steps_median"]
    # a step that grows with the base's size shows here; steps under 0.1 ms are noise
    res["step_ratios_large_vs_small"] = {s: ratio(large[s], small[s], 2) if small[s] > 1e-4 else None for s in small}
    return res


def catalog_bytes(path: Path) -> int:
    """Bytes of a version's inputs catalog: what an append reads of its parent (the exactly-once
    lookup) and copies into the thin version, the part of an append that grows with the parent."""
    from h5forge.format.catalog import INPUTS
    with h5py.File(path, "r") as f:
        return sum(f[INPUTS][name].nbytes for name in ("content", "content_at", "ids"))


def child_build(spec_file: str) -> None:
    from h5forge.spec import load_spec
    build(load_spec(spec_file))


def main() -> None:
    if "--child-build" in sys.argv:
        return child_build(sys.argv[sys.argv.index("--child-build") + 1])
    args = cli(__doc__, dict(n=300, size=64, rounds=1, append_small=100, append_large=300, append_new=20, append_repeats=1),
               n=3000, size=224, rounds=2, change=0.01, append_small=2000, append_large=20000, append_new=100,
               append_repeats=3, no_append=False, only="")
    WORK.mkdir(parents=True, exist_ok=True)
    t_run, mach = time.perf_counter(), machine()
    if args.only == "append":  # the append part alone, in its own result file
        res = append_scaling(args)
        ratios = {"append onto large / onto small": res["ratio_large_vs_small"],
                  "append onto large / onto small, fastest rounds": res["min_ratio_large_vs_small"],
                  "append CPU, large / small": res["cpu_ratio_large_vs_small"],
                  "append exactly-once lookup, large / small": res["known_samples_ratio"]}
        save("nightly_append", {"machine": mach, "args": vars(args), "append": res, "ratios": ratios,
                                "run_seconds": round(time.perf_counter() - t_run, 1)}, args.smoke)
        return
    if args.only:
        raise SystemExit(f"--only {args.only!r}: the only part that runs alone is 'append'")
    raw0 = raw_folder(args.n, args.size)
    spare = raw_folder(max(3, round(args.n * args.change)), args.size, seed=7)
    rounds = [round_trip(raw0, spare, args, r + 1) for r in range(args.rounds)]
    full = med(x["full"]["seconds"] for x in rounds)
    m = {k: med(x[k]["seconds"] for x in rounds) for k in ("full", "unchanged", "one_percent", "resumed", "reference_full")}
    result = {"machine": mach, "args": vars(args), "rounds": rounds, "median_seconds": m,
              "hash_seconds_median": med(x["full"]["steps"]["hash"] for x in rounds),
              "identical_to_full_rebuild": all(x["one_percent_vs_full_rebuild"]["identical"] and
                                               x["resumed_vs_full_rebuild"]["identical"] for x in rounds)}
    if not args.no_append:
        result["append"] = append_scaling(args)
    result["ratios"] = {"unchanged / full": ratio(m["unchanged"], full),
                        "1 % changed / full": ratio(m["one_percent"], full),
                        "resumed after kill at 80 % / full": ratio(m["resumed"], full),
                        "raw-file hashing / full": ratio(result["hash_seconds_median"], full),
                        "append onto large / onto small": result.get("append", {}).get("ratio_large_vs_small"),
                        "append exactly-once lookup, large / small": result.get("append", {}).get("known_samples_ratio")}
    save("nightly", result | {"run_seconds": round(time.perf_counter() - t_run, 1)}, args.smoke)
    if not result["identical_to_full_rebuild"]:
        raise SystemExit("a reused or resumed version differs from a full rebuild; see the results")


if __name__ == "__main__":
    main()
