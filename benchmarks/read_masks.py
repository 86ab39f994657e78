"""The loader a user gets out of the box on images + masks (uint8 as stored) against a plain DataLoader
over memory-mapped uint8 .npy of the same arrays, whole epochs with their workers' start, on real
pictures; beside them the same file through a plain DataLoader (torch's default_collate, and h5forge's
collate) and through ``ds.loader()`` converting to float32 + int64; and (``--only chunks``) small pictures
stored one sample per chunk against several: the build, the loader and random reads. Method:
benchmarks/README.md, "read_masks" (each reader a probe process of benchmarks.read_peers).
"""

import argparse
import os
import shutil
import statistics
import sys
from pathlib import Path


from benchmarks.common import CACHE, cli, interleaved, log, make_spec, med, own_cpu, parts, random_read_latency, ratio
from benchmarks.common import raw_folder, sampled, save, warm
from benchmarks.read_peers import FIELDS, LOADS, medians, prepare, probe_rounds, write_npy

READERS = ("npy_mmap", "h5forge_lz4_plain", "h5forge_lz4_collate", "h5forge_lz4_default", "h5forge_lz4_float")
# the chunks part's figures compared between each number of samples per chunk and the first
COMPARED = (
    "build_cpu_ms_per_sample inline_build_cpu_ms_per_sample inline_file_bytes_per_sample file_bytes_per_sample"
    " loader_samples_per_s loader_cpu_ms_per_batch random_read_p50_us h5py_random_read_p50_us"
).split()


def masks(args) -> dict:
    """Whole epochs of each reader (README, "read_masks"), ``--rounds`` rounds interleaved: medians, and
    each ratio's rounds (the two readers of a ratio run next to each other in every round)."""
    data = prepare(args.n, args.size, codecs=("lz4",), content=args.content)
    LOADS.clear()
    rates, cpus, outputs = probe_rounds(dict.fromkeys(READERS, Path(sys.executable)), data, args)
    rate, cpu = medians(rates, cpus)
    pairs = {
        "default_loader_vs_npy": ("h5forge_lz4_default", "npy_mmap"),
        "float_loader_vs_npy": ("h5forge_lz4_float", "npy_mmap"),
        "uint8_plain_vs_npy": ("h5forge_lz4_plain", "npy_mmap"),
        "default_loader_vs_uint8_plain": ("h5forge_lz4_default", "h5forge_lz4_plain"),
        "uint8_plain_vs_h5forge_collate": ("h5forge_lz4_plain", "h5forge_lz4_collate"),
        "float_loader_vs_default": ("h5forge_lz4_float", "h5forge_lz4_default"),
    }
    rounds = {k: [ratio(x, y) for x, y in zip(rates[a], rates[b])] for k, (a, b) in pairs.items()}
    ratios = {k: ratio(rate[a], rate[b]) for k, (a, b) in pairs.items()}
    ratios |= {f"{k} (median of rounds)": round(statistics.median(v), 3) for k, v in rounds.items()}
    ratios["cpu_per_batch_float_vs_default"] = ratio(cpu["h5forge_lz4_float"], cpu["h5forge_lz4_default"])
    ratios["cpu_per_batch_uint8_plain_vs_h5forge_collate"] = ratio(cpu["h5forge_lz4_plain"], cpu["h5forge_lz4_collate"])
    return {
        "ratios": ratios,
        "spread": {f"{k} (median of rounds)": [min(v), max(v)] for k, v in rounds.items()},
        "ratio_rounds": rounds,
        "samples_per_s": rate,
        "samples_per_s_spread": {k: [round(min(v)), round(max(v))] for k, v in rates.items()},
        "loader_cpu_ms_per_batch": cpu,
        "all_rounds": {k: [round(x) for x in v] for k, v in rates.items()},
        "loadavg_rounds": [min(LOADS), statistics.median(LOADS), max(LOADS)],
        "outputs": outputs,
    }


def chunks(args) -> dict:
    """``--chunk-n`` pictures of ``--chunk-size``² (and their masks) built with each ``--chunk-rows``:
    build CPU, the default loader's epoch, random single-sample reads (README, "read_masks")."""
    import h5forge
    from h5forge.read.torch import H5Dataset

    n, size, ks = args.chunk_n, args.chunk_size, [int(k) for k in args.chunk_rows.split(",")]
    raw = raw_folder(n, size, size_range=(size, size))
    warm([raw])
    data, work = CACHE / "read_masks_chunks" / f"n{n}-{size}", CACHE / "read_masks_chunks" / "work"
    data.mkdir(parents=True, exist_ok=True)
    runs: dict[int, list] = {k: [] for k in ks}
    for r, k in interleaved(ks, args.rounds):
        out, layout = work / f"k{k}", {"splits": {"ratios": {"train": 1.0}}, "storage": {"chunk_rows": k}}
        inline = make_spec(raw, work / f"inline{k}", size, **layout, compute={"inline_below": n + 1})  # no dask
        shutil.rmtree(inline.output.dir, ignore_errors=True)
        c0 = own_cpu()
        res = h5forge.build(inline)
        cpu_ms, size_bytes = round(1000 * (own_cpu() - c0) / n, 3), os.path.getsize(res.path)
        runs[k].append({"inline_cpu_ms_per_sample": cpu_ms, "inline_file_bytes": size_bytes})
        shutil.rmtree(out, ignore_errors=True)
        spec = make_spec(raw, out, size, args.workers, **layout)
        with sampled() as usage:
            res = h5forge.build(spec)
        runs[k][-1] |= {
            "cpu_ms_per_sample": round(1000 * usage["cpu_seconds"] / n, 3),
            "clean_write_samples_per_s": round(n / res.timings["clean_write_seconds"]),
            "file_bytes": os.path.getsize(res.path),
        }
        log(f"round {r + 1}/{args.rounds} chunk_rows {k}: {runs[k][-1]}")
        shutil.rmtree(data / f"k{k}", ignore_errors=True)
        os.replace(out, data / f"k{k}")  # the last round's version is the one read
        (data / f"lz4k{k}.h5").unlink(missing_ok=True)
        (data / f"lz4k{k}.h5").symlink_to(data / f"k{k}" / Path(res.path).name)
    write_npy(data, data / f"lz4k{ks[0]}.h5", n)  # the .npy the loaders are checked against
    names = ["npy_mmap", *(f"h5forge_lz4k{k}_float" for k in ks)]  # float32 images, int64 masks, converted after
    steady = argparse.Namespace(**{**vars(args), "epochs": 0})  # one timed pass after the warm-up batches
    rates, cpus, _ = probe_rounds(dict.fromkeys(names, Path(sys.executable)), data, steady)
    rate, cpu = medians(rates, cpus)
    import h5py

    latency: dict[int, dict] = {}
    for r in range(2):  # random single samples as stored (uint8), the second round kept
        for k in ks if r % 2 == 0 else ks[::-1]:
            ds = H5Dataset(data / f"lz4k{k}.h5", "train", FIELDS)
            with h5py.File(data / f"lz4k{k}.h5", "r") as f:  # HDF5's own read, default chunk cache
                plain = [f["train"][name] for name in FIELDS]
                h5py_read = lambda i, plain=plain: [d[i] for d in plain]  # noqa: E731
                latency[k] = {
                    name: random_read_latency(get, len(ds), args.reads, r)
                    for name, get in (("h5forge", ds.reader.read_one), ("h5py", h5py_read))
                }
    table = {
        k: {
            "build_cpu_ms_per_sample": med([x["cpu_ms_per_sample"] for x in runs[k]], 3),
            "inline_build_cpu_ms_per_sample": med([x["inline_cpu_ms_per_sample"] for x in runs[k]], 3),
            "inline_file_bytes_per_sample": round(runs[k][-1]["inline_file_bytes"] / n, 1),
            "build_clean_write_samples_per_s": med([x["clean_write_samples_per_s"] for x in runs[k]], 0),
            "file_bytes_per_sample": round(runs[k][-1]["file_bytes"] / n, 1),
            "loader_samples_per_s": rate[f"h5forge_lz4k{k}_float"],
            "loader_cpu_ms_per_batch": cpu[f"h5forge_lz4k{k}_float"],
            "random_read_p50_us": latency[k]["h5forge"]["p50_us"],
            "random_read_p99_us": latency[k]["h5forge"]["p99_us"],
            "h5py_random_read_p50_us": latency[k]["h5py"]["p50_us"],
        }
        for k in ks
    }
    one = table[ks[0]]
    ratios = {f"chunk_rows {k} / {ks[0]}: {m}": ratio(table[k][m], one[m], 2) for k in ks[1:] for m in COMPARED}
    return {
        "ratios": ratios,
        "sample_bytes": 4 * size * size,
        "by_chunk_rows": table,
        "npy_mmap_loader_samples_per_s": rate["npy_mmap"],
        "builds": runs,
        "loader_all_rounds": {k: [round(x) for x in v] for k, v in rates.items()},
        "latency": latency,
    }


def main() -> None:
    args = cli(
        __doc__,
        dict(n=200, size=64, rounds=1, epochs=1, chunk_n=600, chunk_rows="1,16", reads=200),
        n=10_000,
        size=224,
        rounds=7,
        epochs=2,
        content="photos",
        workers=2,
        batch=32,
        only="masks,chunks",
        chunk_n=20_000,
        chunk_size=32,
        chunk_rows="1,4,16,64,256",
        reads=2000,
    )
    only = parts(args.only, ("masks", "chunks"))
    for part, run in (("masks", masks), ("chunks", chunks)):
        if part in only:  # each part its own results: read_masks.*, read_masks_chunks.*
            save("read_masks" if part == "masks" else f"read_masks_{part}", run(args))


if __name__ == "__main__":
    main()
