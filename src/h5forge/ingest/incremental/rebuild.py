"""Rebuilds that cost what changed: publish nothing when nothing changed; otherwise take every
unchanged sample from the latest version (or from what a killed build left) and clean the rest.

``write_samples`` is what ``h5forge.ingest.build.write_version`` runs; a full rebuild with no
earlier version takes nothing and cleans everything.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import h5py
import numpy as np

from h5forge.format.catalog import input_key
from h5forge.format.mapped import rows_of
from h5forge.format.names import RESUMABLE, RESUME_SUFFIX, version_name
from h5forge.format.row_files import row_files_of
from h5forge.ingest.incremental import hash_cache
from h5forge.ingest.discover import Inventory
from h5forge.ingest.parallel import ClusterAhead
from h5forge.ingest.incremental.inputs import Inputs, fingerprint, rules_hash
from h5forge.ingest.incremental.resume import Checkpoints, discard_resumable, resumable_source
from h5forge.ingest.incremental.take_over import TakenOver
from h5forge.ingest.incremental.reuse import Source, make_plan, runs, usable, write_reusing
from h5forge.ingest.writer import DatasetWriter
from h5forge.spec import DatasetSpec
from h5forge.store.versions import latest


def inputs_of(spec: DatasetSpec, inventory: Inventory) -> Inputs:
    """The build's input hashes: made now when the latest version or a killed build's rows were
    written under the same field rules (what is unchanged can then be taken), else left to the
    cleaning workers, so that a full build reads each raw file once. A file whose state (size,
    times, inode) is the one the last build recorded is not read again (``hash_cache``)."""
    out = Path(spec.output.dir)
    if not comparable(out, rules_hash(spec)):
        return fingerprint(spec, inventory, hash_files=False)
    return fingerprint(spec, inventory, cache=hash_cache.load(out, inventory.root))


def comparable(out: Path, rules: str) -> bool:
    """Whether the latest version, or rows a killed build left, were written under ``rules``."""
    try:
        if json.loads((out / (RESUMABLE + RESUME_SUFFIX)).read_text()).get("rules") == rules:
            return True
    except (OSError, ValueError, AttributeError):
        pass
    return bool(previous_sources(out, rules))


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


def previous_sources(out: Path, rules: str) -> list[Source]:
    """The files holding the latest version's rows, when written under the same field rules."""
    number = latest(out)
    if number is None:
        return []
    path = Path(out) / version_name(number)
    try:
        files = [path.parent / seg["file"] for seg in row_files_of(path)]
    except OSError:
        return []
    return [Source(p) for p in files if usable(p, rules)]


def write_samples(
    spec: DatasetSpec,
    inventory: Inventory,
    inputs: Inputs,
    writer: DatasetWriter,
    timings: dict,
    progress: Callable[[int], None] = lambda n: None,
    status: Callable[[str], None] = lambda text: None,
    taken: TakenOver | None = None,
    cluster: ClusterAhead | None = None,
) -> Written:
    """Every sample of the inventory into ``writer``, taking what earlier files already hold.
    ``taken``: the writer's file is a killed build's, holding the first rows of each split already.
    ``cluster``: the LocalCluster the run started ahead, cleaned on when it fits."""
    out = Path(spec.output.dir)
    t0 = time.perf_counter()
    resumed = resumable_source(out, inputs)
    sources = ([resumed] if resumed else []) + previous_sources(out, inputs.rules)
    checkpoints = Checkpoints(writer, inputs, len(inventory.samples), exact_stats=not sources, raw_root=inventory.root)
    try:
        samples = inventory.samples
        if taken is not None:  # its rows and rejections stand: the rest follows them
            samples = [ref for ref in samples if ref.id not in taken.ids]
            writer.add_rejections(taken.rejections)
            timings["resumed_in_place"] = taken.rows
            timings["resumed_damaged_rows"] = taken.damaged
        plan = make_plan(samples, inputs, sources)
        timings["plan_seconds"] = round(time.perf_counter() - t0, 3)
        timings["hash_seconds"] = inputs.hash_seconds
        timings["hashed_files"] = inputs.hashed_files
        if resumed is not None:
            timings["resumed_rows"] = sum(1 for t in plan.taken if t is not None and t.source == 0)

        def advance(n: int) -> None:
            progress(n)
            checkpoints.tick(n)

        if taken is not None:
            advance(len(taken.ids))  # and a checkpoint: the kept rows stay durable if this build is killed
            checkpoints.save()

        written = write_reusing(
            spec, inventory.root, plan, sources, writer, timings, advance, status, inputs, cluster=cluster
        )
        if inputs.deferred:  # every sample's key is known now: the file records the build's input key
            inputs.seal(spec, inventory)
        cleaned = written.pop("cleaned_rows")
        timings.update(written)
    except BaseException:
        checkpoints.discard()
        if resumed is not None:  # whatever went wrong may be in what it left: the next run starts afresh
            discard_resumable(out)
        raise
    finally:
        for src in sources:
            src.close()
    checkpoints.discard()
    if resumed is not None:
        discard_resumable(out)
    copied_unchecked = resumed is not None and any(t is not None and t.source == 0 for t in plan.taken)
    sampled = (plan.reused or (taken is not None and taken.rows)) and not copied_unchecked
    return Written(cleaned if plan.reused or taken is not None else None, REUSED_CHECKSUM_SAMPLE if sampled else None)


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
    from h5forge.format.checksums import stored_checksums
    from h5forge.format.names import CHECKSUM
    from h5forge.kinds import stored_kinds

    kinds = stored_kinds(spec)
    bad = []
    with h5py.File(path, "r") as f:
        for split, listed in rows.items():
            g = f[split]
            for _, a, b in runs(np.array(sorted(listed), np.int64)):
                stored = rows_of(g[CHECKSUM])[a:b]
                for i, digest in enumerate(stored_checksums(g, kinds, a, b)):
                    if digest.encode() != stored[i]:
                        bad.append(f"{split}[{a + i}]: stored data does not match its checksum")
    if bad:
        raise VerificationFailed(bad)
