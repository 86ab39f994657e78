"""A build's candidate version written, as the steps of its route: plan which rows are reused and
which are cleaned, clean, assemble (``_pipeline/build.py`` then verifies and publishes it).

Four choices shape the route; ``Route.choose`` makes each once, from the spec and the plan, before
any row is written:

- ``where`` cleaning runs: ``inline`` (this process), ``local`` (a LocalCluster the run starts) or
  ``external`` (the scheduler at ``compute.dask_address``);
- what the workers ``return``: their ``rows`` (encoded chunks, through the dask connection or in
  process), ``chunk_files`` (the chunks written to ``<output>/.chunks/``, placed by the writer) or
  ``row_files`` (files of the version's layout, which it maps);
- how the version is assembled (``assembly``): ``copy`` (one self-contained file) or ``mapped``
  (``storage.assemble: mapped``: its sample arrays mapped onto the workers' row files);
- what is reused (``rebuild.Reuse``): nothing, the latest version's unchanged rows, a killed
  build's file taken over in place, or a killed build's rows copied (a resume).

A combination that cannot work is refused where it is made (``RouteRefused``). A worker whose chunk
file the writer cannot see sends its chunks from then on (``parallel.clean_stream``): the one
choice a run may revise, to the same version.
"""

from __future__ import annotations

import logging
from concurrent.futures import Executor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from h5forge.errors import NothingToBuild, UsageError, VerificationFailed
from h5forge._format.names import FORMAT_VERSION
from h5forge._format.summary import WriteSummary
from h5forge._ingest.assemble import MappedWriter
from h5forge._ingest.discover import Inventory
from h5forge._ingest.incremental import hash_cache
from h5forge._ingest.incremental.inputs import Inputs
from h5forge._ingest.incremental.rebuild import Reuse, check_cleaned_rows, inputs_of, plan_reuse, write_samples
from h5forge._ingest.parallel import INLINE_BYTES, ClusterAhead, batch_samples, clean_all, inline_limit, where_to_clean
from h5forge._ingest.writer import DatasetWriter
from h5forge.spec import DatasetSpec
from h5forge._store.reports import write_quarantine
from h5forge._store.versions import Candidate

log = logging.getLogger(__name__)

WHERE = ("inline", "local", "external")
RETURNS = ("rows", "chunk_files", "row_files")
ASSEMBLY = ("copy", "mapped")


class RouteRefused(UsageError):
    """A combination of the route's choices that cannot work."""


@dataclass(frozen=True)
class Route:
    """How a build's rows reach its version: the four choices (module docstring), checked together."""

    where: str
    returns: str
    assembly: str
    reuse: Reuse

    def __post_init__(self) -> None:
        if self.where not in WHERE or self.returns not in RETURNS or self.assembly not in ASSEMBLY:
            raise RouteRefused(f"no such route: {self}")
        if (self.assembly == "mapped") != (self.returns == "row_files"):
            raise RouteRefused(
                f"{self}: a mapped version maps the row files its workers write, and only a mapped "
                "version takes row files"
            )
        if self.returns == "chunk_files" and self.where == "inline":
            raise RouteRefused(
                f"{self}: cleaning in this process hands its rows to the writer; chunk files need workers"
            )
        if self.assembly == "mapped" and self.reuse.any:
            raise RouteRefused(
                f"{self}: a version holds one kind of row, and reused rows are copied: a build "
                "that reuses rows writes a self-contained (copy) version"
            )

    @classmethod
    def choose(cls, spec: DatasetSpec, reuse: Reuse) -> Route:
        where = where_to_clean(spec, len(reuse.plan.to_clean))
        assembly = "mapped" if spec.storage.assemble == "mapped" and not reuse.any else "copy"
        returns = "row_files" if assembly == "mapped" else "rows" if where == "inline" else "chunk_files"
        return cls(where, returns, assembly, reuse)

    def __str__(self) -> str:
        return f"{self.where}/{self.returns}/{self.assembly}/{self.reuse.what}"

    def open_writer(self, candidate: Candidate, spec: DatasetSpec, inputs: Inputs) -> DatasetWriter:
        """The writer of the version file (a killed build's file taken over continues it)."""
        args = (candidate.partial, spec, candidate.number, candidate.parent, inputs)
        if self.assembly == "mapped":
            return MappedWriter(*args)
        return DatasetWriter(*args, durable=self.reuse.taken.durable if self.reuse.taken is not None else None)

    def clean(self, spec: DatasetSpec, root: Path, writer: DatasetWriter, timings: dict, status, cluster):
        """The planned samples cleaned, in order, each batch handed back as ``returns`` says."""
        to = writer.row_files_to if isinstance(writer, MappedWriter) else None
        chunk_files = self.returns == "chunk_files"
        samples = self.reuse.plan.to_clean
        return clean_all(spec, root, samples, timings, status, FORMAT_VERSION, to, cluster, self.where, chunk_files)


def _running_workers(spec: DatasetSpec, cluster: ClusterAhead | None) -> tuple[Executor, int] | None:
    """The workers of the LocalCluster the run started ahead, once they are up (cleaning would wait
    for them next), to share the take-over's check of a killed build's rows; None without one, or
    when it failed to start (cleaning then says why)."""
    if cluster is None or not cluster.fits(spec.compute.workers, spec.compute.secure):
        return None
    try:
        cluster.client()
    except Exception:  # noqa: BLE001 - raised again where cleaning asks for it
        return None
    return cluster.executor()


def write_version(
    spec: DatasetSpec,
    inventory: Inventory,
    candidate: Candidate,
    progress: Callable[[int], None] = lambda n: None,
    status: Callable[[str], None] = lambda text: None,
    inputs: Inputs | None = None,
    cluster: ClusterAhead | None = None,
) -> WriteSummary:
    """Write the candidate version: plan the rows taken from files already written (``inputs``:
    the samples' hashes, ``rebuild.inputs_of`` when not given), choose the route, clean the rest,
    assemble. Returns the summary; its ``checksum_sample`` says how many rows of each split
    ``verify`` must check (``rebuild.Written``).

    ``progress`` hears how many inputs each batch settled, ``status`` what happens before the first.
    ``cluster``: the LocalCluster the run started ahead (``parallel.cluster_ahead``), cleaned on when it fits.
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
    reuse = plan_reuse(spec, inventory, inputs, candidate.partial, timings, _running_workers(spec, cluster))
    try:
        route = Route.choose(spec, reuse)
        timings["route"] = str(route)
        compute, n = spec.compute, len(reuse.plan.to_clean)
        where = {
            "external": f"on the dask scheduler at {compute.dask_address}",
            "inline": f"in this process (fewer than {inline_limit(spec)}: compute.inline_below, or as many as "
            f"{INLINE_BYTES >> 20} MiB of stored values hold)",
            "local": f"on a LocalCluster of {compute.workers} processes",
        }[route.where]
        log.info("cleaning %d samples %s, %d per batch", n, where, batch_samples(spec, n))
        with route.open_writer(candidate, spec, inputs) as writer:
            writer.add_rejections(inventory.rejections)
            cleaned = route.clean(spec, inventory.root, writer, timings, status, cluster)
            written = write_samples(spec, inventory, inputs, writer, reuse, cleaned, timings, progress)
            timings["hash_cache_files"] = hash_cache.save(
                candidate.out, inventory.root, inputs.states, inputs.hexes, inputs.stated_at_ns
            )
            summary = writer.finish(timings).with_(checksum_sample=written.checksum_sample)
    finally:
        reuse.close()
    if written.cleaned is not None:  # a rebuild that took rows: the rows it made are checked in full here
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
