"""Tasks of the build flow (thin wrappers over h5forge.ingest.build and h5forge.store.versions)."""

from __future__ import annotations

from prefect import get_run_logger

from h5forge.format.names import version_name
from h5forge.format.summary import WriteSummary
from h5forge.ingest import build, discover as discovery
from h5forge.ingest.discover import Inventory
from h5forge.ingest.inputs import Inputs
from h5forge.ingest.nightly import inputs_of, unchanged_since
from h5forge.spec import DatasetSpec
from h5forge.store import versions
from h5forge.store.verify import HealthReport
from h5forge.store.versions import Candidate
from h5forge.tasks import step
from h5forge.tasks.artifacts import log_report
from h5forge.tasks.progress import progress


@step(name="discover")
def discover_samples(spec: DatasetSpec) -> Inventory:
    inventory = discovery.discover(spec)
    get_run_logger().info(
        "found %d complete samples under %s (%s); %d input(s) rejected at discovery",
        len(inventory.samples), inventory.root, inventory.split_counts(), len(inventory.rejections))
    return inventory


@step(name="stage-version")
def stage_version(spec: DatasetSpec) -> Candidate:
    candidate = versions.stage(spec.output.dir)
    get_run_logger().info("writing %s (parent: %s)", version_name(candidate.number),
                          candidate.parent and version_name(candidate.parent))
    return candidate


@step(name="fingerprint")
def fingerprint_inputs(spec: DatasetSpec, inventory: Inventory) -> Inputs:
    inputs = inputs_of(spec, inventory)
    if inputs.deferred:
        get_run_logger().info("no version made under these field rules: the raw files are hashed as they are cleaned")
    else:
        get_run_logger().info("hashed the raw files of %d samples in %.2f s", len(inputs.samples), inputs.hash_seconds)
    return inputs


@step(name="unchanged")
def unchanged_version(spec: DatasetSpec, inputs: Inputs) -> int | None:
    """The latest version, when it was built from these very inputs and rules (nothing to publish)."""
    number = unchanged_since(spec.output.dir, inputs)
    if number is not None:
        get_run_logger().info("unchanged since v%04d: same raw inputs and field rules; nothing published", number)
    return number


@step(name="clean-and-write")
def clean_and_write(spec: DatasetSpec, inventory: Inventory, candidate: Candidate,
                    inputs: Inputs | None = None) -> WriteSummary:
    logger = get_run_logger()
    n, compute = len(inventory.samples), spec.compute
    if compute.dask_address:
        where = f"on the dask scheduler at {compute.dask_address}"
    elif n < compute.inline_below:  # as ingest.parallel decides: a cluster would cost more than it saves
        where = f"in this process (fewer than compute.inline_below = {compute.inline_below})"
    else:
        where = f"on a LocalCluster of {compute.workers} processes"
    logger.info("cleaning %d samples %s, %d per batch", n, where, compute.batch_size)
    with progress(n, "clean+write", logger) as display:
        summary = build.write_version(spec, inventory, candidate, display.advance, display.status, inputs)
    logger.info("wrote %d samples %s, %d rejected, compression ratio %.3f",
                summary.samples, summary.counts, summary.rejected, summary.compression_ratio)
    return summary


@step(name="verify")
def verify_candidate(candidate: Candidate) -> HealthReport:
    return log_report(build.verify_candidate(candidate))


@step(name="publish")
def publish_version(candidate: Candidate, report: HealthReport) -> str:
    path = build.publish_candidate(candidate, report)
    get_run_logger().info("published %s; dataset_latest.h5 now points at it", path)
    return path


@step(name="retention")
def apply_retention(spec: DatasetSpec) -> list[str]:
    removed = versions.retain(spec.output.dir, spec.output.keep, spec.output.retire_after_seconds)
    if removed:
        get_run_logger().info("retention (keep %d): removed %s", spec.output.keep,
                              ", ".join(p.name for p in removed))
    return [str(p) for p in removed]
