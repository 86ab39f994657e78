"""The loader a user gets out of the box on images + masks against a plain DataLoader over
memory-mapped uint8 .npy of the same arrays, with masks in the default dtype (int64) and as uint8.

    python -m benchmarks.read_masks [--smoke] [--n 8000 --size 224 --rounds 3 --workers 2]

Method: benchmarks/README.md, "read_masks" (each reader a probe process of benchmarks.read_peers).
"""

import sys
from pathlib import Path

from benchmarks.common import cli, ratio, save
from benchmarks.read_peers import medians, prepare, probe_rounds

READERS = ("npy_mmap", "h5forge_lz4_plain", "h5forge_lz4_default", "h5forge_lz4_u8masks")


def main() -> None:
    args = cli(__doc__, dict(n=200, size=64, rounds=1), n=8000, size=224, rounds=3, workers=2, batch=32)
    data = prepare(args.n, args.size, codecs=("lz4",))
    rates, cpus, outputs = probe_rounds(dict.fromkeys(READERS, Path(sys.executable)), data, args)
    rate, cpu = medians(rates, cpus)
    ratios = {"default_loader_vs_npy": ratio(rate["h5forge_lz4_default"], rate["npy_mmap"]),
              "uint8_masks_loader_vs_npy": ratio(rate["h5forge_lz4_u8masks"], rate["npy_mmap"]),
              "uint8_plain_vs_npy": ratio(rate["h5forge_lz4_plain"], rate["npy_mmap"]),
              "default_loader_vs_uint8_plain": ratio(rate["h5forge_lz4_default"], rate["h5forge_lz4_plain"]),
              "cpu_per_batch_uint8_masks_vs_default": ratio(cpu["h5forge_lz4_u8masks"], cpu["h5forge_lz4_default"])}
    save("read_masks", {"ratios": ratios,
                        "samples_per_s": rate, "loader_cpu_ms_per_batch": cpu,
                        "all_rounds": {k: [round(x) for x in v] for k, v in rates.items()}, "outputs": outputs}, args.smoke)


if __name__ == "__main__":
    main()
