"""The writer's process with the workers' chunks sent through dask against written to segment
files: CPU of the calling process while it cleans on a LocalCluster and writes the version.

    python -m benchmarks.segments [--smoke] [--n 1000 --size 224 --workers 2 --reps 2]

What is measured and how: benchmarks/README.md, section "segments".
"""

import shutil
import time

import h5py

from benchmarks.common import CACHE, cli, loadavg, machine, make_spec, ratio, raw_folder, save, warm

WORK = CACHE / "segments"


def build_once(spec, via_files: bool) -> dict:
    """One build; the calling process's CPU and wall time in the clean-and-write step."""
    import h5forge
    from h5forge.ingest import build, parallel

    shutil.rmtree(spec.output.dir, ignore_errors=True)
    spent: dict = {}
    write_samples, make_folder = build.write_samples, parallel.make_folder

    def timed(*args, **kwargs):
        c, t = time.process_time(), time.perf_counter()
        try:
            return write_samples(*args, **kwargs)
        finally:
            spent["cpu"], spent["wall"] = time.process_time() - c, time.perf_counter() - t

    build.write_samples = timed
    if not via_files:
        parallel.make_folder = lambda spec: None  # the workers send their chunks, as without segment files
    try:
        result = h5forge.build(spec)
    finally:
        build.write_samples, parallel.make_folder = write_samples, make_folder
    with h5py.File(result.path, "r") as f:
        checksums = {s: f[s]["checksum"][()].tobytes() for s in ("train", "val", "test")}
        digests = {s: str(f[s].attrs["digest"]) for s in ("train", "val", "test")}
    return {"samples": sum(result.counts.values()),
            "cpu": spent["cpu"], "wall": spent["wall"], "checksums": checksums, "digests": digests}


def main() -> None:
    args = cli(__doc__, dict(n=96, size=64, workers=2, reps=1), n=1000, size=224, workers=2, reps=2)
    raw = raw_folder(args.n, args.size)
    warm([raw])
    result = {"machine": machine(), "args": vars(args), "loadavg_start": loadavg()}
    runs: dict[str, list[dict]] = {"sent": [], "files": []}
    for _ in range(args.reps):
        for arm in ("sent", "files"):  # interleaved: the machine's load changes during the run
            spec = make_spec(raw, WORK / arm, args.size,
                             compute={"workers": args.workers, "inline_below": 0})
            runs[arm].append(build_once(spec, arm == "files"))
    same = all(r["checksums"] == runs["sent"][0]["checksums"] and r["digests"] == runs["sent"][0]["digests"]
               for arm in runs.values() for r in arm)
    if not same:
        raise RuntimeError("the versions differ between the arms")
    n = runs["sent"][0]["samples"]
    best = {arm: {"cpu_ms_per_sample": round(1000 * min(r["cpu"] for r in rs) / n, 4),
                  "wall_seconds": round(min(r["wall"] for r in rs), 3)} for arm, rs in runs.items()}
    result.update(samples=n, same_version=same, writer_process=best, ratios={
        "writer_cpu_files_over_sent": ratio(best["files"]["cpu_ms_per_sample"], best["sent"]["cpu_ms_per_sample"]),
        "clean_write_wall_files_over_sent": ratio(best["files"]["wall_seconds"], best["sent"]["wall_seconds"]),
    })
    save("segments", result, args.smoke)


if __name__ == "__main__":
    main()
