"""Reads against npy mmap, LMDB, webdataset and mosaic-streaming, and the read path's own machinery
switched off piece by piece (an A/B in the same run). Method: benchmarks/README.md, "read_peers"; the
peers' venv (build/peers-venv) is made by this command.
"""

import contextlib
import json
import os
import statistics
import sys
import time
import warnings
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from benchmarks.common import CACHE, REPO, built, child_json, cli, fresh, interleaved, log, make_spec, own_cpu
from benchmarks.common import peers_venv, photo_folder, proc_cpu, random_read_latency, ratio, raw_folder, save, warm

PEERS_VENV = REPO / "build" / "peers-venv"
PEERS = ["webdataset==1.0.2", "mosaicml-streaming==0.13.0", "lmdb==3.0.0"]
FIELDS = ("images", "masks")
WARMUP = 5  # batches before the clock starts: workers up, first batches through
PIECES = ("ctypes", "mmap", "direct", "pool", "thread")


# ---- the read path's machinery, each piece with its switch ---------------------------------------


def _unthreaded(self):
    """``_ConvertingLoader.__iter__`` with each batch converted in the caller's thread."""
    from collections import deque

    from h5forge.read import torch as h5torch

    recent = deque(maxlen=max(1, self.num_workers) * (self.prefetch_factor or 2) * 2 + 2)
    for batch in DataLoader.__iter__(self):
        recent.append(batch)
        targets = self.dataset._targets(batch) if self.device is None else {}
        yield h5torch._converted(self.dataset, batch, self.device, targets)


def _switches() -> dict[str, tuple]:
    """piece -> (owner, attribute, what turns it off)."""
    from h5forge._format import chunk_codec
    from h5forge.read import _direct as direct, torch as h5torch

    never = classmethod(lambda cls, *args, **kwargs: None)
    return {
        "ctypes": (chunk_codec, "_LZ4_SAFE", None),  # LZ4 blocks through lz4.block.decompress + a copy
        "mmap": (direct._ChunkIndex, "of", never),  # chunks by read_direct_chunk
        "direct": (direct.DirectRows, "of", never),  # every row through h5py's filters
        "pool": (h5torch._BlockPool, "take", lambda self, nbytes: h5torch._shared_block(nbytes)),  # a block a batch
        "thread": (h5torch._ConvertingLoader, "__iter__", _unthreaded),  # converted in the main thread
    }


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


# ---- the readers (each built in a probe process) ---------------------------------------------------


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
        with self.env.begin(buffers=True) as txn:  # copied out inside the read txn
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

        return (
            wds.WebDataset(where, shardshuffle=len(where), seed=seed, empty_check=False)
            .shuffle(1000, seed=seed)
            .decode()
            .to_tuple("images.npy", "masks.npy")
            .map_tuple(torch.from_numpy, torch.from_numpy)
        )
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
    endpoint = {"endpoint_url": os.environ["AWS_ENDPOINT_URL"]}
    return as_tuples(StreamingDataset)(where, cache_dir=cache, shuffle=True, seed=seed, storage_options=endpoint)


def reader(name: str, data: Path, args):
    """npy_mmap, lmdb, webdataset, mosaic, or h5forge_<codec>_<plain|collate|loader|default|float|worker>
    (README). With ``--epochs`` the workers are not persistent: each epoch starts its own."""
    common = {"batch_size": args.batch, "num_workers": args.workers, "persistent_workers": args.workers > 0}
    common["persistent_workers"] &= not args.epochs

    def dl(ds, **kw) -> DataLoader:
        return DataLoader(ds, **common, **kw)

    shapes = json.loads((data / "shapes.json").read_text())
    if name == "npy_mmap":
        return dl(NpyItems(data), shuffle=True)
    if name == "lmdb":
        return dl(LmdbItems(data / "peers" / "lmdb", shapes["n"], shapes["shapes"]), shuffle=True)
    if name == "webdataset":
        shards = sorted(str(p) for p in (data / "peers" / "wds").glob("*.tar"))
        return dl(peer_dataset(name, shards, args.seed, args.batch))
    if name == "mosaic":
        return dl(peer_dataset(name, str(data / "peers" / "mds"), args.seed, args.batch))
    from h5forge.read.torch import H5Dataset, collate

    codec, how = name.split("_")[1:3]
    kw = {"image_dtype": "uint8", "mask_dtype": "uint8"}
    if how in ("default", "float", "worker"):  # nothing asked, or float32 in [0, 1] and int64 converted by h5forge
        kw = {"image_dtype": "float32", "mask_dtype": "int64"} if how != "default" else {}
    ds = H5Dataset(data / f"{codec}.h5", "train", FIELDS, **kw)
    if how == "plain":  # torch's default_collate stacks the samples
        return dl(ds, shuffle=True)
    if how == "collate":  # h5forge's collate: each batch read into shared memory and passed through
        return dl(ds, shuffle=True, collate_fn=collate)
    return ds.loader(**common, shuffle=True, seed=args.seed, convert="worker" if how == "worker" else "after")


def children_cpu() -> float:
    """CPU seconds of this process's live children: the loader's workers."""
    pids = {p for f in Path(f"/proc/{os.getpid()}/task").glob("*/children") for p in f.read_text().split()}
    return sum(proc_cpu(int(pid)) for pid in pids if Path(f"/proc/{pid}").exists())


def probe(probe: str, data: str, seed: int, batch: int, workers: int, limit: int, epochs: int, check: int) -> dict:
    """(In a probe process.) One reader (name: reader[-0workers][-off-piece+piece]), one timed pass (``limit``
    samples at most, 0: all), or ``epochs`` whole epochs; ``check``: then every value of an epoch summed."""
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", "The given NumPy array is not writable")
    name, _, pieces = probe.partition("-off-")
    if name.endswith("-0workers"):
        name, workers = name.removesuffix("-0workers"), 0
    args = SimpleNamespace(seed=seed, batch=batch, workers=workers, limit=limit, epochs=epochs, check=check)
    with off(*filter(None, pieces.split("+"))):
        loader = reader(name, Path(data), args)
        if args.epochs:
            return whole_epochs(loader, args)
        it = iter(loader)
        first = next(it)
        for _ in range(WARMUP - 1):
            next(it)
        n, batches, t, cpu, kids = 0, 0, time.perf_counter(), time.process_time(), children_cpu()
        for x, _ in it:
            n, batches = n + x.shape[0], batches + 1
            if args.limit and n >= args.limit:
                break
        out = {
            "samples_per_s": n / (time.perf_counter() - t),
            "dtypes": [str(v.dtype)[6:] for v in first],
            "main_cpu_ms_per_batch": round((time.process_time() - cpu) / batches * 1000, 2),
            "workers_cpu_ms_per_batch": round((children_cpu() - kids) / batches * 1000, 2),
        }
        if args.check:
            del it
            out["epoch_sums"] = epoch_sums(loader)
    return out


def epoch_sums(loader) -> list[int]:
    """Every value of one epoch summed per field, whatever the order: equal across readers."""
    sums = [0, 0]
    for x, m in loader:
        x = x if x.dtype == torch.uint8 else (x * 255).round().to(torch.int64)
        sums = [sums[0] + int(x.sum(dtype=torch.int64)), sums[1] + int(m.sum(dtype=torch.int64))]
    return sums


def whole_epochs(loader, args) -> dict:
    """``--epochs`` whole epochs, each from a new iterator (its workers started, and stopped at its end,
    inside the clock), after one short untimed pass (``WARMUP`` batches): samples/s over all of them, and
    CPU per batch of this process and of the workers (which have ended). --check: then one more epoch,
    untimed, every value summed."""
    for k, _ in enumerate(loader):
        if k + 1 == WARMUP:
            break
    n, batches, per_epoch, dtypes = 0, 0, [], []
    t, cpu, kids = time.perf_counter(), time.process_time(), own_cpu(children=True)
    for _ in range(args.epochs):
        t0, n0 = time.perf_counter(), n
        for x, m in loader:  # a new iterator: its workers start here and are joined at its end
            n, batches = n + x.shape[0], batches + 1
            dtypes = dtypes or [str(v.dtype)[6:] for v in (x, m)]
        per_epoch.append(round((n - n0) / (time.perf_counter() - t0)))
    seconds, main = time.perf_counter() - t, time.process_time() - cpu
    out = {
        "samples_per_s": n / seconds,
        "epoch_samples_per_s": per_epoch,
        "dtypes": dtypes,
        "main_cpu_ms_per_batch": round(main / batches * 1000, 2),
        "workers_cpu_ms_per_batch": round((own_cpu(children=True) - kids) / batches * 1000, 2),
    }
    if args.check:
        out["epoch_sums"] = epoch_sums(loader)
    return out


# ---- data ------------------------------------------------------------------------------------------


def prepare(n: int, size: int, codecs=("lz4", "none"), content: str = "generated") -> Path:
    """Links to the lz4 and none versions ``h5forge.build`` makes, and the same arrays as .npy (cached).
    ``content``: the demo generator's pictures, or ``"photos"`` (common.photo_folder)."""
    photos = content == "photos"
    data = CACHE / "read_peers" / f"{'photos-' if photos else ''}n{n}-{size}"
    data.mkdir(parents=True, exist_ok=True)
    raw = photo_folder(n, size) if photos else raw_folder(n, size)
    for codec in codecs:
        spec = make_spec(raw, data / "unused", size, splits={"ratios": {"train": 1.0}}, storage={"codec": codec})
        assert spec.storage.chunk_rows == 1, spec.storage
        path = built(spec, f"read-{'photos-' if photos else ''}n{n}-{size}-{codec}")
        (data / f"{codec}.h5").unlink(missing_ok=True)
        (data / f"{codec}.h5").symlink_to(path)
    made_from = os.path.realpath(data / "lz4.h5")  # the cached arrays are this version's, or made anew
    stale = (data / "npy_from").read_text() != made_from if (data / "npy_from").exists() else True
    write_npy(data, data / "lz4.h5", n, stale)
    (data / "npy_from").write_text(made_from)
    return data


def write_npy(data: Path, version: Path, n: int, stale: bool = True) -> None:
    """The version's train images and masks as ``data/<field>.npy`` (missing or ``stale`` ones written),
    their shapes in ``data/shapes.json``: what the probes' .npy and peer readers read."""
    import h5py

    with h5py.File(version, "r") as f:
        for k in FIELDS:
            if stale or not (data / f"{k}.npy").exists():
                np.save(data / "tmp.npy", f["train"][k][()])
                os.replace(data / "tmp.npy", data / f"{k}.npy")
        shapes = [list(f["train"][k].shape[1:]) for k in FIELDS]
    (data / "shapes.json").write_text(json.dumps({"n": n, "shapes": shapes}))


def write_peers(data: str) -> None:
    """(In the peers' venv.) The .npy arrays as an LMDB, webdataset shards and MDS shards."""
    data = Path(data)
    imgs, masks = (np.load(data / f"{k}.npy", mmap_mode="r") for k in FIELDS)
    n, root = imgs.shape[0], data / "peers"
    if (root / ".complete").exists():
        return
    fresh(root)  # lmdb makes its own folder, not the ones above it
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


# ---- in this process: single-sample latency and a worker's CPU per batch --------------------------


def in_process(data: Path, reads: int, batches: int) -> tuple[dict, dict]:
    """(latency, cpu) of h5forge (lz4 with each codec piece off, none) against .npy (README). Each set
    is opened under its switches: a reader's chunk handling is fixed when it first reads."""
    from torch.utils.data._utils.collate import default_collate

    from h5forge.read.torch import H5Dataset

    mm = NpyItems(data)
    probes = {
        "npy_mmap": (lambda i: (lambda x, m: (x.div(255), m.to(torch.int64)))(*mm[i]), ()),
        "npy_mmap_raw": (mm.__getitem__, ()),
    }
    fetch = {"npy_mmap": (lambda idx: default_collate([mm[i] for i in idx]), ())}
    sets = [("lz4", ()), *(("lz4", (p,)) for p in ("ctypes", "mmap", "direct")), ("none", ()), ("none", ("direct",))]
    for codec, pieces in sets:
        key, path = codec + "".join(f"-off-{p}" for p in pieces), data / f"{codec}.h5"
        with off(*pieces):
            ds = H5Dataset(path, "train", FIELDS, image_dtype="float32", mask_dtype="int64")  # read + convert
            u8 = H5Dataset(path, "train", FIELDS, image_dtype="uint8", mask_dtype="uint8")  # as stored
            ds.reader.read_one(0), u8.reader.read_one(0)
        probes |= {f"h5forge_{key}": (ds.__getitem__, pieces), f"h5forge_{key}_raw": (ds.reader.read_one, pieces)}
        fetch[f"h5forge_{key}"] = (u8.__getitems__, pieces)
    for r in range(2):
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


LOADS: list[float] = []  # the 1-minute load average as each probe started


def probe_rounds(pythons: dict, data: Path, args, limit=lambda name: 0) -> tuple[dict, dict, dict]:
    """Each reader's probe process once a round, rounds interleaved (order reversed every other round), the
    files in the page cache: samples/s and CPU ms per batch (main + workers) of every round, and each
    reader's first outputs. The first round sums every value of an epoch (in-process readers apart):
    readers that disagree end the command."""
    warm([data])
    rates, cpus, info = {k: [] for k in pythons}, {k: [] for k in pythons}, {}
    for r, name in interleaved(list(pythons), args.rounds):
        check = r == 0 and "-0workers" not in name
        LOADS.append(os.getloadavg()[0])
        how = (name, data, r, args.batch, args.workers, limit(name), getattr(args, "epochs", 0), int(check))
        res = child_json("read_peers", "--child", "probe", *how, python=pythons[name])
        rates[name].append(res.pop("samples_per_s"))
        info.setdefault(name, res)
        cpus[name].append(res["main_cpu_ms_per_batch"] + res["workers_cpu_ms_per_batch"])
        log(f"round {r + 1}/{args.rounds} {name:36s} {rates[name][-1]:8.0f} samples/s")
    sums = {k: tuple(v["epoch_sums"]) for k, v in info.items() if "epoch_sums" in v}
    if len(set(sums.values())) != 1:
        raise SystemExit(f"readers disagree on the data: {sums}")
    return rates, cpus, info


def medians(rates: dict, cpus: dict) -> tuple[dict, dict]:
    """Per reader, the median samples/s and loader CPU ms per batch (main + workers) of the rounds."""
    return (
        {k: round(statistics.median(v)) for k, v in rates.items()},
        {k: round(statistics.median(v), 2) for k, v in cpus.items()},
    )


def main() -> None:
    args = cli(
        __doc__,
        dict(n=200, size=64, rounds=1, reads=100, cpu_batches=10),
        n=10_000,
        size=224,
        rounds=3,
        workers=2,
        batch=32,
        reads=2_000,
        cpu_batches=100,
        pieces=",".join(PIECES),
    )
    torch.set_num_threads(1)  # as in the probes: one intra-op thread (2 spin on 2 busy cores)
    data = prepare(args.n, args.size)
    peers_py = peers_venv(PEERS_VENV, not args.smoke, PEERS)
    pieces = [p for p in args.pieces.split(",") if p]
    # default: ds.loader() with nothing asked (uint8); float: asked for float32 + int64, converted after the
    # transfer, where the machinery's pieces (pool, thread) work, so they are switched off there
    names = [
        *"npy_mmap h5forge_lz4_plain h5forge_lz4_loader h5forge_lz4_default h5forge_lz4_float".split(),
        *"h5forge_lz4_worker h5forge_none_plain npy_mmap-0workers h5forge_lz4_plain-0workers".split(),
        "h5forge_lz4_float-0workers",
        *(f"h5forge_lz4_float-off-{p}" for p in pieces),
        "h5forge_lz4_plain-off-direct",
    ]
    pythons = dict.fromkeys(names, Path(sys.executable))
    if peers_py is not None:
        child_json("read_peers", "--child", "write_peers", data, python=peers_py)
        pythons |= dict.fromkeys(("lmdb", "webdataset", "mosaic"), peers_py)
    rates, cpus, info = probe_rounds(pythons, data, args, limit=lambda name: args.n // 2 if "-0workers" in name else 0)
    lat, cpu = in_process(data, args.reads, args.cpu_batches)
    rate, loader_cpu = medians(rates, cpus)
    vs_npy = {k: ratio(v, rate["npy_mmap-0workers" if "-0workers" in k else "npy_mmap"]) for k, v in rate.items()}
    # A/B: each piece's gain = with it on / with it off (speed), and the CPU it saves
    ab = {}
    for p in pieces:
        on, off_ = "h5forge_lz4_float", f"h5forge_lz4_float-off-{p}"
        ab[p] = {
            "speed_on_over_off": ratio(rate[on], rate[off_]),
            "loader_cpu_off_over_on": ratio(loader_cpu[off_], loader_cpu[on]),
        }
        if (k := f"h5forge_lz4-off-{p}") in cpu:  # a codec piece: a worker's CPU per batch and the latency too
            ab[p] |= {
                "worker_cpu_off_over_on": ratio(cpu[k], cpu["h5forge_lz4"]),
                "latency_p50_off_over_on": ratio(lat[k]["p50_us"], lat["h5forge_lz4"]["p50_us"]),
                "raw_p50_off_over_on": ratio(lat[f"{k}_raw"]["p50_us"], lat["h5forge_lz4_raw"]["p50_us"]),
            }
    ratios = {f"{k}_vs_npy": v for k, v in vs_npy.items() if not k.startswith("npy") and "-off-" not in k}
    ratios |= {
        "default_loader_vs_uint8_plain": ratio(rate["h5forge_lz4_default"], rate["h5forge_lz4_plain"]),
        "float_loader_vs_uint8_plain": ratio(rate["h5forge_lz4_float"], rate["h5forge_lz4_plain"]),
        "cpu_per_batch_float_vs_uint8_plain": ratio(loader_cpu["h5forge_lz4_float"], loader_cpu["h5forge_lz4_plain"]),
        "cpu_per_batch_default_vs_uint8_plain": ratio(
            loader_cpu["h5forge_lz4_default"], loader_cpu["h5forge_lz4_plain"]
        ),
        "worker_cpu_per_batch_lz4_vs_npy": ratio(cpu["h5forge_lz4"], cpu["npy_mmap"]),
        **{f"latency_p50_{c}_vs_npy": lat[f"h5forge_{c}"]["p50_vs_npy"] for c in ("lz4", "none")},
        **{
            f"{p} on/off speed, off/on loader CPU": [v["speed_on_over_off"], v["loader_cpu_off_over_on"]]
            for p, v in ab.items()
        },
    }
    result = {
        "peers": PEERS if peers_py else "not installed (skipped)",
        "args": vars(args) | {"warmup_batches": WARMUP},
        "ratios": ratios,
        "machinery_ab": ab,
        "samples_per_s": rate,
        "vs_npy": vs_npy,
        "all_rounds": {k: [round(x) for x in v] for k, v in rates.items()},
        "outputs": info,
        "loader_cpu_ms_per_batch": loader_cpu,
        "latency": lat,
        "cpu_ms_per_batch": cpu,
    }
    save("read_peers", result)


if __name__ == "__main__":
    main()
