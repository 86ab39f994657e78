"""The kinds beside images: a label's cost in the loader, CT volumes from DICOM (the workers' open files,
slice reads), what LZ4 saves on CT slices against what it costs to read one, signals from EDF (stored
sizes). Method: benchmarks/README.md, "kinds".
"""

import os
import time
import warnings

import h5py
import numpy as np
import psutil
import torch

from benchmarks.common import CACHE, DEMO_SPEC, REPO, built, cli, generated, interleaved, latencies_us, log, med
from benchmarks.common import parts, percentiles, proc_cpu, ratio, raw_folder, rounds, save, warm

WORK = CACHE / "kinds"
PARTS = ("labels", "ct", "ct_codec", "signals")
SLICES = ("lz4", "none")  # the codecs CT slices are read with
ARTICLE_LZF_STORED_VS_RAW = round(1 / 3.2, 3)  # the source article: 3.2:1 with LZF


def parse(data: dict):
    from h5forge.spec import parse_spec

    return parse_spec({"output": {"dir": str(WORK / "unused")}, "splits": {"ratios": {"train": 1.0}}, **data}, REPO)


def spec_of(name: str, root, batch_size: int, **fields):
    """A spec of ``fields`` on ``root``, ``batch_size`` samples a dask task."""
    return parse({"name": name, "source": {"root": str(root)}, "compute": {"batch_size": batch_size}, "fields": fields})


def loader_rates(loaders: dict, n_rounds: int) -> dict:
    """Each persistent loader's timed epoch after 3 untimed batches, interleaved: median samples/s and CPU
    ms per batch of the main process and of its workers."""

    def epoch(name: str, r: int) -> tuple:
        loader = loaders[name]
        for _ in zip(range(3), loader):
            pass
        it = iter(loader)
        pids = [os.getpid(), *([w.pid for w in loader._iterator._workers] if loader.num_workers else [])]
        before, n, batches, t = [proc_cpu(p) for p in pids], 0, 0, time.perf_counter()
        for b in it:
            n, batches = n + len(b if isinstance(b, torch.Tensor) else b[0]), batches + 1
        return (n / (time.perf_counter() - t), *(1000 * (proc_cpu(p) - c) / batches for p, c in zip(pids, before)))

    runs = rounds(loaders, n_rounds, epoch)
    return {
        k: {
            "samples_per_s": med(x[0] for x in v),
            "main_cpu_ms_per_batch": med(x[1] for x in v),
            "workers_cpu_ms_per_batch": med(sum(x[2:]) for x in v),
            "rounds": [round(x[0], 1) for x in v],
        }
        for k, v in runs.items()
    }


def labels_part(args) -> dict:
    import yaml

    from h5forge._demo import LABELS
    from h5forge._format.layout import decode_str
    from h5forge.read.torch import H5Dataset

    raw = raw_folder(args.n, args.size, size_range=(args.size * 3 // 4, args.size * 5 // 4))
    data = yaml.safe_load(DEMO_SPEC.read_text())
    data["fields"].pop("masks")
    data["fields"]["images"]["size"] = [args.size, args.size]
    data["fields"]["label"] = {"kind": "label", "column": "label", "classes": list(LABELS)}
    path = built(parse({**data, "source": {"root": str(raw)}}), f"kinds-labels-n{args.n}-{args.size}")
    warm([path])
    both = H5Dataset(path, fields=("images", "label"))
    n = len(both)
    stored = both.reader.read(range(n))["label"]  # the labels are the annotation column's, row by row
    assert stored.tolist() == [LABELS.index(s) for s in decode_str(both.meta("label"))]
    loaders = {
        f"{name}_{w}workers": H5Dataset(path, fields=fields).loader(batch_size=32, num_workers=w, shuffle=True)
        for w in (args.workers, 0)
        for name, fields in (("images+label", ("images", "label")), ("images", ("images",)))
    }
    got = loader_rates(loaders, args.rounds)
    speed = {k: v["samples_per_s"] for k, v in got.items()}
    return {
        "samples": n,
        "image_px": args.size,
        "class_counts": np.bincount(stored, minlength=len(LABELS)).tolist(),
        "loaders": got,
        "labels_vs_images_only": {
            f"{w}workers": ratio(speed[f"images+label_{w}workers"], speed[f"images_{w}workers"])
            for w in (args.workers, 0)
        },
    }


def slices_npy(version, name: str):
    """Every CT slice of ``version`` in a memory-mapped .npy (made once), and its path."""
    npy = WORK / f"{name}-slices.npy"
    if not npy.exists():
        with h5py.File(version, "r") as f:
            np.save(npy, f["train"]["ct"][()])
    return np.load(npy, mmap_mode="r"), npy


def worker_fds(cases, workers: int, epochs: int) -> list[dict]:
    """Open descriptors of each persistent loader worker (and those on the dataset file) at each epoch's end."""
    loader = cases.loader(batch_size=2, num_workers=workers, shuffle=True, persistent_workers=True)
    out, pids = [], None
    for e in range(epochs):
        for k, _ in enumerate(loader):
            pids = pids or ([w.pid for w in loader._iterator._workers] if k == 1 else None)
        procs = [psutil.Process(p) for p in pids]
        handles = [sum(f.path == cases.real_path for f in p.open_files()) for p in procs]
        out.append({"epoch": e + 1, "worker_fds": [p.num_fds() for p in procs], "dataset_handles": handles})
        log(f"ct epoch {e + 1}: {out[-1]}")
    return out


def ct_part(args) -> dict:
    from h5forge.read._direct import DirectRows
    from h5forge.read.torch import H5Dataset
    from h5forge._demo import generate_ct

    depths = (args.depth_min, args.depth_max)  # slices per case; each slice 128² int16, in DICOM files
    make = lambda root: generate_ct(root, n=args.cases, seed=0, bad=False, depth_range=depths)  # noqa: E731
    raw = generated(f"kinds-ct-{args.cases}-{args.depth_min}-{args.depth_max}", make)

    def ct_spec(codec: str | None):
        field = {"kind": "volume", "files": "case_*", "size": [128, 128], **({"codec": codec} if codec else {})}
        return spec_of("ct", raw, 2, ct=field)

    spec = ct_spec(None)  # the default: storage.codec (lz4)
    path = built(spec, f"kinds-{raw.name}")
    plain = built(ct_spec("none"), f"kinds-{raw.name}-none")  # the setting docs/reading.md recommends for slices
    cases = H5Dataset(path, fields=("ct",))
    epochs = worker_fds(cases, args.ct_workers, args.ct_epochs)
    # a slice through the reader against a memory-mapped .npy of every slice: 2-D (one slice) and
    # 2.5-D (the slice and --ct-context neighbours each side, clamped to its case), in random order
    # and in a sweep through consecutive slices (a 2.5-D model's validation)
    k = args.ct_context
    ds = {"lz4": H5Dataset(path, fields=("ct",), unit="slice"), "none": H5Dataset(plain, fields=("ct",), unit="slice")}
    stack = {
        f"{codec}_cache{c}": H5Dataset(p, fields=("ct",), unit="slice", context=k, slice_cache=c)
        for codec, p in (("lz4", path), ("none", plain))
        for c in ((0, None) if codec == "lz4" else (None,))
    }
    n = len(ds["lz4"])
    mm, npy = slices_npy(path, raw.name)
    index = stack["lz4_cache0"].slices
    for i in (0, n // 2, n - 1):
        for d in ds.values():
            assert np.array_equal(d[i].numpy(), mm[i])
        for d in stack.values():
            assert np.array_equal(d[i].numpy(), mm[index.elements(np.array([i]))[0]])
    warm([path, plain, npy])
    # the same slice read through h5py (the direct chunk path off), and LZ4's own decompression of it
    via_h5py = H5Dataset(path, fields=("ct",), unit="slice")
    via_h5py.reader.read_elements("ct", np.array([0]))
    via_h5py.reader._direct["ct"] = None
    direct = ds["lz4"].reader._direct["ct"]
    assert isinstance(direct, DirectRows) and direct._index
    chunks = direct._index
    out = np.empty(mm.shape[1:], mm.dtype)
    at = out.ctypes.data

    def decompress(i: int) -> None:  # the stored chunk into a row: no allocation, no bookkeeping
        assert chunks.read_at(i, at, out.nbytes, "lz4")

    def npy_stack(i: int):
        return torch.from_numpy(mm[index.elements(np.array([i]))[0]])

    probes = {
        "npy_mmap": lambda i: torch.from_numpy(np.array(mm[i])),
        "slice_lz4": ds["lz4"].__getitem__,
        "slice_none": ds["none"].__getitem__,
        "slice_lz4_h5py": via_h5py.__getitem__,
        "lz4_decompress_only": decompress,
        f"npy_mmap_context{k}": npy_stack,
        **{f"stack_{name}": d.__getitem__ for name, d in stack.items()},
    }
    rng = np.random.default_rng(0)
    start = int(rng.integers(0, n))
    orders = {
        "random": rng.integers(0, n, args.slice_reads).tolist(),
        "sweep": [(start + j) % n for j in range(args.slice_reads)],
    }
    times: dict[str, list[float]] = {}
    by_round: dict[tuple[int, str], float] = {}  # each round's p50 of the single slices: the ratios' spread
    for r, name in interleaved(list(probes), args.slice_rounds + 1):  # the first round warms up
        for order in ("random", "sweep") if "context" in name or name.startswith("stack") else ("random",):
            got = latencies_us(probes[name], orders[order])
            if r:
                times.setdefault(f"{name}.{order}" if order == "sweep" else name, []).extend(got)
                by_round[r, name] = float(np.median(got))
    lat = {name: percentiles(us, (50, 90, 99), nd=2) for name, us in times.items()}
    for name, v in lat.items():
        log(f"ct {name:32s} p50 {v['p50_us']:8.2f} p90 {v['p90_us']:8.2f} µs")
    stored = {}
    for codec, p in (("lz4", path), ("none", plain)):
        with h5py.File(p, "r") as f:
            stored[codec] = ratio(f["train"]["ct"].id.get_storage_size(), mm.nbytes)
    base, base_k = lat["npy_mmap"], lat[f"npy_mmap_context{k}"]
    vs = {
        f"{name}_{q}_vs_npy": ratio(lat[name][f"{q}_us"], base[f"{q}_us"], 2)
        for name in ("slice_lz4", "slice_none", "slice_lz4_h5py", "lz4_decompress_only")
        for q in ("p50", "p90")
    }
    for name in (name for name in lat if name.startswith("stack")):  # against the .npy stack in the same order
        against = lat[f"npy_mmap_context{k}.sweep"] if "sweep" in name else base_k
        vs |= {f"{name}_{q}_vs_npy": ratio(lat[name][f"{q}_us"], against[f"{q}_us"], 2) for q in ("p50", "p90")}
    return {
        "cases": len(cases),
        "slices": n,
        "slice_bytes": int(mm[0].nbytes),
        "codec_default": spec.storage.codec,
        "stored_vs_raw": stored,
        "context": k,
        "slice_cache_default": stack["lz4_cacheNone"].reader.slice_cache,
        "worker_fds": epochs,
        "worker_fds_constant": all(e["worker_fds"] == epochs[0]["worker_fds"] for e in epochs),
        "slice_latency": lat,
        "vs_npy": vs,
        "slice_p50_vs_npy": vs["slice_lz4_p50_vs_npy"],
        "slice_none_p50_vs_npy": vs["slice_none_p50_vs_npy"],
        "rounds": {
            f"slice{'' if codec == 'lz4' else '_none'}_p50_vs_npy": [
                ratio(by_round[r, f"slice_{codec}"], by_round[r, "npy_mmap"], 2)
                for r in range(1, args.slice_rounds + 1)
            ]
            for codec in ("lz4", "none")
        },
    }


def ct_codec_part(args) -> dict:
    """Per slice size and share of each slice outside the scanner's field of view, volumes built with lz4 and
    with none: what LZ4 saves, and a random slice's p50 against a memory-mapped .npy."""
    import nibabel

    from h5forge.read.torch import H5Dataset

    rows, times = [], {}
    sizes, outside = [int(x) for x in args.codec_sizes.split(",")], [float(x) for x in args.codec_outside.split(",")]

    def make(root, size: int, share: float) -> None:
        rng, root = np.random.default_rng(0), root.mkdir(parents=True) or root
        yy, xx = np.mgrid[:size, :size] - (size - 1) / 2
        fov = np.hypot(yy, xx) <= np.sqrt((1 - share) * size * size / np.pi)  # the field of view: a disc
        depth = max(2, args.codec_slices // args.codec_cases)
        for c in range(args.codec_cases):
            v = np.where(fov, rng.normal(40, 60, (depth, size, size)), -3024).round().astype(np.int16)
            nibabel.save(nibabel.Nifti1Image(v.transpose(2, 1, 0), np.eye(4)), root / f"case{c:03d}.nii")

    names = [(size, share) for size in sizes for share in outside]
    sets = {}
    for size, share in names:
        raw = generated(
            f"kinds-ctcodec-{size}-{share}-{args.codec_cases}-{args.codec_slices}",
            lambda root, size=size, share=share: make(root, size, share),
        )
        field = {"kind": "volume", "files": "*.nii", "size": [size, size]}
        paths = {c: built(spec_of("ctcodec", raw, 2, ct=field | {"codec": c}), f"kinds-{raw.name}-{c}") for c in SLICES}
        mm, npy = slices_npy(paths["none"], raw.name)
        warm([*paths.values(), npy])
        ds = {codec: H5Dataset(p, fields=("ct",), unit="slice") for codec, p in paths.items()}
        for d in ds.values():
            assert np.array_equal(d[len(mm) // 2].numpy(), mm[len(mm) // 2])
        with h5py.File(paths["lz4"], "r") as f:
            saved = 1 - f["train"]["ct"].id.get_storage_size() / mm.nbytes
        sets[(size, share)] = (ds, mm, saved)
    order = np.random.default_rng(0)
    probes = [(key, how) for key in names for how in ("npy", "lz4", "none")]
    for r, (key, how) in interleaved(probes, args.slice_rounds + 1):  # the first round warms up
        ds, mm, _ = sets[key]
        get = (lambda i, mm=mm: torch.from_numpy(np.array(mm[i]))) if how == "npy" else ds[how].__getitem__
        got = latencies_us(get, order.integers(0, len(mm), args.slice_reads).tolist())
        if r:
            times.setdefault((key, how), []).extend(got)
    for size, share in names:
        p50 = {how: percentiles(times[((size, share), how)], (50,), nd=2)["p50_us"] for how in ("npy", "lz4", "none")}
        row = {"slice_px": size, "outside_fov": share, "lz4_saves": round(sets[(size, share)][2], 3), "p50_us": p50}
        rows.append(row | {f"{c}_p50_vs_npy": ratio(p50[c], p50["npy"], 2) for c in SLICES})
        log(f"ct_codec {rows[-1]}")
    # per slice size, the least LZ4 saving from which on a random lz4 slice reads within 1.5x of .npy
    within = {}
    for size in sizes:
        at = sorted((r["lz4_saves"], r["lz4_p50_vs_npy"]) for r in rows if r["slice_px"] == size)
        within[f"{size}px"] = next((s for k, (s, _) in enumerate(at) if all(x <= 1.5 for _, x in at[k:])), None)
    return {"slices_per_set": args.codec_slices, "sets": rows, "lz4_within_1_5x_npy_from_saving": within}


def signals_part(args) -> dict:
    from h5forge._demo import SIGNAL_CHANNELS, generate_signals
    from h5forge._format.codecs import CODECS

    root = generated(
        f"kinds-edf-{args.recordings}-{args.seconds_min}-{args.seconds_max}",
        lambda root: generate_signals(
            root, n=args.recordings, seed=0, bad=False, seconds_range=(args.seconds_min, args.seconds_max)
        ),
    )
    ch = {label.lower(): (label, float(s[0])) for label, s in SIGNAL_CHANNELS.items()}
    edf = sum(p.stat().st_size for p in root.glob("*.edf"))
    out = {
        "recordings": args.recordings,
        "edf_bytes": edf,
        "article_lzf_stored_vs_raw_claim": ARTICLE_LZF_STORED_VS_RAW,
    }
    for codec in ("default", *CODECS):
        chosen = {} if codec == "default" else {"codec": codec}  # each signal field has its own codec
        fields = {
            k: {"kind": "signal", "files": "*.edf", "channel": label, "rate": rate} for k, (label, rate) in ch.items()
        }
        spec = spec_of("signals", root, 8, **{k: field | chosen for k, field in fields.items()})
        with h5py.File(built(spec, f"kinds-{root.name}-{codec}"), "r") as f:
            raw, stored = sum(f["train"][k].size * 4 for k in ch), sum(f["train"][k].id.get_storage_size() for k in ch)
        out[codec] = {"stored_vs_raw": round(stored / raw, 4), "stored_vs_edf": ratio(stored, edf)}
        log(f"signals {codec:15s} {out[codec]}")
    return out


def main() -> None:
    args = cli(
        __doc__,
        dict(
            n=200,
            size=64,
            rounds=1,
            cases=4,
            depth_min=8,
            depth_max=16,
            ct_epochs=2,
            slice_reads=100,
            slice_rounds=1,
            recordings=4,
            seconds_min=2,
            seconds_max=10,
            codec_sizes="64",
            codec_outside="0,0.6",
            codec_cases=2,
            codec_slices=16,
        ),
        parts=",".join(PARTS),
        n=5_000,
        size=128,
        workers=2,
        rounds=9,
        cases=36,
        depth_min=60,
        depth_max=150,
        ct_epochs=3,
        ct_workers=4,
        ct_context=2,
        slice_reads=2_000,
        slice_rounds=4,
        recordings=60,
        seconds_min=60,
        seconds_max=600,
        codec_sizes="128,256,512",
        codec_outside="0,0.1,0.2,0.3,0.45,0.6,0.8",
        codec_cases=8,
        codec_slices=240,
    )
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", "The given NumPy array is not writable")
    warnings.filterwarnings("ignore", "This DataLoader will create")  # 4 CT workers on 2 cores: asked for
    WORK.mkdir(parents=True, exist_ok=True)
    only, result = parts(args.parts, PARTS), {}
    for name, fn in (("labels", labels_part), ("ct", ct_part), ("ct_codec", ct_codec_part), ("signals", signals_part)):
        if name in only:
            result[name] = fn(args)
    lab, ct, sig = (result.get(k, {}) for k in ("labels", "ct", "signals"))
    ratios = {
        **{f"labels_vs_images_only_{k}": v for k, v in lab.get("labels_vs_images_only", {}).items()},
        **{f"ct_{k}": ct[k] for k in ("worker_fds_constant", "slice_p50_vs_npy", "slice_none_p50_vs_npy") if ct},
        **{
            f"ct_lz4_within_1_5x_npy_from_saving_{k}": v
            for k, v in result.get("ct_codec", {}).get("lz4_within_1_5x_npy_from_saving", {}).items()
        },
        **{f"signals_{c}_stored_vs_raw": sig[c]["stored_vs_raw"] for c in ("default", "lzf") if sig},
    }
    result = {"ratios": ratios, **result}
    if ct:
        result["spread"] = {f"ct_{k}": [min(v), max(v)] for k, v in ct["rounds"].items()}
    save("kinds" if set(only) == set(PARTS) else "kinds_" + "_".join(only), result)


if __name__ == "__main__":
    main()
