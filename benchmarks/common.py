"""Shared by the benchmark commands: the one spec builder, cached inputs, the library calls they time,
RSS/CPU sampling, JSON results and the one Markdown renderer."""

import argparse
import contextlib
import cProfile
import hashlib
import io
import json
import os
import platform
import pstats
import re
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
RESULTS = BENCH / "results"
CACHE = Path(os.environ.get("H5FORGE_BENCH_CACHE", "/tmp/h5forge-bench"))  # generated inputs, work folders
CACHE.mkdir(parents=True, exist_ok=True)
DEMO_SPEC = REPO / "config" / "demo.yaml"


def append_lib():
    """The append steps (recover, scan_inbox, stage_append, write_delta, ...): one import site."""
    try:
        from h5forge.ingest import append
    except ImportError:
        from h5forge.store import append
    return append


def get(summary, key: str):
    """A field of a library result: the writer's WriteSummary, a flow's result (dicts in older revisions)."""
    return summary[key] if isinstance(summary, dict) else getattr(summary, key)


def write_file(path: Path, spec, batches, timings: dict | None = None, version: int = 1):
    """DatasetWriter add + finish of cleaned batches; returns the writer's summary."""
    from h5forge.ingest.writer import DatasetWriter
    with DatasetWriter(path, spec, version=version) as w:
        for b in batches:
            w.add(b)
        return w.finish(timings)


def clean_in_process(spec, refs) -> list:
    from h5forge.ingest.clean import clean_batch
    bs = spec.compute.batch_size
    return [clean_batch(spec, spec.source.root, refs[i:i + bs]) for i in range(0, len(refs), bs)]


def build_file(spec, path: Path):
    """discover + clean_all (dask, or in-process below inline_below) + the writer: one file, no versions."""
    from h5forge.ingest.discover import discover
    from h5forge.ingest.parallel import clean_all
    inv = discover(spec)
    return write_file(path, spec, clean_all(spec, inv.root, inv.samples))


def make_spec(raw: Path, out: Path, size: int | None = None, **sections):
    """The demo spec (config/demo.yaml) on ``raw`` writing to ``out``; ``size``: image size in px;
    ``sections``: per spec section, the fields to change, e.g. storage={"codec": "none"}."""
    from h5forge.spec import load_spec, override
    spec = load_spec(DEMO_SPEC)
    sections["source"] = {"root": Path(raw).resolve(), "inbox": None, **sections.get("source", {})}
    update = {name: getattr(spec, name).model_copy(update=changes) for name, changes in sections.items()}
    if size:
        update["fields"] = {**spec.fields, "images": spec.fields["images"].model_copy(update={"size": (size, size)})}
    return override(spec.model_copy(update=update), output=out)


def write_spec(spec, path: Path) -> Path:
    """The spec as a YAML file, for the CLI, the flows and other processes."""
    import yaml
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(spec.model_dump(mode="json", exclude_unset=True), sort_keys=False))
    return path


def code_key() -> str:
    """A hash of the library's source: cached files written by other library code are not reused."""
    import h5forge
    files = sorted(Path(h5forge.__file__).parent.rglob("*.py"))
    return hashlib.sha1(b"".join(p.read_bytes() for p in files)).hexdigest()[:8]


def raw_folder(n: int, size: int = 224, seed: int = 0) -> Path:
    """``n`` generated good samples for a spec of ``size`` px (raw PNGs of 150-260 px for the 224 px
    demo, 40-70 px for small specs), cached under CACHE until its ``.complete`` marker exists."""
    from h5forge.demo import generate
    size_range = (150, 260) if size >= 150 else (40, 70)
    root = CACHE / f"raw-n{n}-s{seed}-{size_range[0]}-{size_range[1]}"
    if (root / ".complete").exists():
        return root
    shutil.rmtree(root, ignore_errors=True)
    t0 = time.perf_counter()
    generate(root, n=n, seed=seed, bad=False, size_range=size_range, workers=2)
    (root / ".complete").write_text(json.dumps({"n": n, "seconds": round(time.perf_counter() - t0, 1)}))
    log(f"generated {n:,} samples into {root} in {time.perf_counter() - t0:.0f} s")
    return root


def prefect_env(home: Path, **extra: str) -> dict:
    """The environment of a process using Prefect: its own PREFECT_HOME, no telemetry, a patient
    ephemeral server start, no input hashing; every other PREFECT_* variable dropped."""
    home.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    return {**env, "PREFECT_HOME": str(home), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "240", "PREFECT_TASKS_DEFAULT_NO_CACHE": "true",
            "DO_NOT_TRACK": "1", **extra}


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')} load {os.getloadavg()[0]:.1f}] {msg}", flush=True)


def med(xs, nd: int = 4):
    xs = [x for x in xs if x is not None]
    return round(statistics.median(xs), nd) if xs else None


def ratio(a, b, nd: int = 3):
    return round(a / b, nd) if a is not None and b else None


def loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def cpu_pressure() -> str | None:
    """Linux PSI: the share of time some runnable task waited for a CPU (avg10/60/300 %)."""
    psi = Path("/proc/pressure/cpu")
    return psi.read_text().splitlines()[0] if psi.exists() else None


def machine() -> dict:
    import h5py
    model = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                  if ln.startswith("model name")), platform.processor())
    git = subprocess.run(["git", "-C", str(REPO), "describe", "--always", "--dirty"], capture_output=True, text=True)
    return {"cpu_count": os.cpu_count(), "cpu_model": model, "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
            "python": platform.python_version(), "h5py": h5py.version.version, "hdf5": h5py.version.hdf5_version,
            "git": git.stdout.strip(), "loadavg": loadavg(), "cpu_pressure": cpu_pressure()}


def warm(paths) -> None:
    """Read files (or every file under folders) once: into the page cache."""
    subprocess.run(["find", *map(str, paths), "-type", "f", "-exec", "cat", "{}", "+"], stdout=subprocess.DEVNULL, check=True)


def random_read_latency(get_item, n_items: int, reads: int, seed: int) -> dict:
    """p50/p99/mean in µs of ``get_item(i)`` for random ``i`` (20 warm-up reads first)."""
    import numpy as np
    idx = [int(i) for i in np.random.default_rng(seed).integers(0, n_items, reads)]
    for i in idx[:20]:
        get_item(i)
    times = []
    for i in idx:
        t = time.perf_counter_ns()
        get_item(i)
        times.append(time.perf_counter_ns() - t)
    a = np.array(times) / 1000
    return {f"{k}_us": round(float(v), 1) for k, v in zip(("p50", "p99", "mean"), (*np.percentile(a, [50, 99]), a.mean()))}


@contextlib.contextmanager
def timed(owner, *names: str):
    """Wrap ``owner.<name>`` (library functions or methods) to add up the seconds spent in them."""
    spent, originals = dict.fromkeys(names, 0.0), {n: getattr(owner, n) for n in names}

    def wrap(name, fn):
        def inner(*a, **k):
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                spent[name] += time.perf_counter() - t
        return inner

    for n, fn in originals.items():
        setattr(owner, n, wrap(n, fn))
    try:
        yield spent
    finally:
        for n, fn in originals.items():
            setattr(owner, n, fn)


def profiled(fn, *args, top: int = 16, sort: str = "tottime"):
    """``fn(*args)`` under cProfile: (its result, the Stats, the top ``top`` lines as text)."""
    prof = cProfile.Profile()
    out = prof.runcall(fn, *args)
    stats = pstats.Stats(prof, stream=(buf := io.StringIO()))
    stats.sort_stats(sort).print_stats(top)
    text = buf.getvalue()[max(0, buf.getvalue().find("ncalls")):]
    return out, stats, text.replace(str(REPO) + "/", "").replace(sys.prefix + "/", "").rstrip()


@contextlib.contextmanager
def sampled(pid: int | None = None, interval: float = 0.1, rescan: float = 1.0):
    """RSS and CPU time of a process and its descendants, sampled in a thread; the dict yielded is filled
    on exit: peak RSS of the sum, of the main process, of the largest child; CPU seconds while sampled.
    The process list is refreshed every ``rescan`` s only (finding children walks all of /proc)."""
    root, stop, out, cpu, procs, scanned = psutil.Process(pid or os.getpid()), threading.Event(), {}, {}, [], 0.0
    peak, start = dict.fromkeys(("sum", "main", "child"), 0), sum(root.cpu_times()[:2])

    def sample() -> None:
        nonlocal procs, scanned
        if time.monotonic() - scanned >= rescan:
            with contextlib.suppress(psutil.NoSuchProcess):
                procs, scanned = [root] + root.children(recursive=True), time.monotonic()
        rss = {}
        for p in procs:
            with contextlib.suppress(psutil.Error):
                rss[p.pid], cpu[p.pid] = p.memory_info().rss, sum(p.cpu_times()[:2])
        main = rss.pop(root.pid, 0)
        peak.update(sum=max(peak["sum"], main + sum(rss.values())), main=max(peak["main"], main),
                    child=max(peak["child"], *rss.values(), 0))

    def loop() -> None:
        while not stop.wait(interval):
            sample()

    sample()
    (thread := threading.Thread(target=loop, daemon=True)).start()
    try:
        yield out
    finally:
        stop.set()
        thread.join()
        main = cpu.get(root.pid, start) - start
        children = sorted((round(v, 2) for k, v in cpu.items() if k != root.pid), reverse=True)
        out.update({"cpu_seconds": round(main + sum(children), 2), "cpu_seconds_main": round(main, 2),
                    "cpu_seconds_children": children, "processes_seen": len(cpu),
                    **{f"peak_{k}_mib": round(v / 2**20, 1) for k, v in peak.items()}})


def cli(doc: str, smoke: dict, **defaults) -> argparse.Namespace:
    """Flags from ``defaults`` (n_large -> --n-large, typed like its default; False -> a switch), and
    --smoke: the ``smoke`` values replace the defaults (explicit flags still win)."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    for k, v in defaults.items():
        kind = {"action": "store_true"} if v is False else {"required": True} if v is ... else {"type": type(v), "default": v}
        ap.add_argument("--" + k.replace("_", "-"), **kind)
    ap.add_argument("--smoke", action="store_true", help="tiny sizes for CI; results go to results/smoke/")
    if "--smoke" in sys.argv:
        ap.set_defaults(**smoke)
    return ap.parse_args()


def save(name: str, result: dict, smoke: bool) -> Path:
    """``results/<name>.json`` and ``.md`` (``results/smoke/`` for --smoke); prints its ratios."""
    dest = (RESULTS / "smoke" if smoke else RESULTS) / name
    dest.parent.mkdir(parents=True, exist_ok=True)
    module = next(p for p in _prefixes(name) if (BENCH / f"{p}.py").exists() or p == name.split("_")[0])
    result = {"benchmark": name, "command": " ".join([f"python -m benchmarks.{module}", *sys.argv[1:]]),
              "finished_at": time.strftime("%Y-%m-%d %H:%M:%S"), "loadavg_end": loadavg(), **result}
    dest.with_suffix(".json").write_text(json.dumps(result, indent=1, default=str) + "\n")
    dest.with_suffix(".md").write_text(render(result))
    print("".join(f"  {k}: {v}\n" for k, v in result.get("ratios", {}).items()) + f"wrote {dest}.json and .md", flush=True)
    return dest


def _leaf(v) -> bool:
    """A table cell: a scalar, a one-line string or a short list of those."""
    if isinstance(v, list):
        return len(v) <= 12 and all(x is None or isinstance(x, (bool, int, float, str)) and "\n" not in str(x) for x in v)
    return v is None or isinstance(v, (bool, int, float)) or (isinstance(v, str) and "\n" not in v)


def _split(d: dict, deep: bool, prefix: str = "") -> tuple[dict, dict]:
    """(cells, rest): leaves and nested dicts flattened to dotted keys (only small ones unless ``deep``)."""
    cells, rest = {}, {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if _leaf(v):
            cells[key] = v
        elif isinstance(v, dict) and v and (deep or (len(v) <= 8 and all(map(_leaf, v.values())))):
            c, r = _split(v, deep, key + ".")
            cells.update(c)
            rest.update(r)
        else:
            rest[key] = v
    return cells, rest


def _cell(v) -> str:
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.4g}" if isinstance(v, float) else str(v)
    return (json.dumps(v) if isinstance(v, list) else str(v)).replace("|", "/")


def _table(rows: dict[str, dict]) -> list[str]:
    cols = list(dict.fromkeys(k for r in rows.values() for k in r))
    if len(cols) > 10 and len(rows) < len(cols):  # wide and short: one column per row instead
        rows, cols = {c: {k: r[c] for k, r in rows.items() if c in r} for c in cols}, list(rows)
    lines = ["| | " + " | ".join(map(str, cols)) + " |", "|---" * (len(cols) + 1) + "|"]
    return lines + [f"| {k} | " + " | ".join(_cell(r[c]) if c in r else "" for c in cols) + " |" for k, r in rows.items()]


def _section(name: str, v, depth: int) -> list[str]:
    head = ["#" * min(depth, 6) + f" {name}", ""]
    if isinstance(v, str):
        return head + ["```", v.rstrip(), "```", ""]
    if isinstance(v, list) and all(isinstance(x, dict) for x in v):
        v = {str(i + 1): x for i, x in enumerate(v)}
    if not isinstance(v, dict):
        return head + [_cell(v), ""]
    rows = v and all(isinstance(x, dict) for x in v.values())  # one table row per item
    parts = {k: _split(x, True) for k, x in v.items()} if rows else {"": _split(v, False)}
    table = {k: c for k, (c, _) in parts.items() if c} if rows else {k: {"value": x} for k, x in parts[""][0].items()}
    lines = head + (_table(table) + [""] if table else [])
    for k, (_, rest) in parts.items():
        for kk, x in rest.items():
            lines += _section(" / ".join(p for p in (name, k, kk) if p), x, depth + 1)
    return lines


def _prefixes(name: str) -> list[str]:
    """build_peers_prefect -> [build_peers_prefect, build_peers, build]."""
    parts = name.split("_")
    return ["_".join(parts[:k]) for k in range(len(parts), 0, -1)]


def render(result: dict) -> str:
    """Markdown: the method (benchmarks/README.md, section of the command), then the JSON as tables."""
    text, name = (BENCH / "README.md").read_text(), result["benchmark"]
    # the command's own section (read_peers), else its family's (read_latency -> read,
    # build_peers_prefect -> build_peers)
    section = next((m for key in _prefixes(name)
                    if (m := re.search(rf"^## {key}\n(.*?)(?=^## |\Z)", text, re.S | re.M))), None)
    lines = [f"# {result['benchmark']} ({result['finished_at']})", "", section[1].strip() if section else "", ""]
    return "\n".join(lines + _section("", result, 2)[2:]).rstrip() + "\n"
