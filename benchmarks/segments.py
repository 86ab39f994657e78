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


def writer_part(spec, raw, n: int) -> dict:
    """In one process, CPU ms per sample of the writer's side of a batch: unpickling the batch a
    worker sent with its chunks, or reading its segment file, then ``DatasetWriter.add`` (second of
    two passes each; the first pays first-write costs)."""
    import pickle

    from h5forge.ingest.clean import clean_batch
    from h5forge.ingest.discover import discover
    from h5forge.ingest.segment_files import read_segment, write_segment
    from h5forge.ingest.writer import DatasetWriter

    inventory = discover(spec)
    refs, bs = inventory.samples[:n], spec.compute.batch_size
    batches = [clean_batch(spec, inventory.root, refs[i:i + bs]) for i in range(0, len(refs), bs)]
    sent = [pickle.dumps(b, protocol=5) for b in batches]
    folder = WORK / "segment-files"
    out: dict = {}
    for arm in ("sent", "files"):
        for _ in range(2):
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir(parents=True)
            placed = [pickle.dumps(write_segment(b, folder), protocol=5) for b in batches]  # what a worker returns
            path = WORK / "writer.h5"
            path.unlink(missing_ok=True)
            c = time.process_time()
            with DatasetWriter(path, spec, version=1) as w:
                for blob in (sent if arm == "sent" else placed):
                    batch = pickle.loads(blob)
                    w.add(batch if arm == "sent" else read_segment(batch, folder))
                t_add = time.process_time() - c
                w.finish()
            out[arm] = {"receive_and_add_ms_per_sample": round(1000 * t_add / len(refs), 4),
                        "bytes_received_per_sample": round(sum(map(len, sent if arm == "sent" else placed)) / len(refs))}
    return out


def main() -> None:
    args = cli(__doc__, dict(n=96, size=64, workers=2, reps=1), n=1000, size=224, workers=2, reps=2)
    raw = raw_folder(args.n, args.size)
    warm([raw])
    result = {"machine": machine(), "args": vars(args), "loadavg_start": loadavg()}
    result["writer_in_process"] = writer_part(make_spec(raw, WORK / "parts", args.size), raw, args.n)
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
        "writer_add_files_over_sent": ratio(result["writer_in_process"]["files"]["receive_and_add_ms_per_sample"],
                                            result["writer_in_process"]["sent"]["receive_and_add_ms_per_sample"]),
    })
    save("segments", result, args.smoke)


if __name__ == "__main__":
    main()
