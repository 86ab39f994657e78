"""What hashing costs per sample, format 2 (sha256) against format 3 (BLAKE3): the workers' value digests,
the writer's row checksums and verify's checksum pass; the raw files' sha256 for scale. Method:
benchmarks/README.md, "row_hash".
"""

import hashlib
import shutil
import time

from benchmarks.common import CACHE, clean_batches, cli, least_seconds, make_spec, ratio, raw_folder, save, warm
from benchmarks.common import write_version

WORK = CACHE / "row_hash"


def format_cpu(spec, batches: list, values: list, provenance: list, fmt: int, reps: int) -> dict:
    """CPU seconds of the values digests, the row checksums and verify's checksum pass in format ``fmt``."""
    from h5forge._format.checksums import row_checksum, values_digest
    from h5forge._store.verify import verify_file

    cpu = lambda fn: least_seconds(fn, reps, time.process_time)  # noqa: E731
    digests = [values_digest(v, fmt) for v in values]
    assert digests == [d for b in batches for d in b.digests]  # what the workers computed
    path = write_version(WORK / f"format{fmt}.h5", spec, batches, format_version=fmt)
    verify = lambda **kw: verify_file(path, resample=0, latency_reads=0, workers=1, **kw)  # noqa: E731
    assert (report := verify()).ok, report.errors
    return {
        "values_digest": cpu(lambda: [values_digest(v, fmt) for v in values]),
        "row_checksum": cpu(lambda: [row_checksum(d, *p, fmt) for d, p in zip(digests, provenance)]),
        "verify_checksums_only": cpu(verify) - cpu(lambda: verify(checksums=False)),
    }


def main() -> None:
    args = cli(__doc__, dict(n=96, size=64, reps=1), n=2000, size=224, reps=3)
    from h5forge._ingest.discover import discover
    from h5forge.kinds import stored_kinds

    shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir(parents=True)
    warm([raw := raw_folder(args.n, args.size)])
    spec = make_spec(raw, WORK / "out", args.size)
    inventory = discover(spec)
    refs, kinds = inventory.samples[: args.n], list(stored_kinds(spec))
    n = len(refs)
    batches = {fmt: clean_batches(spec, inventory.root, refs, format_version=fmt) for fmt in (2, 3)}
    values = [
        [b.arrays[p].decoded()[i] if hasattr(b.arrays[p], "decoded") else b.arrays[p][i] for p in kinds]
        for b in batches[2]
        for i in range(len(b))
    ]
    provenance = [(b.ids[i], b.files[i], b.source_sha256[i]) for b in batches[2] for i in range(len(b))]
    raw_bytes = [(inventory.root / f).read_bytes() for ref in refs for f in ref.files.values()]
    ms: dict[str, dict[str, float]] = {}
    for fmt in (2, 3):
        part = {
            k: round(1000 * v / n, 4)
            for k, v in format_cpu(spec, batches[fmt], values, provenance, fmt, args.reps).items()
        }
        ms[f"format{fmt}"] = part | {"total": round(sum(part.values()), 4)}
    sha = least_seconds(lambda: [hashlib.sha256(b).digest() for b in raw_bytes], args.reps, time.process_time)
    ms["raw_files_sha256"] = {"per_sample": round(1000 * sha / n, 4)}
    ratios = {
        "hash_cpu_format3_over_format2": ratio(ms["format3"]["total"], ms["format2"]["total"]),
        "cpu_ms_saved_per_sample": round(ms["format2"]["total"] - ms["format3"]["total"], 4),
    }
    raw_per_sample = round(sum(map(len, raw_bytes)) / n)
    save("row_hash", {"samples": n, "raw_bytes_per_sample": raw_per_sample, "cpu_ms_per_sample": ms, "ratios": ratios})


if __name__ == "__main__":
    main()
