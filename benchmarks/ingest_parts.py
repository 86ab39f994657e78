"""The parts of a build and a rebuild that the headline benchmarks only show summed: discovery, the
exact histograms, copying a stored chunk, finding the files a version reads, and verify's
checksums in one process against several. One run, on the build_peers corpus.

    python -m benchmarks.ingest_parts [--smoke] [--n 10000 --size 224 --hist-n 2000 --copy-n 3000 --reps 3]
                                      [--walk-also PATH,...]

- **discover**: ``discover(spec)`` on the raw folder (page cache warm), best of ``--reps``;
- **histograms**: CPU ms a sample of ``channel_counts`` (two pixels a bincount) against one
  ``np.bincount`` per channel, per cleaned batch (``compute.batch_size`` rows, as a build counts
  them), on ``--hist-n`` samples; the counts must be equal;
- **chunk copy**: on a version built from the corpus, µs a chunk of ``read_direct_chunk`` of the
  images, of ``os.pread`` of the same bytes, and of ``write_direct_chunk`` into a new file
  (what a nightly rebuild does for each unchanged sample), over ``--copy-n`` rows;
- **files a version reads**: ms of ``format.segments.virtual_sources``'s walk (links, then each
  dataset opened) against h5py's ``visititems``, on that version and on any ``--walk-also``
  versions (comma-separated paths, e.g. the append benchmark's 100k base);
- **verify**: wall seconds of the checksum pass of that version with 1 and with 2 processes
  (``verify_file(workers=...)``, the threshold lowered so both apply at every size).
"""

import os
import shutil
import time
from pathlib import Path

import h5py
import numpy as np

from benchmarks.common import CACHE, cli, loadavg, log, machine, make_spec, ratio, raw_folder, save, warm

WORK = CACHE / "ingest_parts"


def best(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def histograms(spec, refs, raw: Path) -> dict:
    from h5forge.ingest.clean import clean_batch
    from h5forge.kinds.image import channel_counts

    size = spec.compute.batch_size  # the build counts each cleaned batch
    blocks = [clean_batch(spec, raw, refs[i:i + size], encode=False).arrays["images"] for i in range(0, len(refs), size)]
    c0 = time.process_time()
    pairs = [channel_counts(b) for b in blocks]
    c1 = time.process_time()
    per_channel = [np.stack([np.bincount(b[:, c].ravel(), minlength=256) for c in range(b.shape[1])]) for b in blocks]
    c2 = time.process_time()
    if not all(np.array_equal(a, b) for a, b in zip(pairs, per_channel)):
        raise RuntimeError("channel_counts differs from a bincount per channel")
    n = sum(len(b) for b in blocks)
    return {"samples": n, "pairs_cpu_ms_per_sample": round((c1 - c0) / n * 1e3, 3),
            "bincount_per_channel_cpu_ms_per_sample": round((c2 - c1) / n * 1e3, 3)}


def build_version(spec) -> Path:
    from h5forge.ingest.build import publish_candidate, verify_candidate, write_version
    from h5forge.ingest.discover import discover
    from h5forge.store.versions import output_lock, stage

    with output_lock(spec.output.dir):
        cand = stage(spec.output.dir)
        write_version(spec, discover(spec), cand)
        return Path(publish_candidate(cand, verify_candidate(cand)))


def chunk_copy(path: Path, n: int) -> dict:
    with h5py.File(path, "r") as f:
        d = f["train"]["images"]
        n = min(n, d.shape[0])
        tail = (0,) * (d.ndim - 1)
        t = time.perf_counter()
        chunks = [d.id.read_direct_chunk((r, *tail)) for r in range(n)]
        read_s = time.perf_counter() - t
        where = []
        d.id.chunk_iter(lambda info: where.append((info.byte_offset, info.size)))
        fd = os.open(path, os.O_RDONLY)
        try:
            t = time.perf_counter()
            for offset, size in where[:n]:
                os.pread(fd, size, offset)
            pread_s = time.perf_counter() - t
        finally:
            os.close(fd)
        target = WORK / "copy.h5"
        with h5py.File(target, "w") as out:
            space = h5py.h5s.create_simple((n, *d.shape[1:]), (h5py.h5s.UNLIMITED, *d.shape[1:]))
            dst = h5py.h5d.create(out.id, b"x", d.id.get_type(), space, dcpl=d.id.get_create_plist())
            t = time.perf_counter()
            for r, (mask, data) in enumerate(chunks):
                dst.write_direct_chunk((r, *tail), data, mask)
            out.flush()
            write_s = time.perf_counter() - t
        target.unlink()
    return {"chunks": n, "chunk_bytes_mean": round(sum(len(c[1]) for c in chunks) / n),
            "read_direct_chunk_us": round(read_s / n * 1e6, 1), "pread_us": round(pread_s / n * 1e6, 1),
            "write_direct_chunk_us": round(write_s / n * 1e6, 1)}


def files_read(paths: list[Path], reps: int) -> dict:
    """What retention asks of every kept version, the files its virtual datasets read: the walk
    ``format.segments.virtual_sources`` does (links, then each dataset opened) against h5py's
    ``visititems``, which asks HDF5 for each object's full info, chunk index included."""
    from h5forge.format.segments import virtual_sources

    def visititems(f: h5py.File) -> None:
        def visit(_name, obj):  # returns None: visititems stops at the first other value
            if isinstance(obj, h5py.Dataset) and obj.is_virtual:
                obj.virtual_sources()
        f.visititems(visit)

    out = {}
    for path in paths:
        with h5py.File(path, "r") as f:
            rows = sum(int(f[s].attrs.get("count", 0)) for s in ("train", "val", "test"))
        times = {}
        for name, fn in (("links_walk_ms", virtual_sources), ("visititems_ms", visititems)):
            def once(fn=fn):
                with h5py.File(path, "r") as f:
                    fn(f)
            times[name] = round(best(once, reps) * 1e3, 2)
        out[f"{rows} rows"] = times
    return out


def verify_processes(path: Path) -> dict:
    from h5forge.store import verify

    saved, verify.PARALLEL_ROWS = verify.PARALLEL_ROWS, 1
    try:
        out = {}
        for workers in (1, 2, 1, 2):  # interleaved; the second of each kept (the first warms the cache)
            t = time.perf_counter()
            report = verify.verify_file(path, workers=workers, resample=0, latency_reads=0)
            if not report.ok:
                raise RuntimeError(report.errors)
            out[f"{workers}_process_seconds"] = round(time.perf_counter() - t, 3)
        out["rows"] = report.stats["checksums_checked"]
        return out
    finally:
        verify.PARALLEL_ROWS = saved


def main() -> None:
    args = cli(__doc__, dict(n=120, size=64, hist_n=64, copy_n=100, reps=1),
               n=10_000, size=224, hist_n=2000, copy_n=3000, reps=3, walk_also="")
    from h5forge.ingest.discover import discover

    shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir(parents=True)
    raw = raw_folder(args.n, args.size)
    warm([raw])
    spec = make_spec(raw, WORK / "out", args.size)
    result = {"machine": machine(), "args": vars(args), "loadavg_start": loadavg()}
    inventory = discover(spec)
    result["discover"] = {"samples": len(inventory.samples), "seconds": round(best(lambda: discover(spec), args.reps), 3)}
    log(f"discover: {result['discover']}")
    result["histograms"] = h = histograms(spec, inventory.samples[:args.hist_n], raw)
    log(f"histograms: {h}")
    path = build_version(spec)
    result["chunk_copy"] = c = chunk_copy(path, args.copy_n)
    log(f"chunk copy: {c}")
    result["files_read"] = w = files_read([path, *map(Path, args.walk_also.split(",") if args.walk_also else [])],
                                          args.reps)
    log(f"files a version reads: {w}")
    result["verify"] = v = verify_processes(path)
    log(f"verify: {v}")
    result["ratios"] = {
        "histogram CPU, pairs / bincount per channel": ratio(h["pairs_cpu_ms_per_sample"],
                                                             h["bincount_per_channel_cpu_ms_per_sample"]),
        "chunk copy us (read + write)": round(c["read_direct_chunk_us"] + c["write_direct_chunk_us"], 1),
        "verify 2 processes / 1": ratio(v["2_process_seconds"], v["1_process_seconds"]),
    }
    shutil.rmtree(WORK, ignore_errors=True)
    save("ingest_parts", result, args.smoke)


if __name__ == "__main__":
    main()
