"""Verify a version file: structure, every checksum, samples against their sources, read latency.

A version passes when it has no errors. Warnings (slow reads, a raw file changed since the
build) are reported but do not fail it: they say nothing about the file's integrity. What a field
must look like, and how it is re-derived from its source, is its kind's business.
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

from h5forge.format import arrays
from h5forge.format.codecs import ensure_filters
from h5forge.format.layout import SMALL_ROWS, decode_str
from h5forge.format.names import (CHECKSUM, FORMAT, FORMAT_VERSION, IDS, INDEX, PER_SAMPLE, SOURCE_FILES,
                                  SOURCE_SHA256, SPEC, SPLITS, Attr, block_rows)
from h5forge.format.segments import virtual_sources
from h5forge.format.summary import read_summary
from h5forge.kinds import FieldKind, decode_sample, stored_kinds
from h5forge.samples import Reject, SampleRef
from h5forge.spec import DatasetSpec, spec_from_json
from h5forge.store.figures import figure_rows

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

    def errors_of(self, check: str, problems: list[str], ok: str) -> None:
        """Record the problems of one check (the first MAX_LISTED of them), or its ok line."""
        for p in problems[:MAX_LISTED]:
            self.error(check, p)
        if len(problems) > MAX_LISTED:
            self.error(check, f"... and {len(problems) - MAX_LISTED} more {check} problems")
        if not problems:
            self.checks[check] = ok

    def merge(self, other: "HealthReport", prefix: str) -> None:
        """Fold another file's report in (e.g. an append's delta file), its lines prefixed."""
        self.checks = {**{f"{prefix} {k}": v for k, v in other.checks.items()}, **self.checks}
        self.errors = [f"{prefix}: {e}" for e in other.errors] + self.errors
        self.warnings += other.warnings
        self.ok = self.ok and other.ok

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
            lines += ["", "## Figures", "", "| figure | value |", "|---|---|"]
            lines += [f"| {name} | {value} |" for name, value in figure_rows(self.stats)]
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
        kinds = stored_kinds(spec)
        _check_sources_exist(f, report)
        if not report.ok:
            return report
        _check_structure(f, spec, kinds, report)
        if not report.ok:
            return report
        if checksums:
            rows = None if checksum_sample is None else _sampled_rows(f, checksum_sample, seed)
            _check_checksums(f, spec, kinds, report, rows)
        n_resample = spec.verify.resample if resample is None else resample
        if n_resample:
            root = Path(source_root) if source_root else spec.source.root
            _check_against_sources(f, kinds, root, n_resample, seed, report)
        reads = spec.verify.latency_reads if latency_reads is None else latency_reads
        summary = read_summary(f)
        report.stats.update({
            "version": int(f.attrs[Attr.VERSION]),
            "counts": {s: int(f[s].attrs.get(Attr.COUNT, 0)) for s in SPLITS},
            "codec": str(f.attrs.get(Attr.CODEC)),
            "compression_ratio": summary.get("compression_ratio"),
            "file_bytes": path.stat().st_size,
        })
    if reads:
        _measure_latency(path, kinds, reads, seed, report)
    return report


def _check_header(f: h5py.File, report: HealthReport) -> DatasetSpec | None:
    if f.attrs.get(Attr.FORMAT) != FORMAT:
        report.error("format", f"not an h5forge file (format attribute is {f.attrs.get(Attr.FORMAT)!r})")
        return None
    if int(f.attrs.get(Attr.FORMAT_VERSION, -1)) > FORMAT_VERSION:
        report.error("format", f"format_version {f.attrs[Attr.FORMAT_VERSION]} is newer than this h5forge reads")
        return None
    try:
        spec = spec_from_json(f[SPEC][()].decode())
    except (KeyError, OSError, ValueError, UnicodeDecodeError) as err:
        report.error("format", f"/{SPEC} is missing or unreadable: {err}")
        return None
    report.checks["format"] = f"ok ({FORMAT} v{int(f.attrs[Attr.FORMAT_VERSION])})"
    return spec


def _check_sources_exist(f: h5py.File, report: HealthReport) -> None:
    sources = virtual_sources(f)
    missing = sorted(s for s in sources if not Path(s).exists())
    for m in missing:
        report.error("dependencies", f"file this version reads from is missing: {m}")
    if not missing:
        report.checks["dependencies"] = f"ok ({len(sources)} other file(s))" if sources else "ok (self-contained)"


def _dtype_matches(ds: h5py.Dataset, want) -> bool:
    want_str = h5py.check_string_dtype(np.dtype(want))
    if want_str is not None:
        have = h5py.check_string_dtype(ds.dtype)
        return have is not None and have.length == want_str.length
    return ds.dtype == np.dtype(want)


def _check_structure(f: h5py.File, spec: DatasetSpec, kinds: dict[str, FieldKind], report: HealthReport) -> None:
    problems: list[str] = []
    for split in SPLITS:
        if split not in f:
            problems.append(f"/{split} is missing")
            continue
        g = f[split]
        count = int(g.attrs.get(Attr.COUNT, -1))
        for path, kind in kinds.items():
            st = kind.stored()
            missing = [name for name in st.datasets(path) if name not in g]
            if missing:
                problems += [f"/{split}/{name} is missing" for name in missing]
                continue
            ds = g[path]
            rows = arrays.rows(g, path, st)
            lead = int(g[path + arrays.LENGTHS][()].sum()) if st.ragged else count
            if rows != count or ds.shape != (lead, *st.shape):
                problems.append(f"/{split}/{path} has shape {ds.shape} over {rows} rows, expected "
                                f"{(lead, *st.shape)} over {count}")
            if not _dtype_matches(ds, st.dtype):
                problems.append(f"/{split}/{path} has dtype {ds.dtype}, expected {np.dtype(st.dtype)}")
            want = st.chunk(spec.storage.chunk_rows, SMALL_ROWS)
            if st.bulk and not ds.is_virtual and ds.chunks and ds.chunks != want:
                problems.append(f"/{split}/{path} has chunks {ds.chunks}, the spec asks {want}")
            problems += [f"/{split} lacks the {a} attribute" for a in kind.stats_attrs() if a not in g.attrs]
            if kind.indexed and f"{INDEX}/{split}/{path}" not in f:
                problems.append(f"/{INDEX}/{split}/{path} is missing")
        for key in PER_SAMPLE:
            if key not in g:
                problems.append(f"/{split}/{key} is missing")
            elif g[key].shape[0] != count:
                problems.append(f"/{split}/{key} has {g[key].shape[0]} rows, count attribute says {count}")
        for col in spec.annotations.index_by:
            key = f"{INDEX}/{split}/{col}"
            if key not in f:
                problems.append(f"/{key} is missing")
                continue
            rows, offsets = f[key]["rows"][()], f[key]["offsets"][()]
            if len(rows) != count or offsets[-1] != count or np.any(np.diff(offsets) < 0):
                problems.append(f"/{key} is inconsistent with {count} rows")
            elif count and not np.array_equal(np.sort(rows), np.arange(count)):
                problems.append(f"/{key}/rows is not a permutation of the split's rows")
    report.errors_of("structure", problems, "ok")


def _sampled_rows(f: h5py.File, k: int, seed: int) -> dict[str, list[tuple[int, int]]]:
    """``k`` random rows of each split, and its last row (where the newest segment ends)."""
    rng = np.random.default_rng(seed)
    out = {}
    for split in SPLITS:
        n = int(f[split].attrs[Attr.COUNT])
        picks = set(rng.choice(n, size=min(k, n), replace=False).tolist()) | {n - 1} if n else set()
        out[split] = [(r, r + 1) for r in sorted(picks)]
    return out


def _check_checksums(f: h5py.File, spec: DatasetSpec, kinds: dict[str, FieldKind], report: HealthReport,
                     ranges: dict[str, list[tuple[int, int]]] | None = None) -> None:
    bad: list[str] = []
    checked = 0
    summed = {path: kind.stored() for path, kind in kinds.items() if kind.checksummed}
    step = block_rows(spec.storage.chunk_rows)
    for split in SPLITS:
        g = f[split]
        n = int(g.attrs[Attr.COUNT])
        readers = [arrays.RowReader(g, path, st) for path, st in summed.items()]
        spans = [(0, n)] if ranges is None else ranges[split]
        blocks_of = [(a, min(hi, a + step)) for lo, hi in spans for a in range(lo, hi, step)]
        for start, stop in blocks_of:
            stored = g[CHECKSUM][start:stop]
            try:
                blocks = [read(start, stop) for read in readers]
            except OSError as err:
                bad.extend(_locate_unreadable(g, summed, split, start, stop, err))
                continue
            for i in range(stop - start):
                h = hashlib.sha256()
                for block in blocks:
                    h.update(np.ascontiguousarray(block[i]).data)
                if h.hexdigest().encode() != stored[i]:
                    bad.append(f"{split}[{start + i}] (id {decode_str(g[IDS][start + i:start + i + 1])[0]!r}): "
                               "stored data does not match its checksum")
            checked += stop - start
    report.errors_of("checksums", bad, f"ok ({checked} samples{'' if ranges is None else ', sampled'})")
    report.stats["checksums_checked"] = checked


def _locate_unreadable(g: h5py.Group, fields: dict, split: str, start: int, stop: int,
                       err: Exception) -> list[str]:
    out = []
    for row in range(start, stop):
        for path, st in fields.items():
            try:
                arrays.RowReader(g, path, st).row(row)
            except OSError as e:
                out.append(f"{split}[{row}] field {path!r} cannot be read (corrupt chunk): {e}")
    return out or [f"{split}[{start}:{stop}] cannot be read: {err}"]


def _stored_ref(g: h5py.Group, kinds: dict[str, FieldKind], split: str, row: int) -> SampleRef:
    """The sample of a stored row as discovery saw it: its files and its annotation columns."""
    files = dict(zip(decode_str(g[SOURCE_SHA256].attrs[Attr.FIELDS]), decode_str(g[SOURCE_FILES][row])))
    columns = {}
    for kind in kinds.values():
        if kind.annotation_column:
            value = g[kind.path][row]
            columns[kind.annotation_column] = value.decode() if isinstance(value, bytes) else value.item()
    return SampleRef(decode_str(g[IDS][row:row + 1])[0], split, files, columns)


def _check_against_sources(f: h5py.File, kinds: dict[str, FieldKind], root: Path, k: int, seed: int,
                           report: HealthReport) -> None:
    rng = np.random.default_rng(seed)
    population = [(s, i) for s in SPLITS for i in range(int(f[s].attrs[Attr.COUNT]))]
    if not population:
        report.checks["sources"] = "ok (empty dataset)"
        return
    picks = [population[j] for j in sorted(rng.choice(len(population), size=min(k, len(population)), replace=False))]
    compared, changed = 0, []
    for split, row in picks:
        g = f[split]
        ref = _stored_ref(g, kinds, split, row)
        try:
            decoded = decode_sample(kinds, root, ref)
        except Reject as rej:
            changed.append(f"{split}[{row}] source {rej.path} no longer cleans: {rej.reason}")
            continue
        if [decoded[n].sha256 for n in ref.files] != decode_str(g[SOURCE_SHA256][row]):
            changed.append(f"{split}[{row}] raw files of {ref.id!r} changed since the build; not compared")
            continue
        for path, kind in kinds.items():
            if kind.checksummed and not np.array_equal(decoded[path].value,
                                                       arrays.RowReader(g, path, kind.stored()).row(row)):
                source = ref.files.get(path, "its annotation record")
                report.error("sources", f"{split}[{row}] field {path!r} (id {ref.id!r}) differs from its "
                                        f"source cleaned again ({source})")
        compared += 1
    report.warnings.extend(changed)
    if "sources" not in report.checks:
        report.checks["sources"] = (f"ok ({compared} samples re-derived from their sources and compared, "
                                    f"{len(changed)} sources changed or gone)")


def _measure_latency(path: Path, kinds: dict[str, FieldKind], reads: int, seed: int, report: HealthReport) -> None:
    """Random single-sample reads (every field) with a fresh handle, as a training job does."""
    rng = np.random.default_rng(seed + 1)
    with h5py.File(os.path.realpath(path), "r") as f:
        split = max(SPLITS, key=lambda s: int(f[s].attrs[Attr.COUNT]))
        n = int(f[split].attrs[Attr.COUNT])
        if n == 0:
            return
        g = f[split]
        readers = [arrays.RowReader(g, p, kind.stored()) for p, kind in kinds.items() if kind.checksummed]
        rows = rng.integers(0, n, size=reads)
        times = np.empty(reads)
        for i, row in enumerate(rows):
            t = time.perf_counter()
            for read in readers:
                read.row(row)
            times[i] = time.perf_counter() - t
    p50, p99 = float(np.percentile(times, 50) * 1e3), float(np.percentile(times, 99) * 1e3)
    report.stats["random_read_ms"] = {"split": split, "reads": reads, "p50": round(p50, 3), "p99": round(p99, 3)}
    report.checks["read latency"] = f"p50 {p50:.2f} ms, p99 {p99:.2f} ms"
    if p50 > 5.0:
        report.warnings.append(f"random reads are slow: p50 {p50:.1f} ms > 5 ms (SSD target); "
                               "check the chunk rows and codec, or the disk")
