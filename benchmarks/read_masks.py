"""The loader a user gets out of the box on images + masks against a plain DataLoader over memory-mapped
uint8 .npy, masks int64 and uint8; and (``chunks``) small pictures one sample per chunk against several:
the build, the loader and random reads.

    python -m benchmarks.read_masks [--smoke] [--n 8000 --size 224 --rounds 3] [--only masks,chunks]

Method: benchmarks/README.md, "read_masks" (each reader a probe process of benchmarks.read_peers).
"""

import os
import shutil
import sys
from pathlib import Path

from benchmarks.common import (CACHE, cli, interleaved, make_spec, med, own_cpu, random_read_latency, ratio,
                               raw_folder, rounds, sampled, save, warm)
from benchmarks.read_peers import FIELDS, prepare, probe_rounds, save_npy

READERS = ("npy_mmap", "h5forge_lz4_plain", "h5forge_lz4_default", "h5forge_lz4_u8masks")


def masks(args) -> dict:
    got = probe_rounds(dict.fromkeys(READERS, Path(sys.executable)), prepare(args.n, args.size, codecs=("lz4",)), args)
    rate, cpu = got["samples_per_s"], got["loader_cpu_ms_per_batch"]
    return {"ratios": {"default_loader_vs_npy": ratio(rate["h5forge_lz4_default"], rate["npy_mmap"]),
                       "uint8_masks_loader_vs_npy": ratio(rate["h5forge_lz4_u8masks"], rate["npy_mmap"]),
                       "uint8_plain_vs_npy": ratio(rate["h5forge_lz4_plain"], rate["npy_mmap"]),
                       "default_loader_vs_uint8_plain": ratio(rate["h5forge_lz4_default"], rate["h5forge_lz4_plain"]),
                       "cpu_per_batch_uint8_masks_vs_default": ratio(cpu["h5forge_lz4_u8masks"], cpu["h5forge_lz4_default"])},
            **got}


def build_both_ways(raw: Path, work: Path, size: int, n: int, k: int, workers: int) -> tuple[dict, str]:
    """A version of ``k`` rows per chunk built in this process alone, then on a LocalCluster: each build's
    CPU per sample and file bytes, and the second's clean-and-write speed and path."""
    import h5forge
    spec = lambda out, compute: make_spec(raw, out, size, splits={"ratios": {"train": 1.0}},  # noqa: E731
                                          storage={"chunk_rows": k}, compute=compute)
    shutil.rmtree(work / f"inline{k}", ignore_errors=True)
    c0 = own_cpu()
    res = h5forge.build(spec(work / f"inline{k}", {"inline_below": n + 1}))  # no dask: the pipeline alone
    run = {"inline_cpu_ms_per_sample": round(1000 * (own_cpu() - c0) / n, 3), "inline_file_bytes": os.path.getsize(res.path)}
    shutil.rmtree(work / f"k{k}", ignore_errors=True)
    with sampled() as usage:
        res = h5forge.build(spec(work / f"k{k}", {"workers": workers, "inline_below": 0}))
    return run | {"cpu_ms_per_sample": round(1000 * usage["cpu_seconds"] / n, 3), "file_bytes": os.path.getsize(res.path),
                  "clean_write_samples_per_s": round(n / res.timings["clean_write_seconds"])}, res.path


def random_reads(data: Path, ks: list[int], reads: int) -> dict:
    """Random single samples as stored (uint8) through h5forge's reader and through h5py (HDF5's default
    chunk cache), p50/p99; two rounds interleaved, the second kept."""
    import h5py

    from h5forge.read.torch import H5Dataset
    latency: dict[int, dict] = {}
    for r, k in interleaved(ks, 2):
        ds = H5Dataset(data / f"lz4k{k}.h5", "train", FIELDS)
        with h5py.File(data / f"lz4k{k}.h5", "r") as f:
            plain = [f["train"][name] for name in FIELDS]
            latency[k] = {"h5forge": random_read_latency(ds.reader.read_one, len(ds), reads, r),
                          "h5py": random_read_latency(lambda i, plain=plain: [d[i] for d in plain], len(ds), reads, r)}
    return latency


def chunks(args) -> dict:
    n, size, ks = args.chunk_n, args.chunk_size, [int(k) for k in args.chunk_rows.split(",")]
    warm([raw := raw_folder(n, size, size_range=(size, size))])
    data, work = CACHE / "read_masks_chunks" / f"n{n}-{size}", CACHE / "read_masks_chunks" / "work"
    data.mkdir(parents=True, exist_ok=True)

    def build(k: int, r: int) -> dict:
        run, path = build_both_ways(raw, work, size, n, k, args.workers)
        shutil.rmtree(data / f"k{k}", ignore_errors=True)
        os.replace(work / f"k{k}", data / f"k{k}")  # the last round's version is the one read
        (data / f"lz4k{k}.h5").unlink(missing_ok=True)
        (data / f"lz4k{k}.h5").symlink_to(data / f"k{k}" / Path(path).name)
        return run

    runs = rounds(ks, args.rounds, build)
    save_npy(data, data / f"lz4k{ks[0]}.h5", n)  # the .npy the loaders are checked against
    got = probe_rounds(dict.fromkeys(["npy_mmap", *(f"h5forge_lz4k{k}_default" for k in ks)], Path(sys.executable)), data, args)
    rate, cpu, latency = got["samples_per_s"], got["loader_cpu_ms_per_batch"], random_reads(data, ks, args.reads)
    of = lambda k, key, nd: med([x[key] for x in runs[k]], nd)  # noqa: E731
    table = {k: {"build_cpu_ms_per_sample": of(k, "cpu_ms_per_sample", 3),
                 "inline_build_cpu_ms_per_sample": of(k, "inline_cpu_ms_per_sample", 3),
                 "inline_file_bytes_per_sample": round(runs[k][-1]["inline_file_bytes"] / n, 1),
                 "build_clean_write_samples_per_s": of(k, "clean_write_samples_per_s", 0),
                 "file_bytes_per_sample": round(runs[k][-1]["file_bytes"] / n, 1),
                 "loader_samples_per_s": rate[f"h5forge_lz4k{k}_default"],
                 "loader_cpu_ms_per_batch": cpu[f"h5forge_lz4k{k}_default"],
                 "random_read_p50_us": latency[k]["h5forge"]["p50_us"], "random_read_p99_us": latency[k]["h5forge"]["p99_us"],
                 "h5py_random_read_p50_us": latency[k]["h5py"]["p50_us"]} for k in ks}
    ratios = {f"chunk_rows {k} / {ks[0]}: {m}": ratio(table[k][m], table[ks[0]][m], 2) for k in ks[1:]
              for m in ("build_cpu_ms_per_sample", "inline_build_cpu_ms_per_sample", "inline_file_bytes_per_sample",
                        "file_bytes_per_sample", "loader_samples_per_s", "loader_cpu_ms_per_batch", "random_read_p50_us",
                        "h5py_random_read_p50_us")}
    return {"ratios": ratios, "sample_bytes": 4 * size * size, "by_chunk_rows": table,
            "npy_mmap_loader_samples_per_s": rate["npy_mmap"], "builds": runs, "loader_all_rounds": got["all_rounds"],
            "latency": latency}


def main() -> None:
    args = cli(__doc__, dict(n=200, size=64, rounds=1, chunk_n=600, chunk_rows="1,16", reads=200),
               n=8000, size=224, rounds=3, workers=2, batch=32, only="masks,chunks",
               chunk_n=20_000, chunk_size=32, chunk_rows="1,4,16,64,256", reads=2000)
    for part, run in (("masks", masks), ("chunks", chunks)):
        if part in args.only.split(","):  # each part its own results: read_masks.*, read_masks_chunks.*
            save("read_masks" if part == "masks" else f"read_masks_{part}", run(args), args.smoke, module="read_masks")


if __name__ == "__main__":
    main()
