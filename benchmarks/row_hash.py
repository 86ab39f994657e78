"""What hashing costs per sample, format 2 (sha256) against format 3 (BLAKE3): the workers' value
digests and the writer's row checksums on cleaned samples of the build_peers corpus, then verify's
checksum pass over a version written in each format; and, for scale, the raw files' sha256.

    python -m benchmarks.row_hash [--smoke] [--n 2000 --size 224 --reps 3]

What is measured and how: benchmarks/README.md, section "row_hash".
"""

import hashlib
import shutil
import time

from benchmarks.common import CACHE, cli, least_seconds, make_spec, ratio, raw_folder, save, warm

WORK = CACHE / "row_hash"


def best_cpu(fn, reps: int) -> float:
    return least_seconds(fn, reps, time.process_time)


def main() -> None:
    args = cli(__doc__, dict(n=96, size=64, reps=1), n=2000, size=224, reps=3)
    from h5forge.format.checksums import row_checksum, values_digest
    from h5forge.ingest.clean import clean_batch
    from h5forge.ingest.discover import discover
    from h5forge.ingest.writer import DatasetWriter
    from h5forge.kinds import stored_kinds
    from h5forge.store.verify import verify_file

    shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir(parents=True)
    raw = raw_folder(args.n, args.size)
    warm([raw])
    spec = make_spec(raw, WORK / "out", args.size)
    inventory = discover(spec)
    refs = inventory.samples[: args.n]
    n, bs = len(refs), spec.compute.batch_size
    kinds = list(stored_kinds(spec))
    batches = {fmt: [clean_batch(spec, inventory.root, refs[i : i + bs], format_version=fmt) for i in range(0, n, bs)]
               for fmt in (2, 3)}
    values = [[b.arrays[p].decoded()[i] if hasattr(b.arrays[p], "decoded") else b.arrays[p][i] for p in kinds]
              for b in batches[2] for i in range(len(b))]
    provenance = [(b.ids[i], b.files[i], b.source_sha256[i]) for b in batches[2] for i in range(len(b))]
    raw_bytes = [(inventory.root / f).read_bytes() for ref in refs for f in ref.files.values()]
    ms: dict[str, dict[str, float]] = {}
    for fmt in (2, 3):
        digests = [values_digest(v, fmt) for v in values]
        assert digests == [d for b in batches[fmt] for d in b.digests]  # what the workers computed
        part = {
            "values_digest": best_cpu(lambda: [values_digest(v, fmt) for v in values], args.reps),  # noqa: B023
            "row_checksum": best_cpu(
                lambda: [row_checksum(d, *p, fmt) for d, p in zip(digests, provenance)], args.reps  # noqa: B023
            ),
        }
        path = WORK / f"format{fmt}.h5"
        with DatasetWriter(path, spec, version=1, format_version=fmt) as w:
            for b in batches[fmt]:
                w.add(b)
            w.finish()
        report = verify_file(path, resample=0, latency_reads=0, workers=1)
        assert report.ok, report.errors
        part["verify_checksums_only"] = best_cpu(
            lambda: verify_file(path, resample=0, latency_reads=0, workers=1), args.reps  # noqa: B023
        ) - best_cpu(lambda: verify_file(path, checksums=False, resample=0, latency_reads=0, workers=1), args.reps)  # noqa: B023
        ms[f"format{fmt}"] = {k: round(1000 * v / n, 4) for k, v in part.items()}
        ms[f"format{fmt}"]["total"] = round(sum(ms[f"format{fmt}"].values()), 4)
    ms["raw_files_sha256"] = {"per_sample": round(1000 * best_cpu(lambda: [hashlib.sha256(b).digest() for b in raw_bytes],
                                                                    args.reps) / n, 4)}
    ratios = {"hash_cpu_format3_over_format2": ratio(ms["format3"]["total"], ms["format2"]["total"]),
              "cpu_ms_saved_per_sample": round(ms["format2"]["total"] - ms["format3"]["total"], 4)}
    save("row_hash", {"samples": n,
                      "raw_bytes_per_sample": round(sum(map(len, raw_bytes)) / n), "cpu_ms_per_sample": ms,
                      "ratios": ratios}, args.smoke)


if __name__ == "__main__":
    main()
