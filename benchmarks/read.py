"""Read benchmark: h5forge's torch reader vs memory-mapped .npy, the article's reader and raw PNGs.

    .venv/bin/python benchmarks/read.py                 # 10,000 samples, 224x224, about 10-15 min
    .venv/bin/python benchmarks/read.py --n 2000 --grid-n 1000 --repeats 1   # a quick look

Builds (once; reused from --work) a demo raw folder and a version file with the default spec
(the demo spec's codec, chunk_rows 1), every sample in the train split; derives the same arrays as .npy, the
article's layout (chunks of 32 + LZF) and a grid of chunk_rows x codec variants. Then, in one
run with the configurations interleaved round-robin (the machine is shared and noisy: compare the
ratios, not the absolute numbers), measures samples/s of one shuffled epoch after a warm-up, batch
32, --workers DataLoader workers, and random single-sample latency. Every loader returns the same
thing: images float32/255 (B,3,224,224), masks int64 (B,1,224,224).

Results: benchmarks/results/read.json and read.md; the ratios are printed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import h5py
import numpy as np
import torch
import yaml
from PIL import Image
from torch.utils.data import DataLoader, Dataset

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from _common import random_read_latency  # noqa: E402
from h5forge.format.codecs import codec_options, ensure_filters  # noqa: E402
from h5forge.read.torch import H5Dataset  # noqa: E402

RESULTS = REPO / "benchmarks" / "results"
DEFAULT_CODEC = yaml.safe_load((REPO / "config" / "demo.yaml").read_text())["storage"]["codec"]
SIZE = 224


# ---------------------------------------------------------------- data
def _spec(raw: Path, out: Path, chunk_rows: int = 1, codec: str | None = None):
    """The demo spec (its codec unless ``codec`` is given), every sample in train."""
    from h5forge.spec import load_spec, override

    spec = load_spec(REPO / "config" / "demo.yaml")
    codec = codec or spec.storage.codec
    spec = spec.model_copy(update={
        "source": spec.source.model_copy(update={"root": raw}),
        "splits": spec.splits.model_copy(update={"ratios": {"train": 1.0}}),
        "storage": spec.storage.model_copy(update={"chunk_rows": chunk_rows, "codec": codec}),
    })
    return override(spec, output=out)


def _clean(args):
    from h5forge.ingest.clean import clean_batch

    spec, root, refs = args
    return clean_batch(spec, root, refs)


def build(work: Path, n: int) -> dict[str, Path]:
    from h5forge.ingest.demo import generate
    from h5forge.ingest.discover import discover
    from h5forge.ingest.writer import DatasetWriter

    raw, out = work / f"raw{n}", work / f"out{n}"
    paths = {"raw": raw, "h5": out / f"dataset_{DEFAULT_CODEC}.h5", "npy_images": out / "images.npy",
             "npy_masks": out / "masks.npy", "article": out / "article_c32_lzf.h5"}
    if not (raw / "annotations.json").exists():
        t = time.perf_counter()
        shutil.rmtree(raw, ignore_errors=True)
        generate(raw, n=n, seed=0, bad=False, workers=2)
        print(f"generated {n} raw samples in {time.perf_counter() - t:.0f} s", flush=True)
    if not paths["h5"].exists():
        t = time.perf_counter()
        out.mkdir(parents=True, exist_ok=True)
        spec = _spec(raw, out)
        inv = discover(spec)
        tmp = out / "building.h5"
        w = DatasetWriter(tmp, spec, version=1)
        jobs = [(spec, inv.root, inv.samples[i:i + 256]) for i in range(0, len(inv.samples), 256)]
        with ProcessPoolExecutor(2) as pool:
            for batch in pool.map(_clean, jobs):
                w.add(batch)
        w.finish()
        os.replace(tmp, paths["h5"])
        print(f"built the default version file in {time.perf_counter() - t:.0f} s", flush=True)
    ensure_filters()
    if not paths["npy_masks"].exists():
        with h5py.File(paths["h5"], "r") as f:
            for field in ("images", "masks"):
                d = f["train"][field]
                mm = np.lib.format.open_memmap(out / f"{field}.tmp.npy", mode="w+", dtype=np.uint8, shape=d.shape)
                for s in range(0, d.shape[0], 512):
                    mm[s:s + 512] = d[s:s + 512]
                mm.flush()
                del mm
                os.replace(out / f"{field}.tmp.npy", out / f"{field}.npy")
    if not paths["article"].exists():
        derive(paths["h5"], paths["article"], n, 32, "lzf")
    return paths


def derive(src: Path, dst: Path, n: int, chunk_rows: int, codec: str) -> Path:
    """A copy of the first ``n`` train rows of ``src`` with another chunk shape / codec."""
    tmp = dst.with_suffix(".tmp.h5")
    with h5py.File(src, "r") as f, h5py.File(tmp, "w") as g:
        g.attrs.update(dict(f.attrs))
        g.attrs["codec"] = codec
        f.copy("meta", g)
        tr = g.create_group("train")
        tr.attrs.update(dict(f["train"].attrs))
        tr.attrs["count"] = n
        opts = {"compression": "lzf"} if codec == "lzf" else codec_options(codec)
        for field in ("images", "masks"):
            d = f["train"][field]
            o = tr.create_dataset(field, shape=(n, *d.shape[1:]), dtype=np.uint8, chunks=(chunk_rows, *d.shape[1:]), **opts)
            step = max(chunk_rows, 512 // chunk_rows * chunk_rows)
            for s in range(0, n, step):
                o[s:min(n, s + step)] = d[s:min(n, s + step)]
    os.replace(tmp, dst)
    return dst


# ---------------------------------------------------------------- baselines
def to_model(img_u8: np.ndarray, mask_u8: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.from_numpy(np.asarray(img_u8)).div(255), torch.from_numpy(np.asarray(mask_u8)).to(torch.int64)


class NpyDataset(Dataset):
    """The same arrays as memory-mapped .npy, a plain map-style Dataset (lazy mmap per worker)."""

    def __init__(self, images: Path, masks: Path):
        self.paths = (str(images), str(masks))
        self.n = np.load(self.paths[0], mmap_mode="r").shape[0]
        self._mm = None

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i):
        if self._mm is None:
            self._mm = tuple(np.load(p, mmap_mode="r") for p in self.paths)
        return to_model(self._mm[0][i], self._mm[1][i])

    def __getstate__(self):
        return {**self.__dict__, "_mm": None}


class ArticleDataset(Dataset):
    """The source article's reader: handle opened in __init__, one HDF5 read per item."""

    def __init__(self, path: Path):
        self.f = h5py.File(path, "r")  # works with fork only (h5py objects cannot be pickled)
        self.images, self.masks = self.f["train"]["images"], self.f["train"]["masks"]

    def __len__(self) -> int:
        return self.images.shape[0]

    def __getitem__(self, i):
        return to_model(self.images[i], self.masks[i])


def _fit(a: np.ndarray, size: int) -> np.ndarray:
    """Centre-crop larger sides, pad smaller ones with 0 (what the cleaner does for this data)."""
    out = np.zeros((size, size, *a.shape[2:]), dtype=a.dtype)
    h, w = a.shape[:2]
    ch, cw = min(h, size), min(w, size)
    sy, sx = (h - ch) // 2, (w - cw) // 2
    py, px = (size - ch) // 2, (size - cw) // 2
    out[py:py + ch, px:px + cw] = a[sy:sy + ch, sx:sx + cw]
    return out


class PngDataset(Dataset):
    """Decoding the original PNGs per item (the article's "PNG+JSON" starting point)."""

    def __init__(self, raw: Path):
        records = json.loads((raw / "annotations.json").read_text())
        self.ids = sorted(r["id"] for r in records)
        self.labels = {r["id"]: r["label"] for r in records}
        self.raw = str(raw)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i):
        sid = self.ids[i]
        img = np.asarray(Image.open(f"{self.raw}/images/{sid}.png").convert("RGB"))
        mask = np.asarray(Image.open(f"{self.raw}/masks/{sid}.png").convert("L")) > 0
        return to_model(_fit(img, SIZE).transpose(2, 0, 1), _fit(mask.astype(np.uint8), SIZE)[None])


# ---------------------------------------------------------------- measuring
class Runner:
    """One persistent DataLoader per configuration, so interleaving does not re-fork workers."""

    def __init__(self, name: str, make, limit: int | None, warmup: int = 5):
        self.name, self.make, self.limit, self.warmup = name, make, limit, warmup
        self.loader = None
        self.rates: list[float] = []

    def run(self) -> float:
        if self.loader is None:
            self.loader = self.make()
        it = iter(self.loader)  # warm-up: workers up, first batches through (not timed)
        for _ in range(self.warmup):
            next(it)
        del it
        n = 0
        t = time.perf_counter()
        for x, m in self.loader:
            n += x.shape[0]
            if self.limit and n >= self.limit:
                break
        rate = n / (time.perf_counter() - t)
        self.rates.append(rate)
        return rate

    def close(self) -> None:
        self.loader = None

    @property
    def median(self) -> float:
        return statistics.median(self.rates)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=10_000, help="samples in the dataset (all in train)")
    ap.add_argument("--grid-n", type=int, default=4_000, help="samples in each chunk_rows x codec variant")
    ap.add_argument("--work", type=Path, default=Path("/tmp/h5forge-readbench"))
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3, help="interleaved rounds (medians reported)")
    ap.add_argument("--slow-limit", type=int, default=1_280, help="samples timed for the slow baselines")
    ap.add_argument("--grid-limit", type=int, default=2_560, help="samples timed per grid variant")
    ap.add_argument("--reads", type=int, default=2_000, help="random single-sample reads for latency")
    ap.add_argument("--setup-only", action="store_true", help="build the files and stop")
    ap.add_argument("--latency-only", action="store_true",
                    help="only random single-sample latency of the chunk_rows-1 grid files vs npy "
                         "(results to read_latency.json/.md)")
    ap.add_argument("--grid", default="1:zstd,4:zstd,16:zstd,1:lz4,4:lz4,16:lz4,1:none,4:none,16:none")
    args = ap.parse_args()
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    args.work.mkdir(parents=True, exist_ok=True)
    paths = build(args.work, args.n)
    grid = []
    gn = min(args.grid_n, args.n)
    for item in [g for g in args.grid.split(",") if g]:
        rows, codec = item.split(":")
        p = args.work / f"out{args.n}" / f"grid{gn}_c{rows}_{codec}.h5"
        if not p.exists():
            t = time.perf_counter()
            derive(paths["h5"], p, gn, int(rows), codec)
            print(f"derived {p.name} in {time.perf_counter() - t:.0f} s", flush=True)
        grid.append((int(rows), codec, p))
    setup_s = time.perf_counter() - t0
    if args.setup_only:
        print(f"setup done in {setup_s:.0f} s")
        return
    if args.latency_only:
        return latency_by_codec(args, paths, [(c, p) for rows, c, p in grid if rows == 1], gn)

    B, W = args.batch, args.workers
    ds = H5Dataset(paths["h5"], "train", ("images", "masks"))
    npy = NpyDataset(paths["npy_images"], paths["npy_masks"])
    assert len(ds) == len(npy) == args.n, (len(ds), len(npy))
    # same values through both readers (a spot check, float32/255 and int64)
    for i in (0, args.n // 2, args.n - 1):
        assert all(torch.equal(a, b) for a, b in zip(ds[i], npy[i]))

    def dl(dataset, workers, shuffle):
        return DataLoader(dataset, batch_size=B, shuffle=shuffle, num_workers=workers,
                          persistent_workers=workers > 0)

    main_runners = {
        "h5forge": Runner("h5forge", lambda: ds.loader(batch_size=B, num_workers=W, shuffle=True, seed=0), None),
        "npy_mmap": Runner("npy_mmap", lambda: dl(npy, W, True), None),
        "article_shuffled": Runner("article_shuffled", lambda: dl(ArticleDataset(paths["article"]), W, True), args.slow_limit),
        "article_sequential": Runner("article_sequential", lambda: dl(ArticleDataset(paths["article"]), W, False), None),
        "png_shuffled": Runner("png_shuffled", lambda: dl(PngDataset(paths["raw"]), W, True), args.slow_limit * 2),
        "png_sequential": Runner("png_sequential", lambda: dl(PngDataset(paths["raw"]), W, False), args.slow_limit * 2),
        "h5forge_sequential": Runner("h5forge_sequential", lambda: ds.loader(batch_size=B, num_workers=W, shuffle=False), None),
        "h5forge_1worker": Runner("h5forge_1worker", lambda: ds.loader(batch_size=B, num_workers=1, shuffle=True, seed=0), None),
        "npy_mmap_1worker": Runner("npy_mmap_1worker", lambda: dl(npy, 1, True), None),
        "h5forge_0workers": Runner("h5forge_0workers", lambda: ds.loader(batch_size=B, num_workers=0, shuffle=True, seed=0), args.n // 2),
        "npy_mmap_0workers": Runner("npy_mmap_0workers", lambda: dl(npy, 0, True), args.n // 2),
    }
    grid_runners = {}
    for rows, codec, p in grid:
        gds = H5Dataset(p, "train", ("images", "masks"))
        grid_runners[f"c{rows}_{codec}"] = Runner(
            f"c{rows}_{codec}", lambda gds=gds: gds.loader(batch_size=B, num_workers=W, shuffle=True, seed=0), args.grid_limit)
    grid_runners["npy_grid"] = Runner("npy_grid", lambda: dl(npy, W, True), args.grid_limit)

    for r in range(args.repeats):
        for group in (main_runners, grid_runners):
            for name, runner in group.items():
                rate = runner.run()
                print(f"round {r + 1}/{args.repeats} {name:20s} {rate:9.0f} samples/s", flush=True)
                if r == args.repeats - 1:
                    runner.close()

    # random single-sample latency, in this process (item = read + convert to float/int64)
    lat = {}
    art = ArticleDataset(paths["article"])
    for r in range(2):  # interleaved twice; the second round is reported
        lat = {
            "h5forge": random_read_latency(lambda i: ds[i], args.n, args.reads, r),
            "npy_mmap": random_read_latency(lambda i: npy[i], args.n, args.reads, r),
            "h5forge_raw_uint8": random_read_latency(lambda i: ds.reader.read_one(i), args.n, args.reads, r),
            "npy_mmap_raw_copy": random_read_latency(lambda i: (np.array(npy._mm[0][i]), np.array(npy._mm[1][i])), args.n, args.reads, r),
            "article": random_read_latency(lambda i: art[i], args.n, max(50, args.reads // 20), r),
        }
    ds.close()

    # CPU time per batch in one process (noise-robust: other jobs steal wall time, not CPU time):
    # the work a DataLoader worker does for one batch of the shuffled epoch
    from torch.utils.data._utils.collate import default_collate

    cpu_batches = max(10, args.grid_limit // B)

    def cpu_per_batch(fetch, order) -> float:
        fetch(order[:B])
        t = time.process_time()
        for k in range(cpu_batches):
            fetch(order[k * B:(k + 1) * B])
        return (time.process_time() - t) / cpu_batches * 1000

    cpu = {}
    for r in range(2):
        for rows, codec, p in grid:
            gds = H5Dataset(p, "train", ("images", "masks"))
            order = gds.sampler(seed=r).indices(r).tolist()
            cpu.setdefault(f"c{rows}_{codec}", []).append(cpu_per_batch(gds.__getitems__, order))
            gds.close()
        order = np.random.default_rng(r).permutation(gn).tolist()
        cpu.setdefault("npy", []).append(cpu_per_batch(lambda idx: default_collate([npy[i] for i in idx]), order))
    cpu_ms = {k: round(min(v), 2) for k, v in cpu.items()}

    rate = {k: round(v.median) for k, v in {**main_runners, **grid_runners}.items()}
    ratios = {
        "h5forge_vs_npy": rate["h5forge"] / rate["npy_mmap"],
        "h5forge_vs_article_shuffled": rate["h5forge"] / rate["article_shuffled"],
        "h5forge_vs_article_sequential": rate["h5forge"] / rate["article_sequential"],
        "h5forge_vs_png_shuffled": rate["h5forge"] / rate["png_shuffled"],
        "h5forge_vs_png_sequential": rate["h5forge"] / rate["png_sequential"],
        "article_sequential_vs_png_sequential": rate["article_sequential"] / rate["png_sequential"],
        "h5forge_2_vs_1_workers": rate["h5forge"] / rate["h5forge_1worker"],
        "npy_2_vs_1_workers": rate["npy_mmap"] / rate["npy_mmap_1worker"],
        "latency_p50_h5forge_vs_npy": lat["h5forge"]["p50_us"] / lat["npy_mmap"]["p50_us"],
        "latency_p99_h5forge_vs_npy": lat["h5forge"]["p99_us"] / lat["npy_mmap"]["p99_us"],
    }
    ratios = {k: round(v, 3) for k, v in ratios.items()}
    grid_table = []
    sizes = {}
    for rows, codec, p in grid:
        with h5py.File(p, "r") as f:
            stored = sum(f["train"][k].id.get_storage_size() for k in ("images", "masks"))
            raw = sum(f["train"][k].size for k in ("images", "masks"))
        sizes[f"c{rows}_{codec}"] = stored / raw
        grid_table.append({"chunk_rows": rows, "codec": codec, "samples_per_s": rate[f"c{rows}_{codec}"],
                           "vs_npy": round(rate[f"c{rows}_{codec}"] / rate["npy_grid"], 3),
                           "cpu_ms_per_batch": cpu_ms[f"c{rows}_{codec}"],
                           "npy_cpu_vs_this": round(cpu_ms["npy"] / cpu_ms[f"c{rows}_{codec}"], 3),
                           "size_ratio": round(stored / raw, 3)})
    with h5py.File(paths["h5"], "r") as f:
        default_size = sum(f["train"][k].id.get_storage_size() for k in ("images", "masks")) / sum(
            f["train"][k].size for k in ("images", "masks"))
    result = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "torch": torch.__version__,
                    "h5py": h5py.version.version, "hdf5": h5py.version.hdf5_version,
                    "loadavg_end": os.getloadavg()},
        "setup": {"n": args.n, "grid_n": gn, "batch": B, "workers": W, "repeats": args.repeats,
                  "default": f"{DEFAULT_CODEC}, chunk_rows 1", "default_size_ratio": round(default_size, 3),
                  "slow_limit": args.slow_limit, "grid_limit": args.grid_limit, "setup_seconds": round(setup_s)},
        "samples_per_s": rate,
        "all_rounds": {k: [round(x) for x in v.rates] for k, v in {**main_runners, **grid_runners}.items()},
        "latency": lat,
        "ratios": ratios,
        "grid": grid_table,
        "cpu_ms_per_batch": cpu_ms,
        "seconds": round(time.perf_counter() - t0),
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "read.json").write_text(json.dumps(result, indent=2) + "\n")
    (RESULTS / "read.md").write_text(markdown(result))
    print(json.dumps(ratios, indent=2))
    print(f"wrote {RESULTS / 'read.json'} and read.md in {result['seconds']} s")


def latency_by_codec(args, paths: dict, files: list[tuple[str, Path]], n: int) -> None:
    """Random single-sample latency per codec (chunk_rows 1) against the same rows as .npy: read +
    convert as a training item, and the raw uint8 read alone; rounds interleaved, the last kept."""
    npy = NpyDataset(paths["npy_images"], paths["npy_masks"])
    npy[0]
    res: dict[str, dict] = {}
    for r in range(2):
        for codec, p in files:
            ds = H5Dataset(p, "train", ("images", "masks"))
            res[codec] = random_read_latency(lambda i: ds[i], n, args.reads, r)
            res[f"{codec}_raw"] = random_read_latency(lambda i: ds.reader.read_one(i), n, args.reads, r)
            ds.close()
        res["npy"] = random_read_latency(lambda i: npy[i], n, args.reads, r)
        res["npy_raw"] = random_read_latency(lambda i: (np.array(npy._mm[0][i]), np.array(npy._mm[1][i])),
                                             n, args.reads, r)
    rows = []
    for key, v in res.items():
        base = res["npy_raw" if key.endswith("_raw") else "npy"]["p50_us"]
        rows.append({"reader": key, **v, "p50_vs_npy": round(v["p50_us"] / base, 2)})
        print(f"{key:12s} p50 {v['p50_us']:8.1f} us  p99 {v['p99_us']:9.1f} us  p50 vs npy {v['p50_us'] / base:.2f}")
    out = {"n": n, "reads": args.reads, "loadavg_end": os.getloadavg(), "rows": rows}
    (RESULTS / "read_latency.json").write_text(json.dumps(out, indent=1))
    md = ["# Random single-sample latency by codec (benchmarks/read.py --latency-only)", "",
          f"{n} samples of 224x224 image + mask, chunk_rows 1, {args.reads} random reads per reader, one "
          "process; `<codec>` = read + convert to float32/255 and int64 (a training item), `<codec>_raw` = "
          "the uint8 read alone; npy = the same rows memory-mapped. Load average at the end: "
          f"{[round(x, 2) for x in os.getloadavg()]}.", "",
          "| reader | p50 µs | p99 µs | p50 vs npy |", "|---|---|---|---|"]
    md += [f"| {r['reader']} | {r['p50_us']} | {r['p99_us']} | {r['p50_vs_npy']} |" for r in rows]
    (RESULTS / "read_latency.md").write_text("\n".join(md) + "\n")


def markdown(r: dict) -> str:
    s, rate, lat, q = r["setup"], r["samples_per_s"], r["latency"], r["ratios"]
    lines = [
        "# Read benchmark (benchmarks/read.py)", "",
        f"{s['n']} samples of 224x224 RGB image + mask, all in train; batch {s['batch']}, {s['workers']} workers, "
        f"one shuffled epoch after a warm-up, medians of {s['repeats']} interleaved rounds "
        f"({r['machine']['cpus']} shared cores: compare ratios, not absolute numbers). "
        f"Every loader yields float32/255 images and int64 masks. Default layout: {s['default']} "
        f"(stored size {s['default_size_ratio']:.3f} of raw).", "",
        "| loader | samples/s | h5forge / this |", "|---|---|---|",
    ]
    for k in ("h5forge", "npy_mmap", "article_shuffled", "article_sequential", "png_shuffled", "png_sequential",
              "h5forge_sequential", "h5forge_1worker", "npy_mmap_1worker", "h5forge_0workers", "npy_mmap_0workers"):
        lines.append(f"| {k} | {rate[k]} | {rate['h5forge'] / rate[k]:.2f} |")
    lines += ["", f"Slow baselines (article shuffled, PNG) time {s['slow_limit']}-{2 * s['slow_limit']} samples, not a whole epoch.", "",
              "## Random single-sample latency (one process, read + convert)", "",
              "| reader | p50 µs | p99 µs |", "|---|---|---|"]
    lines += [f"| {k} | {v['p50_us']} | {v['p99_us']} |" for k, v in lat.items()]
    lines += ["", "## Ratios", "", "| ratio | value |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in q.items()]
    lines += ["", f"## Layout grid ({s['grid_n']} samples each, {s['grid_limit']} samples timed, shuffled, "
              f"{s['workers']} workers, chunk-aware sampler)", "",
              "| chunk_rows | codec | samples/s | vs npy (same rounds) | CPU ms/batch | npy CPU / this | stored/raw |",
              "|---|---|---|---|---|---|---|"]
    lines += [f"| {g['chunk_rows']} | {g['codec']} | {g['samples_per_s']} | {g['vs_npy']} | {g['cpu_ms_per_batch']} | "
              f"{g['npy_cpu_vs_this']} | {g['size_ratio']} |" for g in r["grid"]]
    lines += ["", f"CPU ms/batch: one process, {s['batch']}-sample batches of a shuffled order, read + convert (the work of "
              f"a worker per batch; min of 2 rounds). npy (per-item + default_collate): {r['cpu_ms_per_batch']['npy']} ms. "
              "CPU time is robust to the other jobs on the machine; wall-clock samples/s is not."]
    lines += ["", f"npy through the same grid timing: {rate['npy_grid']} samples/s.", "",
              f"Total run time {r['seconds']} s (setup {s['setup_seconds']} s).", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
