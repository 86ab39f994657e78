"""Tasks of the build flow. Arrays never pass through Prefect: tasks exchange paths and summaries."""

from __future__ import annotations

from prefect import get_run_logger, task
from prefect.cache_policies import NONE

from h5forge.ingest import build
from h5forge.ingest import discover as discovery
from h5forge.store import versions
from h5forge.ingest.discover import Inventory
from h5forge.spec import DatasetSpec
from h5forge.store.verify import HealthReport
from h5forge.store.versions import Candidate
from h5forge.tasks.artifacts import log_report
from h5forge.tasks.progress import progress


@task(name="discover", cache_policy=NONE, persist_result=False)
def discover_samples(spec: DatasetSpec) -> Inventory:
    inventory = discovery.discover(spec)
    get_run_logger().info(
        "found %d complete samples under %s (%s); %d input(s) rejected at discovery",
        len(inventory.samples), inventory.root, inventory.split_counts(), len(inventory.rejections))
    return inventory


@task(name="stage-version", cache_policy=NONE, persist_result=False)
def stage_version(spec: DatasetSpec) -> Candidate:
    candidate = versions.stage(spec.output.dir)
    get_run_logger().info("writing %s (parent: %s)", versions.version_name(candidate.number),
                          candidate.parent and versions.version_name(candidate.parent))
    return candidate


@task(name="clean-and-write", cache_policy=NONE, persist_result=False)
def clean_and_write(spec: DatasetSpec, inventory: Inventory, candidate: Candidate) -> dict:
    logger = get_run_logger()
    where = spec.compute.dask_address or f"a LocalCluster of {spec.compute.workers} processes"
    logger.info("cleaning %d samples on %s, %d per batch", len(inventory.samples), where,
                spec.compute.batch_size)
    with progress(len(inventory.samples), "clean+write", logger.info) as advance:
        summary = build.write_version(spec, inventory, candidate, advance)
    logger.info("wrote %d samples %s, %d rejected, compression ratio %.3f",
                summary["samples"], summary["counts"], summary["rejected"], summary["compression_ratio"])
    return summary


@task(name="verify", cache_policy=NONE, persist_result=False)
def verify_candidate(candidate: Candidate) -> HealthReport:
    report = build.verify_candidate(candidate)
    log_report(report)
    return report


@task(name="publish", cache_policy=NONE, persist_result=False)
def publish_version(candidate: Candidate, report: HealthReport) -> str:
    path = build.publish_candidate(candidate, report)
    get_run_logger().info("published %s; dataset_latest.h5 now points at it", path)
    return path


@task(name="retention", cache_policy=NONE, persist_result=False)
def apply_retention(spec: DatasetSpec) -> list[str]:
    removed = versions.retain(spec.output.dir, spec.output.keep)
    if removed:
        get_run_logger().info("retention (keep %d): removed %s", spec.output.keep,
                              ", ".join(p.name for p in removed))
    return [str(p) for p in removed]
