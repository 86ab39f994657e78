"""Verify a version file: structure, the files it depends on, split digests, every row checksum,
samples against their sources, read latency.

A version passes when it has no errors. Warnings (slow reads, a raw file changed since the
build, a source it will not read) are reported but do not fail it: they say nothing about the
file's integrity. What a field must look like, and how it is re-derived from its source, is its
kind's business. Nothing stored in the file is trusted: a part that cannot be read is an error of
the check that met it (never an exception), sources are read only below the source root, and
counts from the stored spec are capped.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import stat
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import h5py
import numpy as np

from h5forge._format import arrays, heap, leases
from h5forge._format import markdown
from h5forge._format.checksums import (
    PROVENANCE,
    RowChecksums,
    UnknownDigestRule,
    canonical,
    file_digest,
    legacy_checksum,
    split_digest,
)
from h5forge._format.catalog import INPUTS, Catalog, catalog_intact, content_digest, id_digest, location, read_catalog
from h5forge._format.chunk_codec import ZSTD_FILTER, zstd_intact
from h5forge._format.codecs import ensure_filters
from h5forge._format.dims import scale_problems
from h5forge._format.filters import filter_ids
from h5forge._format.mapped import SOURCES, read_all, rows_of
from h5forge._format.layout import SMALL_ROWS, decode_str, provenance_layout
from h5forge._format.names import (
    CHECKSUM,
    CHECKSUMS_COVER_ALL,
    FORMAT,
    FORMAT_VERSION,
    IDS,
    INDEX,
    PER_SAMPLE,
    SOURCE_FILES,
    SOURCE_SHA256,
    SPEC,
    SPLITS,
    Attr,
    block_rows,
)
from h5forge._format.row_files import counts_of, listed_row_files, virtual_sources
from h5forge.kinds import FieldKind, decode_sample, stored_kinds
from h5forge.kinds.index import RowIndex
from h5forge.kinds.statistics import Statistics
from h5forge._samples import Reject, SampleRef
from h5forge.spec import DatasetSpec, spec_from_json
from h5forge._store.isolated import LOOK_LIMIT, Crashed, Stuck, crash_text, in_child
from h5forge._store.sizes import version_sizes
from h5forge._store.sources import MAX_SOURCE_BYTES, source_problem
from h5forge._figures import figure_rows

if TYPE_CHECKING:
    from concurrent.futures import Executor

MAX_LISTED = 20  # errors of one kind listed before summarising the rest
MAX_STORED_COUNT = 1000  # resample / latency_reads taken from the file's own spec at most
MAX_BLOCK_ROWS = 256  # rows checksummed per read, whatever chunk_rows the file's spec claims
BLOCK_BYTES = 4 << 20  # small rows are checksummed more at a time, up to this many stored bytes


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
        lines = [
            f"# Health report: {markdown.text(Path(self.path).name)}",
            "",
            f"**{'HEALTHY' if self.ok else 'BROKEN'}**",
            "",
            "| check | result |",
            "|---|---|",
        ]
        lines += [f"| {markdown.text(k)} | {markdown.text(v)} |" for k, v in self.checks.items()]
        if self.errors:
            lines += ["", "## Errors", *[f"- {markdown.text(e)}" for e in self.errors]]
        if self.warnings:
            lines += ["", "## Warnings", *[f"- {markdown.text(w)}" for w in self.warnings]]
        if self.stats:
            lines += ["", "## Figures", "", "| figure | value |", "|---|---|"]
            lines += [f"| {markdown.text(name)} | {markdown.text(value)} |" for name, value in figure_rows(self.stats)]
        return "\n".join(lines) + "\n"


def verify_file(
    path: str | Path,
    *,
    checksums: bool = True,
    resample: int | None = None,
    latency_reads: int | None = None,
    source_root: str | Path | None = None,
    seed: int = 0,
    checksum_sample: int | None = None,
    max_source_bytes: int = MAX_SOURCE_BYTES,
    isolate: bool = False,
    workers: int | None = None,
    executor: tuple[Executor, int] | None = None,
    walk_heap: bool = True,
) -> HealthReport:
    """Run every check on ``path``; never raises for a broken file: whatever cannot be read is an
    error of the check that tried, and the report says BROKEN.

    ``checksum_sample``: check that many random rows per split (and its last row) instead of all
    rows; an append verifies its delta file in full and samples the thin version over it.
    ``resample`` and ``latency_reads`` override the stored spec's counts, which are capped at
    ``MAX_STORED_COUNT`` (the file is what is being checked: nothing in it is trusted).
    ``isolate``: check in a forked child process, so that a file which crashes the HDF5 library
    itself (some corrupt virtual-dataset mappings make opening a dataset segfault) gives a BROKEN
    report instead of killing the caller. For callers without other threads (the CLI).
    ``workers``: processes that share the checksums of a file of at least ``PARALLEL_ROWS`` rows
    (default: ``verify_workers()``, the CPUs this process may use); 1 checks in this process.
    ``executor``: running processes to checksum on and how many there are (a build passes the dask
    workers that cleaned it): the rows are shared among them from ``EXECUTOR_ROWS`` rows on, as
    they cost no start; a share they fail to check is checked as without them.
    ``walk_heap``: walk the global heap of the file and of the files it reads from before HDF5
    reads a string (``h5forge._format.heap``: a pass over their bytes). A build verifying what it
    has just written passes False, as that heap is what HDF5 wrote moments ago. An ``isolate``d
    check that does not walk it, or reads no checksums, is given ``isolated.LOOK_LIMIT``: HDF5 can
    loop for ever on a damaged heap, or on damage the walk does not look for.

    The version is pinned for the whole check, as readers pin it (its lease,
    h5forge._format.leases): retention does not delete it meanwhile. ``dataset_latest.h5`` is
    resolved and pinned in one step (a version deleted before the pin is resolved again).
    """
    options = dict(
        checksums=checksums,
        resample=resample,
        latency_reads=latency_reads,
        source_root=source_root,
        seed=seed,
        checksum_sample=checksum_sample,
        max_source_bytes=max_source_bytes,
        workers=workers,
        walk_heap=walk_heap,
    )
    with leases.pinned(path) as real:  # a forked child (isolate) shares the pin of this process
        if isolate:
            return _in_child(real, path, options)
        return _verify(Path(path), real, executor=executor, **options)  # type: ignore[arg-type]


def _verify(
    path: Path,
    real: str,
    *,
    checksums: bool,
    resample: int | None,
    latency_reads: int | None,
    source_root: str | Path | None,
    seed: int,
    checksum_sample: int | None,
    max_source_bytes: int,
    workers: int | None,
    executor: tuple[Executor, int] | None,
    walk_heap: bool,
) -> HealthReport:
    """``verify_file`` on the pinned version ``real`` (``path`` as given, for the report)."""
    if executor is not None and executor[1] < 1:
        executor = None
    ensure_filters()
    report = HealthReport(str(path))
    if not os.path.exists(real):
        report.error("open", f"{path}: no such file")
        return report
    try:
        regular = stat.S_ISREG(os.stat(real).st_mode)
    except OSError as err:
        report.error("open", f"{path}: cannot be read ({err.strerror or err})")
        return report
    if not regular:
        report.error("open", f"{path}: not a regular file")
        return report
    if walk_heap:  # before HDF5 reads a string: a damaged heap can make it loop for ever
        try:
            damaged = heap.damage(real)
        except (OSError, ValueError) as err:
            report.error("open", f"{path}: cannot be read ({_why(err)})")
            return report
        report.errors_of("global heap", [f"{path}: {damaged}"] if damaged else [], "ok")
        if damaged:
            return report
    try:
        f = h5py.File(real, "r")
    except Exception as err:  # noqa: BLE001 - any failure to open is a verdict on the file
        report.error("open", f"{path}: not a readable HDF5 file ({_why(err)})")
        return report
    kinds: dict[str, FieldKind] = {}
    reads = 0
    try:
        with f:
            spec, old_format = _check_header(f, report)
            if spec is None:
                return report
            kinds = stored_kinds(spec)
            if not _guarded(report, "dependencies", _check_dependencies, f, report, walk_heap) or not report.ok:
                return report
            if not _guarded(report, "structure", _check_structure, f, spec, kinds, report) or not report.ok:
                return report
            if not old_format:
                _guarded(report, "split digests", _check_digests, f, report)
                _guarded(report, "file digest", _check_file_digest, f, report)
            rows = None if checksum_sample is None else _sampled_rows(f, checksum_sample, seed)
            _guarded(report, "inputs catalog", _check_catalog, f, report, rows if checksums else {})
            if checksums:
                n_workers = verify_workers() if workers is None else workers
                checked = (f, spec, kinds, report, rows, old_format, n_workers, executor)
                _guarded(report, "checksums", _check_checksums, *checked)
            n_resample = _count(report, "resample", spec.verify.resample, resample)
            if n_resample:
                roots = [
                    Path(source_root) if source_root else spec.source.root,
                    *([spec.source.inbox] if spec.source.inbox else []),
                ]
                missing = _missing_decoders()
                if missing:  # a reader-only install: the file is not at fault, so this is no error
                    report.warnings.append(
                        f"sources not compared: re-deriving samples needs the build extra "
                        f"(pip install 'h5forge[build]'; {missing} is not installed)"
                    )
                    report.checks["sources"] = "skipped (no build extra)"
                else:
                    compared = (f, kinds, roots, n_resample, seed, report, max_source_bytes)
                    _guarded(report, "sources", _check_against_sources, *compared)
            reads = _count(report, "latency_reads", spec.verify.latency_reads, latency_reads)
            _guarded(report, "figures", _figures, f, Path(real), kinds, report)
            _guarded(report, "non-finite values", _count_nonfinite, f, kinds, report)
    except Exception as err:  # noqa: BLE001 - e.g. closing a file whose metadata is corrupt
        report.error("read", f"{path}: cannot be read ({_why(err)})")
    if reads and report.ok:
        _guarded(report, "read latency", _measure_latency, Path(real), kinds, reads, seed, report)
    SOURCES.close_all()  # the mapped files read for the checks, latency's included, are not kept open after them
    return report


def _in_child(real: str, path: str | Path, options: dict) -> HealthReport:
    """The checks of the pinned version ``real`` in a forked child (the pin's lease is inherited)."""
    try:
        # a check of every row takes what the version's size asks; one without the checksums reads
        # little, and past the limit HDF5 loops on something the heap walk does not see
        limit = None if options["walk_heap"] and options["checksums"] else LOOK_LIMIT
        return in_child(lambda: _verify(Path(path), real, executor=None, **options), what=f"verify {path}", limit=limit)
    except Crashed as err:
        report = HealthReport(str(path))
        report.error("read", f"{path}: {crash_text(err.exitcode)}")
        return report
    except Stuck as err:
        report = HealthReport(str(path))
        report.error("read", str(err))
        return report


def _why(err: BaseException) -> str:
    return f"{type(err).__name__}: {err}" if not isinstance(err, OSError) else str(err)


def _missing_decoders() -> str | None:
    """The first raw-file decoder the source comparison needs that is not installed, if any."""
    import importlib.util

    return next((m for m in ("PIL", "pydicom", "pyedflib", "nibabel") if importlib.util.find_spec(m) is None), None)


def _guarded(report: HealthReport, check: str, fn, *args) -> bool:
    """Run one check; an exception it meets (a corrupt chunk, header or heap) is that check's error."""
    try:
        fn(*args)
        return True
    except Exception as err:  # noqa: BLE001 - verify reports a broken file, it never raises on one
        report.error(check, f"{check}: the file cannot be read ({_why(err)})")
        return False


def _count(report: HealthReport, name: str, stored: int, given: int | None) -> int:
    """A count the caller gave, or the stored spec's, capped (a file may ask for 300 million reads)."""
    if given is not None:
        return given
    if stored > MAX_STORED_COUNT:
        flag = "--latency-reads" if name == "latency_reads" else "--resample"
        report.warnings.append(
            f"verify.{name} {stored} stored in the file is capped at {MAX_STORED_COUNT}; pass {flag} to choose"
        )
        return MAX_STORED_COUNT
    return stored


def _figures(f: h5py.File, path: Path, kinds: dict[str, FieldKind], report: HealthReport) -> None:
    report.stats.update(
        {
            "version": int(f.attrs[Attr.VERSION]),
            "counts": {s: int(f[s].attrs.get(Attr.COUNT, 0)) for s in SPLITS},
            "codec": str(f.attrs.get(Attr.CODEC)),
            "compression_ratio": version_sizes(path, kinds).ratio,
            "file_bytes": path.stat().st_size,
        }
    )


def _count_nonfinite(f: h5py.File, kinds: dict[str, FieldKind], report: HealthReport) -> None:
    """The NaN/inf values kept on purpose (a signal's ``nonfinite: keep``, a float32 volume), per
    field, from the split statistics: reported, never an error."""
    kept = {
        path: sum(kind.nonfinite(f[s]) for s in SPLITS) for path, kind in kinds.items() if isinstance(kind, Statistics)
    }
    kept = {path: n for path, n in kept.items() if n}
    if kept:
        report.stats["nonfinite"] = kept
        report.checks["non-finite values"] = (
            f"{sum(kept.values())} kept (" + ", ".join(f"{p}: {n}" for p, n in kept.items()) + ")"
        )


def _check_header(f: h5py.File, report: HealthReport) -> tuple[DatasetSpec | None, bool]:
    """The stored spec, and whether the file is in a format whose checksums cover less."""
    try:
        fmt, version = f.attrs.get(Attr.FORMAT), int(f.attrs.get(Attr.FORMAT_VERSION, -1))
    except Exception as err:  # noqa: BLE001 - a corrupt attribute
        report.error("format", f"the file's attributes cannot be read ({_why(err)})")
        return None, False
    if fmt != FORMAT:
        report.error("format", f"not an h5forge file (format attribute is {fmt!r})")
        return None, False
    if version > FORMAT_VERSION or version < 1:
        report.error("format", f"format_version {version} is not one this h5forge reads (1 to {FORMAT_VERSION})")
        return None, False
    try:
        spec = spec_from_json(f[SPEC][()].decode())
    except Exception as err:  # noqa: BLE001 - missing, corrupt, not JSON, not a spec
        report.error("format", f"/{SPEC} is missing or unreadable: {_why(err)}")
        return None, False
    old = version < CHECKSUMS_COVER_ALL
    report.checks["format"] = f"ok ({FORMAT} v{version}{', an older format' if old else ''})"
    if old:
        report.warnings.append(
            f"format {version}: its checksums cover the stored field bytes only, not the ids, annotation "
            "columns, source files and their hashes, split statistics or row indexes; rebuild (`h5forge build`) to "
            "have every value covered"
        )
    return spec, old


def _check_dependencies(f: h5py.File, report: HealthReport, walk_heap: bool) -> None:
    """Every file a thin version reads exists and is the row file it recorded: an h5forge version
    with the recorded counts (a missing or replaced one would read as zeros or as other rows)."""
    sources = virtual_sources(f)
    missing = sorted(s for s in sources if not Path(s).exists())
    problems = [f"file this version reads from is missing: {m}" for m in missing]
    if not problems:
        base = Path(os.path.realpath(f.filename)).parent
        for row_file in listed_row_files(f) or []:
            problems += _row_file_problems(base / row_file["file"], row_file["counts"], walk_heap)
    report.errors_of(
        "dependencies", problems, f"ok ({len(sources)} other file(s))" if sources else "ok (self-contained)"
    )


def _row_file_problems(path: Path, counts: dict[str, int], walk_heap: bool) -> list[str]:
    if not path.is_file() or path.stat().st_size == 0:
        return [f"file this version reads from is not a version file: {path} (empty or not a file)"]
    try:
        damaged = heap.damage(path) if walk_heap else None
        if damaged:
            return [f"file this version reads from is damaged: {path}: {damaged}"]
        with h5py.File(path, "r") as row_file:
            if row_file.attrs.get(Attr.FORMAT) != FORMAT:
                return [f"file this version reads from is not an h5forge file: {path}"]
            have = counts_of(row_file)
    except Exception as err:  # noqa: BLE001 - a replaced or damaged row file
        return [f"file this version reads from cannot be read: {path} ({_why(err)})"]
    if any(have[s] < int(counts.get(s, 0)) for s in SPLITS):
        return [
            f"file this version reads from holds other rows than it recorded: {path} (counts {have}, recorded {counts})"
        ]
    return []


def _dtype_matches(ds: h5py.Dataset, want) -> bool:
    want_str = h5py.check_string_dtype(np.dtype(want))
    if want_str is not None:
        have = h5py.check_string_dtype(ds.dtype)
        return have is not None and have.length == want_str.length
    return ds.dtype == np.dtype(want)


def _check_structure(f: h5py.File, spec: DatasetSpec, kinds: dict[str, FieldKind], report: HealthReport) -> None:
    # a walk of every group: a damaged group B-tree can fail a walk (h5py's visit, h5dump) while
    # each name, looked up alone, still opens
    f.visit(lambda _name: None)
    problems: list[str] = []
    declared = [str(x) for x in f.attrs.get(Attr.FIELDS, [])]
    if declared != list(spec.fields):  # what a reader returns by default
        problems.append(f"the file lists fields {declared}, its spec declares {list(spec.fields)}")
    for split in SPLITS:
        if split not in f:
            problems.append(f"/{split} is missing")
            continue
        g = f[split]
        problems += scale_problems(g)
        count = int(g.attrs.get(Attr.COUNT, -1))
        for path, kind in kinds.items():
            st = kind.stored()
            missing = [name for name in st.datasets(path) if name not in g]
            if missing:
                problems += [f"/{split}/{name} is missing" for name in missing]
                continue
            ds = g[path]
            rows = arrays.rows(g, path, st)
            lead = int(read_all(g[path + arrays.LENGTHS]).sum()) if st.ragged else count
            if rows != count or ds.shape != (lead, *st.shape):
                problems.append(
                    f"/{split}/{path} has shape {ds.shape} over {rows} rows, expected {(lead, *st.shape)} over {count}"
                )
            if st.ragged and count > 0 and int(read_all(g[path + arrays.LENGTHS]).min()) < 0:
                problems.append(f"/{split}/{path}{arrays.LENGTHS} holds a negative length")
            if not _dtype_matches(ds, st.dtype):
                problems.append(f"/{split}/{path} has dtype {ds.dtype}, expected {np.dtype(st.dtype)}")
            want = st.chunk(spec.storage.chunk_rows, SMALL_ROWS)
            if st.bulk and not ds.is_virtual and ds.chunks and ds.chunks != want:
                problems.append(f"/{split}/{path} has chunks {ds.chunks}, the spec asks {want}")
            if isinstance(kind, Statistics):
                problems += [f"/{split} lacks the {a} attribute" for a in kind.stats_attrs() if a not in g.attrs]
            if isinstance(kind, RowIndex) and f"{INDEX}/{split}/{path}" not in f:
                problems.append(f"/{INDEX}/{split}/{path} is missing")
        layout = provenance_layout(g[SOURCE_FILES].shape[1] if SOURCE_FILES in g and g[SOURCE_FILES].ndim == 2 else 0)
        for key in PER_SAMPLE:
            if key not in g:
                problems.append(f"/{split}/{key} is missing")
                continue
            ds, (shape, dtype) = g[key], layout[key]
            if ds.shape[0] != count:
                problems.append(f"/{split}/{key} has {ds.shape[0]} rows, count attribute says {count}")
            if ds.shape[1:] != shape or not _dtype_matches(ds, dtype):  # plain HDF5 reads it with these
                problems.append(
                    f"/{split}/{key} holds {ds.shape[1:]} of {ds.dtype}, expected {shape} of {np.dtype(dtype)}"
                )
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


def _check_digests(f: h5py.File, report: HealthReport) -> None:
    problems = []
    for split in SPLITS:
        stored = f[split].attrs.get(Attr.DIGEST)
        if stored is None:
            problems.append(f"/{split} has no {Attr.DIGEST} attribute")
            continue
        try:
            digest = split_digest(f, split)
        except UnknownDigestRule as err:
            problems.append(str(err))
            continue
        if str(stored) != digest:
            problems.append(
                f"/{split}: its attributes, statistics, row indexes or the spec do not match the split's {Attr.DIGEST}"
            )
    report.errors_of("split digests", problems, f"ok ({len(SPLITS)} splits)")


def _check_catalog(f: h5py.File, report: HealthReport, ranges: dict[str, list[tuple[int, int]]] | None) -> None:
    """Ids are unique, and the exactly-once catalog (``/inputs``) is what the rows say. ``ranges``
    None: recomputed from every row (ids unique by name); otherwise the stored catalog's own
    consistency (its digest, sizes, order, no id twice) and the rows of ``ranges`` found in it."""
    stored = read_catalog(f)
    if ranges is None:
        problems, made, ids = _rows_catalog(f)
        if stored is not None:
            problems += _catalog_differences(stored, made, ids)
        checked = "every row"
    else:
        problems = [] if stored is None else _catalog_consistency(f, stored, ranges)
        checked = "sampled rows"
    if stored is None and not problems:
        report.checks["inputs catalog"] = f"ok (ids unique; no catalog: an older file; {checked})"
        return
    report.errors_of(
        "inputs catalog",
        problems,
        f"ok ({len(stored.ids) if stored is not None else 0} samples, ids unique; {checked})",
    )


def _rows_catalog(f: h5py.File) -> tuple[list[str], Catalog, list[str]]:
    """Duplicate ids (by name, in NFC as the exactly-once check compares them), the catalog the
    rows make and their ids."""
    contents, at, digests, every = [], [], [], []
    rows_by_id: dict[bytes, list[tuple[str, int, str]]] = {}
    for split in SPLITS:
        g = f[split]
        ids = decode_str(read_all(g[IDS]))
        for row, (sid, hexes) in enumerate(zip(ids, read_all(g[SOURCE_SHA256]))):
            digest = id_digest(sid)
            digests.append(digest)
            every.append(sid)
            rows_by_id.setdefault(digest, []).append((split, row, sid))
            contents.append(content_digest(hexes))
            at.append(location(split, row))
    problems = [
        f"id {rows[0][2]!r} is in {len(rows)} rows: " + ", ".join(f"{s}[{r}]" for s, r, _ in rows[:MAX_LISTED])
        for rows in rows_by_id.values()
        if len(rows) > 1
    ]
    return problems, Catalog.of(contents, at, digests), every


def _catalog_differences(stored: Catalog, made: Catalog, ids: list[str]) -> list[str]:
    problems = []
    if not np.array_equal(stored.ids, made.ids) and not np.array_equal(stored.ids, _bytes_id_digests(ids)):
        problems.append(f"/{INPUTS}/ids does not match the ids of the rows (the exactly-once check reads it)")
    if not np.array_equal(stored.content, made.content):
        problems.append(f"/{INPUTS}/content does not match the raw-file hashes of the rows")
    elif not np.array_equal(_pairs(stored), _pairs(made)):
        problems.append(f"/{INPUTS}/content_at does not match where the rows are")
    return problems


def _bytes_id_digests(ids: list[str]) -> np.ndarray:
    """The id hashes as catalogs written before ids were matched in NFC have them (of the id's bytes)."""
    return np.sort(
        np.array([hashlib.sha256(i.encode("utf-8", "surrogatepass")).digest()[:16] for i in ids], dtype="S16")
    )


def _pairs(c: Catalog) -> np.ndarray:
    """The locations ordered by (content, location): equal contents may be stored in any order."""
    return c.content_at[np.lexsort((c.content_at, c.content))]


def _catalog_consistency(f: h5py.File, stored: Catalog, ranges: dict[str, list[tuple[int, int]]]) -> list[str]:
    problems = []
    if catalog_intact(f, stored) is False:
        problems.append(
            f"/{INPUTS}/ids, content or content_at do not match the catalog's digest (damaged since it was written)"
        )
    total = sum(int(f[s].attrs[Attr.COUNT]) for s in SPLITS)
    if not len(stored.ids) == len(stored.content) == len(stored.content_at) == total:
        problems.append(f"/{INPUTS} holds {len(stored.ids)} ids and {len(stored.content)} contents for {total} rows")
        return problems
    if total and (np.any(stored.ids[1:] < stored.ids[:-1]) or np.any(stored.content[1:] < stored.content[:-1])):
        problems.append(f"/{INPUTS}/ids or content is not sorted (the exactly-once check bisects it)")
    twice = int(np.count_nonzero(stored.ids[1:] == stored.ids[:-1])) if total else 0
    if twice:
        problems.append(f"/{INPUTS}/ids: {twice} id(s) are in the dataset more than once")
    for split, spans in ranges.items():
        g = f[split]
        ids, hashes = rows_of(g[IDS]), rows_of(g[SOURCE_SHA256])
        for lo, hi in spans:
            for row in range(lo, hi):
                sid = decode_str(ids[row : row + 1])[0]
                digest = content_digest(hashes[row])
                if not (stored.has_id(id_digest(sid)) or stored.has_id(_bytes_id_digests([sid])[0])):
                    problems.append(f"{split}[{row}] (id {sid!r}) is missing from /{INPUTS}/ids")
                q = np.array([digest], dtype=stored.content.dtype)
                first, last = (int(np.searchsorted(stored.content, q, side)[0]) for side in ("left", "right"))
                if location(split, row) not in set(stored.content_at[first:last].tolist()):
                    problems.append(f"{split}[{row}] (id {sid!r}) is not where /{INPUTS}/content_at says")
    return problems


def _check_file_digest(f: h5py.File, report: HealthReport) -> None:
    stored = f.attrs.get(Attr.FILE_DIGEST)
    if stored is None:
        report.warnings.append(
            f"no {Attr.FILE_DIGEST}: the file's own attributes, diagnostics and inputs catalog "
            "are not covered (written by an h5forge that did not record it)"
        )
        report.checks["file digest"] = "none (older file)"
        return
    try:
        digest = file_digest(f)
    except UnknownDigestRule as err:  # a newer h5forge's file, not a damaged one
        report.error("file digest", str(err))
        return
    if str(stored) != digest:
        report.error(
            "file digest",
            f"the file's attributes (name, version, codec, lineage, ...), its diagnostics, "
            f"its inputs catalog or its stored spec do not match its {Attr.FILE_DIGEST}",
        )
    else:
        report.checks["file digest"] = "ok"


def _sampled_rows(f: h5py.File, k: int, seed: int) -> dict[str, list[tuple[int, int]]]:
    """``k`` random rows of each split, and its last row (where the newest row file ends)."""
    rng = np.random.default_rng(seed)
    out = {}
    for split in SPLITS:
        n = int(f[split].attrs[Attr.COUNT])
        picks = set(rng.choice(n, size=min(k, n), replace=False).tolist()) | {n - 1} if n else set()
        out[split] = [(r, r + 1) for r in sorted(picks)]
    return out


def _check_checksums(
    f: h5py.File,
    spec: DatasetSpec,
    kinds: dict[str, FieldKind],
    report: HealthReport,
    ranges: dict[str, list[tuple[int, int]]] | None,
    old_format: bool,
    workers: int = 1,
    executor: tuple[Executor, int] | None = None,
) -> None:
    step = _block_step(f, spec, kinds)
    blocks: list[tuple[str, int, int]] = []
    for split in SPLITS:
        n = int(f[split].attrs[Attr.COUNT])
        spans = [(0, n)] if ranges is None else ranges[split]
        blocks += [(split, a, min(hi, a + step)) for lo, hi in spans for a in range(lo, hi, step)]
    shared = None if executor is None else _shares(blocks, executor[1], EXECUTOR_ROWS)
    parts = _shares(blocks, workers) if shared is None or len(shared) < 2 else shared
    if parts is shared and executor is not None:
        bad, checked = _checksums_on(executor[0], f, kinds, parts, old_format)
    elif len(parts) > 1:
        bad, checked = _checksums_in_processes(f, kinds, parts, old_format)
    else:
        bad, checked = _checksum_blocks(f, kinds, blocks, old_format)
    only = ", field bytes only" if old_format else ""
    report.errors_of("checksums", bad, f"ok ({checked} samples{'' if ranges is None else ', sampled'}{only})")
    report.stats["checksums_checked"] = checked
    report.stats["checksum_processes"] = len(parts)


def _block_step(f: h5py.File, spec: DatasetSpec, kinds: dict[str, FieldKind]) -> int:
    """Rows checksummed per read: whole chunks of at least BLOCK_ROWS rows (chunk_rows comes from the
    file), and a whole number of those up to SMALL_ROWS while BLOCK_BYTES holds the rows as the
    file's datasets store them: each read has costs of its own, which small rows would otherwise
    repeat every few rows. A ragged field keeps the first."""
    step = min(block_rows(spec.storage.chunk_rows), MAX_BLOCK_ROWS)
    try:
        g = next(f[s] for s in SPLITS if s in f)
        if any(k.stored().ragged for k in kinds.values()):
            return step
        nbytes = sum(int(np.prod(g[p].shape[1:])) * g[p].dtype.itemsize for p in kinds)
    except (KeyError, StopIteration, TypeError, ValueError, OSError):  # the layout check names what is wrong
        return step
    return max(step, min(SMALL_ROWS, step * (BLOCK_BYTES // max(1, nbytes) // step)))


def _checksum_blocks(
    f: h5py.File, kinds: dict[str, FieldKind], blocks: list[tuple[str, int, int]], old_format: bool
) -> tuple[list[str], int]:
    """The rows of ``blocks`` whose stored data does not match their checksum, and how many were checked."""
    bad: list[str] = []
    checked = 0
    # format 1 sums the stored bytes of the image-like fields only
    summed = {p: k for p, k in kinds.items() if k.checksummed} if old_format else kinds
    made: dict[str, RowChecksums] = {}
    zstd: dict[str, _ZstdChunks] = {}
    for split, start, stop in blocks:
        g = f[split]
        try:
            stored = rows_of(g[CHECKSUM])[start:stop]  # read as the readers read (_format.mapped)
            if old_format:
                rows = [arrays.RowReader(g, p, k.stored())(start, stop) for p, k in summed.items()]
                sums = [legacy_checksum(b[i] for b in rows) for i in range(stop - start)]
            else:  # each split's datasets opened once
                sums = (made.get(split) or made.setdefault(split, RowChecksums(g, summed)))(start, stop)
            ids = decode_str(rows_of(g[IDS])[start:stop])
            corrupt = (zstd.get(split) or zstd.setdefault(split, _ZstdChunks(g, summed))).corrupt(split, start, stop)
        except Exception as err:  # noqa: BLE001 - a corrupt chunk, heap or string
            bad.extend(_locate_unreadable(g, summed, split, start, stop, err))
            continue
        bad += [
            f"{split}[{start + i}] (id {ids[i]!r}): stored data does not match its checksum"
            for i in range(stop - start)
            if sums[i].encode() != stored[i]
        ]
        bad += corrupt
        checked += stop - start
    return bad, checked


class _ZstdChunks:
    """The chunks of one split's fields stored by the Zstd filter alone, asked of zstd itself: HDF5's
    Zstd filter returns uninitialised memory for a chunk zstd finds corrupt instead of failing,
    which a row's checksum may then match (``chunk_codec.zstd_intact``). Each chunk is asked once."""

    def __init__(self, g: h5py.Group, kinds: dict[str, FieldKind]):
        self.fields: list[tuple[str, h5py.Dataset, np.ndarray | None, set[int]]] = [
            (path, g[path], arrays.offsets(g, path) if kind.stored().ragged else None, set())
            for path, kind in kinds.items()
            if g[path].chunks and not g[path].is_virtual and filter_ids(g[path]) == [ZSTD_FILTER]
        ]

    def corrupt(self, split: str, start: int, stop: int) -> list[str]:
        """The corrupt chunks holding rows ``start:stop``."""
        problems = []
        for path, ds, starts, asked in self.fields:
            lo, hi = (start, stop) if starts is None else (int(starts[start]), int(starts[stop]))
            rows, size = ds.chunks[0], int(np.prod(ds.chunks)) * ds.dtype.itemsize
            for c in sorted(set(range(lo // rows, -(-hi // rows))) - asked):  # reported in file order
                asked.add(c)
                mask, raw = ds.id.read_direct_chunk((c * rows,) + (0,) * (ds.ndim - 1))
                if (len(raw) != size) if mask & 1 else zstd_intact(raw, size) is False:
                    problems.append(f"{split}/{path}: its stored chunk {c} is corrupt (zstd cannot decode it)")
        return problems


# Below this many rows a file is checksummed in the calling process: starting a checking process
# costs more than it saves (benchmarks/results/ingest_parts.md, "verify").
PARALLEL_ROWS = 8192
# Processes that are running already (a build's dask workers) cost no start: from this many rows
# the checksums are shared among them.
EXECUTOR_ROWS = 1024


def verify_workers() -> int:
    """Processes that checksum a large file: the CPUs this process may use, at most 16."""
    try:
        return max(1, min(16, len(os.sched_getaffinity(0))))
    except AttributeError:  # not Linux
        return max(1, min(16, os.cpu_count() or 1))


def _shares(
    blocks: list[tuple[str, int, int]], workers: int, least: int | None = None
) -> list[list[tuple[str, int, int]]]:
    """``blocks`` cut into ``workers`` runs of about equal rows (one run below ``least`` rows,
    default ``PARALLEL_ROWS``)."""
    rows = sum(b - a for _, a, b in blocks)
    if workers <= 1 or rows < (PARALLEL_ROWS if least is None else least):
        return [blocks]
    parts: list[list[tuple[str, int, int]]] = [[]]
    share, taken = rows / workers, 0
    for block in blocks:
        if taken >= share * len(parts) and len(parts) < workers:
            parts.append([])
        parts[-1].append(block)
        taken += block[2] - block[1]
    return [p for p in parts if p]


def _checksums_in_processes(
    f: h5py.File, kinds: dict[str, FieldKind], parts: list, old_format: bool
) -> tuple[list[str], int]:
    """Each part of the blocks checked in its own process, the first in this one. The children are
    forked from a fresh server process (``forkserver``): this process may run other threads (a
    Prefect task), which a plain fork would copy mid-operation. Where no process can be started,
    everything is checked here."""
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload([__name__])
    try:
        pool = ProcessPoolExecutor(len(parts) - 1, mp_context=ctx)
        futures = [pool.submit(_checksum_part, f.filename, part, old_format) for part in parts[1:]]
    except (OSError, RuntimeError, AssertionError):  # e.g. no process may be started here
        return _checksum_blocks(f, kinds, [b for part in parts for b in part], old_format)
    with pool:
        bad, checked = _checksum_blocks(f, kinds, parts[0], old_format)
        for future, part in zip(futures, parts[1:]):
            try:
                more, n = future.result()
            except BrokenProcessPool:  # the HDF5 library crashed on a part of the file
                split, start, _ = part[0]
                crash = f"{split}[{start}:] cannot be read: the HDF5 library crashed while checking these rows"
                more, n = [f"{crash}; the file is corrupt"], 0
            bad += more
            checked += n
    return bad, checked


def _checksums_on(executor: Executor, f: h5py.File, kinds: dict[str, FieldKind], parts: list, old_format: bool):
    """Each part of the blocks checked by ``executor``'s processes while this one waits. A part they
    fail to check (a process lost, a crash of the HDF5 library on it) is checked again here, each
    in a process of its own (``_checksums_in_processes``), so a crash is reported, not suffered."""
    bad: list[str] = []
    checked = 0
    try:
        futures = [executor.submit(_checksum_part, f.filename, part, old_format) for part in parts]
    except Exception:  # noqa: BLE001 - e.g. an executor shut down: checked as without it
        return _checksums_in_processes(f, kinds, parts, old_format)
    for future, part in zip(futures, parts):
        try:
            more, n = future.result()
        except Exception:  # noqa: BLE001 - checked again below, where a failure is located
            more, n = _checksums_in_processes(f, kinds, [[], part], old_format)
        bad += more
        checked += n
    return bad, checked


def _checksum_part(path: str, blocks: list[tuple[str, int, int]], old_format: bool) -> tuple[list[str], int]:
    ensure_filters()
    with h5py.File(path, "r") as f:
        return _checksum_blocks(f, stored_kinds(spec_from_json(f[SPEC][()].decode())), blocks, old_format)


def _locate_unreadable(
    g: h5py.Group, kinds: dict[str, FieldKind], split: str, start: int, stop: int, err: Exception
) -> list[str]:
    """Which rows of which datasets cannot be read, after a block failed."""

    def field_row(path: str, kind: FieldKind) -> Callable[[int], Any]:
        return lambda i: arrays.RowReader(g, path, kind.stored()).row(i)

    def column_row(name: str) -> Callable[[int], Any]:
        return lambda i: rows_of(g[name])[i]

    readers = {path: field_row(path, kind) for path, kind in kinds.items()}
    readers.update({name: column_row(name) for name in (*PROVENANCE, CHECKSUM)})
    out = []
    for row in range(start, stop):
        for name, read in readers.items():
            try:
                canonical(read(row))
            except Exception as e:  # noqa: BLE001 - this is what is being located
                out.append(f"{split}[{row}] field {name!r} cannot be read (corrupt chunk or string): {_why(e)}")
    return out or [f"{split}[{start}:{stop}] cannot be read: {_why(err)}"]


def _stored_ref(g: h5py.Group, kinds: dict[str, FieldKind], split: str, row: int) -> SampleRef:
    """The sample of a stored row as discovery saw it: its files (an empty path: a file the sample
    lacks, ``h5forge.kinds.optional``) and its annotation columns."""
    stored = zip(decode_str(g[SOURCE_SHA256].attrs[Attr.FIELDS]), decode_str(rows_of(g[SOURCE_FILES])[row]))
    files = {name: rel for name, rel in stored if rel}
    columns = {}
    for kind in kinds.values():
        if kind.annotation_column:
            value = rows_of(g[kind.path])[row]
            columns[kind.annotation_column] = value.decode() if isinstance(value, bytes) else value.item()
    return SampleRef(decode_str(rows_of(g[IDS])[row : row + 1])[0], split, files, columns)


def _check_against_sources(
    f: h5py.File,
    kinds: dict[str, FieldKind],
    roots: list[Path],
    k: int,
    seed: int,
    report: HealthReport,
    max_source_bytes: int,
) -> None:
    rng = np.random.default_rng(seed)
    population = [(s, i) for s in SPLITS for i in range(int(f[s].attrs[Attr.COUNT]))]
    if not population:
        report.checks["sources"] = "ok (empty dataset)"
        return
    picks = [population[j] for j in sorted(rng.choice(len(population), size=min(k, len(population)), replace=False))]
    compared, changed, unread = 0, [], []
    folders = {kind.name for kind in kinds.values() if kind.reads_folders}
    for split, row in picks:
        g = f[split]
        ref = _stored_ref(g, kinds, split, row)
        refused = [
            (rel, why)
            for name, rel in ref.files.items()
            if (why := source_problem(roots, rel, folders=name in folders, max_bytes=max_source_bytes))
        ]
        if refused:
            unread += [f"{split}[{row}] source {rel!r} {why}; not read" for rel, why in refused]
            continue
        try:
            decoded = decode_sample(kinds, roots[0], ref)
        except Reject as rej:
            changed.append(f"{split}[{row}] source {rej.path} no longer cleans: {rej.reason}")
            continue
        fields = decode_str(g[SOURCE_SHA256].attrs[Attr.FIELDS])
        if [decoded[n].sha256 for n in fields] != decode_str(rows_of(g[SOURCE_SHA256])[row]):
            changed.append(f"{split}[{row}] raw files of {ref.id!r} changed since the build; not compared")
            continue
        for path, kind in kinds.items():
            if kind.checksummed and not arrays.same_values(
                decoded[path].value, arrays.RowReader(g, path, kind.stored()).row(row)
            ):
                source = ref.files.get(path, "its annotation record")
                report.error(
                    "sources",
                    f"{split}[{row}] field {path!r} (id {ref.id!r}) differs from its source cleaned again ({source})",
                )
        compared += 1
    report.warnings.extend(changed + unread)
    if "sources" not in report.checks:
        report.checks["sources"] = (
            f"ok ({compared} samples re-derived from their sources and compared, "
            f"{len(changed)} sources changed or gone" + (f", {len(unread)} not read" if unread else "") + ")"
        )


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
        report.warnings.append(
            f"random reads are slow: p50 {p50:.1f} ms > 5 ms (SSD target); check the chunk rows and codec, or the disk"
        )
