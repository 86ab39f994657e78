"""A build's candidate version written: a killed build's file taken over, unchanged rows copied,
the rest cleaned, then the rows made anew checked (``pipeline/build.py`` verifies and publishes it).
"""

from __future__ import annotations

import time
from typing import Callable

from h5forge.errors import NothingToBuild, VerificationFailed
from h5forge.format.summary import WriteSummary
from h5forge.ingest.incremental import hash_cache
from h5forge.ingest.discover import Inventory
from h5forge.ingest.incremental.inputs import Inputs
from h5forge.ingest.incremental.rebuild import check_cleaned_rows, inputs_of, write_samples
from h5forge.ingest.assemble import open_writer
from h5forge.ingest.incremental.take_over import take_over
from h5forge.ingest.parallel import ClusterAhead
from h5forge.kinds import stored_kinds
from h5forge.spec import DatasetSpec
from h5forge.store.reports import write_quarantine
from h5forge.store.versions import Candidate


def write_version(
    spec: DatasetSpec,
    inventory: Inventory,
    candidate: Candidate,
    progress: Callable[[int], None] = lambda n: None,
    status: Callable[[str], None] = lambda text: None,
    inputs: Inputs | None = None,
    cluster: ClusterAhead | None = None,
) -> WriteSummary:
    """Clean every sample on dask and stream it into the candidate file. Returns the summary.

    Samples whose inputs (``inputs``: their hashes, ``rebuild.inputs_of`` when not given) are unchanged since
    the latest version, or durable in what a killed build left, are copied instead of cleaned
    (``h5forge.ingest.incremental.rebuild``); a killed build's file whose durable rows come first
    is taken over in place, its rows kept where they are (``h5forge.ingest.incremental.take_over``).

    ``progress`` hears how many inputs each batch settled, ``status`` what happens before the first.
    ``cluster``: the LocalCluster the run started ahead (``parallel.cluster_ahead``), cleaned on when it fits.
    The summary's ``checksum_sample`` says how many rows of each split ``verify`` must check (``rebuild.Written``).

    The quarantine report is written whatever happens to the samples, so an empty result says why.
    """
    if not inventory.samples:
        write_quarantine(candidate.out, candidate.number, inventory.rejections)
        raise NothingToBuild(
            f"no complete sample under {inventory.root} "
            f"({inventory.rejected} input(s) rejected; see the quarantine report)"
        )
    timings: dict = {}
    inputs = inputs_of(spec, inventory) if inputs is None else inputs
    t0 = time.perf_counter()
    taken = take_over(candidate.out, inputs, inventory.samples, stored_kinds(spec), candidate.partial)
    durable = taken.durable if taken is not None else None
    if taken is not None:
        timings["take_over_seconds"] = round(time.perf_counter() - t0, 3)
    with open_writer(candidate.partial, spec, candidate.number, candidate.parent, inputs, durable) as writer:
        writer.add_rejections(inventory.rejections)
        written = write_samples(spec, inventory, inputs, writer, timings, progress, status, taken, cluster)
        timings["hash_cache_files"] = hash_cache.save(
            candidate.out, inventory.root, inputs.states, inputs.hexes, inputs.stated_at_ns
        )
        summary = writer.finish(timings).with_(checksum_sample=written.checksum_sample)
    if written.cleaned is not None:  # a rebuild that copied rows: the rows it made are checked in full here
        try:
            check_cleaned_rows(candidate.partial, spec, written.cleaned)
        except VerificationFailed:
            candidate.discard()
            raise
    write_quarantine(candidate.out, candidate.number, summary.rejections)
    if summary.samples == 0:
        candidate.discard()
        raise NothingToBuild(
            f"all {len(inventory.samples)} sample(s) under {inventory.root} were rejected "
            "while cleaning; nothing to publish (see the quarantine report)"
        )
    return summary
