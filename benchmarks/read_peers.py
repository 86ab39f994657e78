"""Reading uint8 image+mask samples: h5forge's loaders against npy mmap, LMDB, webdataset and
mosaic-streaming, side by side in one run, each through a plain shuffled DataLoader.

    python -m benchmarks.read_peers [--smoke] [--n 10000 --size 224 --rounds 3 --workers 2 --batch 32]

The peers are installed by this command into their own venv (build/peers-venv, never into the
project's environment) and read in subprocesses of it; with --smoke a peer that is not installed
is skipped with a line saying so. What is measured and how: benchmarks/README.md, "read_peers".
"""

import argparse
import copy
import json
import os
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

REPO = Path(__file__).resolve().parent.parent
PEERS_VENV = REPO / "build" / "peers-venv"
PEERS = ("webdataset==1.0.2", "mosaicml-streaming==0.13.0", "lmdb==3.0.0")
FIELDS = ("images", "masks")
WARMUP = 5  # batches before the clock starts: workers up, first batches through


# ---- the readers (each built in a probe process) ---------------------------------------------------
class NpyItems(Dataset):
    """Memory-mapped .npy, one copied uint8 row per field (opened lazily in each process)."""

    def __init__(self, folder: Path):
        self.folder, self.mm = folder, None
        self.n = np.load(folder / "images.npy", mmap_mode="r").shape[0]

    def __len__(self) -> int:
        return self.n

    def arrays(self):
        if self.mm is None:
            self.mm = [np.load(self.folder / f"{k}.npy", mmap_mode="r") for k in FIELDS]
        return self.mm

    def __getitem__(self, i):
        return tuple(torch.from_numpy(np.array(a[i])) for a in self.arrays())


class LmdbItems(Dataset):
    """One LMDB record per sample (image bytes then mask bytes), copied out inside its read txn."""

    def __init__(self, path: Path, n: int, shapes: list):
        self.path, self.n, self.shapes, self.env = str(path), n, shapes, None
        self.sizes = [int(np.prod(s)) for s in shapes]

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i):
        import lmdb
        if self.env is None:
            self.env = lmdb.open(self.path, readonly=True, lock=False, readahead=False, meminit=False)
        with self.env.begin(buffers=True) as txn:
            a = np.frombuffer(txn.get(int(i).to_bytes(8, "big")), np.uint8)
            img = a[:self.sizes[0]].reshape(self.shapes[0]).copy()
            mask = a[self.sizes[0]:].reshape(self.shapes[1]).copy()
        return torch.from_numpy(img), torch.from_numpy(mask)


def h5forge_reader(name: str, data: Path, batch: int, workers: int, seed: int):
    """name = h5forge_<codec>_<how>[_h5py]: how = plain (torch's DataLoader over uint8 outputs),
    loader (ds.loader, uint8), default (ds.loader with the default dtypes: float32 images, int64
    masks, converted after the transfer), worker (the same converted in the workers); _h5py reads
    through h5py instead of direct chunk reads."""
    from h5forge.read import reader
    from h5forge.read.torch import H5Dataset
    if name.endswith("_h5py"):  # the comparison: every row through HDF5's filter pipeline
        reader.DirectRows.of = staticmethod(lambda d: None)
    codec, how = name.split("_")[1:3]
    u8 = {} if how in ("default", "worker") else {"image_dtype": "uint8", "mask_dtype": "uint8"}
    ds = H5Dataset(data / f"{codec}.h5", "train", FIELDS, **u8)
    if how == "plain":
        return DataLoader(ds, batch_size=batch, shuffle=True, num_workers=workers, persistent_workers=workers > 0)
    return ds.loader(batch_size=batch, num_workers=workers, shuffle=True, seed=seed,
                     convert="worker" if how == "worker" else "after")


def peer_reader(name: str, data: Path, batch: int, workers: int, seed: int):
    shapes = json.loads((data / "shapes.json").read_text())
    if name == "lmdb":
        return DataLoader(LmdbItems(data / "peers" / "lmdb", shapes["n"], shapes["shapes"]), batch_size=batch,
                          shuffle=True, num_workers=workers, persistent_workers=workers > 0)
    if name == "webdataset":
        import webdataset as wds
        urls = sorted(str(p) for p in (data / "peers" / "wds").glob("*.tar"))
        ds = (wds.WebDataset(urls, shardshuffle=len(urls), seed=seed, empty_check=False).shuffle(1000, seed=seed)
              .decode().to_tuple("images.npy", "masks.npy").map_tuple(torch.from_numpy, torch.from_numpy))
        return DataLoader(ds, batch_size=batch, num_workers=workers, persistent_workers=workers > 0)
    if name == "mosaic":
        from streaming import StreamingDataset
        from streaming.base.util import clean_stale_shared_memory
        clean_stale_shared_memory()

        class Tuples(StreamingDataset):
            def __getitem__(self, i):
                s = super().__getitem__(i)
                return torch.from_numpy(s["images"]), torch.from_numpy(s["masks"])

        ds = Tuples(local=str(data / "peers" / "mds"), shuffle=True, shuffle_seed=seed, batch_size=batch)
        return DataLoader(ds, batch_size=batch, num_workers=workers, persistent_workers=workers > 0)
    raise SystemExit(f"unknown reader {name}")


def probe(args) -> None:
    """One reader, one pass: WARMUP untimed batches, then the rest of the same epoch (or --limit
    samples) timed; with --check, a second full epoch summing every value (untimed)."""
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", "The given NumPy array is not writable")
    data, name = Path(args.data), args.probe
    workers = 0 if name.endswith("_0workers") else args.workers
    base = name.removesuffix("_0workers")
    if base == "npy_mmap":
        loader = DataLoader(NpyItems(data), batch_size=args.batch, shuffle=True, num_workers=workers,
                            persistent_workers=workers > 0)
    elif base.startswith("h5forge_"):
        loader = h5forge_reader(base, data, args.batch, workers, args.seed)
    else:
        loader = peer_reader(base, data, args.batch, workers, args.seed)
    it = iter(loader)
    first = next(it)
    for _ in range(WARMUP - 1):
        next(it)
    n, batches, t, cpu, kids = 0, 0, time.perf_counter(), time.process_time(), children_cpu()
    for x, _ in it:
        n, batches = n + x.shape[0], batches + 1
        if args.limit and n >= args.limit:
            break
    rate = n / (time.perf_counter() - t)
    out = {"samples_per_s": rate, "timed_samples": n, "dtypes": [str(v.dtype).removeprefix("torch.") for v in first],
           "main_cpu_ms_per_batch": round((time.process_time() - cpu) / batches * 1000, 2),
           "workers_cpu_ms_per_batch": round((children_cpu() - kids) / batches * 1000, 2)}
    if args.check:  # every value of one epoch, whatever the order: equal across readers
        del it
        sums, seen = [0, 0], 0
        for x, m in loader:
            x = x if x.dtype == torch.uint8 else (x * 255).round().to(torch.int64)
            sums[0] += int(x.sum(dtype=torch.int64))
            sums[1] += int(m.sum(dtype=torch.int64))
            seen += x.shape[0]
        out["epoch_sums"], out["epoch_samples"] = sums, seen
    print(json.dumps(out), flush=True)


def children_cpu() -> float:
    """CPU seconds (user + system) of this process's live children: the loader's workers."""
    pids = set()
    for f in Path(f"/proc/{os.getpid()}/task").glob("*/children"):
        pids |= set(f.read_text().split())
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # gone
            continue
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


# ---- data ------------------------------------------------------------------------------------------
def prepare(n: int, size: int) -> Path:
    """A folder with the h5forge version file (lz4, the default codec, one sample per chunk), its
    twin with codec none, and the same arrays as .npy (cached under the benchmarks' cache)."""
    import h5py

    from benchmarks.common import CACHE, build_file, make_spec, raw_folder
    from benchmarks.read import derive
    data = CACHE / "read_peers" / f"n{n}-{size}"
    data.mkdir(parents=True, exist_ok=True)
    if not (data / "lz4.h5").exists():
        spec = make_spec(raw_folder(n, size), data / "spec-out", size, splits={"ratios": {"train": 1.0}})
        assert spec.storage.codec == "lz4" and spec.storage.chunk_rows == 1, spec.storage
        build_file(spec, data / "building.h5")
        os.replace(data / "building.h5", data / "lz4.h5")
    if not (data / "none.h5").exists():
        derive(data / "lz4.h5", data / "none.h5", n, 1, "none")
    with h5py.File(data / "lz4.h5", "r") as f:
        count, shapes = int(f["train"].attrs["count"]), [list(f["train"][k].shape[1:]) for k in FIELDS]
        for k in FIELDS:
            if not (data / f"{k}.npy").exists():
                np.save(data / "tmp.npy", f["train"][k][()])
                os.replace(data / "tmp.npy", data / f"{k}.npy")
    (data / "shapes.json").write_text(json.dumps({"n": count, "shapes": shapes}))
    return data


def write_peers(data: Path, only: list[str]) -> None:
    """(In the peers' venv.) The .npy arrays as an LMDB, webdataset shards and MDS shards."""
    import shutil
    imgs, masks = (np.load(data / f"{k}.npy", mmap_mode="r") for k in FIELDS)
    n, root = imgs.shape[0], data / "peers"
    for name in only:
        done = root / f"{name}.complete"
        if done.exists():
            continue
        shutil.rmtree(root / name, ignore_errors=True)
        (root / name).mkdir(parents=True)
        if name == "lmdb":
            import lmdb
            env = lmdb.open(str(root / "lmdb"), map_size=int((imgs.nbytes + masks.nbytes) * 1.5) + (1 << 30))
            with env.begin(write=True) as txn:
                for i in range(n):
                    txn.put(i.to_bytes(8, "big"), imgs[i].tobytes() + masks[i].tobytes())
            env.close()
        elif name == "wds":
            import webdataset as wds
            with wds.ShardWriter(str(root / "wds" / "shard-%05d.tar"), maxcount=max(1, n // 10), verbose=0) as sink:
                for i in range(n):
                    sink.write({"__key__": f"{i:07d}", "images.npy": np.array(imgs[i]), "masks.npy": np.array(masks[i])})
        elif name == "mds":
            from streaming import MDSWriter
            cols = {k: f"ndarray:uint8:{','.join(map(str, a.shape[1:]))}" for k, a in zip(FIELDS, (imgs, masks))}
            with MDSWriter(out=str(root / "mds"), columns=cols, compression=None, size_limit=1 << 26) as w:
                for i in range(n):
                    w.write({"images": np.array(imgs[i]), "masks": np.array(masks[i])})
        done.write_text("ok")


def peers_python(smoke: bool) -> tuple[Path | None, dict]:
    """The peers' interpreter, creating build/peers-venv when missing (its own torch and numpy, as
    the peers require them); under --smoke a missing venv is not installed: (None, {})."""
    py = PEERS_VENV / "bin" / "python"
    if not (PEERS_VENV / ".installed").exists():
        if smoke:
            print(f"peers skipped: {PEERS_VENV} is not installed (the full-size run installs it)", flush=True)
            return None, {}
        try:
            subprocess.run([sys.executable, "-m", "venv", "--clear", str(PEERS_VENV)], check=True)
            subprocess.run([str(py), "-m", "pip", "install", "--quiet", *PEERS], check=True, timeout=1800)
            (PEERS_VENV / ".installed").write_text("\n".join(PEERS))
        except (subprocess.SubprocessError, OSError) as err:
            raise SystemExit(f"the peers could not be installed into {PEERS_VENV}: {err}") from None
    freeze = subprocess.run([str(py), "-m", "pip", "freeze"], capture_output=True, text=True).stdout.split()
    keep = ("torch==", "numpy==", "webdataset==", "mosaicml-streaming==", "lmdb==")
    return py, {ln.split("==")[0]: ln.split("==")[1] for ln in freeze if ln.startswith(keep)}


# ---- the run ---------------------------------------------------------------------------------------
def run_probe(python: Path, name: str, data: Path, args, seed: int, check: bool) -> dict:
    limit = args.n // 2 if name.endswith("_0workers") else 0
    cmd = [str(python), "-m", "benchmarks.read_peers", "--probe", name, "--data", str(data), "--batch", str(args.batch),
           "--workers", str(args.workers), "--seed", str(seed), "--limit", str(limit), *(["--check"] if check else [])]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env=env, timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(f"{name} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def latency(data: Path, reads: int) -> dict:
    """Random single-sample read + convert (float32/255 images, int64 masks, as ``ds[i]``), and the
    raw uint8 read, p50/p99 in µs, two interleaved rounds, the second kept."""
    from benchmarks.common import random_read_latency
    from h5forge.read.torch import H5Dataset
    mm = NpyItems(data)
    n = len(mm)

    def npy_item(i):
        x, m = mm[i]
        return x.div(255), m.to(torch.int64)

    sets = {c: H5Dataset(data / f"{c}.h5", "train", FIELDS) for c in ("lz4", "none")}
    sets["lz4_h5py"] = H5Dataset(data / "lz4.h5", "train", FIELDS)
    sets["lz4_h5py"].reader._handles()
    sets["lz4_h5py"].reader._direct = {k: None for k in FIELDS}  # opened once in this process: stays h5py
    probes = {"npy_mmap": npy_item, "npy_mmap_raw": mm.__getitem__,
              **{f"h5forge_{k}": ds.__getitem__ for k, ds in sets.items()},
              **{f"h5forge_{k}_raw": ds.reader.read_one for k, ds in sets.items()}}
    for r in range(2):
        res = {k: random_read_latency(f, n, reads, r) for k, f in probes.items()}
    for k, v in res.items():
        v["p50_vs_npy"] = round(v["p50_us"] / res["npy_mmap_raw" if k.endswith("_raw") else "npy_mmap"]["p50_us"], 2)
    return res


def cpu_per_batch(data: Path, batches: int) -> dict:
    """CPU ms of one process fetching a random 32-sample uint8 batch (a loader worker's work per
    batch): ``__getitems__`` with direct chunk reads and through h5py, lz4 and none, against
    ``.npy`` per item + default_collate; min of 3 passes over the same batches."""
    from torch.utils.data._utils.collate import default_collate

    from h5forge.read.torch import H5Dataset
    mm = NpyItems(data)
    fetch = {"npy_mmap": lambda idx: default_collate([mm[i] for i in idx])}
    for codec in ("lz4", "none"):
        for how in ("direct", "h5py"):
            ds = H5Dataset(data / f"{codec}.h5", "train", FIELDS, image_dtype="uint8", mask_dtype="uint8")
            ds.reader._handles()
            if how == "h5py":
                ds.reader._direct = {k: None for k in FIELDS}
            fetch[f"h5forge_{codec}_{how}"] = ds.__getitems__
    rng = np.random.default_rng(0)
    order = [rng.choice(len(mm), 32, replace=False).tolist() for _ in range(batches)]
    best: dict[str, float] = {}
    for _ in range(3):
        for k, f in fetch.items():
            f(order[0])
            t = time.process_time()
            for b in order:
                f(b)
            best[k] = min(best.get(k, 1e9), (time.process_time() - t) / len(order) * 1000)
    return {k: round(v, 2) for k, v in best.items()} | convert_cpu(data, order[:20])


def convert_cpu(data: Path, order: list) -> dict:
    """CPU ms of the default loader's main-process share: a stored 32-sample batch converted (float32
    images / 255, int64 masks, new tensors) by the kinds' numpy conversion (the default) and by
    torch kernels (``device="cpu"``); min of 3 passes over the same stored batches."""
    from h5forge.read.torch import H5Dataset
    default = H5Dataset(data / "lz4.h5", "train", FIELDS)
    stored = copy.copy(default)
    stored._ship_stored = True  # what a worker of ds.loader() ships
    batches = [stored.__getitems__(idx).stacked for idx in order]
    best: dict[str, float] = {}
    for _ in range(3):
        for k, device in (("convert_numpy", None), ("convert_torch", "cpu")):
            t = time.process_time()
            for b in batches:
                default.convert(b, device)
            best[k] = min(best.get(k, 1e9), (time.process_time() - t) / len(batches) * 1000)
    return {k: round(v, 2) for k, v in best.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--probe"), ap.add_argument("--data"), ap.add_argument("--check", action="store_true")
    ap.add_argument("--seed", type=int, default=0), ap.add_argument("--limit", type=int, default=0)
    ap.add_argument("--write-peers")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes for CI; results go to results/smoke/")
    ap.add_argument("--n", type=int), ap.add_argument("--size", type=int), ap.add_argument("--rounds", type=int)
    ap.add_argument("--workers", type=int, default=2), ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--reads", type=int)
    args = ap.parse_args()
    if args.probe:
        return probe(args)
    if args.write_peers:
        return write_peers(Path(args.data), args.write_peers.split(","))
    small = dict(n=200, size=64, rounds=1, reads=100) if args.smoke else dict(n=10_000, size=224, rounds=3, reads=2_000)
    for k, v in small.items():
        setattr(args, k, getattr(args, k) or v)
    from benchmarks.common import log, machine, ratio, save
    torch.set_num_threads(1)  # as in the probes: one intra-op thread (2 spin on 2 busy cores)
    t0, load_start = time.perf_counter(), [round(x, 2) for x in os.getloadavg()]
    data = prepare(args.n, args.size)
    own = Path(sys.executable)
    peers_py, peer_versions = peers_python(args.smoke)
    names = ["npy_mmap", "h5forge_lz4_plain", "h5forge_lz4_loader", "h5forge_lz4_default", "h5forge_lz4_worker",
             "h5forge_lz4_plain_h5py", "h5forge_none_plain", "npy_mmap_0workers", "h5forge_lz4_plain_0workers",
             "h5forge_lz4_default_0workers"]
    pythons = dict.fromkeys(names, own)
    if peers_py is not None:
        subprocess.run([str(peers_py), "-m", "benchmarks.read_peers", "--write-peers", "lmdb,wds,mds",
                        "--data", str(data)], check=True, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
        pythons |= {"lmdb": peers_py, "webdataset": peers_py, "mosaic": peers_py}
    for f in sorted(p for p in data.rglob("*") if p.is_file()):  # every reader's files in page cache
        with open(f, "rb") as fh:
            while fh.read(1 << 24):
                pass
    rates, info = {k: [] for k in pythons}, {}
    for r in range(args.rounds):
        order = list(pythons) if r % 2 == 0 else list(reversed(pythons))
        for name in order:
            res = run_probe(pythons[name], name, data, args, r, check=r == 0 and not name.endswith("_0workers"))
            rates[name].append(res["samples_per_s"])
            if r == 0:
                info[name] = {k: v for k, v in res.items() if k != "samples_per_s"}
            log(f"round {r + 1}/{args.rounds} {name:30s} {res['samples_per_s']:8.0f} samples/s")
    sums = {k: tuple(v["epoch_sums"]) for k, v in info.items() if not k.endswith("_0workers")}
    if len(set(sums.values())) != 1:
        raise SystemExit(f"readers disagree on the data: {sums}")
    lat = latency(data, args.reads)
    cpu = cpu_per_batch(data, 10 if args.smoke else 100)
    rate = {k: round(statistics.median(v)) for k, v in rates.items()}
    vs_npy = {k: ratio(v, rate["npy_mmap_0workers" if k.endswith("_0workers") else "npy_mmap"]) for k, v in rate.items()}
    ratios = {f"{k}_vs_npy": v for k, v in vs_npy.items() if k not in ("npy_mmap", "npy_mmap_0workers")}
    ratios |= {"default_loader_vs_uint8_plain": ratio(rate["h5forge_lz4_default"], rate["h5forge_lz4_plain"]),
               "default_loader_vs_uint8_loader": ratio(rate["h5forge_lz4_default"], rate["h5forge_lz4_loader"]),
               "direct_vs_h5py_lz4": ratio(rate["h5forge_lz4_plain"], rate["h5forge_lz4_plain_h5py"]),
               "cpu_per_batch_lz4_direct_vs_h5py": ratio(cpu["h5forge_lz4_direct"], cpu["h5forge_lz4_h5py"]),
               "cpu_per_batch_lz4_direct_vs_npy": ratio(cpu["h5forge_lz4_direct"], cpu["npy_mmap"]),
               "cpu_per_batch_none_direct_vs_npy": ratio(cpu["h5forge_none_direct"], cpu["npy_mmap"]),
               "latency_p50_default_lz4_vs_npy": lat["h5forge_lz4"]["p50_vs_npy"],
               "latency_p50_lz4_h5py_vs_npy": lat["h5forge_lz4_h5py"]["p50_vs_npy"],
               "latency_p50_none_vs_npy": lat["h5forge_none"]["p50_vs_npy"]}
    cpu_total = {k: round(v["main_cpu_ms_per_batch"] + v["workers_cpu_ms_per_batch"], 2) for k, v in info.items()}
    ratios["cpu_per_batch_default_vs_uint8_plain"] = ratio(cpu_total["h5forge_lz4_default"], cpu_total["h5forge_lz4_plain"])
    result = {"command": " ".join(["python -m benchmarks.read_peers", *sys.argv[1:]]),
              "machine": {**machine(), "torch": torch.__version__}, "loadavg_start": load_start,
              "peers": peer_versions or "not installed (skipped)",
              "setup": {"n": args.n, "size": args.size, "batch": args.batch, "workers": args.workers,
                        "rounds": args.rounds, "warmup_batches": WARMUP},
              "ratios": ratios, "samples_per_s": rate, "vs_npy": vs_npy,
              "all_rounds": {k: [round(x) for x in v] for k, v in rates.items()},
              "outputs": info, "latency": lat, "cpu_ms_per_batch": cpu, "loader_cpu_ms_per_batch": cpu_total, "seconds": round(time.perf_counter() - t0)}
    save("read_peers", result, args.smoke)


if __name__ == "__main__":
    main()
