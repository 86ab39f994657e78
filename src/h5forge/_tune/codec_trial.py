"""The codec table measured on the user's own raw data (``h5forge codecs RAW``).

A sample of the raw inputs is cleaned once by the spec's field kinds, then written with each codec
by the real writer and read back by the real reader, measuring per codec: stored/raw of the
sample arrays, the writer's CPU per sample, the median time of one random read (page cache warm)
and the reader's CPU per random batch.

The recommendation (``recommend``) weighs only stored/raw against reader CPU per batch (every
epoch pays it; a file is written once), by what the user is short of (``GOALS``): ``disk`` picks
the smallest; ``read`` the smallest of those within ``READ_NOISE`` of the lowest reader CPU;
``balanced`` the smallest of those within ``BALANCED_SLACK`` of it or ``BALANCED_EXTRA_MS`` per
sample above it (twice a tiny cost is still nothing a data loader feels). Under every goal,
``none`` unless the pick saves at least ``MIN_SAVING`` of the raw bytes (docs/codecs.md).
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import yaml

from h5forge.errors import NothingToBuild, UsageError
from h5forge._format.codecs import CODECS
from h5forge._ingest.clean import CleanedBatch, clean_batch
from h5forge._ingest.discover import discover
from h5forge._ingest.parallel import batch_samples
from h5forge._ingest.writer import DatasetWriter
from h5forge.read._reader import SplitReader
from h5forge.spec import DatasetSpec, parse_spec

GOALS = ("balanced", "disk", "read")
READ_NOISE = 1.1  # reader CPU within 10 % of the lowest counts as "as fast" under --for read
BALANCED_SLACK = 2.0  # --for balanced: up to twice the lowest reader CPU for a smaller file,
BALANCED_EXTRA_MS = 0.05  # or up to 0.05 ms more reader CPU per sample
MIN_SAVING = 0.05  # compressing must save at least 5 % of the raw bytes to be worth it
BATCH = 32  # samples per batch when measuring reader CPU
BATCHES = 10
READS = 100  # single random reads per codec for the p50


@dataclass(frozen=True)
class CodecResult:
    codec: str
    raw_bytes: int
    stored_bytes: int
    write_ms_per_sample: float
    read_p50_ms: float
    batch_cpu_ms: float
    needs: str

    @property
    def ratio(self) -> float:
        return self.stored_bytes / self.raw_bytes if self.raw_bytes else 1.0


@dataclass(frozen=True)
class CodecTrial:
    """What was measured, on which samples, and the codec the rule picks."""

    spec_name: str
    ids: list[str]  # the samples written, in order
    rejected: int  # sampled inputs the field kinds rejected (not written)
    results: list[CodecResult]
    goal: str  # what the recommendation optimises (one of GOALS)
    recommended: str
    reason: str
    batch: int  # samples per batch in the reader CPU measure (fewer than BATCH when the split is small)


def spec_for(raw: Path, spec_file: Path | None) -> DatasetSpec:
    """The given spec with its source root set to ``raw``, or one inferred as ``init`` would."""
    from h5forge._init import infer_spec
    from h5forge.spec import load_spec

    raw = Path(raw).resolve()
    if not raw.is_dir():
        raise UsageError(f"{raw} is not a folder")
    if spec_file is not None:
        spec = load_spec(spec_file)
        return spec.model_copy(update={"source": spec.source.model_copy(update={"root": raw})})
    with tempfile.TemporaryDirectory() as tmp:
        inferred = infer_spec(raw, Path(tmp) / "spec.yaml")
        if inferred.todo:
            raise UsageError(
                f"cannot infer a complete spec for {raw} ({', '.join(inferred.todo)} unknown); "
                f"write one with `h5forge init {raw} --out spec.yaml`, fill it in, and pass --spec"
            )
        return parse_spec(yaml.safe_load(inferred.text), Path(tmp), "inferred spec")


def with_codec(spec: DatasetSpec, codec: str) -> DatasetSpec:
    """The spec writing every sample array with ``codec``: the storage codec, and the codec of any
    field whose kind picks its own."""
    fields = {
        name: f.model_copy(update={"codec": codec}) if "codec" in type(f).model_fields else f
        for name, f in spec.fields.items()
    }
    return spec.model_copy(update={"fields": fields, "storage": spec.storage.model_copy(update={"codec": codec})})


def cleaned_sample(spec: DatasetSpec, n: int, seed: int = 0) -> tuple[list[CleanedBatch], int]:
    """``n`` raw inputs picked at random (seeded), cleaned in this process, in batches."""
    inventory = discover(spec)
    if not inventory.samples:
        raise NothingToBuild(f"no complete sample under {inventory.root}")
    rng = np.random.default_rng(seed)
    picked = sorted(rng.choice(len(inventory.samples), size=min(n, len(inventory.samples)), replace=False))
    refs = [inventory.samples[i] for i in picked]
    size = batch_samples(spec, len(refs))
    batches = [clean_batch(spec, inventory.root, refs[i : i + size]) for i in range(0, len(refs), size)]
    rejected = sum(len(b.rejections) for b in batches)
    if not sum(len(b) for b in batches):
        raise NothingToBuild(f"all {len(refs)} sampled input(s) under {inventory.root} were rejected")
    return batches, rejected


def _write(spec: DatasetSpec, batches: list[CleanedBatch], path: Path) -> tuple[float, int, int]:
    """Write the batches; (CPU seconds from the created, empty file on, raw bytes, stored bytes)."""
    with DatasetWriter(path, spec, version=1) as writer:
        cpu = time.process_time()
        for b in batches:
            writer.add(b)
        summary = writer.finish()
    return time.process_time() - cpu, summary.array_bytes_raw, summary.array_bytes_stored


def _reads(path: Path, rng: np.random.Generator, reads: int, batch: int, batches: int) -> tuple[float, float, int]:
    """(p50 ms of one random sample, CPU ms per random batch, samples per batch), in the split
    with most samples."""
    counts: dict[str, int] = {}
    for split in ("train", "val", "test"):
        with SplitReader(path, split) as r:
            counts[split] = len(r)
    split = max(counts, key=lambda s: counts[s])
    with SplitReader(path, split) as reader:
        n = len(reader)
        reader.read([0])  # open the file and read the small columns outside the timings
        times = []
        for i in rng.integers(0, n, size=reads):
            t = time.perf_counter()
            reader.read([int(i)])
            times.append(time.perf_counter() - t)
        cpu = time.process_time()
        for _ in range(batches):
            reader.read(np.sort(rng.choice(n, size=min(batch, n), replace=False)))
        batch_cpu = (time.process_time() - cpu) / batches
    return float(np.median(times)) * 1e3, batch_cpu * 1e3, min(batch, n)


def read_budget(goal: str, lowest_ms: float, batch: int) -> float:
    """The most reader CPU per batch (ms) a codec may cost under ``goal``, given the lowest."""
    if goal not in GOALS:
        raise UsageError(f"unknown goal {goal!r}; choose from {', '.join(GOALS)}")
    if goal == "disk":
        return float("inf")
    if goal == "read":
        return READ_NOISE * lowest_ms
    return max(BALANCED_SLACK * lowest_ms, lowest_ms + BALANCED_EXTRA_MS * batch)


def _rule(goal: str, cheapest: CodecResult, budget: float, batch: int) -> str:
    if goal == "disk":
        return "smallest stored/raw"
    lowest = f"{cheapest.codec}'s {cheapest.batch_cpu_ms:.2f} ms"
    how = (
        f"the lowest, {lowest}, x{READ_NOISE:g}"
        if goal == "read"
        else f"the lowest, {lowest}, x{BALANCED_SLACK:g} or + {BALANCED_EXTRA_MS:g} ms per sample, whichever is more"
    )
    return (
        f"smallest stored/raw among the codecs whose reader CPU per batch of {batch} is at most {budget:.2f} ms ({how})"
    )


def recommend(results: Sequence[CodecResult], goal: str = "balanced", batch: int = BATCH) -> tuple[str, str]:
    """The codec the ``goal``'s rule in the module doc picks, and why, in one line. ``batch``: the
    samples per batch the reader CPU was measured on."""
    cheapest = min(results, key=lambda r: r.batch_cpu_ms)
    budget = read_budget(goal, cheapest.batch_cpu_ms, batch)
    allowed = [r for r in results if r.batch_cpu_ms <= budget]
    best = min(allowed, key=lambda r: (r.ratio, r.batch_cpu_ms))
    rule = _rule(goal, cheapest, budget, batch)
    cost = f"{best.batch_cpu_ms / cheapest.batch_cpu_ms:.2f}x the lowest reader CPU"
    if best.codec == "none":
        return "none", f"{rule}: none of them saves space"
    if best.ratio > 1 - MIN_SAVING:
        return "none", f"{rule}: {best.codec} saves only {1 - best.ratio:.1%} (< {MIN_SAVING:.0%}), not worth its CPU"
    return best.codec, f"{rule}: {best.codec} stores {best.ratio:.3f} of raw at {cost}"


def trial(
    spec: DatasetSpec,
    sample: int = 500,
    codecs: Sequence[str] | None = None,
    seed: int = 0,
    reads: int = READS,
    batch: int = BATCH,
    batches: int = BATCHES,
    workdir: Path | None = None,
    goal: str = "balanced",
) -> CodecTrial:
    """Measure ``codecs`` (default: every codec h5forge knows) on ``sample`` inputs of ``spec``, and
    recommend one for ``goal``."""
    read_budget(goal, 1.0, batch)  # an unknown goal is refused before anything is measured
    names = list(codecs or CODECS)
    unknown = [c for c in names if c not in CODECS]
    if unknown:
        raise UsageError(f"unknown codec(s) {', '.join(unknown)}; choose from {', '.join(CODECS)}")
    cleaned, rejected = cleaned_sample(spec, sample, seed)
    written = sum(len(b) for b in cleaned)
    results = []
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        # one untimed write and read first: the first codec measured must not pay for loading
        # code and registering filters
        _write(with_codec(spec, names[0]), [next(b for b in cleaned if len(b))], Path(tmp) / "warm-up.h5")
        _reads(Path(tmp) / "warm-up.h5", np.random.default_rng(seed), 2, 1, 1)
        for codec in names:
            path = Path(tmp) / f"{codec}.h5"
            cpu, raw, stored = _write(with_codec(spec, codec), cleaned, path)
            p50, batch_cpu, per_batch = _reads(path, np.random.default_rng(seed), reads, batch, batches)
            results.append(CodecResult(codec, raw, stored, cpu / written * 1e3, p50, batch_cpu, CODECS[codec].needs))
            path.unlink()
    choice, reason = recommend(results, goal, per_batch)
    ids = [i for b in cleaned for i in b.ids]
    return CodecTrial(spec.name, ids, rejected, results, goal, choice, reason, per_batch)
