"""Rebuilds that cost what changed: publish nothing when nothing changed; otherwise take every
unchanged sample from the latest version (or from what a killed build left) and clean the rest.

``write_samples`` is what ``h5forge.ingest.build.write_version`` runs; a full rebuild with no
earlier version takes nothing and cleans everything, as before.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Callable

import h5py

from h5forge.format.catalog import input_key
from h5forge.format.names import version_name
from h5forge.format.segments import segments_of
from h5forge.ingest.discover import Inventory
from h5forge.ingest.inputs import Inputs
from h5forge.ingest.resume import Checkpoints, discard_resumable, resumable_source
from h5forge.ingest.reuse import Source, make_plan, usable, write_reusing
from h5forge.ingest.writer import DatasetWriter
from h5forge.spec import DatasetSpec
from h5forge.store.versions import latest


def unchanged_since(out: Path, inputs: Inputs) -> int | None:
    """The latest version, when it was built from exactly these inputs under these rules."""
    number = latest(out)
    if number is None:
        return None
    try:
        with h5py.File(os.path.realpath(Path(out) / version_name(number)), "r") as f:
            return number if input_key(f)[0] == inputs.key else None
    except OSError:
        return None


def previous_sources(out: Path, inputs: Inputs) -> list[Source]:
    """The files holding the latest version's rows, when written under the same field rules."""
    number = latest(out)
    if number is None:
        return []
    path = Path(out) / version_name(number)
    try:
        files = [path.parent / seg["file"] for seg in segments_of(path)]
    except OSError:
        return []
    return [Source(p) for p in files if usable(p, inputs.rules)]


def write_samples(spec: DatasetSpec, inventory: Inventory, inputs: Inputs, writer: DatasetWriter,
                  timings: dict, progress: Callable[[int], None] = lambda n: None,
                  status: Callable[[str], None] = lambda text: None) -> None:
    """Every sample of the inventory into ``writer``, taking what earlier files already hold."""
    out = Path(spec.output.dir)
    t0 = time.perf_counter()
    resumed = resumable_source(out, inputs)
    sources = ([resumed] if resumed else []) + previous_sources(out, inputs)
    checkpoints = Checkpoints(writer, inputs, len(inventory.samples))
    try:
        plan = make_plan(inventory.samples, inputs, sources)
        timings["plan_seconds"] = round(time.perf_counter() - t0, 3)
        timings["hash_seconds"] = inputs.hash_seconds
        if resumed is not None:
            timings["resumed_rows"] = sum(1 for t in plan.taken if t is not None and t.source == 0)

        def advance(n: int) -> None:
            progress(n)
            checkpoints.tick(n)

        timings.update(write_reusing(spec, inventory.root, plan, sources, writer, timings, advance, status))
    except BaseException:
        checkpoints.discard()
        raise
    finally:
        for src in sources:
            src.close()
    checkpoints.discard()
    if resumed is not None:
        discard_resumable(out)
