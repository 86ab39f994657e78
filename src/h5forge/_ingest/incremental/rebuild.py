"""Rebuilds that cost what changed: publish nothing when nothing changed; otherwise take every
unchanged sample from the latest version (or from what a killed build left) and clean the rest.

``plan_reuse`` and ``write_samples`` are steps of ``h5forge._ingest.build.write_version``; a full
rebuild with no earlier version takes nothing and cleans everything.
"""

from __future__ import annotations

import json
import logging
import os
import time
from concurrent.futures import Executor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

import h5py
import numpy as np

from h5forge._format import heap
from h5forge._format.catalog import input_key
from h5forge._format.mapped import rows_of
from h5forge._format.names import RESUMABLE, RESUME_SUFFIX, version_name
from h5forge._format.row_files import row_files_of
from h5forge._ingest.incremental import hash_cache
from h5forge._ingest.discover import Inventory
from h5forge._ingest.incremental.inputs import Inputs, fingerprint, rules_hash
from h5forge._ingest.incremental.resume import Checkpoints, discard_resumable, resumable_source
from h5forge._ingest.incremental.take_over import TakenOver, take_over
from h5forge._ingest.incremental.reuse import Plan, Source, make_plan, runs, usable, write_reusing
from h5forge._ingest.clean import CleanedBatch
from h5forge.kinds import stored_kinds
from h5forge._ingest.writer import DatasetWriter
from h5forge.spec import DatasetSpec
from h5forge._store.versions import latest

log = logging.getLogger(__name__)


def inputs_of(spec: DatasetSpec, inventory: Inventory) -> Inputs:
    """The build's input hashes: made now when the latest version or a killed build's rows were
    written under the same field rules (what is unchanged can then be taken), else left to the
    cleaning workers, so that a full build reads each raw file once. A file whose state (size,
    times, inode) is the one the last build recorded is not read again (``hash_cache``)."""
    out = Path(spec.output.dir)
    if not comparable(out, rules_hash(spec)):
        return fingerprint(spec, inventory, hash_files=False)
    if inventory.digests is not None:  # the hash cache, looked up after discovery
        return fingerprint(spec, inventory)
    return fingerprint(spec, inventory, cache=hash_cache.load(out, inventory.root))


def comparable(out: Path, rules: str) -> bool:
    """Whether the latest version, or rows a killed build left, were written under ``rules``."""
    return killed_build_rows(out, rules) is not None or bool(previous_sources(out, rules))


def killed_build_rows(out: Path, rules: str) -> int | None:
    """The rows a killed build written under ``rules`` made durable, as its last checkpoint counts
    them (before the take-over checks them); None when there is no such build."""
    try:
        saved = json.loads((out / (RESUMABLE + RESUME_SUFFIX)).read_text())
        if saved.get("rules") == rules:
            return sum(int(n) for n in saved.get("counts", {}).values())
    except (OSError, ValueError, AttributeError, TypeError):
        pass
    return None


def unchanged_since(out: Path, inputs: Inputs) -> int | None:
    """The latest version, when it was built from exactly these inputs under these rules."""
    number = latest(out)
    if number is None or inputs.deferred or not inputs.key:
        return None
    try:
        with h5py.File(os.path.realpath(Path(out) / version_name(number)), "r") as f:
            return number if input_key(f)[0] == inputs.key else None
    except OSError:
        return None


def previous_sources(out: Path, rules: str, say: bool = False) -> list[Source]:
    """The files holding the latest version's rows, when written under the same field rules. None
    is taken from a version whose global heap is damaged (``h5forge._format.heap``, walked once per
    process): HDF5 loops for ever or fails on some of its strings, the first of which this reads.
    ``say``: log why nothing is taken from such a version (the plan of the build's rows does)."""
    number = latest(out)
    if number is None:
        return []
    path = Path(out) / version_name(number)
    try:
        problem = heap.version_damage(path)
        if problem:
            if say:
                log.warning("nothing is taken from %s: %s", path.name, problem)
            return []
        files = [path.parent / seg["file"] for seg in row_files_of(path)]
    except OSError:
        return []
    return [Source(p) for p in files if usable(p, rules)]


@dataclass(frozen=True)
class Reuse:
    """What a build takes from files already written, planned before any row is written: for every
    sample the stored row it is copied from, or None (``plan``); the files those rows are in
    (``sources``: a killed build's file first when ``resumed``, then the latest version's); and a
    killed build's file taken over in place (``taken``), whose samples the plan leaves out."""

    plan: Plan
    sources: list[Source]
    taken: TakenOver | None = None
    resumed: Source | None = None

    @property
    def resumed_rows(self) -> int:
        """Rows copied from a killed build's file."""
        return sum(1 for t in self.plan.taken if t is not None and t.source == 0) if self.resumed else 0

    @property
    def any(self) -> bool:
        """Whether any row of the version is not cleaned by this build."""
        return self.taken is not None or self.plan.reused > 0

    @property
    def what(self) -> str:
        """``nothing``, or what is reused: ``take-over``, ``resume``, ``unchanged`` (joined by ``+``)."""
        named = (
            ("take-over", self.taken is not None),
            ("resume", self.resumed_rows > 0),
            ("unchanged", self.plan.reused > self.resumed_rows),
        )
        return "+".join(name for name, on in named if on) or "nothing"

    def close(self) -> None:
        """The sources closed; a killed build's file the plan read is removed, used or not (when the
        build failed, whatever went wrong may be in it: the next run starts afresh)."""
        for src in self.sources:
            src.close()
        if self.resumed is not None:
            discard_resumable(self.resumed.path.parent)


def plan_reuse(
    spec: DatasetSpec,
    inventory: Inventory,
    inputs: Inputs,
    partial: Path,
    timings: dict,
    workers: tuple[Executor, int] | None = None,
) -> Reuse:
    """Which rows the build at ``partial`` takes from files already written, and which it cleans: a
    killed build's file taken over in place (``take_over``: it becomes ``partial``; ``workers``
    check its rows), else its durable rows copied (a resume), and the unchanged rows of the latest
    version."""
    out = Path(spec.output.dir)
    t0 = time.perf_counter()
    taken = take_over(out, inputs, inventory.samples, stored_kinds(spec), partial, workers)
    samples = inventory.samples
    if taken is not None:  # its rows and rejections stand: the rest follows them
        samples = [ref for ref in samples if ref.id not in taken.ids]
        timings["take_over_seconds"] = round(time.perf_counter() - t0, 3)
        timings["resumed_in_place"] = taken.rows
        timings["resumed_damaged_rows"] = taken.damaged
        timings["take_over_processes"] = taken.processes
    t0 = time.perf_counter()
    resumed = resumable_source(out, inputs)
    sources = ([resumed] if resumed else []) + previous_sources(out, inputs.rules, say=True)
    try:
        reuse = Reuse(make_plan(samples, inputs, sources), sources, taken, resumed)
    except BaseException:
        Reuse(Plan([], []), sources, taken, resumed).close()
        raise
    timings["plan_seconds"] = round(time.perf_counter() - t0, 3)
    timings["hash_seconds"] = inputs.hash_seconds
    timings["hashed_files"] = inputs.hashed_files
    if resumed is not None:
        timings["resumed_rows"] = reuse.resumed_rows
    return reuse


def write_samples(
    spec: DatasetSpec,
    inventory: Inventory,
    inputs: Inputs,
    writer: DatasetWriter,
    reuse: Reuse,
    cleaned: Iterable[CleanedBatch],
    timings: dict,
    progress: Callable[[int], None] = lambda n: None,
) -> Written:
    """Every sample of the inventory into ``writer`` in order: the rows ``reuse`` takes, and the
    ``cleaned`` batches (the samples the plan cleans, in order); checkpoints as it goes."""
    taken = reuse.taken
    checkpoints = Checkpoints(
        writer,
        inputs,
        len(inventory.samples),
        len(reuse.plan.to_clean),
        exact_stats=not reuse.sources,
        raw_root=inventory.root,
    )

    def advance(n: int, cleaned: bool = True) -> None:
        progress(n)
        checkpoints.tick(n, cleaned)

    try:
        if taken is not None:
            writer.add_rejections(taken.rejections)
            advance(len(taken.ids), False)  # and a checkpoint: the kept rows stay durable if this build is killed
            checkpoints.save()
        written = write_reusing(spec, inventory.root, reuse.plan, reuse.sources, writer, cleaned, advance, inputs)
        if inputs.deferred:  # every sample's key is known now: the file records the build's input key
            inputs.seal(spec, inventory)
        cleaned_rows = written.pop("cleaned_rows")
        timings.update(written)
    finally:
        checkpoints.discard()
    # rows copied from a killed build's file were checked by nothing: verify checks every row then
    sampled = (reuse.plan.reused or (taken is not None and taken.rows)) and not reuse.resumed_rows
    return Written(cleaned_rows if reuse.any else None, REUSED_CHECKSUM_SAMPLE if sampled else None)


@dataclass(frozen=True)
class Written:
    """How a version's rows came. ``cleaned``: the rows made anew, per split, when any row was
    taken from another file (None: every row was cleaned). ``checksum_sample``: how many rows of
    each split ``verify`` checks against their checksums: ``REUSED_CHECKSUM_SAMPLE`` when every
    taken row is a copy of a published version's (verified when it was published) or was kept in
    place from a killed build's file (checked in full by ``take_over``), its cleaned rows being
    checked in full (``check_cleaned_rows``); None (every row) for a full build, or when any row
    was copied from a killed build's file, which nothing checked."""

    cleaned: dict[str, list[int]] | None
    checksum_sample: int | None


# rows of each split whose checksums verify re-checks when every other row was either checked in
# full before (cleaned, or kept from a killed build) or copied as stored: a misplaced copy shows in a
# few rows, and verify's sampled check costs more per row than its full pass, so a large sample
# would cost more than checking everything
REUSED_CHECKSUM_SAMPLE = 16


def check_cleaned_rows(path: Path, spec: DatasetSpec, rows: dict[str, list[int]]) -> None:
    """The checksums of the rows a rebuild cleaned, read back from the written file, in full.

    A rebuild's copied rows are byte copies of rows verified when their version was published,
    each with its checksum, so ``verify`` samples them (``REUSED_CHECKSUM_SAMPLE`` per split);
    the rows made anew are checked here, all of them, as a full build checks its rows."""
    from h5forge.errors import VerificationFailed
    from h5forge._format.checksums import RowChecksums
    from h5forge._format.names import CHECKSUM

    kinds = stored_kinds(spec)
    bad = []
    with h5py.File(path, "r") as f:
        for split, listed in rows.items():
            if not listed:
                continue
            g = f[split]
            made, checksums = RowChecksums(g, kinds), rows_of(g[CHECKSUM])
            for _, a, b in runs(np.array(sorted(listed), np.int64)):
                stored = checksums[a:b]
                for i, digest in enumerate(made(a, b)):
                    if digest.encode() != stored[i]:
                        bad.append(f"{split}[{a + i}]: stored data does not match its checksum")
    if bad:
        raise VerificationFailed(bad)
