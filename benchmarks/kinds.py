"""Kinds benchmark: labels beside images, CT volumes, signals (stored sizes, reads vs their sources).

    python -m benchmarks.kinds [--smoke] [--n 5000 --size 128 --cases 36 --recordings 60] [--parts labels,ct,signals]

What is measured and how: benchmarks/README.md, section "kinds".
"""

import contextlib
import json
import os
import shutil
import statistics
import time
import warnings
from pathlib import Path

import h5py
import numpy as np
import psutil
import torch
from torch.utils.data import DataLoader, Dataset

from benchmarks.common import (CACHE, DEMO_SPEC, REPO, build_file, clean_in_process, cli, code_key, log, machine,
                               profiled, random_read_latency, ratio, save, warm, write_file)

WORK = CACHE / "kinds"
ARTICLE_LZF_STORED_VS_RAW = round(1 / 3.2, 3)  # the source article: 3.2:1 with LZF


def parse(data: dict, base: Path = REPO):
    from h5forge.spec import parse_spec
    return parse_spec(data, base)


def built(spec, path: Path) -> Path:
    """``path`` built from ``spec`` (discover, clean, DatasetWriter) unless it exists."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        t = time.perf_counter()
        build_file(spec, path.with_suffix(".building"))
        os.replace(path.with_suffix(".building"), path)
        log(f"built {path.name} in {time.perf_counter() - t:.0f} s")
    return path


@contextlib.contextmanager
def generating(root: Path):
    """Yields True when ``root`` must be (re)generated; marks it complete afterwards."""
    if (root / ".complete").exists():
        yield False
        return
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    t = time.perf_counter()
    yield True
    (root / ".complete").write_text(json.dumps({"seconds": round(time.perf_counter() - t, 1)}))
    log(f"generated {root} in {time.perf_counter() - t:.0f} s")


def batch_len(b) -> int:
    from h5forge.read.collate import Padded
    if isinstance(b, torch.Tensor):
        return len(b)
    if isinstance(b, Padded):
        return len(b.lengths)
    return batch_len(b[0])


def proc_stat(pid: int) -> tuple[float, int]:
    """CPU seconds (user + system) and minor page faults of a process so far (Linux /proc)."""
    f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK"), int(f[7])


class Loop:
    """One persistent loader per configuration: each run() is a few untimed warm-up batches, then one
    timed epoch (or ``limit`` samples): samples/s, and per batch the CPU ms and minor page faults of
    the main process and of the loader's workers (summed)."""

    def __init__(self, make, limit: int | None = None, warmup: int = 3):
        self.make, self.limit, self.warmup, self.loader, self.rates = make, limit, warmup, None, []
        self.stats: dict[str, list[float]] = {}

    def run(self) -> float:
        self.loader = self.loader or self.make()
        it = iter(self.loader)
        for _ in zip(range(min(self.warmup, len(self.loader) - 1)), it):
            pass
        del it
        it = iter(self.loader)
        procs = [os.getpid(), *(worker_pids(self.loader) if self.loader.num_workers else [])]
        before = [proc_stat(p) for p in procs]
        n, batches, t = 0, 0, time.perf_counter()
        for b in it:
            n, batches = n + batch_len(b), batches + 1
            if self.limit and n >= self.limit:
                break
        self.rates.append(n / (time.perf_counter() - t))
        delta = [(y[0] - x[0], y[1] - x[1]) for x, y in zip(before, [proc_stat(p) for p in procs])]
        who = {"main": delta[:1], **({"workers": delta[1:]} if delta[1:] else {})}
        for name, d in who.items():
            self.stats.setdefault(f"cpu_ms_per_batch_{name}", []).append(sum(c for c, _ in d) * 1000 / batches)
            self.stats.setdefault(f"minor_faults_per_batch_{name}", []).append(sum(f for _, f in d) / batches)
        return self.rates[-1]


def interleaved(loops: dict[str, Loop], rounds: int, what: str) -> None:
    """Every loop once per round, the order reversed every other round."""
    for r in range(rounds):
        for name in (list(loops) if r % 2 == 0 else list(loops)[::-1]):
            loop = loops[name]
            rate = loop.run()
            cpu = {k: v[-1] for k, v in loop.stats.items() if k.startswith("cpu")}
            log(f"{what} round {r + 1}/{rounds} {name:24s} {rate:9.1f} samples/s, CPU ms/batch main "
                f"{cpu['cpu_ms_per_batch_main']:.2f} workers {cpu.get('cpu_ms_per_batch_workers', 0):.2f}")
    for loop in loops.values():
        loop.loader = None


def rates(loops: dict[str, Loop]) -> dict:
    return {k: {"samples_per_s": round(statistics.median(v.rates), 1),
                **{s: round(statistics.median(x), 2) for s, x in v.stats.items()},
                "rounds": [round(x, 1) for x in v.rates]} for k, v in loops.items()}


class Items(Dataset):
    """A map-style dataset over ``keys``: item i = ``fetch(keys[i])``."""

    def __init__(self, keys: list, fetch):
        self.keys, self.fetch = keys, fetch

    def __len__(self) -> int:
        return len(self.keys)

    def __getitem__(self, i):
        return self.fetch(self.keys[i])


def cpu_ms_per_batch(fetch, n: int, batch: int, batches: int, seed: int) -> float:
    """CPU ms (this process) per ``fetch(indices)`` of random batches: min of 3 passes."""
    order = np.random.default_rng(seed).permutation(n)
    idx = [order[(k * batch) % max(1, n - batch):][:batch].tolist() for k in range(batches)]
    fetch(idx[0])
    best = float("inf")
    for _ in range(3):
        t = time.process_time()
        for i in idx:
            fetch(i)
        best = min(best, (time.process_time() - t) / batches * 1000)
    return round(best, 3)


# ---- 1. labels beside images ---------------------------------------------------------------------

def label_file(n: int, size: int) -> Path:
    """The demo data (``generate``, raw pictures around ``size`` px) built with the demo spec's images plus
    a ``kind: label`` field from its ``label`` column, every sample in train."""
    import yaml

    from h5forge.demo import LABELS, generate
    raw = WORK / f"cells-n{n}-{size * 3 // 4}-{size * 5 // 4}"
    with generating(raw) as todo:
        if todo:
            generate(raw, n=n, seed=0, bad=False, size_range=(size * 3 // 4, size * 5 // 4), workers=2)
    data = yaml.safe_load(DEMO_SPEC.read_text())
    data["fields"].pop("masks")
    data["fields"]["images"]["size"] = [size, size]
    data["fields"]["label"] = {"kind": "label", "column": "label", "classes": list(LABELS)}
    data.update(source={"root": str(raw)}, output={"dir": str(WORK / "out")}, splits={"ratios": {"train": 1.0}})
    spec = parse(data)
    return built(spec, WORK / f"labels-n{n}-{size}-{spec.storage.codec}-{code_key()}.h5")


def labels_part(args) -> dict:
    from h5forge.format.layout import decode_str
    from h5forge.demo import LABELS
    from h5forge.read.torch import H5Dataset
    path = label_file(args.n, args.size)
    warm([path])
    both, images = H5Dataset(path, fields=("images", "label")), H5Dataset(path, fields=("images",))
    n = len(images)
    stored = both.reader.read(range(n))["label"]  # the labels are the annotation column's, row by row
    assert stored.tolist() == [LABELS.index(s) for s in decode_str(both.meta("label"))]
    a, b = both[n // 2], images[n // 2]
    assert torch.equal(a[0], b) and int(a[1]) == stored[n // 2]

    def loop(fields, workers: int) -> Loop:
        return Loop(lambda: H5Dataset(path, fields=fields).loader(batch_size=args.batch, num_workers=workers,
                                                                     shuffle=True))

    loops = {"images+label_2workers": loop(("images", "label"), args.workers),
             "images_2workers": loop(("images",), args.workers),
             "images+label_0workers": loop(("images", "label"), 0), "images_0workers": loop(("images",), 0)}
    interleaved(loops, args.rounds, "labels")
    got = rates(loops)
    paired = {w: med_ratio(loops[f"images+label_{w}"].rates, loops[f"images_{w}"].rates) for w in ("2workers", "0workers")}
    label_only = H5Dataset(path, fields=("label",))
    batches = [np.random.default_rng(k).permutation(n)[:args.batch].tolist() for k in range(args.cpu_batches)]
    prof = lambda d: profiled(lambda: [d.__getitems__(b) for b in batches * 3], top=10)[2]  # noqa: E731
    cpu = {name: cpu_ms_per_batch(d.__getitems__, n, args.batch, args.cpu_batches, 0)
           for name, d in (("images+label", both), ("images", images), ("label_alone", label_only))}
    with h5py.File(path, "r") as f:
        g = f["train"]
        size = {k: g[k].id.get_storage_size() for k in ("images", "label")}
    return {"samples": n, "image_px": args.size, "batch": args.batch, "workers": args.workers, "rounds": args.rounds,
            "classes": list(LABELS), "class_counts": np.bincount(stored, minlength=len(LABELS)).tolist(),
            "stored_bytes": size, "samples_per_s": got,
            "labels_vs_images_only": {w: ratio(got[f"images+label_{w}"]["samples_per_s"],
                                               got[f"images_{w}"]["samples_per_s"]) for w in ("2workers", "0workers")},
            "labels_vs_images_only_median_of_rounds": paired,
            "cpu_ms_per_batch_in_process": cpu | {"label_share": ratio(cpu["images+label"] - cpu["images"], cpu["images"])},
            "profile_images+label": prof(both), "profile_images": prof(images)}


def med_ratio(a: list[float], b: list[float]) -> float:
    """Median over rounds of a round's ratio (the two ran back to back in each round)."""
    return round(statistics.median(x / y for x, y in zip(a, b)), 3)


# ---- 2. CT volumes -------------------------------------------------------------------------------

def ct_raw(cases: int, depths: tuple[int, int], size: int, seed: int = 0) -> Path:
    """``cases`` DICOM series ROOT/cases/case_NNN/*.dcm of ``depths`` slices of size x size int16, made
    from pydicom's CT_small.dcm (its pixels resampled to ``size``, a +400 HU sphere and noise added
    per slice, explicit VR little endian), files saved in shuffled order."""
    import copy

    import pydicom
    from pydicom.data import get_testdata_file
    from pydicom.uid import generate_uid
    root = WORK / f"ct-{cases}-{depths[0]}-{depths[1]}-{size}-s{seed}"
    with generating(root) as todo:
        if not todo:
            return root
        base = pydicom.dcmread(get_testdata_file("CT_small.dcm"))
        src = base.pixel_array.astype(np.int32)
        pick = np.arange(size) * src.shape[0] // size
        pixels = src[np.ix_(pick, pick)]
        mm = float(base.PixelSpacing[0]) * src.shape[0] / size
        yy, xx = np.mgrid[0:size, 0:size] * mm
        for c in range(cases):
            rng = np.random.default_rng([seed, c])
            depth, spacing = int(rng.integers(depths[0], depths[1] + 1)), float(rng.choice([1.0, 1.25, 2.5]))
            folder = root / "cases" / f"case_{c:03d}"
            folder.mkdir(parents=True)
            centre, radius = rng.uniform(0.3, 0.7, 3) * (depth * spacing, size * mm, size * mm), rng.uniform(8, 20)
            ds = copy.deepcopy(base)
            ds.Rows = ds.Columns = size
            ds.PixelSpacing = [mm, mm]
            ds.SeriesInstanceUID = generate_uid(entropy_srcs=[str(seed), str(c), "series"])
            ds.StudyInstanceUID = generate_uid(entropy_srcs=[str(seed), str(c), "study"])
            ds.ImageOrientationPatient = [1, 0, 0, 0, 1, 0]
            ds.SliceThickness = spacing
            for k in rng.permutation(depth):
                inside = (k * spacing - centre[0]) ** 2 + (yy - centre[1]) ** 2 + (xx - centre[2]) ** 2 <= radius ** 2
                values = pixels + 400 * inside + np.round(rng.normal(0, 12, pixels.shape)).astype(np.int32)
                ds.PixelData = np.clip(values, -32768, 32767).astype(np.int16).tobytes()
                ds.SOPInstanceUID = ds.file_meta.MediaStorageSOPInstanceUID = generate_uid(
                    entropy_srcs=[str(seed), str(c), str(k)])
                ds.ImagePositionPatient = [-size * mm / 2, -size * mm / 2, -150.0 + k * spacing]
                ds.SliceLocation, ds.InstanceNumber = -150.0 + k * spacing, int(rng.integers(1, 10_000))
                ds.save_as(folder / f"{ds.SOPInstanceUID}.dcm", enforce_file_format=True)
    return root


def dicom_case(folder: Path) -> torch.Tensor:
    """The plain way: dcmread every file of the folder, sort by position, stack HU as int16."""
    import pydicom
    dss = [pydicom.dcmread(p) for p in folder.iterdir() if p.suffix == ".dcm"]
    dss.sort(key=lambda d: float(d.ImagePositionPatient[2]))
    hu = np.stack([d.pixel_array.astype(np.float32) * float(d.RescaleSlope) + float(d.RescaleIntercept) for d in dss])
    return torch.from_numpy(hu.astype(np.int16))


def worker_pids(loader) -> list[int]:
    """The worker processes of a DataLoader with persistent workers (its live iterator's)."""
    return [w.pid for w in loader._iterator._workers]


def fds(pids: list[int], path: Path) -> dict:
    """Open descriptors of each process, and how many of them are the dataset file."""
    out = {"fds": [], "h5_handles": []}
    for pid in pids:
        p = psutil.Process(pid)
        out["fds"].append(p.num_fds())
        out["h5_handles"].append(sum(f.path == str(path) for f in p.open_files()))
    return out


def ct_fds(path: Path, epochs: int, workers: int) -> dict:
    """A persistent 4-worker loader over every case for ``epochs`` epochs; descriptors per worker after
    the 2nd batch and at the end of each epoch."""
    from h5forge.read.torch import H5Dataset
    ds = H5Dataset(path, fields=("ct",))
    loader = ds.loader(batch_size=2, num_workers=workers, shuffle=True, persistent_workers=True)
    rows, pids, t0, slices = [], None, time.perf_counter(), 0
    for e in range(epochs):
        n, mid = 0, None
        for k, (values, depths) in enumerate(loader):
            n += len(depths)
            slices += int(depths.sum())
            if k == 1:
                pids = pids or worker_pids(loader)
                mid = fds(pids, Path(ds.real_path))
        assert n == len(ds), (n, len(ds))
        assert worker_pids(loader) == pids, "workers were replaced"
        end = fds(pids, Path(ds.real_path))
        rows.append({"epoch": e + 1, "cases": n, "fds_after_2_batches": mid["fds"], "fds_end": end["fds"],
                     "h5_handles_end": end["h5_handles"], "main_fds": psutil.Process().num_fds()})
        log(f"ct fds epoch {e + 1}: workers {end['fds']} (after 2 batches {mid['fds']}), dataset handles "
            f"{end['h5_handles']}")
    wall = time.perf_counter() - t0
    del loader
    constant = all(r["fds_end"] == rows[0]["fds_end"] for r in rows)
    return {"workers": workers, "worker_pids": pids, "epochs": rows, "constant_at_epoch_end": constant,
            "constant_after_2_batches": all(r["fds_after_2_batches"] == rows[0]["fds_after_2_batches"] for r in rows),
            "cases_per_s": round(epochs * len(ds) / wall, 2), "slices_per_s": round(slices / wall, 1)}


def npy_slices(path: Path) -> Path:
    """Every slice of the split as one .npy (for a memory map), and an uncompressed twin of the file
    (one slice per chunk, no filter) to split HDF5 reads from decompression."""
    npy, plain = path.with_suffix(".slices.npy"), path.with_suffix(".nocodec.h5")
    if not npy.exists() or not plain.exists():
        with h5py.File(path, "r") as f, h5py.File(plain.with_suffix(".tmp"), "w") as g:
            d = f["train"]["ct"]
            mm = np.lib.format.open_memmap(npy.with_suffix(".tmp.npy"), "w+", d.dtype, d.shape)
            o = g.create_dataset("ct", shape=d.shape, dtype=d.dtype, chunks=(1, *d.shape[1:]))
            for s in range(0, d.shape[0], 256):
                mm[s:s + 256] = o[s:s + 256] = d[s:s + 256]
            mm.flush()
            del mm
        os.replace(npy.with_suffix(".tmp.npy"), npy)
        os.replace(plain.with_suffix(".tmp"), plain)
    return npy


def ct_part(args) -> dict:
    from h5forge.read.collate import VarlenCollate
    from h5forge.read.torch import H5Dataset
    raw = ct_raw(args.cases, (args.depth_min, args.depth_max), args.ct_size)
    spec = parse({"name": "ct", "source": {"root": str(raw)}, "output": {"dir": str(WORK / "out")},
                  "splits": {"ratios": {"train": 1.0}}, "compute": {"batch_size": 2},
                  "fields": {"ct": {"kind": "volume", "files": "cases/*", "size": [args.ct_size] * 2}}})
    t = time.perf_counter()
    path = built(spec, WORK / f"ct-{raw.name}-{spec.storage.codec}-{code_key()}.h5")
    build_s = time.perf_counter() - t
    npy = npy_slices(path)
    folders = sorted((raw / "cases").iterdir())
    warm([path, npy, path.with_suffix(".nocodec.h5"), raw / "cases"])
    cases = H5Dataset(path, fields=("ct",))
    ids = cases.ids()
    depths = cases.reader.lengths("ct")
    assert ids == [p.name for p in folders] and len(ids) == args.cases
    k = len(ids) // 2
    assert torch.equal(cases[k], dicom_case(folders[k]))  # the same HU through both
    with h5py.File(path, "r") as f:
        stored = f["train"]["ct"].id.get_storage_size()
    dicom_bytes = sum(p.stat().st_size for p in (raw / "cases").rglob("*.dcm"))
    setup = {"cases": len(ids), "slices": int(depths.sum()),
             "depths_min_median_max": [int(depths.min()), int(np.median(depths)), int(depths.max())],
             "slice_px": args.ct_size, "source": "DICOM (pydicom, CT_small.dcm resampled)",
             "codec": spec.storage.codec, "raw_int16_bytes": int(depths.sum()) * args.ct_size ** 2 * 2,
             "stored_bytes": stored, "dicom_bytes": dicom_bytes, "build_seconds": round(build_s, 1)}
    setup["stored_vs_raw"] = ratio(stored, setup["raw_int16_bytes"])

    # file descriptors of the loader's workers over epochs
    fd = ct_fds(path, args.ct_epochs, args.ct_workers)

    # random single-slice latency: the reader's slice path vs a memory map; where the time goes
    sl = H5Dataset(path, fields=("ct",), unit="slice")
    mm = np.load(npy, mmap_mode="r")
    total = len(sl)
    for i in (0, total // 3, total - 1):
        assert np.array_equal(sl[i].numpy(), mm[i])
    fh, fp = h5py.File(path, "r"), h5py.File(path.with_suffix(".nocodec.h5"), "r")
    d_lz, d_plain = fh["train"]["ct"], fp["ct"]
    probes = {
        "reader_slice": sl.__getitem__,
        "npy_mmap": lambda i: torch.from_numpy(np.array(mm[i])),
        "reader_read_elements_raw": lambda i: sl.reader.read_elements("ct", np.array([i])),
        "h5py_dataset_i": lambda i: d_lz[i],
        "h5py_nocodec_dataset_i": lambda i: d_plain[i],
        "h5py_read_direct_chunk_no_decompress": lambda i: d_lz.id.read_direct_chunk((i, 0, 0)),
        "npy_mmap_copy_raw": lambda i: np.array(mm[i])}
    lat = {}
    for r in range(2):  # interleaved twice; the second round is kept
        lat = {name: random_read_latency(fn, total, args.slice_reads, r) for name, fn in probes.items()}
    fh.close()
    fp.close()
    for name, v in lat.items():
        v["p50_vs_npy"] = ratio(v["p50_us"], lat["npy_mmap"]["p50_us"], 2)
        log(f"ct slice latency {name:40s} p50 {v['p50_us']:8.1f} us p99 {v['p99_us']:8.1f} us")
    from h5forge.format.codecs import CODECS
    one_chunk, raw_chunk = {}, np.ascontiguousarray(mm[total // 2])
    for codec in dict.fromkeys((spec.storage.codec, "none")):  # one slice's chunk, chunk cache off: the filter's share
        fname = WORK / "slice-codec.h5"
        with h5py.File(fname, "w") as f:
            f.create_dataset("x", data=raw_chunk[None], chunks=(1, *raw_chunk.shape), **CODECS[codec].options())
        with h5py.File(fname, "r", rdcc_nbytes=0) as f:
            x = f["x"]
            one_chunk[codec] = random_read_latency(lambda i: x[0], 1, args.slice_reads, 0)["p50_us"]
        fname.unlink()

    # whole cases: reader vs the DICOM folder, in this process and through 2 loader workers
    rng = np.random.default_rng(0)
    dicom_n = min(args.dicom_cases, len(ids))
    per = {"reader": [], "pydicom": []}
    for r in range(args.case_rounds):
        order = rng.permutation(len(ids))
        for name in (("reader", "pydicom") if r % 2 == 0 else ("pydicom", "reader")):
            pick = order if name == "reader" else order[:dicom_n]
            t, s = time.perf_counter(), 0
            for i in pick:
                s += len(cases[int(i)] if name == "reader" else dicom_case(folders[int(i)]))
            per[name].append((len(pick) / (time.perf_counter() - t), s / (time.perf_counter() - t)))
            log(f"ct cases round {r + 1} {name:8s} {per[name][-1][0]:7.2f} cases/s {per[name][-1][1]:8.0f} slices/s")
    in_process = {k: {"cases_per_s": round(statistics.median(x[0] for x in v), 2),
                      "slices_per_s": round(statistics.median(x[1] for x in v), 1),
                      "cases_per_round": len(ids) if k == "reader" else dicom_n} for k, v in per.items()}
    loops = {"reader_2workers": Loop(lambda: H5Dataset(path, fields=("ct",)).loader(batch_size=2, num_workers=2,
                                                                                     shuffle=True), warmup=1),
             "pydicom_2workers": Loop(lambda: DataLoader(Items(folders, dicom_case), batch_size=2, shuffle=True,
                                                         num_workers=2, persistent_workers=True,
                                                         collate_fn=VarlenCollate(varlen=(0,))), dicom_n, warmup=1)}
    interleaved(loops, args.case_rounds, "ct cases")
    loaded = rates(loops)
    prof = profiled(lambda: [sl[int(i)] for i in np.random.default_rng(9).integers(0, total, args.slice_reads)], top=14)[2]
    return {**setup, "worker_fds": fd,
            "slice_latency": {"slices": total, "reads": args.slice_reads, "probes": lat,
                              "one_slice_file_cache_off_p50_us": one_chunk,
                              "profile_reader_slice": prof},
            "case_reads_in_process": in_process, "case_reads_loader_cases_per_s": loaded}


# ---- 3. signals ----------------------------------------------------------------------------------

def signal_spec(root: Path, files: str, channels: dict[str, tuple[str, float]], **storage):
    return parse({"name": "signals", "source": {"root": str(root)}, "output": {"dir": str(WORK / "out")},
                  "splits": {"ratios": {"train": 1.0}}, "compute": {"batch_size": 8}, "storage": storage,
                  "fields": {name: {"kind": "signal", "files": files, "channel": label, "rate": rate}
                             for name, (label, rate) in channels.items()}})


def real_edf() -> tuple[Path, Path, dict]:
    """pyedflib's test_generator.edf (11 channels, 200 Hz, 600 s) as a one-recording source folder."""
    import pyedflib
    import pyedflib.data
    src = Path(pyedflib.data.__file__).parent / "test_generator.edf"
    root = WORK / "edf-real"
    (root / "rec").mkdir(parents=True, exist_ok=True)
    if not (root / "rec" / src.name).exists():
        shutil.copy(src, root / "rec" / src.name)
    r = pyedflib.EdfReader(str(src))
    channels = {f"ch{i}": (label, float(r.getSampleFrequency(i))) for i, label in enumerate(r.getSignalLabels())}
    r.close()
    return root, root / "rec" / src.name, channels


def generated_edf(n: int, seconds: tuple[int, int]) -> tuple[Path, dict]:
    """``generate_signals``: EDF+ recordings of ACC 1000 Hz, VOLT 100 Hz, TEMP 1 Hz (gait, ECG-like pulses,
    temperature drift, each plus noise, 16-bit digital)."""
    from h5forge.demo import SIGNAL_CHANNELS, generate_signals
    root = WORK / f"edf-gen-{n}-{seconds[0]}-{seconds[1]}"
    with generating(root) as todo:
        if todo:
            generate_signals(root, n=n, seed=0, bad=False, seconds_range=seconds)
    return root, {label.lower(): (label, float(spec[0])) for label, spec in SIGNAL_CHANNELS.items()}


def edf_reader(channels: int):
    """The plain way: open the EDF with pyedflib, read every channel, float32 tensors."""
    def read(path: Path):
        import pyedflib
        r = pyedflib.EdfReader(str(path))
        try:
            return tuple(torch.from_numpy(r.readSignal(k).astype(np.float32)) for k in range(channels))
        finally:
            r.close()
    return read


def codec_table(root: Path, channels: dict, reads: int, tag: str, cache_off: bool) -> dict:
    """Every codec of CODECS on the same cleaned recordings: stored/raw (values of all channels, and per
    channel), write CPU, random recording read (all channels) p50 through the reader."""
    from h5forge.format.codecs import CODECS
    from h5forge.ingest.discover import discover
    from h5forge.read.torch import H5Dataset
    spec = signal_spec(root, "rec/*.edf" if (root / "rec").exists() else "*.edf", channels)
    batches = clean_in_process(spec, discover(spec).samples)
    rows, per_channel, path = {}, {}, WORK / f"codec-{tag}.h5"
    for codec in ["none", *CODECS]:  # the first write warms up, then every codec
        s = spec.model_copy(update={"storage": spec.storage.model_copy(update={"codec": codec})})
        c0 = time.process_time()
        write_file(path, s, batches)
        cpu = time.process_time() - c0
        with h5py.File(path, "r") as f:
            g = f["train"]
            sizes = {k: (g[k].size * 4, g[k].id.get_storage_size()) for k in channels}
        ds = H5Dataset(path, fields=tuple(channels), rdcc_nbytes=0 if cache_off else None)
        n = len(ds)
        lat = random_read_latency(ds.reader.read_one, n, reads, 0)
        ds.close()
        raw, stored = sum(a for a, _ in sizes.values()), sum(b for _, b in sizes.values())
        rows[codec] = {"raw_float32_bytes": raw, "stored_bytes": stored, "stored_vs_raw": round(stored / raw, 4),
                       "vs_article_lzf_claim": round(stored / raw / ARTICLE_LZF_STORED_VS_RAW, 3),
                       "write_cpu_s": round(cpu, 3), "read_recording_p50_ms": round(lat["p50_us"] / 1000, 3),
                       "read_recording_p99_ms": round(lat["p99_us"] / 1000, 3), "file_bytes": path.stat().st_size}
        for k, (a, b) in sizes.items():
            per_channel.setdefault(f"{k} ({channels[k][0]})", {})[codec] = round(b / a, 3)
        log(f"signals {tag:9s} {codec:15s} stored/raw {stored / raw:.3f}  read p50 {lat['p50_us'] / 1000:.2f} ms")
        path.unlink()
    return {"recordings": n, "codecs": rows, "stored_vs_raw_per_channel": per_channel}


def signals_part(args) -> dict:
    from h5forge.ingest.discover import discover
    from h5forge.read.collate import VarlenCollate
    from h5forge.read.torch import H5Dataset
    real_root, real_path, real_ch = real_edf()
    gen_root, gen_ch = generated_edf(args.recordings, (args.seconds_min, args.seconds_max))
    out = {}
    for tag, root, ch, cache_off in (("real", real_root, real_ch, True), ("generated", gen_root, gen_ch, False)):
        files = sorted(root.rglob("*.edf"))
        table = codec_table(root, ch, args.signal_reads if tag == "generated" else args.signal_reads // 2, tag, cache_off)
        raw, edf = table["codecs"]["none"]["raw_float32_bytes"], sum(p.stat().st_size for p in files)
        for row in table["codecs"].values():
            row["stored_vs_edf"] = ratio(row["stored_bytes"], edf)
        out[tag] = {"edf_files": len(files), "edf_bytes": edf, "edf_vs_raw_float32": ratio(edf, raw),
                    "channels": {k: f"{label} {rate:g} Hz" for k, (label, rate) in ch.items()}, **table}
    # reads of the default codec's file vs the EDF per sample
    read = {}
    for tag, root, ch in (("real", real_root, real_ch), ("generated", gen_root, gen_ch)):
        spec = signal_spec(root, "rec/*.edf" if tag == "real" else "*.edf", ch)
        path = WORK / f"signals-{tag}-{root.name}-{spec.storage.codec}-{code_key()}.h5"
        if not path.exists():
            write_file(path.with_suffix(".tmp"), spec, clean_in_process(spec, discover(spec).samples))
            os.replace(path.with_suffix(".tmp"), path)
        ds = H5Dataset(path, fields=tuple(ch), rdcc_nbytes=0 if tag == "real" else None)
        edfs = [root / ("rec" if tag == "real" else "") / f"{i}.edf" for i in ds.ids()]
        warm([path, *edfs])
        fetch = edf_reader(len(ch))
        k = len(ds) // 2
        assert all(np.allclose(a.numpy(), b.numpy(), rtol=1e-6, atol=1e-3) for a, b in zip(ds[k], fetch(edfs[k])))
        lat = {}
        for r in range(2):
            lat = {"h5forge": random_read_latency(ds.__getitem__, len(ds), args.signal_reads, r),
                   "pyedflib_per_sample": random_read_latency(lambda i: fetch(edfs[i]), len(ds), args.signal_reads, r)}
        read[tag] = {"codec": spec.storage.codec, "chunk_cache": "off (one recording: every read would hit it)"
                     if tag == "real" else "default", "latency": lat,
                     "p50_vs_pyedflib": ratio(lat["h5forge"]["p50_us"], lat["pyedflib_per_sample"]["p50_us"]),
                     "p99_vs_pyedflib": ratio(lat["h5forge"]["p99_us"], lat["pyedflib_per_sample"]["p99_us"])}
        log(f"signals {tag} latency p50 h5forge {lat['h5forge']['p50_us'] / 1000:.2f} ms, pyedflib "
            f"{lat['pyedflib_per_sample']['p50_us'] / 1000:.2f} ms")
        if tag == "generated":
            fields = tuple(ch)
            loops = {"h5forge_2workers": Loop(lambda: H5Dataset(path, fields=fields).loader(
                         batch_size=args.signal_batch, num_workers=args.workers, shuffle=True), warmup=1),
                     "pyedflib_2workers": Loop(lambda: DataLoader(
                         Items(edfs, fetch), batch_size=args.signal_batch, shuffle=True, num_workers=args.workers,
                         persistent_workers=True, collate_fn=VarlenCollate(varlen=range(len(fields)))), warmup=1)}
            interleaved(loops, args.rounds, "signals")
            read[tag]["loader"] = {"batch": args.signal_batch, **rates(loops)}
            read[tag]["loader_vs_pyedflib"] = ratio(read[tag]["loader"]["h5forge_2workers"]["samples_per_s"],
                                                    read[tag]["loader"]["pyedflib_2workers"]["samples_per_s"])
        ds.close()
    return {"article_lzf_stored_vs_raw_claim": ARTICLE_LZF_STORED_VS_RAW,
            **{tag: {**out[tag], "read": read[tag]} for tag in ("real", "generated")}}


def main() -> None:
    args = cli(__doc__, dict(n=200, size=64, rounds=2, cpu_batches=4, cases=4, depth_min=8, depth_max=16, ct_size=128,
                             slice_reads=100, dicom_cases=4, case_rounds=1, recordings=6, seconds_min=2, seconds_max=10,
                             signal_reads=20, signal_batch=2),
               parts="labels,ct,signals", n=5_000, size=128, batch=32, workers=2, rounds=9, cpu_batches=40,
               cases=36, depth_min=60, depth_max=150, ct_size=256, ct_epochs=3, ct_workers=4, slice_reads=2_000,
               dicom_cases=12, case_rounds=5, recordings=60, seconds_min=60, seconds_max=600, signal_reads=200,
               signal_batch=8)
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", "The given NumPy array is not writable")
    warnings.filterwarnings("ignore", "This DataLoader will create")  # 4 CT workers on 2 cores: asked for
    WORK.mkdir(parents=True, exist_ok=True)
    parts = [p for p in args.parts.split(",") if p]
    t0, result, seconds = time.perf_counter(), {}, {}
    for name, fn in (("labels", labels_part), ("ct", ct_part), ("signals", signals_part)):
        if name in parts:
            t = time.perf_counter()
            result[name] = fn(args)
            seconds[name] = round(time.perf_counter() - t, 1)
    ratios = {}
    if "labels" in result:
        lab = result["labels"]["labels_vs_images_only"]
        ratios |= {"labels_vs_images_only_2workers": lab["2workers"], "labels_vs_images_only_0workers": lab["0workers"]}
    if "ct" in result:
        ct = result["ct"]
        loaded = ct["case_reads_loader_cases_per_s"]
        ratios |= {"ct_worker_fds_constant": ct["worker_fds"]["constant_at_epoch_end"],
                   "ct_slice_p50_vs_npy": ct["slice_latency"]["probes"]["reader_slice"]["p50_vs_npy"],
                   "ct_slice_p99_vs_npy": ratio(ct["slice_latency"]["probes"]["reader_slice"]["p99_us"],
                                                ct["slice_latency"]["probes"]["npy_mmap"]["p99_us"], 2),
                   "ct_case_reads_vs_pydicom": ratio(ct["case_reads_in_process"]["reader"]["cases_per_s"],
                                                     ct["case_reads_in_process"]["pydicom"]["cases_per_s"], 1),
                   "ct_case_loader_vs_pydicom": ratio(loaded["reader_2workers"]["samples_per_s"],
                                                      loaded["pydicom_2workers"]["samples_per_s"], 1)}
    if "signals" in result:
        sig = result["signals"]
        for tag in ("real", "generated"):
            codecs = sig[tag]["codecs"]
            best = min(codecs, key=lambda c: codecs[c]["stored_vs_raw"])
            ratios |= {f"signals_{tag}_lzf_stored_vs_raw": codecs["lzf"]["stored_vs_raw"],
                       f"signals_{tag}_smallest": f"{best} {codecs[best]['stored_vs_raw']}",
                       f"signals_{tag}_p50_vs_pyedflib": sig[tag]["read"]["p50_vs_pyedflib"]}
        ratios["signals_loader_vs_pyedflib"] = sig["generated"]["read"]["loader_vs_pyedflib"]
    result = {"machine": {**machine(), "torch": torch.__version__}, "ratios": ratios, "args": vars(args), **result,
              "seconds": {**seconds, "total": round(time.perf_counter() - t0, 1)}}
    save("kinds" if set(parts) == {"labels", "ct", "signals"} else "kinds_" + "_".join(parts), result, args.smoke)


if __name__ == "__main__":
    main()
