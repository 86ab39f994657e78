"""The parts of a build and a rebuild the headline benchmarks only show summed: discovery, the exact
histograms, the single writer's CPU, copying a stored chunk (alone with ``--only chunk_copy``), verify's
checksums in one process and two. Method: benchmarks/README.md, "ingest_parts".
"""

import os
import shutil
import time
from pathlib import Path

import h5py
import numpy as np

from h5forge.read._direct import chunk_index

from benchmarks.common import CACHE, built, clean_batches, cli, fresh, least_seconds, log, make_spec, med, parts, ratio
from benchmarks.common import raw_folder, save, warm, write_version

WORK = CACHE / "ingest_parts"


def clean_and_write(spec, inventory, n: int) -> tuple[dict, dict]:
    """(writer, histograms): CPU per sample of each stage on the first ``n`` samples, in this process."""
    import dataclasses
    import pickle

    from h5forge._ingest.clean import encode_rows
    from h5forge._ingest.incremental.inputs import fingerprint
    from h5forge.kinds import stored_kinds
    from h5forge.kinds._pictures import channel_counts
    from h5forge._store.verify import verify_file

    inventory.samples = refs = inventory.samples[:n]
    n, cpu, t = len(refs), time.process_time, {}
    inputs = fingerprint(spec, inventory)  # as the build gives them to the writer
    c0 = cpu()
    plain = clean_batches(spec, inventory.root, refs, encode=False)
    t["clean_batch_without_encode"], c0 = cpu() - c0, cpu()
    encoded = [dataclasses.replace(b, arrays=encode_rows(spec, stored_kinds(spec), b.arrays)) for b in plain]
    t["encode_in_worker"], c0 = cpu() - c0, cpu()
    blobs = [pickle.dumps(b, protocol=5) for b in encoded]
    t["ship_pickle_dumps"], c0 = cpu() - c0, cpu()
    received = [pickle.loads(b) for b in blobs]
    t["ship_pickle_loads"] = cpu() - c0
    for key, batches in (("writer_from_chunks", received), ("writer_compressing", plain)):
        for _ in range(2):  # the first pass pays first-write costs (allocator, HDF5 caches)
            (WORK / "w.h5").unlink(missing_ok=True)
            c0 = cpu()
            write_version(WORK / "w.h5", spec, batches, inputs=inputs)
            t[key] = cpu() - c0
    c0, report = cpu(), verify_file(WORK / "w.h5")
    t["verify"] = cpu() - c0
    assert report.ok, report.errors
    ms = {k: round(1000 * v / n, 3) for k, v in t.items()}
    worker_ms = ms["clean_batch_without_encode"] + ms["encode_in_worker"] + ms["ship_pickle_dumps"]
    writer_ms = ms["writer_from_chunks"] + ms["ship_pickle_loads"]
    writer = {
        "samples": n,
        "cpu_ms_per_sample": ms,
        "bytes_shipped_per_sample": round(sum(map(len, blobs)) / n),
        "projection_samples_per_s": {
            f"{w} workers": round(min(1000 * w / worker_ms, 1000 / writer_ms)) for w in (2, 8, 32, 128)
        },
    }
    blocks = [b.arrays["images"] for b in plain]
    c0 = cpu()
    pairs = [channel_counts(b) for b in blocks]
    c1 = cpu()
    per_channel = [np.stack([np.bincount(b[:, c].ravel(), minlength=256) for c in range(b.shape[1])]) for b in blocks]
    c2 = cpu()
    if not all(np.array_equal(a, b) for a, b in zip(pairs, per_channel)):
        raise RuntimeError("channel_counts differs from a bincount per channel")
    return writer, {
        "pairs_cpu_ms_per_sample": round((c1 - c0) / n * 1e3, 3),
        "bincount_per_channel_cpu_ms_per_sample": round((c2 - c1) / n * 1e3, 3),
    }


def chunk_copy(path: Path, n: int) -> dict:
    """µs per image chunk of the version: read, copied into a new file three ways, written by ``os.pwrite``,
    and the whole file's ``copy_file_range`` (README). Each write goes to a new file, synced and deleted
    after its timing, so none waits for another's dirty pages."""
    warm([path])
    out_path = WORK / "copy.h5"
    with h5py.File(path, "r") as f:
        d, where = f["train"]["images"], []
        n, tail = min(n, d.shape[0]), (0,) * (d.ndim - 1)
        t0, us = time.perf_counter(), {}  # µs per chunk of each way, in the order the results list them
        chunks = [d.id.read_direct_chunk((r, *tail)) for r in range(n)]
        us["read_direct_chunk_us"] = (time.perf_counter() - t0) / n * 1e6
        d.id.chunk_iter(lambda info: where.append((info.byte_offset, info.size)))
        with open(path, "rb") as fh:
            t0 = time.perf_counter()
            for offset, size in where[:n]:
                os.pread(fh.fileno(), size, offset)
            us["pread_us"] = (time.perf_counter() - t0) / n * 1e6

        def into_new_file(copy) -> float:
            with h5py.File(out_path, "w") as out:
                space = h5py.h5s.create_simple((n, *d.shape[1:]), (h5py.h5s.UNLIMITED, *d.shape[1:]))
                dst = h5py.h5d.create(out.id, b"x", d.id.get_type(), space, dcpl=d.id.get_create_plist())
                t0 = time.perf_counter()
                copy(dst.write_direct_chunk)
                out.flush()
                us = (time.perf_counter() - t0) / n * 1e6
            sync_and_remove(out_path)
            return us

        def written(write) -> None:  # chunks read before: the write alone
            for r, (mask, data) in enumerate(chunks):
                write((r, *tail), data, mask)

        def hdf5_copy(write) -> None:
            for r in range(n):
                mask, data = d.id.read_direct_chunk((r, *tail))
                write((r, *tail), data, mask)

        def indexed_copy(write) -> None:
            index, buffer = chunk_index(d), memoryview(bytearray(max(len(c[1]) for c in chunks)))
            with open(path, "rb") as fh:
                for r in range(n):
                    offset, size, mask = index.place(r)
                    os.preadv(fh.fileno(), [buffer[:size]], offset)
                    write((r, *tail), buffer[:size], mask)

        for key, copy in (("write_direct_chunk", written), ("hdf5_copy", hdf5_copy), ("indexed_copy", indexed_copy)):
            us[f"{key}_us"] = into_new_file(copy)
    nbytes = sum(len(c[1]) for c in chunks)
    with open(WORK / "plain.bin", "wb") as fh:
        t0, at = time.perf_counter(), 0
        for _, data in chunks:
            at += os.pwrite(fh.fileno(), data, at)
        us["pwrite_us"] = (time.perf_counter() - t0) / n * 1e6
    sync_and_remove(WORK / "plain.bin")
    with open(path, "rb") as src, open(WORK / "whole.h5", "wb") as dst:
        t0, whole = time.perf_counter(), os.fstat(src.fileno()).st_size
        left = whole
        while left > 0:
            left -= os.copy_file_range(src.fileno(), dst.fileno(), left)
        us["whole_file_copy_us_per_chunk"] = (time.perf_counter() - t0) / (whole / (nbytes / n)) * 1e6
    sync_and_remove(WORK / "whole.h5")
    return {"chunks": n, "chunk_bytes_mean": round(nbytes / n), **{k: round(v, 1) for k, v in us.items()}}


def sync_and_remove(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)
    path.unlink()


def verify_processes(path: Path) -> dict:
    from h5forge._store import verify

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
    smoke = dict(n=120, size=64, clean_n=64, copy_n=100, reps=1)
    args = cli(__doc__, smoke, n=10_000, size=224, clean_n=1000, copy_n=3000, reps=3, only="")
    from h5forge._ingest.discover import discover

    parts(args.only, ("chunk_copy",))  # the only part that runs alone
    fresh(WORK)
    raw = raw_folder(args.n, args.size)
    warm([raw])
    spec = make_spec(raw, WORK / "out", args.size)
    result: dict = {}
    if args.only:
        path = built(spec, f"ingest-parts-n{args.n}-{args.size}")
        rounds = [chunk_copy(path, args.copy_n) for _ in range(args.reps)]
        result["chunk_copy_rounds"] = rounds
        result["chunk_copy"] = c = {k: med(r[k] for r in rounds) for k in rounds[0]}  # medians
        result["ratios"] = {
            "chunk copy us, HDF5 read + write": c["hdf5_copy_us"],
            "chunk copy us, indexed pread + write (a rebuild's)": c["indexed_copy_us"],
            "indexed copy / HDF5 read + write": ratio(c["indexed_copy_us"], c["hdf5_copy_us"]),
            "indexed copy / pwrite of the same bytes": ratio(c["indexed_copy_us"], c["pwrite_us"]),
        }
        shutil.rmtree(WORK, ignore_errors=True)
        save("ingest_parts_copy", result)
        return
    inventory = discover(spec)
    seconds = round(least_seconds(lambda: discover(spec), args.reps), 3)
    result["discover"] = {"samples": len(inventory.samples), "seconds": seconds}
    path = built(spec, f"ingest-parts-n{args.n}-{args.size}")
    result["chunk_copy"] = c = chunk_copy(path, args.copy_n)
    result["verify"] = v = verify_processes(path)
    result["writer"], result["histograms"] = w, h = clean_and_write(spec, inventory, args.clean_n)
    log(" ".join(f"{k}: {result[k]}" for k in ("discover", "chunk_copy", "verify", "writer", "histograms")))
    result["ratios"] = {
        "histogram CPU, pairs / bincount per channel": ratio(*h.values()),
        "chunk copy us (read + write)": round(c["read_direct_chunk_us"] + c["write_direct_chunk_us"], 1),
        "chunk copy us, indexed pread + write (a rebuild's)": c["indexed_copy_us"],
        "verify 2 processes / 1": ratio(v["2_process_seconds"], v["1_process_seconds"]),
        "writer CPU ms/sample, chunks from the workers": w["cpu_ms_per_sample"]["writer_from_chunks"],
        "writer CPU ms/sample, compressing itself": w["cpu_ms_per_sample"]["writer_compressing"],
    }
    shutil.rmtree(WORK, ignore_errors=True)
    save("ingest_parts", result)


if __name__ == "__main__":
    main()
