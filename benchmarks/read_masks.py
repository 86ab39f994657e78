"""The loader a user gets out of the box on images + masks against a plain DataLoader over
memory-mapped uint8 .npy of the same arrays, with masks in the default dtype (int64) and as uint8.

    python -m benchmarks.read_masks [--smoke] [--n 8000 --size 224 --rounds 3 --workers 2]

Readers (each a probe process of benchmarks.read_peers, one timed pass over the shuffled train
split, 2 workers, batch 32): ``npy_mmap`` (uint8 images and masks), ``h5forge_lz4_plain`` (H5Dataset
with uint8 outputs in a plain shuffled DataLoader), ``h5forge_lz4_default`` (``ds.loader()``:
float32 images, int64 masks), ``h5forge_lz4_u8masks`` (the same with ``mask_dtype="uint8"``). Method: benchmarks/README.md, "read_masks".
"""

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.common import REPO, cli, log, machine, ratio, save
from benchmarks.read_peers import prepare

READERS = ("npy_mmap", "h5forge_lz4_plain", "h5forge_lz4_default", "h5forge_lz4_u8masks")


def main() -> None:
    args = cli(__doc__, dict(n=200, size=64, rounds=1), n=8000, size=224, rounds=3, workers=2, batch=32)
    t0, load_start = time.perf_counter(), [round(x, 2) for x in os.getloadavg()]
    data = prepare(args.n, args.size, codecs=("lz4",))
    subprocess.run(["find", "-L", str(data), "-type", "f", "-exec", "cat", "{}", "+"], stdout=subprocess.DEVNULL, check=True)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    rates, cpus, outputs = {k: [] for k in READERS}, {k: [] for k in READERS}, {}
    for r in range(args.rounds):  # order reversed every other round
        for name in READERS if r % 2 == 0 else READERS[::-1]:
            cmd = [sys.executable, "-m", "benchmarks.read_peers", "--probe", name, "--data", str(data), "--seed", str(r),
                   "--batch", str(args.batch), "--workers", str(args.workers), *(["--check"] if r == 0 else [])]
            proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env=env, timeout=1800)
            if proc.returncode != 0:
                raise RuntimeError(f"{name} failed:\n{proc.stderr[-3000:]}")
            res = json.loads(proc.stdout.strip().splitlines()[-1])
            rates[name].append(res.pop("samples_per_s"))
            cpus[name].append(res["main_cpu_ms_per_batch"] + res["workers_cpu_ms_per_batch"])
            outputs.setdefault(name, res)
            log(f"round {r + 1}/{args.rounds} {name:28s} {rates[name][-1]:8.0f} samples/s")
    sums = {k: tuple(v["epoch_sums"]) for k, v in outputs.items()}
    if len(set(sums.values())) != 1:
        raise SystemExit(f"readers disagree on the data: {sums}")
    rate = {k: round(statistics.median(v)) for k, v in rates.items()}
    cpu = {k: round(statistics.median(v), 2) for k, v in cpus.items()}
    ratios = {"default_loader_vs_npy": ratio(rate["h5forge_lz4_default"], rate["npy_mmap"]),
              "uint8_masks_loader_vs_npy": ratio(rate["h5forge_lz4_u8masks"], rate["npy_mmap"]),
              "uint8_plain_vs_npy": ratio(rate["h5forge_lz4_plain"], rate["npy_mmap"]),
              "default_loader_vs_uint8_plain": ratio(rate["h5forge_lz4_default"], rate["h5forge_lz4_plain"]),
              "cpu_per_batch_uint8_masks_vs_default": ratio(cpu["h5forge_lz4_u8masks"], cpu["h5forge_lz4_default"])}
    save("read_masks", {"machine": machine(), "loadavg_start": load_start, "args": vars(args), "ratios": ratios,
                        "samples_per_s": rate, "loader_cpu_ms_per_batch": cpu,
                        "all_rounds": {k: [round(x) for x in v] for k, v in rates.items()}, "outputs": outputs,
                        "seconds": round(time.perf_counter() - t0)}, args.smoke)


if __name__ == "__main__":
    main()
