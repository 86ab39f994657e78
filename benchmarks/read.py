"""Read benchmark: h5forge's torch reader vs memory-mapped .npy, the article's reader and raw PNGs.

    python -m benchmarks.read [--smoke] [--n 10000 --grid-n 4000 --repeats 3] [--latency-only]

What is measured and how: benchmarks/README.md, section "read".
"""

import os
import statistics
import time
import warnings
from pathlib import Path

import h5py
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset
from torch.utils.data._utils.collate import default_collate

from benchmarks.common import (CACHE, build_file, cli, code_key, log, machine, make_spec, random_read_latency, ratio,
                               raw_folder, save)


def prepare(n: int, size: int):
    """The default version file, its .npy twins and the article's layout (cached)."""
    out = CACHE / "read" / f"out{n}-{size}-{code_key()}"  # rebuilt when the library changes
    spec = make_spec(raw_folder(n, size), out, size, splits={"ratios": {"train": 1.0}})
    p = {"h5": out / f"dataset_{spec.storage.codec}.h5", "article": out / "article_c32_lzf.h5",
         **{f"npy_{k}": out / f"{k}.npy" for k in ("images", "masks")}}
    out.mkdir(parents=True, exist_ok=True)
    if not p["h5"].exists():
        build_file(spec, out / "building.h5")
        os.replace(out / "building.h5", p["h5"])
    for field in (k for k in ("images", "masks") if not p[f"npy_{k}"].exists()):
        with h5py.File(p["h5"], "r") as f:
            np.save(out / "tmp.npy", f["train"][field][()])
        os.replace(out / "tmp.npy", p[f"npy_{field}"])
    if not p["article"].exists():
        derive(p["h5"], p["article"], n, 32, "lzf")
    return p, spec


def derive(src: Path, dst: Path, n: int, chunk_rows: int, codec: str) -> Path:
    """A copy of the first ``n`` train rows of ``src`` with another chunk shape and codec."""
    from h5forge.format.codecs import CODECS
    tmp = dst.with_suffix(".tmp.h5")
    with h5py.File(src, "r") as f, h5py.File(tmp, "w") as g:
        g.attrs.update({**f.attrs, "codec": codec})
        f.copy("meta", g)
        tr = g.create_group("train")
        tr.attrs.update({**f["train"].attrs, "count": n})
        step = max(chunk_rows, 512 // chunk_rows * chunk_rows)
        for field in ("images", "masks"):
            d = f["train"][field]
            o = tr.create_dataset(field, shape=(n, *d.shape[1:]), dtype=np.uint8, chunks=(chunk_rows, *d.shape[1:]),
                                  **CODECS[codec].options())
            for s in range(0, n, step):
                o[s:min(n, s + step)] = d[s:min(n, s + step)]
    os.replace(tmp, dst)
    return dst


class Items(Dataset):
    """Item i = ``fetch(state, i)`` (uint8 image, mask) converted like h5forge's; ``state = open_()``, lazily
    in each process or in __init__ (the article's way)."""

    def __init__(self, n: int, open_, fetch, eager: bool = False):
        self.n, self.open_, self.fetch, self.state = n, open_, fetch, open_() if eager else None

    def __len__(self) -> int:
        return self.n

    def raw(self, i):
        self.state = self.open_() if self.state is None else self.state
        return self.fetch(self.state, i)

    def __getitem__(self, i):
        img, mask = self.raw(i)
        return torch.from_numpy(np.asarray(img)).div(255), torch.from_numpy(np.asarray(mask)).to(torch.int64)


def npy_dataset(paths: dict) -> Items:
    """The same arrays as memory-mapped .npy."""
    return Items(np.load(paths["npy_images"], mmap_mode="r").shape[0],
                 lambda: [np.load(paths[f"npy_{k}"], mmap_mode="r") for k in ("images", "masks")],
                 lambda mm, i: (np.array(mm[0][i]), np.array(mm[1][i])))


def article_dataset(path: Path) -> Items:
    """The source article's reader: the file opened in __init__ (fork only), one HDF5 read per item."""
    f = h5py.File(path, "r")
    return Items(f["train"]["images"].shape[0], lambda: (f, f["train"]["images"], f["train"]["masks"]),
                 lambda s, i: (s[1][i], s[2][i]), eager=True)


def png_dataset(spec) -> Items:
    """Decoding the original PNGs per item (the article's "PNG+JSON" starting point)."""
    from h5forge.ingest.clean import clean_sample
    from h5forge.ingest.discover import discover
    refs = discover(spec).samples
    def fetch(_, i: int):
        values = clean_sample(spec, spec.source.root, refs[i])[0]
        return values["images"], values["masks"]

    return Items(len(refs), lambda: None, fetch)


class Runner:
    """One persistent DataLoader per configuration, so interleaving does not re-fork workers."""

    def __init__(self, make, limit: int | None = None, warmup: int = 5):
        self.make, self.limit, self.warmup, self.loader, self.rates = make, limit, warmup, None, []

    def run(self) -> float:
        if self.loader is None:
            self.loader = self.make()
        it = iter(self.loader)  # warm-up: workers up, first batches through (not timed)
        for _ in zip(range(min(self.warmup, len(self.loader) - 1)), it):
            pass
        del it
        n, t = 0, time.perf_counter()
        for x, _ in self.loader:
            n += x.shape[0]
            if self.limit and n >= self.limit:
                break
        self.rates.append(n / (time.perf_counter() - t))
        return self.rates[-1]


def latency_by_codec(files: dict[str, Path], npy: Items, n: int, reads: int) -> list[dict]:
    """Random single-sample latency per codec vs .npy, as a training item and as the raw uint8 read."""
    from h5forge.read.torch import H5Dataset
    res: dict[str, dict] = {}
    for r in range(2):  # rounds interleaved, the last kept
        for codec, p in files.items():
            ds = H5Dataset(p, "train", ("images", "masks"))
            res[codec] = random_read_latency(ds.__getitem__, n, reads, r)
            res[f"{codec}_raw"] = random_read_latency(ds.reader.read_one, n, reads, r)
            ds.close()
        res |= {"npy": random_read_latency(npy.__getitem__, n, reads, r), "npy_raw": random_read_latency(npy.raw, n, reads, r)}
    return [{"reader": k, **v, "p50_vs_npy": ratio(v["p50_us"], res["npy_raw" if k.endswith("_raw") else "npy"]["p50_us"], 2)}
            for k, v in res.items()]


def main() -> None:
    from h5forge.read.torch import H5Dataset
    args = cli(__doc__, dict(n=200, size=64, grid_n=100, repeats=1, slow_limit=64, grid_limit=64, reads=100),
               n=10_000, size=224, grid_n=4_000, grid="1:zstd,4:zstd,16:zstd,1:lz4,4:lz4,16:lz4,1:none,4:none,16:none",
               workers=2, batch=32, repeats=3, slow_limit=1_280, grid_limit=2_560, reads=2_000, latency_only=False)
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", "The given NumPy array is not writable")
    t0 = time.perf_counter()
    paths, spec = prepare(args.n, args.size)
    gn, grid = min(args.grid_n, args.n), {}
    for rows, codec in (item.split(":") for item in args.grid.split(",") if item):
        p = paths["h5"].parent / f"grid{gn}_c{rows}_{codec}.h5"
        grid[f"c{rows}_{codec}"] = (int(rows), codec, p if p.exists() else derive(paths["h5"], p, gn, int(rows), codec))
    setup_s, npy = time.perf_counter() - t0, npy_dataset(paths)
    by_codec = latency_by_codec({c: p for rows, c, p in grid.values() if rows == 1}, npy, gn, args.reads)
    if args.latency_only:
        return save("read_latency", {"n": gn, "reads": args.reads, "size": args.size, "rows": by_codec}, args.smoke)
    B, W, slow = args.batch, args.workers, args.slow_limit
    ds = H5Dataset(paths["h5"], "train", ("images", "masks"))
    assert len(ds) == len(npy) == args.n, (len(ds), len(npy))
    for i in (0, args.n // 2, args.n - 1):  # same values through both readers
        assert all(torch.equal(a, b) for a, b in zip(ds[i], npy[i]))
    dl = lambda d, workers=W, shuffle=True: DataLoader(  # noqa: E731
        d, batch_size=B, shuffle=shuffle, num_workers=workers, persistent_workers=workers > 0)
    h5 = lambda d=ds, workers=W, shuffle=True: d.loader(batch_size=B, num_workers=workers, shuffle=shuffle, seed=0)  # noqa: E731
    runners = {
        "h5forge": Runner(h5), "npy_mmap": Runner(lambda: dl(npy)),
        "article_shuffled": Runner(lambda: dl(article_dataset(paths["article"])), slow),
        "article_sequential": Runner(lambda: dl(article_dataset(paths["article"]), shuffle=False)),
        "png_shuffled": Runner(lambda: dl(png_dataset(spec)), slow * 2),
        "png_sequential": Runner(lambda: dl(png_dataset(spec), shuffle=False), slow * 2),
        "h5forge_sequential": Runner(lambda: h5(shuffle=False)), "h5forge_1worker": Runner(lambda: h5(workers=1)),
        "npy_mmap_1worker": Runner(lambda: dl(npy, 1)), "h5forge_0workers": Runner(lambda: h5(workers=0), args.n // 2),
        "npy_mmap_0workers": Runner(lambda: dl(npy, 0), args.n // 2),
        **{k: Runner(lambda p=p: h5(H5Dataset(p, "train", ("images", "masks"))), args.grid_limit) for k, (*_, p) in grid.items()},
        "npy_grid": Runner(lambda: dl(npy), args.grid_limit)}
    for r in range(args.repeats):
        for name, runner in runners.items():
            log(f"round {r + 1}/{args.repeats} {name:20s} {runner.run():9.0f} samples/s")
            runner.loader = runner.loader if r < args.repeats - 1 else None
    art = article_dataset(paths["article"])
    items = {"h5forge": ds.__getitem__, "npy_mmap": npy.__getitem__, "h5forge_raw_uint8": ds.reader.read_one,
             "npy_mmap_raw_copy": npy.raw, "article": art.__getitem__}
    for r in range(2):  # interleaved twice; the second round is reported
        lat = {k: random_read_latency(f, args.n, args.reads // (20 if k == "article" else 1), r) for k, f in items.items()}
    ds.close()
    n_batches, cpu = max(1, min(max(10, args.grid_limit // B), gn // B - 1)), {}

    def cpu_per_batch(fetch, order) -> float:
        fetch(order[:B])
        t = time.process_time()
        for k in range(n_batches):
            fetch(order[k * B:(k + 1) * B])
        return (time.process_time() - t) / n_batches * 1000

    for r in range(2):
        for key, (_, _, p) in grid.items():
            gds = H5Dataset(p, "train", ("images", "masks"))
            cpu.setdefault(key, []).append(cpu_per_batch(gds.__getitems__, gds.sampler(seed=r).indices(r).tolist()))
            gds.close()
        order = np.random.default_rng(r).permutation(gn).tolist()
        cpu.setdefault("npy", []).append(cpu_per_batch(lambda idx: default_collate([npy[i] for i in idx]), order))
    cpu_ms = {k: round(min(v), 2) for k, v in cpu.items()}
    rate = {k: round(statistics.median(v.rates)) for k, v in runners.items()}
    pairs = [("h5forge", k) for k in ("npy_mmap", "article_shuffled", "article_sequential", "png_shuffled", "png_sequential")]
    pairs += [("article_sequential", "png_sequential"), ("h5forge", "h5forge_1worker"), ("npy_mmap", "npy_mmap_1worker")]
    ratios = {f"{a}_vs_{b}": ratio(rate[a], rate[b]) for a, b in pairs}
    ratios |= {f"latency_{q}_h5forge_vs_npy": ratio(lat["h5forge"][f"{q}_us"], lat["npy_mmap"][f"{q}_us"]) for q in ("p50", "p99")}

    def stored_ratio(p: Path) -> float:
        with h5py.File(p, "r") as f:
            d = [f["train"][k] for k in ("images", "masks")]
            return round(sum(x.id.get_storage_size() for x in d) / sum(x.size for x in d), 3)

    result = {"machine": {**machine(), "torch": torch.__version__}, "ratios": ratios, "args": vars(args),
              "setup": {"grid_n": gn, "default": f"{spec.storage.codec}, chunk_rows {spec.storage.chunk_rows}",
                        "default_size_ratio": stored_ratio(paths["h5"]), "setup_seconds": round(setup_s)},
              "samples_per_s": rate, "all_rounds": {k: [round(x) for x in v.rates] for k, v in runners.items()},
              "latency": lat, "cpu_ms_per_batch": cpu_ms, "latency_by_codec": by_codec,
              "grid": {k: {"chunk_rows": rows, "codec": codec, "samples_per_s": rate[k], "vs_npy": ratio(rate[k], rate["npy_grid"]),
                           "cpu_ms_per_batch": cpu_ms[k], "npy_cpu_vs_this": ratio(cpu_ms["npy"], cpu_ms[k]),
                           "size_ratio": stored_ratio(p)} for k, (rows, codec, p) in grid.items()},
              "seconds": round(time.perf_counter() - t0)}
    save("read", result, args.smoke)


if __name__ == "__main__":
    main()
