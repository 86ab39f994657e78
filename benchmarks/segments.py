"""Three ways the workers' rows reach the version (sent through dask, chunk files the publisher copies,
segment files the version maps): the publisher's CPU, the bytes each moves, the projection to many
workers, the builds, and reading a segments version. Method: benchmarks/README.md, "segments".
"""

import os
import pickle
import shutil
import time
from pathlib import Path

import h5py

from benchmarks.common import CACHE, clean_batches, cli, folder_bytes, fresh, latencies_us, make_spec, med, percentiles
from benchmarks.common import ratio, raw_folder, save, version_identity, warm

WORK = CACHE / "segments"
ARMS = ("sent", "files", "segments")
WORKERS = (2, 8, 32, 128)
# shared storage assumed for the projection: a 10 GbE link (NFS, a parallel file system's client),
# for the storage's total traffic and for the publisher's own link alike
BANDWIDTH_BYTES_PER_S = 1.25e9


def build_once(spec, arm: str) -> dict:
    """One build; the calling process's CPU and wall time in the clean-and-write step."""
    import h5forge
    from h5forge._ingest import build, parallel

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
    if arm == "sent":
        parallel.make_folder = lambda spec: None  # the workers send their chunks, as without segment files
    try:
        result = h5forge.build(spec)
    finally:
        build.write_samples, parallel.make_folder = write_samples, make_folder
    with h5py.File(result.path, "r") as f:
        virtual = f["train/images"].is_virtual
    return {
        "samples": sum(result.counts.values()),
        "path": result.path,
        "virtual": virtual,
        "cpu": spent["cpu"],
        "wall": spent["wall"],
        "identity": version_identity(result.path),
    }


def _arm_once(spec, arm: str, batches: list, repeat: int) -> dict:
    """One pass of an arm: the workers' writes of ``batches`` after cleaning, then the publisher
    taking them ``repeat`` times over (its cost per row does not depend on what the rows hold)."""
    from h5forge._ingest.assemble import MappedWriter, write_row_file
    from h5forge._ingest.chunk_files import read_chunk_file, write_chunk_file
    from h5forge._ingest.writer import DatasetWriter

    chunk_folder, path = fresh(WORK / "chunk-files"), fresh(WORK / "publisher") / "dataset_v0001.h5"
    c = time.process_time()
    opened = MappedWriter(path, spec, version=1) if arm == "segments" else None
    t_open = time.process_time() - c
    c = time.process_time()
    if arm == "sent":
        returned = [pickle.dumps(b, protocol=5) for b in batches]
    elif arm == "files":
        returned = [pickle.dumps(write_chunk_file(b, chunk_folder), protocol=5) for b in batches]
    else:
        returned = [pickle.dumps(write_row_file(b, spec, opened.row_files_to), protocol=5) for b in batches]
    worker_write = time.process_time() - c
    wrote = folder_bytes(chunk_folder) if arm == "files" else folder_bytes(opened.folder) if arm == "segments" else 0
    if arm == "files":  # the publisher deletes each chunk file it reads: one per batch it takes
        extra = chunk_folder / "again"
        extra.mkdir()
        returned += [pickle.dumps(write_chunk_file(b, extra), protocol=5) for _ in range(repeat - 1) for b in batches]
    else:
        returned *= repeat
    c = time.process_time()
    with opened or DatasetWriter(path, spec, version=1) as w:
        for blob in returned:
            batch = pickle.loads(blob)
            if arm == "files":
                batch = read_chunk_file(batch, chunk_folder if (chunk_folder / _file_of(batch)).exists() else extra)
            w.add(batch)
        t_add = time.process_time() - c
        w.finish()
    return {
        "worker_write": worker_write,
        "add": t_add,
        "all": time.process_time() - c + t_open,
        "wrote": wrote,
        "returned": sum(map(len, returned)),
        "version_bytes": path.stat().st_size,
    }


def _file_of(batch) -> str:
    from h5forge._ingest.chunk_files import ChunkFileRows

    return next(b.file for b in batch.arrays.values() if isinstance(b, ChunkFileRows))


def _best(spec, arm: str, batches: list, repeat: int) -> dict:
    """Per figure, the least of three passes (the first pays first-write costs; the machine is shared)."""
    passes = [_arm_once(spec, arm, batches, repeat) for _ in range(3)]
    return {k: min(p[k] for p in passes) for k in passes[0]}


def publisher_part(spec, n: int) -> dict:
    """In one process, per arm: the workers' side of each batch after cleaning, then the publisher's,
    taking the ``n`` samples' batches twice and eight times over (README, "in_process")."""
    from h5forge._ingest.discover import discover

    inventory = discover(spec)
    refs = inventory.samples[:n]
    c = time.process_time()
    batches = clean_batches(spec, inventory.root, refs)
    clean_ms = 1000 * (time.process_time() - c) / len(refs)
    kept = sum(len(b) for b in batches)
    few, many = 2, 8
    out: dict = {
        "clean_ms_per_sample": round(clean_ms, 4),
        "samples": kept,
        "publisher_rows": [few * kept, many * kept],
    }
    for arm in ARMS:
        small, large = _best(spec, arm, batches, few), _best(spec, arm, batches, many)
        marginal = (large["all"] - small["all"]) / ((many - few) * kept)
        out[arm] = {
            "worker_write_ms_per_sample": round(1000 * small["worker_write"] / kept, 4),
            "publisher_add_ms_per_sample": round(1000 * large["add"] / (many * kept), 4),
            "publisher_all_ms_per_sample": round(1000 * large["all"] / (many * kept), 4),
            "publisher_ms_per_sample": round(1000 * marginal, 4),
            "publisher_fixed_ms": round(1000 * (large["all"] - marginal * many * kept), 1),
            "bytes_to_publisher_per_sample": round(large["returned"] / (many * kept)),
            "bytes_workers_write_per_sample": round(small["wrote"] / kept),
            "bytes_publisher_reads_per_sample": round(small["wrote"] / kept) if arm == "files" else 0,
            "bytes_publisher_writes_per_sample": round(large["version_bytes"] / (many * kept)),
        }
    shutil.rmtree(WORK / "publisher", ignore_errors=True)
    shutil.rmtree(WORK / "chunk-files", ignore_errors=True)
    return out


def projection(parts: dict) -> dict:
    """Samples/s at each number of workers, per arm: the least of the workers', the publisher's, the
    shared storage's and the publisher's own link's (README, "projection")."""
    out: dict = {"bandwidth_assumed_bytes_per_s": BANDWIDTH_BYTES_PER_S}
    for arm in ARMS:
        p = parts[arm]
        worker_ms = parts["clean_ms_per_sample"] + p["worker_write_ms_per_sample"]
        publisher_io = p["bytes_publisher_reads_per_sample"] + p["bytes_publisher_writes_per_sample"]
        storage = p["bytes_workers_write_per_sample"] + publisher_io
        link = p["bytes_to_publisher_per_sample"] + publisher_io
        caps = {
            "publisher": 1000 / p["publisher_ms_per_sample"],
            "storage": BANDWIDTH_BYTES_PER_S / storage,
            "publisher_link": BANDWIDTH_BYTES_PER_S / link,
        }
        rows = {}
        for w in WORKERS:
            limits = {"workers": w * 1000 / worker_ms, **caps}
            by = min(limits, key=limits.get)
            rows[f"{w}_workers"] = {"samples_per_s": round(limits[by]), "limited_by": by}
        out[arm] = {
            "worker_ms_per_sample": round(worker_ms, 4),
            "storage_bytes_per_sample": storage,
            "publisher_link_bytes_per_sample": link,
            **{f"cap_{k}_samples_per_s": round(v) for k, v in caps.items()},
            **rows,
        }
    return out


def read_part(paths: dict[str, Path], workers: int, reps: int) -> dict:
    """A ds.loader() epoch and the median of 500 random single-sample h5py reads, each version, interleaved."""
    import numpy as np

    from h5forge.read.torch import H5Dataset

    rates: dict[str, list] = {k: [] for k in paths}
    single: dict[str, list] = {k: [] for k in paths}
    warm([p for path in paths.values() for p in [path, *Path(path).parent.rglob("*.h5")]])
    for r in range(reps):
        for k, p in paths.items():
            ds = H5Dataset(p, "train", ("images", "masks"))
            t = time.perf_counter()
            n = sum(x.shape[0] for x, _ in ds.loader(batch_size=32, num_workers=workers, shuffle=True, seed=r))
            rates[k].append(round(n / (time.perf_counter() - t), 1))
            ds.close()
            with h5py.File(os.path.realpath(p), "r") as f:
                images = f["train/images"]
                order = np.random.default_rng(r).integers(0, images.shape[0], 500).tolist()
                single[k].append(percentiles(latencies_us(images.__getitem__, order), (50,))["p50_us"])
    return {
        "loader_samples_per_s": rates,
        "random_read_p50_us": single,
        "loader_segments_over_copy": ratio(med(rates["segments"]), med(rates["files"])),
        "random_read_p50_segments_over_copy": ratio(med(single["segments"]), med(single["files"])),
        # each round's ratio: a random read's p50 moves between rounds more than between versions
        "rounds": {
            "loader_segments_over_copy": list(map(ratio, rates["segments"], rates["files"])),
            "random_read_p50_segments_over_copy": list(map(ratio, single["segments"], single["files"])),
        },
    }


def mapping_scaling(counts=(16, 160, 1600), rows: int = 64, reads: int = 500) -> dict:
    """A random row read (h5py, p50 µs) of a virtual dataset over ``k`` files of ``rows`` rows each against
    the same rows in one chunked dataset: what a read pays per mapping (HDF5 looks at them for each read)."""
    import numpy as np

    from h5forge._format.row_files import map_virtual

    out, folder = {}, WORK / "mappings"
    for k in counts:
        fresh(folder)
        data = np.random.default_rng(k).integers(0, 255, (k * rows, 3, 16, 16), dtype=np.uint8)
        for i in range(k):
            with h5py.File(folder / f"s{i}.h5", "w") as f:
                f.create_dataset("train/x", data=data[i * rows : (i + 1) * rows], chunks=(1, 3, 16, 16))
        with h5py.File(folder / "one.h5", "w") as f:
            f.create_dataset("train/x", data=data, chunks=(1, 3, 16, 16))
        segments = [{"file": f"s{i}.h5", "counts": {"train": rows}} for i in range(k)]
        with h5py.File(folder / "vds.h5", "w") as f, h5py.File(folder / "s0.h5", "r") as like:
            map_virtual(f.require_group("train"), "x", like["train/x"], segments, "train")
        p50 = {}
        for name in ("one", "vds"):
            with h5py.File(folder / f"{name}.h5", "r") as f:
                ds = f["train/x"]
                order = np.random.default_rng(0).integers(0, k * rows, reads).tolist()
                latencies_us(ds.__getitem__, order[:50])  # every source opened once, as a reader's first epoch does
                p50[name] = percentiles(latencies_us(ds.__getitem__, order), (50,))["p50_us"]
        out[f"{k}_files"] = {
            **{f"{n}_p50_us": v for n, v in p50.items()},
            "vds_over_one": ratio(p50["vds"], p50["one"]),
        }
    shutil.rmtree(folder, ignore_errors=True)
    return out


def main() -> None:
    args = cli(__doc__, dict(n=96, size=64, workers=2, reps=1), n=1000, size=224, workers=2, reps=2)
    raw = raw_folder(args.n, args.size)
    warm([raw])
    result: dict = {}
    parts = publisher_part(make_spec(raw, WORK / "parts", args.size), args.n)
    result["in_process"] = parts
    result["projection"] = projection(parts)
    runs: dict[str, list[dict]] = {arm: [] for arm in ARMS}
    for _ in range(args.reps):
        for arm in ARMS:  # interleaved: the machine's load changes during the run
            assemble = {"assemble": "mapped" if arm == "segments" else "copy"}
            spec = make_spec(raw, WORK / arm, args.size, args.workers, storage=assemble)
            runs[arm].append(build_once(spec, arm))
    first = runs["sent"][0]
    same = all(r["identity"] == first["identity"] for arm in runs.values() for r in arm)
    if not same or not all(r["virtual"] for r in runs["segments"]):
        raise RuntimeError("the versions differ between the arms, or the segments arm copied its rows")
    n = first["samples"]
    best = {}
    for arm, rs in runs.items():
        cpu_ms, wall = 1000 * min(r["cpu"] for r in rs) / n, min(r["wall"] for r in rs)
        best[arm] = {"cpu_ms_per_sample": round(cpu_ms, 4), "wall_seconds": round(wall, 3)}
    result.update(samples=n, same_version=same, build_calling_process=best)
    last = {arm: Path(runs[arm][-1]["path"]) for arm in ("files", "segments")}
    result["read"] = read_part(last, args.workers, args.reps)
    result["read_mappings"] = mapping_scaling((4, 16) if args.smoke else (16, 160, 1600))
    publisher = {arm: parts[arm]["publisher_ms_per_sample"] for arm in ("segments", "files")}
    build = {k: ratio(best["segments"][k], best["files"][k]) for k in ("cpu_ms_per_sample", "wall_seconds")}
    result["ratios"] = {
        "publisher_ms_segments": publisher["segments"],
        "publisher_ms_copy_files": publisher["files"],
        "publisher_segments_over_copy_files": ratio(publisher["segments"], publisher["files"]),
        "build_cpu_segments_over_copy_files": build["cpu_ms_per_sample"],
        "build_wall_segments_over_copy_files": build["wall_seconds"],
        "loader_segments_over_copy": result["read"]["loader_segments_over_copy"],
        "random_read_p50_segments_over_copy": result["read"]["random_read_p50_segments_over_copy"],
    }
    result["spread"] = {k: [min(v), max(v)] for k, v in result["read"]["rounds"].items()}
    save("segments", result)


if __name__ == "__main__":
    main()
