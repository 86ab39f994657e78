"""Nightly rebuilds (unchanged, 1 % changed, resumed after a SIGKILL) against a full build; appends onto
a large vs a small dataset. Method: benchmarks/README.md, "nightly".
"""

import contextlib
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

from benchmarks.common import CACHE, REPO, built, cli, figures, log, make_spec, med, parts, ratio, raw_folder, save
from benchmarks.common import small_pictures, timing_runner, write_spec

WORK = CACHE / "nightly"
APPEND_RATIOS = {
    "append onto large / onto small": "append.ratio_large_vs_small",
    "append CPU, large / small": "append.cpu_ratio_large_vs_small",
    "append write-delta (exactly-once lookup inside), large / small": "append.step_ratios_large_vs_small.write-delta",
}
SPLITS = ("train", "val", "test")
# what each build's result says of its work, kept beside its wall seconds and its steps'
TIMINGS = (
    "reused cleaned resumed_rows resumed_in_place resumed_damaged_rows reused_chunks_copied reused_copy_seconds"
    " cluster_start_seconds"
).split()


def build(spec) -> dict:
    import h5forge

    runner, t0 = timing_runner(), time.perf_counter()
    res = h5forge.build(spec, runner=runner)
    t = res.timings
    return {
        "seconds": round(time.perf_counter() - t0, 3),
        "steps": runner.seconds,
        "unchanged": res.unchanged,
        "version": res.version,
        "path": res.path,
        **{k: t.get(k) for k in TIMINGS},
    }


def link_copy(src: Path, dst: Path) -> Path:
    """A copy of a folder, pictures and versions hard-linked (neither is modified in place)."""
    shutil.rmtree(dst, ignore_errors=True)

    def link(s: str, d: str) -> None:
        os.link(s, d) if s.endswith((".h5", ".png")) else shutil.copy2(s, d)

    skip = shutil.ignore_patterns(".complete", ".bench-complete")
    return shutil.copytree(src, dst, symlinks=True, copy_function=link, ignore=skip)


def change(raw: Path, spare: Path, k: int) -> dict:
    """``k`` pictures changed (inverted), ``k`` samples removed, ``k`` added from ``spare``."""
    from PIL import Image, ImageOps

    records = json.loads((raw / "annotations.json").read_text())
    picked = [r["id"] for r in records[:: max(1, len(records) // (2 * k + 1))]][: 2 * k]
    changed, removed = picked[0::2], set(picked[1::2])
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
    (raw / "annotations.json").unlink()
    (raw / "annotations.json").write_text(
        json.dumps([r for r in records if r["id"] not in removed] + [{**r, "id": f"new_{r['id']}"} for r in extra])
    )
    return {"changed": len(changed), "removed": len(removed), "added": len(extra)}


def same_content(a: str, b: str) -> dict:
    """Ids, checksums (every value of a row) and split statistics of two versions, compared."""
    diffs = []
    with h5py.File(a, "r") as f, h5py.File(b, "r") as g:
        for s in SPLITS:
            diffs += [f"{s}/{k}" for k in ("ids", "checksum") if not np.array_equal(f[s][k][()], g[s][k][()])]
            diffs += [
                f"{s}@{k}"
                for k, v in f[s].attrs.items()
                if k not in ("digest", "DIMENSION_LIST") and not np.array_equal(v, g[s].attrs[k])
            ]
    return {"identical": not diffs, "differences": diffs}


def killed_build(spec_file: Path) -> float:
    """Seconds until ``h5forge.build`` in a child is SIGKILLed at 80 % (its dask workers ended after it)."""
    t0, logfile, seen = time.perf_counter(), spec_file.with_suffix(".log"), {}
    child = subprocess.Popen(
        [sys.executable, "-c", f"import h5forge; h5forge.build({str(spec_file)!r})"],
        cwd=REPO,
        env={**os.environ, "H5FORGE_KILL_AT": "build:at-80%"},
        stdout=open(logfile, "w"),
        stderr=subprocess.STDOUT,
    )
    while child.poll() is None:
        with contextlib.suppress(psutil.NoSuchProcess):
            seen |= {p.pid: p for p in psutil.Process(child.pid).children(recursive=True)}
        time.sleep(0.2)
    for p in seen.values():  # workers of the killed build's LocalCluster
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    if child.returncode != -signal.SIGKILL:
        raise RuntimeError(f"the build was not killed (exit {child.returncode}):\n{logfile.read_text()[-2000:]}")
    return round(time.perf_counter() - t0, 3)


def round_trip(raw0: Path, spare: Path, args, r: int) -> dict:
    from h5forge._ingest.incremental.hash_cache import RACY_SECONDS
    from h5forge._init.sections import chunk_rows
    from h5forge.kinds import sample_bytes

    raw = link_copy(raw0, WORK / "raw")
    time.sleep(RACY_SECONDS)  # a nightly's inputs are older than the racy window (the links moved their ctime)
    # the 1 % change removes samples too: a nightly of such a folder allows their removal; samples per
    # chunk as `h5forge init` writes them for this size
    rows = chunk_rows(sample_bytes(make_spec(raw, WORK, args.size)))

    def spec_in(name: str):
        return make_spec(raw, WORK / name, args.size, output={"allow_removals": True}, storage={"chunk_rows": rows})

    for name in ("out", "reference", "resume"):
        shutil.rmtree(WORK / name, ignore_errors=True)
    res = {"full": build(spec := spec_in("out"))}
    res["unchanged"] = build(spec)
    res["change"] = change(raw, spare, max(1, round(args.n * args.change / 3)))
    res["one_percent"] = build(spec)
    res["reference_full"] = build(spec_in("reference"))
    res["one_percent_vs_full_rebuild"] = same_content(res["one_percent"]["path"], res["reference_full"]["path"])
    res["seconds_until_killed"] = killed_build(write_spec(spec_in("resume"), WORK / "resume.yaml"))
    res["resumed"] = build(spec_in("resume"))
    res["resumed_vs_full_rebuild"] = same_content(res["resumed"]["path"], res["reference_full"]["path"])
    log(
        f"round {r}: "
        + ", ".join(f"{k} {res[k]['seconds']} s" for k in ("full", "unchanged", "one_percent", "resumed"))
        + f"; reused {res['one_percent']['reused']}, resumed in place {res['resumed']['resumed_in_place']}"
        + f" (copied {res['resumed']['resumed_rows']})"
    )
    return res


def base(n: int, size: int) -> tuple[Path, Path]:
    """(raw folder, output folder of one published version built from it), cached."""
    raw = raw_folder(n, size)
    return raw, Path(built(make_spec(raw, WORK / "unused", size), f"append-base-n{n}-{size}")).parent


def fill_inbox(src: Path, inbox: Path, count: int) -> Path:
    """The first ``count`` samples of ``src`` into ``inbox`` as new ids, with ``<id>.json`` sidecars, backdated."""
    shutil.rmtree(inbox, ignore_errors=True)
    for rec in json.loads((src / "annotations.json").read_text())[:count]:
        new = "new_" + rec["id"]
        for folder in ("images", "masks"):
            (inbox / folder).mkdir(parents=True, exist_ok=True)
            shutil.copy(src / folder / f"{rec['id']}.png", inbox / folder / f"{new}.png")
        (inbox / f"{new}.json").write_text(json.dumps({**rec, "id": new}))
    for p in inbox.rglob("*"):
        os.utime(p, (time.time() - 3600,) * 2)
    return inbox


def append(raw: Path, out: Path, inbox: Path, size: int, expect: int) -> dict:
    """``h5forge.append`` of the inbox, each step timed."""
    import h5forge

    runner, c0, t0 = timing_runner(), time.process_time(), time.perf_counter()
    res = h5forge.append(make_spec(raw, out, size), inbox=inbox, runner=runner)
    if res.added != expect:
        raise RuntimeError(f"append added {res.added} (expected {expect}): {res.rejections[:3]}")
    return {
        "seconds": round(time.perf_counter() - t0, 4),
        "cpu_seconds": round(time.process_time() - c0, 4),
        "steps": runner.seconds,
    }


def append_scaling(args) -> dict:
    """``--append-new`` samples onto a small and a large base at 64 px, rounds interleaved after a warm-up."""
    src = raw_folder(6 * args.append_new, 64, seed=7)  # the inbox takes the first --append-new of these
    bases = {k: base(n, 64) for k, n in (("small", args.append_small), ("large", args.append_large))}
    trials = {k: [] for k in bases}
    for r in range(args.append_repeats + 1):
        for key, (raw, out) in bases.items():
            load = os.getloadavg()[0]
            inbox = fill_inbox(src, WORK / "inbox", args.append_new)
            t = append(raw, link_copy(out, WORK / "trial-out"), inbox, 64, args.append_new)
            trials[key] += [t | {"load": round(load, 2)}] if r else []
            log(f"append round {r} {key}: {t['seconds']} s {t['steps']}")
    res = {
        k: {
            "median_seconds": med(t["seconds"] for t in v),
            "min_seconds": min(t["seconds"] for t in v),
            "median_cpu_seconds": med(t["cpu_seconds"] for t in v),
            "steps_median": {s: med(t["steps"][s] for t in v) for s in v[0]["steps"]},
            "rounds": [{k2: t[k2] for k2 in ("seconds", "cpu_seconds", "load")} for t in v],
        }
        for k, v in trials.items()
    }
    small, large = res["small"]["steps_median"], res["large"]["steps_median"]
    return res | {
        "ratio_large_vs_small": ratio(res["large"]["median_seconds"], res["small"]["median_seconds"]),
        "min_ratio_large_vs_small": ratio(res["large"]["min_seconds"], res["small"]["min_seconds"]),
        "cpu_ratio_large_vs_small": ratio(res["large"]["median_cpu_seconds"], res["small"]["median_cpu_seconds"]),
        # a step that grows with the base's size shows here; steps under 0.1 ms are noise
        "step_ratios_large_vs_small": {s: ratio(large[s], small[s], 2) if small[s] > 1e-4 else None for s in small},
    }


def main() -> None:
    args = cli(
        __doc__,
        dict(n=300, size=64, rounds=1, append_small=100, append_large=300, append_new=20, append_repeats=1),
        n=3000,
        size=224,
        rounds=2,
        change=0.01,
        append_small=2000,
        append_large=20000,
        append_new=100,
        append_repeats=3,
        no_append=False,
        only="",
    )
    WORK.mkdir(parents=True, exist_ok=True)
    result: dict = {}
    parts(args.only, ("append",))  # the only part that runs alone
    if not args.only:
        raw0 = raw_folder(args.n, args.size)
        spare = raw_folder(max(3, round(args.n * args.change)), args.size, seed=7)
        rounds = [round_trip(raw0, spare, args, r + 1) for r in range(args.rounds)]
        m = {k: med(x[k]["seconds"] for x in rounds) for k in ("full", "unchanged", "one_percent", "resumed")}
        m["reference_full"] = med(x["reference_full"]["seconds"] for x in rounds)
        result |= {
            "rounds": rounds,
            "median_seconds": m,
            "hash_seconds_median": med(x["full"]["steps"]["fingerprint"] for x in rounds),
            "identical_to_full_rebuild": all(
                x["one_percent_vs_full_rebuild"]["identical"] and x["resumed_vs_full_rebuild"]["identical"]
                for x in rounds
            ),
            # the 1 % rebuild's copy of the unchanged rows (chunks and small columns), per stored chunk
            "one_percent_copy_us_per_chunk": med(
                round(x["one_percent"]["reused_copy_seconds"] * 1e6 / x["one_percent"]["reused_chunks_copied"], 1)
                for x in rounds
                if x["one_percent"]["reused_chunks_copied"]
            ),
            "ratios": {
                "unchanged / full": ratio(m["unchanged"], m["full"]),
                "1 % changed / full": ratio(m["one_percent"], m["full"]),
                "resumed after kill at 80 % / full": ratio(m["resumed"], m["full"]),
            },
        }
    if args.only == "append" or not args.no_append:
        result["append"] = append_scaling(args)
        result.setdefault("ratios", {}).update(figures(result, APPEND_RATIOS))
    save("nightly_append" if args.only else "nightly" + small_pictures(args), result)
    if result.get("identical_to_full_rebuild") is False:
        raise SystemExit("a reused or resumed version differs from a full rebuild; see the results")


if __name__ == "__main__":
    main()
