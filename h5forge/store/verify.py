"""Verify a version file: structure, every checksum, samples against their sources, read latency.

A version passes when it has no errors. Warnings (slow reads, a raw file changed since the
build) are reported but do not fail it: they say nothing about the file's integrity.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import h5py
import numpy as np

from h5forge.ingest.clean import Reject, clean_sample
from h5forge.format.codecs import ensure_filters
from h5forge.ingest.discover import SampleRef
from h5forge.format.layout import FORMAT, FORMAT_VERSION, PER_SAMPLE, SPLITS, decode_str
from h5forge.spec import DatasetSpec, ImageField, spec_from_json

MAX_LISTED = 20  # errors of one kind listed before summarising the rest


@dataclass
class HealthReport:
    path: str
    ok: bool = True
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    checks: dict[str, str] = field(default_factory=dict)
    stats: dict = field(default_factory=dict)

    def error(self, check: str, message: str) -> None:
        self.ok = False
        self.errors.append(message)
        self.checks[check] = "FAILED"

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, default=str)

    def to_markdown(self) -> str:
        lines = [f"# Health report: `{Path(self.path).name}`", "",
                 f"**{'HEALTHY' if self.ok else 'BROKEN'}**", "", "| check | result |", "|---|---|"]
        lines += [f"| {k} | {v} |" for k, v in self.checks.items()]
        if self.errors:
            lines += ["", "## Errors", *[f"- {e}" for e in self.errors]]
        if self.warnings:
            lines += ["", "## Warnings", *[f"- {w}" for w in self.warnings]]
        if self.stats:
            lines += ["", "## Figures", "```json", json.dumps(self.stats, indent=2, default=str), "```"]
        return "\n".join(lines) + "\n"


def verify_file(path: str | Path, *, checksums: bool = True, resample: int | None = None,
                latency_reads: int | None = None, source_root: str | Path | None = None,
                seed: int = 0, checksum_sample: int | None = None) -> HealthReport:
    """Run every check on ``path``; never raises for a broken file.

    ``checksum_sample``: check that many random rows per split (and its last row) instead of all
    rows; an append verifies its delta file in full and samples the thin version over it.
    """
    ensure_filters()
    path = Path(path)
    report = HealthReport(str(path))
    if not path.exists():
        report.error("open", f"{path}: no such file")
        return report
    try:
        f = h5py.File(os.path.realpath(path), "r")
    except OSError as err:
        report.error("open", f"{path}: not a readable HDF5 file ({err})")
        return report
    with f:
        spec = _check_header(f, report)
        if spec is None:
            return report
        _check_sources_exist(f, report)
        if not report.ok:
            return report
        _check_structure(f, spec, report)
        if not report.ok:
            return report
        if checksums:
            rows = None if checksum_sample is None else _sampled_rows(f, checksum_sample, seed)
            _check_checksums(f, spec, report, rows)
        n_resample = spec.verify.resample if resample is None else resample
        if n_resample:
            root = Path(source_root) if source_root else spec.source.root
            _check_against_sources(f, spec, root, n_resample, seed, report)
        reads = spec.verify.latency_reads if latency_reads is None else latency_reads
        summary = json.loads(f["diagnostics"].attrs.get("summary", "{}")) if "diagnostics" in f else {}
        report.stats.update({
            "version": int(f.attrs["version"]),
            "counts": {s: int(f[s].attrs.get("count", 0)) for s in SPLITS},
            "codec": str(f.attrs.get("codec")),
            "compression_ratio": summary.get("compression_ratio"),
            "file_bytes": path.stat().st_size,
        })
    if reads:
        _measure_latency(path, spec, reads, seed, report)
    return report


def _check_header(f: h5py.File, report: HealthReport) -> DatasetSpec | None:
    if f.attrs.get("format") != FORMAT:
        report.error("format", f"not an h5forge file (format attribute is {f.attrs.get('format')!r})")
        return None
    if int(f.attrs.get("format_version", -1)) > FORMAT_VERSION:
        report.error("format", f"format_version {f.attrs['format_version']} is newer than this h5forge reads")
        return None
    try:
        spec = spec_from_json(f["meta/spec"][()].decode())
    except Exception as err:
        report.error("format", f"/meta/spec is missing or unreadable: {err}")
        return None
    report.checks["format"] = f"ok ({FORMAT} v{int(f.attrs['format_version'])})"
    return spec


def virtual_sources(f: h5py.File) -> set[str]:
    """Files the virtual datasets of ``f`` read from (absolute paths)."""
    sources: set[str] = set()
    base = Path(os.path.realpath(f.filename)).parent

    def visit(_name: str, obj) -> None:
        if isinstance(obj, h5py.Dataset) and obj.is_virtual:
            for vs in obj.virtual_sources():
                src = vs.file_name
                sources.add(str(Path(src) if os.path.isabs(src) or src == "." else base / src))

    f.visititems(visit)
    sources.discard(str(base / "."))
    return sources


def _check_sources_exist(f: h5py.File, report: HealthReport) -> None:
    sources = virtual_sources(f)
    missing = sorted(s for s in sources if not Path(s).exists())
    for m in missing:
        report.error("dependencies", f"file this version reads from is missing: {m}")
    if not missing:
        report.checks["dependencies"] = f"ok ({len(sources)} other file(s))" if sources else "ok (self-contained)"


def _check_structure(f: h5py.File, spec: DatasetSpec, report: HealthReport) -> None:
    problems: list[str] = []
    for split in SPLITS:
        if split not in f:
            problems.append(f"/{split} is missing")
            continue
        g = f[split]
        count = int(g.attrs.get("count", -1))
        for name in spec.fields:
            if name not in g:
                problems.append(f"/{split}/{name} is missing")
                continue
            ds = g[name]
            want = (count, *spec.field_shape(name))
            if ds.shape != want:
                problems.append(f"/{split}/{name} has shape {ds.shape}, expected {want}")
            if ds.dtype != np.uint8:
                problems.append(f"/{split}/{name} has dtype {ds.dtype}, expected uint8")
            if not ds.is_virtual and ds.chunks and ds.chunks[0] != spec.storage.chunk_rows:
                problems.append(f"/{split}/{name} has chunks {ds.chunks}, spec asks {spec.storage.chunk_rows} rows")
        for key in [*PER_SAMPLE, *(f"meta/{c}" for c in spec.annotations.columns)]:
            if key not in g:
                problems.append(f"/{split}/{key} is missing")
            elif g[key].shape[0] != count:
                problems.append(f"/{split}/{key} has {g[key].shape[0]} rows, count attribute says {count}")
        for name, fs in spec.fields.items():
            if isinstance(fs, ImageField) and f"{name}_mean" not in g.attrs:
                problems.append(f"/{split} lacks the {name}_mean attribute")
        for col in spec.annotations.index_by:
            key = f"index/{split}/{col}"
            if key not in f:
                problems.append(f"/{key} is missing")
                continue
            rows, offsets = f[key]["rows"][()], f[key]["offsets"][()]
            if len(rows) != count or offsets[-1] != count or np.any(np.diff(offsets) < 0):
                problems.append(f"/{key} is inconsistent with {count} rows")
            elif count and not np.array_equal(np.sort(rows), np.arange(count)):
                problems.append(f"/{key}/rows is not a permutation of the split's rows")
    for p in problems[:MAX_LISTED]:
        report.error("structure", p)
    if len(problems) > MAX_LISTED:
        report.error("structure", f"... and {len(problems) - MAX_LISTED} more structure problems")
    if not problems:
        report.checks["structure"] = "ok"


def _sampled_rows(f: h5py.File, k: int, seed: int) -> dict[str, list[tuple[int, int]]]:
    """``k`` random rows of each split, and its last row (where the newest segment ends)."""
    rng = np.random.default_rng(seed)
    out = {}
    for split in SPLITS:
        n = int(f[split].attrs["count"])
        picks = set(rng.choice(n, size=min(k, n), replace=False).tolist()) | {n - 1} if n else set()
        out[split] = [(r, r + 1) for r in sorted(picks)]
    return out


def _check_checksums(f: h5py.File, spec: DatasetSpec, report: HealthReport,
                     ranges: dict[str, list[tuple[int, int]]] | None = None) -> None:
    bad: list[str] = []
    checked = 0
    step = spec.storage.chunk_rows * max(1, 64 // spec.storage.chunk_rows)
    for split in SPLITS:
        g = f[split]
        n = int(g.attrs["count"])
        ids = g["ids"]
        spans = [(0, n)] if ranges is None else ranges[split]
        blocks_of: list[tuple[int, int]] = []
        for lo, hi in spans:
            blocks_of += [(a, min(hi, a + step)) for a in range(lo, hi, step)]
        for start, stop in blocks_of:
            stored = g["checksum"][start:stop]
            try:
                blocks = {name: g[name][start:stop] for name in spec.fields}
            except OSError as err:
                bad.extend(_locate_unreadable(g, spec, split, start, stop, err))
                continue
            for i in range(stop - start):
                h = hashlib.sha256()
                for name in spec.fields:
                    h.update(np.ascontiguousarray(blocks[name][i]).data)
                if h.hexdigest().encode() != stored[i]:
                    bad.append(f"{split}[{start + i}] (id {decode_str(ids[start + i:start + i + 1])[0]!r}): "
                               "stored data does not match its checksum")
            checked += stop - start
    for b in bad[:MAX_LISTED]:
        report.error("checksums", b)
    if len(bad) > MAX_LISTED:
        report.error("checksums", f"... and {len(bad) - MAX_LISTED} more corrupt samples")
    if not bad:
        scope = "" if ranges is None else ", sampled"
        report.checks["checksums"] = f"ok ({checked} samples{scope})"
    report.stats["checksums_checked"] = checked


def _locate_unreadable(g: h5py.Group, spec: DatasetSpec, split: str, start: int, stop: int,
                       err: Exception) -> list[str]:
    out = []
    for row in range(start, stop):
        for name in spec.fields:
            try:
                g[name][row]
            except OSError as e:
                out.append(f"{split}[{row}] field {name!r} cannot be read (corrupt chunk): {e}")
    return out or [f"{split}[{start}:{stop}] cannot be read: {err}"]


def _check_against_sources(f: h5py.File, spec: DatasetSpec, root: Path, k: int, seed: int,
                           report: HealthReport) -> None:
    rng = np.random.default_rng(seed)
    population = [(s, i) for s in SPLITS for i in range(int(f[s].attrs["count"]))]
    if not population:
        report.checks["sources"] = "ok (empty dataset)"
        return
    picks = [population[j] for j in sorted(rng.choice(len(population), size=min(k, len(population)), replace=False))]
    compared, changed = 0, []
    for split, row in picks:
        g = f[split]
        files = decode_str(g["source_files"][row])
        hashes = decode_str(g["source_sha256"][row])
        ref = SampleRef(decode_str(g["ids"][row:row + 1])[0], split, dict(zip(spec.fields, files)), {})
        try:
            arrays, raw_hashes = clean_sample(spec, root, ref)
        except Reject as rej:
            changed.append(f"{split}[{row}] source {rej.path} no longer cleans: {rej.reason}")
            continue
        if raw_hashes != hashes:
            changed.append(f"{split}[{row}] raw files of {ref.id!r} changed since the build; not compared")
            continue
        for name in spec.fields:
            if not np.array_equal(arrays[name], g[name][row]):
                report.error("sources", f"{split}[{row}] field {name!r} (id {ref.id!r}) differs from its "
                                        f"source cleaned again ({files[list(spec.fields).index(name)]})")
        compared += 1
    report.warnings.extend(changed)
    if "sources" not in report.checks:
        report.checks["sources"] = f"ok ({compared} compared, {len(changed)} sources changed or gone)"


def _measure_latency(path: Path, spec: DatasetSpec, reads: int, seed: int, report: HealthReport) -> None:
    """Random single-sample reads (all fields) with a fresh handle, as a training job does."""
    rng = np.random.default_rng(seed + 1)
    with h5py.File(os.path.realpath(path), "r") as f:
        split = max(SPLITS, key=lambda s: int(f[s].attrs["count"]))
        n = int(f[split].attrs["count"])
        if n == 0:
            return
        dsets = [f[split][name] for name in spec.fields]
        rows = rng.integers(0, n, size=reads)
        times = np.empty(reads)
        for i, row in enumerate(rows):
            t = time.perf_counter()
            for d in dsets:
                d[row]
            times[i] = time.perf_counter() - t
    p50, p99 = float(np.percentile(times, 50) * 1e3), float(np.percentile(times, 99) * 1e3)
    report.stats["random_read_ms"] = {"split": split, "reads": reads, "p50": round(p50, 3), "p99": round(p99, 3)}
    report.checks["read latency"] = f"p50 {p50:.2f} ms, p99 {p99:.2f} ms"
    if p50 > 5.0:
        report.warnings.append(f"random reads are slow: p50 {p50:.1f} ms > 5 ms (SSD target); "
                               "check the chunk rows and codec, or the disk")
