"""The benchmarks' harness: specs and cached inputs, timing and CPU, child processes, the peers' venvs,
the command line, and the results files with their one Markdown renderer (benchmarks/README.md)."""

import argparse
import contextlib
import hashlib
import json
import os
import platform
import re
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

# Only the standard library up here: the peers' venvs import this module without the project's packages.
BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
RESULTS = Path(os.environ.get("H5FORGE_BENCH_RESULTS", BENCH / "results"))  # bench-check re-runs write elsewhere
CACHE = Path(os.environ.get("H5FORGE_BENCH_CACHE", "/tmp/h5forge-bench"))  # generated inputs, work folders
CACHE.mkdir(parents=True, exist_ok=True)
DEMO_SPEC = REPO / "config" / "demo.yaml"
BIN = Path(sys.executable).parent


def make_spec(raw: Path, out: Path, size: int | None = None, workers: int | None = None, **sections):
    """The demo spec on ``raw`` writing to ``out``; ``sections``: fields to change, e.g. storage={"codec": "none"};
    ``workers``: a LocalCluster of that many however few the samples (``inline_below: 0``)."""
    from h5forge.spec import load_spec, override

    spec = load_spec(DEMO_SPEC)
    if workers:
        sections["compute"] = {"workers": workers, "inline_below": 0, **sections.get("compute", {})}
    sections["source"] = {"root": Path(raw).resolve(), "inbox": None, **sections.get("source", {})}
    update = {name: getattr(spec, name).model_copy(update=changes) for name, changes in sections.items()}
    if size:
        update["fields"] = {**spec.fields, "images": spec.fields["images"].model_copy(update={"size": (size, size)})}
    return override(spec.model_copy(update=update), output=out)


def write_spec(spec, path: Path) -> Path:
    import yaml

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(spec.model_dump(mode="json", exclude_unset=True), sort_keys=False))
    return path


def generated(name: str, make) -> Path:
    """``CACHE/<name>``, made by ``make(folder)`` unless a complete one is there."""
    root = CACHE / name
    if not (root / ".complete").exists():
        shutil.rmtree(root, ignore_errors=True)
        t0 = time.perf_counter()
        make(root)
        (root / ".complete").write_text(f"{time.perf_counter() - t0:.1f} s")
        log(f"generated {root} in {time.perf_counter() - t0:.0f} s")
    return root


def raw_folder(n: int, size: int = 224, seed: int = 0, size_range: tuple[int, int] | None = None) -> Path:
    """``n`` generated samples (PNGs of 150-260 px for a 224 px spec, 40-70 px for small ones), cached."""
    from h5forge._demo import generate

    lo, hi = size_range or ((150, 260) if size >= 150 else (40, 70))
    return generated(
        f"raw-n{n}-s{seed}-{lo}-{hi}",
        lambda root: generate(root, n=n, seed=seed, bad=False, size_range=(lo, hi), workers=2),
    )


# scikit-image's photographs (no drawings)
PHOTOS = (
    "astronaut.png chelsea.png coffee.png hubble_deep_field.jpg ihc.png motorcycle_left.png motorcycle_right.png"
    " retina.jpg rocket.jpg brick.png camera.png cell.png coins.png grass.png gravel.png moon.png clock_motion.png"
).split()


def _photo_sample(job) -> dict:
    """One picture + mask pair of ``size``² cut from a scikit-image photograph (random source, crop,
    scale and flips; grey photographs tinted per channel) and its mask: the picture blurred and cut at
    a random quantile of its brightness, so its regions follow the picture's own edges."""
    import numpy as np
    import skimage.data
    from PIL import Image, ImageFilter

    root, sid, seed, size = job
    rng = np.random.default_rng(seed)
    name = PHOTOS[rng.integers(len(PHOTOS))]
    img = Image.open(Path(skimage.data.__file__).parent / name)
    pix = np.asarray(img.convert("RGB"), dtype=np.float32)
    if img.mode == "L":
        pix = pix * rng.uniform(0.6, 1.0, 3)
    h, w = pix.shape[:2]
    side = int(rng.integers(min(size, h, w), min(h, w) + 1))
    y, x = int(rng.integers(h - side + 1)), int(rng.integers(w - side + 1))
    crop = Image.fromarray(pix[y : y + side, x : x + side].round().astype(np.uint8)).resize(
        (size, size), Image.BILINEAR
    )
    if rng.random() < 0.5:
        crop = crop.transpose(Image.FLIP_LEFT_RIGHT)
    if rng.random() < 0.5:
        crop = crop.transpose(Image.FLIP_TOP_BOTTOM)
    grey = np.asarray(crop.convert("L").filter(ImageFilter.GaussianBlur(3)))
    mask = (grey > np.quantile(grey, rng.uniform(0.3, 0.7))).astype(np.uint8)
    crop.save(root / "images" / f"{sid}.png", compress_level=1)
    Image.fromarray(mask).save(root / "masks" / f"{sid}.png", compress_level=1)
    return {
        "id": sid,
        "label": name.split(".")[0],
        "num_cells": int(side),
        "stain": img.mode,
        "focus_score": round(float(grey.std()) / 128, 4),
    }


def photo_folder(n: int, size: int = 224, seed: int = 0) -> Path:
    """``n`` picture + mask PNG pairs of ``size``² with real content (scikit-image's photographs, cropped
    at random scales; masks cut from the picture's own brightness), in the demo's layout, cached."""

    def make(root: Path) -> None:
        from concurrent.futures import ProcessPoolExecutor

        (root / "images").mkdir(parents=True)
        (root / "masks").mkdir(parents=True)
        jobs = [(root, f"photo_{i:06d}", seed * 1_000_003 + i, size) for i in range(n)]
        with ProcessPoolExecutor(2) as pool:
            records = list(pool.map(_photo_sample, jobs, chunksize=64))
        (root / "annotations.json").write_text(json.dumps(records, indent=1))

    return generated(f"photos-n{n}-s{seed}-{size}", make)


def built(spec, name: str) -> Path:
    """The version ``h5forge.build(spec)`` publishes, cached by ``name``, the spec and the library's source
    (a cached file written by other library code is not reused)."""
    import h5forge

    source = b"".join(p.read_bytes() for p in sorted(Path(h5forge.__file__).parent.rglob("*.py")))
    key = [hashlib.sha1(x).hexdigest()[:8] for x in (source, spec.model_dump_json().encode())]
    out = CACHE / "built" / "-".join([name, *key])
    if not (out / ".bench-complete").exists():
        shutil.rmtree(out, ignore_errors=True)
        t0 = time.perf_counter()
        result = h5forge.build(spec, output=out)
        (out / ".bench-complete").write_text(result.path)
        log(f"built {name} ({sum(result.counts.values()):,} samples) in {time.perf_counter() - t0:.0f} s")
    return Path((out / ".bench-complete").read_text())


def clean_batches(spec, root, refs, **kw) -> list:
    """``refs`` cleaned in this process, one ``clean_batch(**kw)`` per batch the build would make."""
    from h5forge._ingest.clean import clean_batch
    from h5forge._ingest.parallel import batch_samples

    bs = batch_samples(spec, len(refs))
    return [clean_batch(spec, root, refs[i : i + bs], **kw) for i in range(0, len(refs), bs)]


def write_version(path: Path, spec, batches, **kw) -> Path:
    """The batches written and finished by one ``DatasetWriter(path, spec, version=1, **kw)``."""
    from h5forge._ingest.writer import DatasetWriter

    with DatasetWriter(path, spec, version=1, **kw) as w:
        for b in batches:
            w.add(b)
        w.finish()
    return path


def warm(paths) -> None:
    """Read files (or every file under folders, links followed) once: into the page cache."""
    subprocess.run(
        ["find", "-L", *map(str, paths), "-type", "f", "-exec", "cat", "{}", "+"], stdout=subprocess.DEVNULL, check=True
    )


def fresh(path: Path) -> Path:
    """An empty folder at ``path`` (what was there removed)."""
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path


def folder_bytes(path: Path, pattern: str = "*") -> int:
    return sum(p.stat().st_size for p in Path(path).rglob(pattern) if p.is_file())


def version_identity(path) -> dict:
    """Per split: the ids, the row checksums and the split's digest, to compare two versions by."""
    import h5py

    with h5py.File(path, "r") as f:
        return {
            s: (f[s]["ids"][()].tolist(), f[s]["checksum"][()].tobytes(), str(f[s].attrs["digest"]))
            for s in ("train", "val", "test")
        }


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')} load {os.getloadavg()[0]:.1f}] {msg}", flush=True)


def med(xs, nd: int = 4):
    xs = [x for x in xs if x is not None]
    return round(statistics.median(xs), nd) if xs else None


def ratio(a, b, nd: int = 3):
    return round(a / b, nd) if a is not None and b else None


def loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def interleaved(names: list, rounds: int):
    """(round, name) for every name in every round, the order reversed every other round: the machine's
    load drifts, and no name always runs first."""
    for r in range(rounds):
        yield from ((r, name) for name in (names if r % 2 == 0 else names[::-1]))


def rounds(names, n: int, run) -> dict[str, list]:
    """``run(name, round)`` for every name in every round, interleaved: each name's results in round order."""
    out: dict[str, list] = {name: [] for name in names}
    for r, name in interleaved(list(names), n):
        out[name].append(run(name, r))
        log(f"round {r + 1}/{n} {name}: {out[name][-1]}")
    return out


def latencies_us(get_item, indices) -> list[float]:
    out = []
    for i in indices:
        t = time.perf_counter_ns()
        get_item(i)
        out.append((time.perf_counter_ns() - t) / 1000)
    return out


def percentiles(us, qs=(50, 99), nd: int = 1) -> dict:
    """``p<q>_us`` for each q and ``mean_us`` of the µs given."""
    import numpy as np

    return {
        f"{k}_us": round(float(v), nd)
        for k, v in zip([f"p{q}" for q in qs] + ["mean"], [*np.percentile(us, qs), np.mean(us)])
    }


def random_read_latency(get_item, n_items: int, reads: int, seed: int) -> dict:
    """p50/p99/mean in µs of ``get_item(i)`` for random ``i`` (20 warm-up reads first)."""
    import numpy as np

    idx = [int(i) for i in np.random.default_rng(seed).integers(0, n_items, reads)]
    return percentiles(latencies_us(get_item, idx[:20] + idx)[min(20, reads) :])


def least_seconds(fn, reps: int, clock=time.perf_counter) -> float:
    """The least seconds (``clock``: time.process_time for CPU) of ``reps`` calls of ``fn``."""
    out = []
    for _ in range(reps):
        t = clock()
        fn()
        out.append(clock() - t)
    return min(out)


def timing_runner():
    """A pipeline ``Runner`` that records each step's wall seconds in its ``seconds`` dict."""
    from h5forge._pipeline import Runner

    class Timing(Runner):
        def __init__(self):
            self.seconds: dict[str, float] = {}

        def step(self, name, fn, *args, **kwargs):
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[name] = round(self.seconds.get(name, 0) + time.perf_counter() - t, 4)

    return Timing()


def own_cpu(children: bool = False) -> float:
    """CPU seconds of this process and of its children that ended (a loader's workers, verify's processes);
    ``children``: theirs alone."""
    who = (resource.RUSAGE_CHILDREN,) if children else (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
    return sum(r.ru_utime + r.ru_stime for r in map(resource.getrusage, who))


def proc_cpu(pid: int) -> float:
    """CPU seconds (user + system) of a process so far (Linux /proc: cheaper than psutil in a timed loop)."""
    f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def tree_cpu(pid: int) -> float:
    """CPU seconds so far of a process and its live descendants."""
    import psutil

    top = psutil.Process(pid)
    return sum(sum(p.cpu_times()[:2]) for p in [top, *top.children(recursive=True)])


@contextlib.contextmanager
def sampled(pid: int | None = None, interval: float = 0.1):
    """CPU seconds and summed peak RSS of a process tree, sampled in a thread (children found every 10th
    time: that walks /proc); the dict yielded is filled on exit."""
    import psutil

    root, stop_, out, cpu, procs, peak = psutil.Process(pid or os.getpid()), threading.Event(), {}, {}, [], [0]
    start = sum(root.cpu_times()[:2])

    def loop() -> None:
        k = 0
        while k == 0 or not stop_.wait(interval):
            if k % 10 == 0:
                with contextlib.suppress(psutil.NoSuchProcess):
                    procs[:] = [root] + root.children(recursive=True)
            rss, k = 0, k + 1
            for p in procs:
                with contextlib.suppress(psutil.Error):
                    rss, cpu[p.pid] = rss + p.memory_info().rss, sum(p.cpu_times()[:2])
            peak[0] = max(peak[0], rss)

    (thread := threading.Thread(target=loop, daemon=True)).start()
    try:
        yield out
    finally:
        stop_.set()
        thread.join()
        cpu[root.pid] = cpu.get(root.pid, start) - start
        out.update(cpu_seconds=round(sum(cpu.values()), 2), peak_rss_mib=round(peak[0] / 2**20, 1))


def run_sampled(cmd: list[str], **popen) -> tuple[float, float]:
    """(wall seconds, CPU seconds of its process tree, sampled) of a command; its output ends the
    benchmark's message when it fails."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **popen)
    with sampled(proc.pid) as usage:
        output, wall = proc.communicate()[0], time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:4])} failed ({proc.returncode}):\n{output[-3000:]}")
    return wall, usage["cpu_seconds"]


def child_json(module: str, *args: str, python=sys.executable, env: dict | None = None) -> dict:
    """``python -m benchmarks.<module> args`` in a fresh process: the JSON of its last such line of output."""
    env = {**(env or os.environ), "PYTHONPATH": str(REPO)}  # the peers' venvs find this tree's modules
    cmd = [str(python), "-m", f"benchmarks.{module}", *map(str, args)]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env=env, timeout=3600)
    if proc.returncode != 0:
        raise RuntimeError(f"{module} {' '.join(map(str, args))[:300]} failed:\n{proc.stderr[-3000:]}")
    return next((json.loads(line) for line in reversed(proc.stdout.splitlines()) if line.startswith("{")), {})


def stop(proc: subprocess.Popen, timeout: float = 20) -> None:
    """SIGTERM, wait, then SIGKILL the process group (the process was started in its own session)."""
    import signal

    proc.terminate()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=timeout)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def free_port() -> int:
    with socket.create_server(("127.0.0.1", 0)) as s:
        return s.getsockname()[1]


def prefect_env(home: Path, **extra: str) -> dict:
    """A Prefect process's environment: its own PREFECT_HOME, no telemetry, no other PREFECT_* variable."""
    home.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    return {
        **env,
        "PREFECT_HOME": str(home),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "240",
        "PREFECT_TASKS_DEFAULT_NO_CACHE": "true",
        "DO_NOT_TRACK": "1",
        **extra,
    }


def start_prefect_server(home: Path) -> tuple[str, subprocess.Popen, float]:
    """`prefect server start` on a free port; (its API URL, the process, seconds until healthy)."""
    import httpx

    port = free_port()
    url, t0, logfile = f"http://127.0.0.1:{port}/api", time.perf_counter(), home / "server.log"
    home.mkdir(parents=True, exist_ok=True)
    cmd = [str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(port), "--no-ui"]
    out = {"stdout": open(logfile, "w"), "stderr": subprocess.STDOUT}
    proc = subprocess.Popen(cmd, **out, env=prefect_env(home), start_new_session=True)
    while proc.poll() is None and time.perf_counter() - t0 < 240:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return url, proc, time.perf_counter() - t0
        time.sleep(0.5)
    stop(proc)
    raise RuntimeError("prefect server did not start:\n" + logfile.read_text())


def peers_venv(path: Path, install: bool, *pip_args: list[str], pth: bool = False) -> Path | None:
    """A peers' venv's python, made with each ``pip install`` of ``pip_args`` when ``install`` (``pth``:
    the project's packages visible through a .pth file); None when missing and not to be installed."""
    py = path / "bin" / "python"
    if (path / ".complete").exists():
        return py
    if not install:
        log(f"peers skipped: {path} is not installed (the full-size run installs it)")
        return None
    log(f"installing the peers into {path}")
    site = "import site; print(site.getsitepackages()[0])"
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(path)], check=True)
    if pth:
        ours, theirs = (
            subprocess.run([str(p), "-c", site], check=True, capture_output=True, text=True).stdout.strip()
            for p in (sys.executable, py)
        )
        Path(theirs, "h5forge-venv.pth").write_text(ours + "\n")
    for args in pip_args:
        subprocess.run([str(py), "-m", "pip", "install", "-q", *args], check=True, timeout=1800)
    (path / ".complete").write_text(json.dumps(pip_args))
    return py


PARSE_ONLY = "H5FORGE_BENCH_PARSE_ONLY"  # set: cli() parses the flags and exits
_run: dict = {}  # the command's arguments, and its start, as cli() saw them: every results file records them


def cli(doc: str, smoke: dict, **defaults) -> argparse.Namespace:
    """Flags from ``defaults`` (n_large -> --n-large; False: a switch); --smoke replaces them by ``smoke``.
    ``--child FUNCTION ARGS...`` instead runs a function of the benchmark's module in this process (a child
    of the benchmark: ``child_json``), digits as ints, and prints what it returns as JSON."""
    main = sys.modules["__main__"]
    if sys.argv[1:2] == ["--child"]:
        function, *rest = sys.argv[2:]
        print(json.dumps(getattr(main, function)(*(int(a) if a.isdigit() else a for a in rest))), flush=True)
        sys.exit(0)
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    for k, v in defaults.items():
        kind = {"action": "store_true"} if v is False else {"type": type(v), "default": v}
        ap.add_argument("--" + k.replace("_", "-"), **kind)
    ap.add_argument("--smoke", action="store_true", help="tiny sizes for CI; results go to results/smoke/")
    if "--smoke" in sys.argv:
        ap.set_defaults(**smoke)
    args = ap.parse_args()
    if os.environ.get(PARSE_ONLY):  # benchmarks.check asks whether a committed command still parses
        sys.exit(0)
    module = getattr(main.__spec__, "name", "benchmarks.").split(".")[-1]
    _run.update(args=args, module=module, loadavg_start=loadavg(), started=time.perf_counter())
    return args


def parts(only: str, every: tuple[str, ...]) -> list[str]:
    """The parts ``--only`` (or ``--parts``) names, each one of ``every``."""
    chosen = [p for p in only.split(",") if p]
    if unknown := set(chosen) - set(every):
        raise SystemExit(f"no part {sorted(unknown)}: the parts are {', '.join(every)}")
    return chosen


def figures(result: dict, paths: dict[str, str]) -> dict:
    """A results file's ``ratios``: each name with the value at its dotted path in ``result`` (None when
    missing), for the parts that ran (the path's first key)."""
    out = {}
    for name, path in paths.items():
        first, *rest = path.split(".")
        if first in result:
            value = result[first]
            for key in rest:
                value = value.get(key) if isinstance(value, dict) else None
            out[name] = value
    return out


def small_pictures(args) -> str:
    """The results name's suffix of a run at another size than 224² (``_32px_50k``): such runs are kept apart."""
    return f"_{args.size}px_{args.n // 1000}k" if args.size != 224 and not args.smoke else ""


def machine() -> dict:
    import h5py
    import psutil

    git = subprocess.run(["git", "-C", str(REPO), "describe", "--always", "--dirty"], capture_output=True, text=True)
    return {
        "cpu_count": os.cpu_count(),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "python": platform.python_version(),
        "h5py": h5py.version.version,
        "hdf5": h5py.version.hdf5_version,
        "git": git.stdout.strip(),
        "loadavg": loadavg(),
        **({"torch": sys.modules["torch"].__version__} if "torch" in sys.modules else {}),
    }


def save(name: str, result: dict) -> Path:
    """``results/<name>.json`` and ``.md`` (``results/smoke/`` for --smoke) with the command, the machine,
    the arguments, the load averages and the seconds since cli(); prints its ratios."""
    args, module = _run["args"], _run["module"]
    dest = (RESULTS / "smoke" if args.smoke else RESULTS) / name
    dest.parent.mkdir(parents=True, exist_ok=True)
    result = {
        "benchmark": name,
        "command": " ".join([f"python -m benchmarks.{module}", *sys.argv[1:]]),
        "finished_at": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": machine(),
        "args": vars(args),
        "loadavg_start": _run["loadavg_start"],
        "loadavg_end": loadavg(),
        "seconds": round(time.perf_counter() - _run["started"], 1),
        **result,
    }
    dest.with_suffix(".json").write_text(json.dumps(result, indent=1, default=str) + "\n")
    dest.with_suffix(".md").write_text(render(result, module))
    print(
        "".join(f"  {k}: {v}\n" for k, v in result.get("ratios", {}).items()) + f"wrote {dest}.json and .md", flush=True
    )
    return dest


def _flat(v, key: str = "") -> dict:
    """Dotted keys to leaves (scalars, strings, short lists of scalars); longer lists as JSON."""
    if isinstance(v, dict):
        return {k: x for kk, vv in v.items() for k, x in _flat(vv, f"{key}.{kk}" if key else str(kk)).items()}
    if isinstance(v, list) and any(isinstance(x, (dict, list)) for x in v):
        return {k: x for i, vv in enumerate(v) for k, x in _flat(vv, f"{key}[{i}]").items()}
    return {key: v}


def _cell(v) -> str:
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.4g}" if isinstance(v, float) else str(v)
    return (json.dumps(v) if isinstance(v, list) else str(v)).replace("|", "/").replace("\n", " ")


def render(result: dict, module: str) -> str:
    """Markdown: the command's section of benchmarks/README.md, then each part of the JSON as a table."""
    section = re.search(rf"^## {module}\n(.*?)(?=^## |\Z)", (BENCH / "README.md").read_text(), re.S | re.M)
    lines = [f"# {result['benchmark']} ({result['finished_at']})", "", section[1].strip() if section else "", ""]
    parts = {"": {k: v for k, v in result.items() if not isinstance(v, dict)}} | {
        k: v for k, v in result.items() if isinstance(v, dict)
    }
    for name, part in parts.items():
        lines += [f"## {name}" if name else "## run", "", "| | |", "|---|---|"]
        lines += [f"| {k} | {_cell(v)} |" for k, v in _flat(part).items()] + [""]
    return "\n".join(lines).rstrip() + "\n"
