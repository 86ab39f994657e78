"""Reads against npy mmap, LMDB, webdataset and mosaic-streaming, and the read path's own machinery
switched off piece by piece (an A/B in the same run); each reader a probe process per round.

    python -m benchmarks.read_peers [--smoke] [--n 10000 --size 224 --rounds 3] [--pieces ctypes,mmap,...]

Method: benchmarks/README.md, "read_peers". The peers' venv (build/peers-venv) is made by this command.
"""

import contextlib
import json
import os
import shutil
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from benchmarks.common import (CACHE, REPO, built, child_json, cli, make_spec, med, peers_venv,
                               proc_cpu, random_read_latency, ratio, raw_folder, rounds, save, warm)

PEERS_VENV = REPO / "build" / "peers-venv"
PEERS = ["webdataset==1.0.2", "mosaicml-streaming==0.13.0", "lmdb==3.0.0"]
FIELDS = ("images", "masks")
WARMUP = 5  # batches before the clock starts: workers up, first batches through
PIECES = ("ctypes", "mmap", "direct", "pool", "thread")


def _unthreaded(self):
    """``_ConvertingLoader.__iter__`` with each batch converted in the caller's thread."""
    from collections import deque

    from h5forge.read import torch as h5torch
    recent = deque(maxlen=max(1, self.num_workers) * (self.prefetch_factor or 2) * 2 + 2)
    for batch in DataLoader.__iter__(self):
        recent.append(batch)
        yield h5torch._converted(self.dataset, batch, self.device, self.dataset._targets(batch) if self.device is None else {})


def _switches() -> dict[str, tuple]:
    """piece -> (owner, attribute, what turns it off)."""
    from h5forge.format import chunk_codec
    from h5forge.read import direct, torch as h5torch
    return {"ctypes": (chunk_codec, "_LZ4_SAFE", None),  # LZ4 blocks through lz4.block.decompress + a copy
            "mmap": (direct._ChunkIndex, "of", classmethod(lambda cls, *args, **kwargs: None)),  # chunks by read_direct_chunk
            "direct": (direct.DirectRows, "of", classmethod(lambda cls, *args, **kwargs: None)),  # every row through h5py's filters
            "pool": (h5torch._BlockPool, "take", lambda self, nbytes: h5torch._shared_block(nbytes)),  # a new block a batch
            "thread": (h5torch._ConvertingLoader, "__iter__", _unthreaded)}  # converted in the main thread


@contextlib.contextmanager
def off(*pieces: str):
    """The read path with ``pieces`` switched off (restored on exit); forked workers inherit it."""
    table, saved = _switches() if pieces else {}, []  # the peers' venvs have no h5forge
    for piece in pieces:
        owner, name, value = table[piece]
        saved.append((owner, name, vars(owner)[name]))
        setattr(owner, name, value)
    try:
        yield
    finally:
        for owner, name, value in reversed(saved):
            setattr(owner, name, value)


class NpyItems(Dataset):
    """Memory-mapped .npy, one copied uint8 row per field (opened lazily in each process)."""

    def __init__(self, folder: Path):
        self.folder, self.mm = folder, None
        self.n = np.load(folder / "images.npy", mmap_mode="r").shape[0]

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i):
        self.mm = self.mm or [np.load(self.folder / f"{k}.npy", mmap_mode="r") for k in FIELDS]
        return tuple(torch.from_numpy(np.array(a[i])) for a in self.mm)


class LmdbItems(Dataset):
    """One LMDB record per sample (image bytes then mask bytes), copied out inside its read txn."""

    def __init__(self, path: Path, n: int, shapes: list):
        self.path, self.n, self.shapes, self.env = str(path), n, shapes, None

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i):
        import lmdb
        self.env = self.env or lmdb.open(self.path, readonly=True, lock=False, readahead=False, meminit=False)
        cut = int(np.prod(self.shapes[0]))
        with self.env.begin(buffers=True) as txn:
            a = np.frombuffer(txn.get(int(i).to_bytes(8, "big")), np.uint8)
            return tuple(torch.from_numpy(x.reshape(s).copy()) for x, s in zip((a[:cut], a[cut:]), self.shapes))


def as_tuples(dataset_class):
    """A peer's dataset class whose samples (dicts of arrays) come as (image, mask) tensors."""
    class Tuples(dataset_class):
        def __getitem__(self, i):
            s = super().__getitem__(i)
            return torch.from_numpy(s["images"]), torch.from_numpy(s["masks"])
    return Tuples


def peer_dataset(name: str, where, seed: int, batch: int, cache: str | None = None):
    """A peer's own shuffled dataset as its documentation shows it: ``webdataset*`` over the shard URLs
    ``where``, ``mosaic*`` over MDS shards (a local folder, or a remote one cached in ``cache``), ``litdata*``."""
    if name.startswith("webdataset"):
        import webdataset as wds
        return (wds.WebDataset(where, shardshuffle=len(where), seed=seed, empty_check=False).shuffle(1000, seed=seed)
                .decode().to_tuple("images.npy", "masks.npy").map_tuple(torch.from_numpy, torch.from_numpy))
    if name.startswith("mosaic"):
        from streaming import StreamingDataset
        from streaming.base.util import clean_stale_shared_memory
        clean_stale_shared_memory()
        place = {"local": where} if cache is None else {"remote": where, "local": cache}
        return as_tuples(StreamingDataset)(**place, shuffle=True, shuffle_seed=seed, batch_size=batch)
    from litdata import StreamingDataset
    from litdata.streaming import downloader
    # litdata's obstore chunk path builds its client without allow_http, so it refuses a plain-http
    # endpoint; its boto3 path (the one it takes without obstore) honours endpoint_url
    downloader._OBSTORE_AVAILABLE = False
    return as_tuples(StreamingDataset)(where, cache_dir=cache, shuffle=True, seed=seed,
                                       storage_options={"endpoint_url": os.environ["AWS_ENDPOINT_URL"]})


def reader(name: str, data: Path, args):
    """npy_mmap, lmdb, webdataset, mosaic, or h5forge_<codec>_<plain|loader|default|worker|u8masks> (README)."""
    dl = lambda ds, **kw: DataLoader(ds, batch_size=args.batch, num_workers=args.workers,  # noqa: E731
                                     persistent_workers=args.workers > 0, **kw)
    shapes = json.loads((data / "shapes.json").read_text())
    if name == "npy_mmap":
        return dl(NpyItems(data), shuffle=True)
    if name == "lmdb":
        return dl(LmdbItems(data / "peers" / "lmdb", shapes["n"], shapes["shapes"]), shuffle=True)
    if name in ("webdataset", "mosaic"):
        where = sorted(map(str, (data / "peers" / "wds").glob("*.tar"))) if name == "webdataset" else str(data / "peers" / "mds")
        return dl(peer_dataset(name, where, args.seed, args.batch))
    from h5forge.read.torch import H5Dataset
    codec, how = name.split("_")[1:3]
    kw = {"default": {}, "worker": {}, "u8masks": {"mask_dtype": "uint8"}}.get(how, {"image_dtype": "uint8", "mask_dtype": "uint8"})
    ds = H5Dataset(data / f"{codec}.h5", "train", FIELDS, **kw)
    if how == "plain":
        return dl(ds, shuffle=True)
    return ds.loader(batch_size=args.batch, num_workers=args.workers, shuffle=True, seed=args.seed,
                     convert="worker" if how == "worker" else "after")


def children_cpu() -> float:
    """CPU seconds of this process's live children: the loader's workers."""
    pids = {p for f in Path(f"/proc/{os.getpid()}/task").glob("*/children") for p in f.read_text().split()}
    return sum(proc_cpu(int(pid)) for pid in pids if Path(f"/proc/{pid}").exists())


def epoch_sums(loader) -> list[int]:
    """Every value of one epoch summed per field, whatever the order: equal across readers."""
    sums = [0, 0]
    for x, m in loader:
        x = x if x.dtype == torch.uint8 else (x * 255).round().to(torch.int64)
        sums = [sums[0] + int(x.sum(dtype=torch.int64)), sums[1] + int(m.sum(dtype=torch.int64))]
    return sums


def probe(args) -> dict:
    """One reader (name: reader[-0workers][-off-piece+piece]), one timed pass after WARMUP batches."""
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", "The given NumPy array is not writable")
    name, _, pieces = args.probe.partition("-off-")
    if name.endswith("-0workers"):
        name, args.workers = name.removesuffix("-0workers"), 0
    with off(*filter(None, pieces.split("+"))):
        loader = reader(name, Path(args.data), args)
        it = iter(loader)
        first = next(it)
        for _ in range(WARMUP - 1):
            next(it)
        n, batches, t, cpu, kids = 0, 0, time.perf_counter(), time.process_time(), children_cpu()
        for x, _ in it:
            n, batches = n + x.shape[0], batches + 1
            if args.limit and n >= args.limit:
                break
        out = {"samples_per_s": n / (time.perf_counter() - t), "dtypes": [str(v.dtype)[6:] for v in first],
               "main_cpu_ms_per_batch": round((time.process_time() - cpu) / batches * 1000, 2),
               "workers_cpu_ms_per_batch": round((children_cpu() - kids) / batches * 1000, 2)}
        if args.check:
            del it
            out["epoch_sums"] = epoch_sums(loader)
    return out


def save_npy(data: Path, version: Path, n: int) -> None:
    """The version's train arrays as .npy beside it (what the loaders are checked against), and their shapes."""
    import h5py
    with h5py.File(version, "r") as f:
        for k in FIELDS:
            np.save(data / "tmp.npy", f["train"][k][()])
            os.replace(data / "tmp.npy", data / f"{k}.npy")
        shapes = [list(f["train"][k].shape[1:]) for k in FIELDS]
    (data / "shapes.json").write_text(json.dumps({"n": n, "shapes": shapes}))


def prepare(n: int, size: int, codecs=("lz4", "none")) -> Path:
    """Links to the lz4 and none versions ``h5forge.build`` makes, and the same arrays as .npy (cached)."""
    data = CACHE / "read_peers" / f"n{n}-{size}"
    data.mkdir(parents=True, exist_ok=True)
    raw = raw_folder(n, size)
    for codec in codecs:
        spec = make_spec(raw, data / "unused", size, splits={"ratios": {"train": 1.0}}, storage={"codec": codec})
        assert spec.storage.chunk_rows == 1, spec.storage
        (data / f"{codec}.h5").unlink(missing_ok=True)
        (data / f"{codec}.h5").symlink_to(built(spec, f"read-n{n}-{size}-{codec}"))
    made_from = os.path.realpath(data / "lz4.h5")  # the cached arrays are this version's, or made anew
    if not (data / "npy_from").exists() or (data / "npy_from").read_text() != made_from \
            or not all((data / f"{k}.npy").exists() for k in FIELDS):
        save_npy(data, data / "lz4.h5", n)
    (data / "npy_from").write_text(made_from)
    return data


def write_peers(data: Path) -> None:
    """(In the peers' venv.) The .npy arrays as an LMDB, webdataset shards and MDS shards."""
    imgs, masks = (np.load(data / f"{k}.npy", mmap_mode="r") for k in FIELDS)
    n, root = imgs.shape[0], data / "peers"
    if (root / ".complete").exists():
        return
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)  # lmdb makes its own folder, not the ones above it
    import lmdb
    import webdataset as wds
    from streaming import MDSWriter
    samples = lambda: ((i, np.array(imgs[i]), np.array(masks[i])) for i in range(n))  # noqa: E731
    env = lmdb.open(str(root / "lmdb"), map_size=int((imgs.nbytes + masks.nbytes) * 1.5) + (1 << 30))
    with env.begin(write=True) as txn:
        for i, img, mask in samples():
            txn.put(i.to_bytes(8, "big"), img.tobytes() + mask.tobytes())
    env.close()
    (root / "wds").mkdir(parents=True, exist_ok=True)
    with wds.ShardWriter(str(root / "wds" / "shard-%05d.tar"), maxcount=max(1, n // 10), verbose=0) as sink:
        for i, img, mask in samples():
            sink.write({"__key__": f"{i:07d}", "images.npy": img, "masks.npy": mask})
    cols = {k: f"ndarray:uint8:{','.join(map(str, a.shape[1:]))}" for k, a in zip(FIELDS, (imgs, masks))}
    with MDSWriter(out=str(root / "mds"), columns=cols, compression=None, size_limit=1 << 26) as w:
        for _, img, mask in samples():
            w.write({"images": img, "masks": mask})
    (root / ".complete").write_text("ok")


def in_process(data: Path, reads: int, batches: int) -> tuple[dict, dict]:
    """(latency, cpu) of h5forge (lz4 with each codec piece off, none) against .npy (README). Each set
    is opened under its switches: a reader's chunk handling is fixed when it first reads."""
    from torch.utils.data._utils.collate import default_collate

    from h5forge.read.torch import H5Dataset
    mm = NpyItems(data)
    probes = {"npy_mmap": (lambda i: (lambda x, m: (x.div(255), m.to(torch.int64)))(*mm[i]), ()),
              "npy_mmap_raw": (mm.__getitem__, ())}
    fetch = {"npy_mmap": (lambda idx: default_collate([mm[i] for i in idx]), ())}
    for key, codec, pieces in (("lz4", "lz4", ()), *((f"lz4-off-{p}", "lz4", (p,)) for p in ("ctypes", "mmap", "direct")),
                               ("none", "none", ()), ("none-off-direct", "none", ("direct",))):
        with off(*pieces):
            ds, u8 = (H5Dataset(data / f"{codec}.h5", "train", FIELDS, **kw)
                      for kw in ({}, {"image_dtype": "uint8", "mask_dtype": "uint8"}))
            ds.reader.read_one(0), u8.reader.read_one(0)
        probes |= {f"h5forge_{key}": (ds.__getitem__, pieces), f"h5forge_{key}_raw": (ds.reader.read_one, pieces)}
        fetch[f"h5forge_{key}"] = (u8.__getitems__, pieces)
    for r in range(2):  # the second round kept
        lat = {}
        for k, (fn, pieces) in probes.items():
            with off(*pieces):
                lat[k] = random_read_latency(fn, len(mm), reads, r)
    for k, v in lat.items():
        v["p50_vs_npy"] = ratio(v["p50_us"], lat["npy_mmap_raw" if k.endswith("_raw") else "npy_mmap"]["p50_us"], 2)
    rng, cpu = np.random.default_rng(0), {}
    order = [rng.choice(len(mm), 32, replace=False).tolist() for _ in range(batches)]
    for _ in range(3):
        for k, (f, pieces) in fetch.items():
            with off(*pieces):
                f(order[0])
                t = time.process_time()
                for b in order:
                    f(b)
            cpu[k] = min(cpu.get(k, 1e9), round((time.process_time() - t) / len(order) * 1000, 3))
    return lat, cpu


def probe_rounds(pythons: dict, data: Path, args, limit=lambda name: 0) -> dict:
    """Each reader's probe process once a round, rounds interleaved, the files in the page cache: the
    median samples/s and loader CPU ms per batch (main + workers), every round's, and each reader's
    first outputs. The first round sums every value of an epoch: readers that disagree end the command."""
    warm([data])

    def run(name: str, r: int) -> dict:
        check = ["--check"] if r == 0 and "-0workers" not in name else []
        return child_json("read_peers", "--probe", name, "--data", data, "--seed", r, "--batch", args.batch,
                          "--workers", args.workers, "--limit", limit(name), *check, python=pythons[name])

    runs = rounds(pythons, args.rounds, run)
    rates = {k: [x.pop("samples_per_s") for x in v] for k, v in runs.items()}
    cpus = {k: [x["main_cpu_ms_per_batch"] + x["workers_cpu_ms_per_batch"] for x in v] for k, v in runs.items()}
    info = {k: v[0] for k, v in runs.items()}
    sums = {k: tuple(v["epoch_sums"]) for k, v in info.items() if "epoch_sums" in v}
    if len(set(sums.values())) != 1:
        raise SystemExit(f"readers disagree on the data: {sums}")
    return {"samples_per_s": {k: round(med(v)) for k, v in rates.items()},
            "loader_cpu_ms_per_batch": {k: med(v, 2) for k, v in cpus.items()},
            "all_rounds": {k: [round(x) for x in v] for k, v in rates.items()}, "outputs": info}


def machinery_ab(pieces, rate: dict, loader_cpu: dict, lat: dict, cpu: dict) -> dict:
    """Each piece's gain: the default loader's speed with it on / off and the CPU it saves."""
    on, ab = "h5forge_lz4_default", {}
    for p in pieces:
        ab[p] = {"speed_on_over_off": ratio(rate[on], rate[f"{on}-off-{p}"]),
                 "loader_cpu_off_over_on": ratio(loader_cpu[f"{on}-off-{p}"], loader_cpu[on])}
        if f"h5forge_lz4-off-{p}" in cpu:  # the codec pieces, in this process
            ab[p] |= {"worker_cpu_off_over_on": ratio(cpu[f"h5forge_lz4-off-{p}"], cpu["h5forge_lz4"]),
                      "latency_p50_off_over_on": ratio(lat[f"h5forge_lz4-off-{p}"]["p50_us"], lat["h5forge_lz4"]["p50_us"]),
                      "raw_p50_off_over_on": ratio(lat[f"h5forge_lz4-off-{p}_raw"]["p50_us"], lat["h5forge_lz4_raw"]["p50_us"])}
    return ab


def main() -> None:
    args = cli(__doc__, dict(n=200, size=64, rounds=1, reads=100, cpu_batches=10),
               n=10_000, size=224, rounds=3, workers=2, batch=32, reads=2_000, cpu_batches=100,
               pieces=",".join(PIECES), probe="", data="", seed=0, limit=0, check=False, write_peers=False)
    if args.probe:
        return print(json.dumps(probe(args)), flush=True)
    if args.write_peers:
        return write_peers(Path(args.data))
    torch.set_num_threads(1)  # as in the probes: one intra-op thread (2 spin on 2 busy cores)
    data = prepare(args.n, args.size)
    peers_py = peers_venv(PEERS_VENV, not args.smoke, PEERS)
    pieces = [p for p in args.pieces.split(",") if p]
    names = ["npy_mmap", "h5forge_lz4_plain", "h5forge_lz4_loader", "h5forge_lz4_default", "h5forge_lz4_worker",
             "h5forge_none_plain", "npy_mmap-0workers", "h5forge_lz4_plain-0workers", "h5forge_lz4_default-0workers",
             *(f"h5forge_lz4_default-off-{p}" for p in pieces), "h5forge_lz4_plain-off-direct"]
    pythons = dict.fromkeys(names, Path(sys.executable))
    if peers_py is not None:
        child_json("read_peers", "--write-peers", "--data", data, python=peers_py)
        pythons |= dict.fromkeys(("lmdb", "webdataset", "mosaic"), peers_py)
    got = probe_rounds(pythons, data, args, limit=lambda name: args.n // 2 if "-0workers" in name else 0)
    lat, cpu = in_process(data, args.reads, args.cpu_batches)
    rate, loader_cpu = got["samples_per_s"], got["loader_cpu_ms_per_batch"]
    vs_npy = {k: ratio(v, rate["npy_mmap-0workers" if "-0workers" in k else "npy_mmap"]) for k, v in rate.items()}
    ab = machinery_ab(pieces, rate, loader_cpu, lat, cpu)
    ratios = {f"{k}_vs_npy": v for k, v in vs_npy.items() if not k.startswith("npy") and "-off-" not in k}
    ratios |= {"default_loader_vs_uint8_plain": ratio(rate["h5forge_lz4_default"], rate["h5forge_lz4_plain"]),
               "cpu_per_batch_default_vs_uint8_plain": ratio(loader_cpu["h5forge_lz4_default"], loader_cpu["h5forge_lz4_plain"]),
               "worker_cpu_per_batch_lz4_vs_npy": ratio(cpu["h5forge_lz4"], cpu["npy_mmap"]),
               **{f"latency_p50_{c}_vs_npy": lat[f"h5forge_{c}"]["p50_vs_npy"] for c in ("lz4", "none")},
               **{f"{p} on/off speed, off/on loader CPU": [v["speed_on_over_off"], v["loader_cpu_off_over_on"]]
                  for p, v in ab.items()}}
    save("read_peers", {"peers": PEERS if peers_py else "not installed (skipped)", "args": vars(args) | {"warmup_batches": WARMUP},
                        "ratios": ratios, "machinery_ab": ab, "vs_npy": vs_npy, **got, "latency": lat, "cpu_ms_per_batch": cpu},
         args.smoke)


if __name__ == "__main__":
    main()
