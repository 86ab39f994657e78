"""Before/after: CPU time of the build path and of the read path, working tree vs a git revision.

    python -m benchmarks.compare --base 3d98fe6 [--smoke] [--n 1000 --size 224 --rounds 5]

What is measured and how: benchmarks/README.md, section "compare".
"""

import contextlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def probe(spec_path: str, read_file: str, out: str) -> None:
    """One measurement with whatever h5forge the interpreter finds (runs in the tree under test)."""
    mod = lambda new, old: importlib.import_module(new if importlib.util.find_spec(new.rsplit(".", 1)[0]) else old)  # noqa: E731

    # only the tree on PYTHONPATH: the editable install's finder would supply modules the tree lacks
    sys.meta_path[:] = [f for f in sys.meta_path if "__editable__" not in getattr(f, "__module__", "")]
    import torch
    import h5forge
    from h5forge.spec import load_spec
    torch.set_num_threads(1)
    discover = mod("h5forge.ingest.discover", "h5forge.discover").discover
    clean_batch = mod("h5forge.ingest.clean", "h5forge.clean").clean_batch
    writer_cls = mod("h5forge.ingest.writer", "h5forge.writer").DatasetWriter
    h5dataset = mod("h5forge.read.torch", "h5forge.torch").H5Dataset
    spec = load_spec(spec_path)
    refs, bs = discover(spec).samples, spec.compute.batch_size
    chunks = [refs[i:i + bs] for i in range(0, len(refs), bs)]
    clean_batch(spec, spec.source.root, chunks[0])  # warm-up: imports, first-use costs
    c0, batches = time.process_time(), [clean_batch(spec, spec.source.root, c) for c in chunks]
    c1 = time.process_time()
    path = Path(out).with_suffix(".h5")
    w = writer_cls(path, spec, version=1)
    with w if hasattr(w, "__exit__") else contextlib.nullcontext(w):
        for b in batches:
            w.add(b)
        w.finish()
    c2 = time.process_time()
    path.unlink()
    ds = h5dataset(read_file, "train", ("images", "masks"))
    loader = ds.loader(batch_size=32, num_workers=0, shuffle=True, seed=0)
    for _ in zip(range(5), loader):
        pass
    n_batches, c3 = 0, time.process_time()
    for _ in loader:
        n_batches += 1
    c4 = time.process_time()
    ms = lambda s, k: round(1000 * s / k, 4)  # noqa: E731
    Path(out).write_text(json.dumps({
        "h5forge": h5forge.__file__, "modules": [sys.modules[f.__module__].__file__ for f in (clean_batch, h5dataset)],
        "samples": len(refs), "clean_cpu_ms_per_sample": ms(c1 - c0, len(refs)),
        "write_cpu_ms_per_sample": ms(c2 - c1, len(refs)), "build_cpu_ms_per_sample": ms(c2 - c0, len(refs)),
        "read_batches": n_batches, "read_cpu_ms_per_batch": ms(c4 - c3, n_batches)}))


def main() -> None:
    from benchmarks.common import (BENCH, CACHE, REPO, build_file, cli, log, machine, make_spec, med, ratio, raw_folder,
                                   save, write_spec)
    args = cli(__doc__, dict(n=128, size=64, rounds=2), base=..., n=1000, size=224, rounds=5)
    git = lambda *a: subprocess.run(["git", "-C", str(REPO), *a], check=True, capture_output=True, text=True).stdout  # noqa: E731
    base_sha = git("rev-parse", "--verify", f"{args.base}^{{commit}}").strip()
    work = Path(tempfile.mkdtemp(prefix="compare-", dir=CACHE))
    spec = make_spec(raw_folder(args.n, args.size), work / "out", args.size)
    spec_path = write_spec(spec, work / "spec.yaml")
    build_file(spec, work / "read.h5")
    trees = {"working": REPO, "base": work / "base"}
    git("worktree", "add", "--detach", str(trees["base"]), base_sha)
    runs: list[dict] = []
    try:
        for r in range(args.rounds):
            for side, tree in trees.items():
                out = work / f"{side}-{r}.json"
                p = subprocess.run([sys.executable, str(BENCH / "compare.py"), "--probe", str(spec_path), str(work / "read.h5"),
                                    str(out)], env={**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": "1"},
                                   cwd=work, capture_output=True, text=True, timeout=3600)
                if p.returncode != 0:
                    raise RuntimeError(f"probe {side} failed (rc {p.returncode}):\n{p.stderr[-4000:]}")
                runs.append({"round": r + 1, "side": side, **json.loads(out.read_text())})
                log(f"round {r + 1} {side:8s} build {runs[-1]['build_cpu_ms_per_sample']} ms/sample, "
                    f"read {runs[-1]['read_cpu_ms_per_batch']} ms/batch")
    finally:
        git("worktree", "remove", "--force", str(trees["base"]))
        shutil.rmtree(work, ignore_errors=True)
    metrics = ("clean_cpu_ms_per_sample", "write_cpu_ms_per_sample", "build_cpu_ms_per_sample", "read_cpu_ms_per_batch")
    medians = {s: {m: med(r[m] for r in runs if r["side"] == s) for m in metrics} for s in trees}
    ratios = {f"{m} working/base": ratio(medians["working"][m], medians["base"][m]) for m in metrics}
    save("compare", {"machine": machine(), "base": args.base, "base_commit": base_sha, "n": args.n, "size": args.size,
                     "ratios": ratios, "medians": medians, "runs": runs}, args.smoke)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--probe"]:
        probe(*sys.argv[2:5])
    else:
        main()
