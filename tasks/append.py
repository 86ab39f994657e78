"""Tasks of the append flow (thin wrappers over h5forge.ingest.append)."""

from __future__ import annotations

from pathlib import Path

from prefect import get_run_logger

from h5forge.format.names import version_name
from h5forge.format.summary import WriteSummary
from h5forge.ingest import append
from h5forge.ingest.append import AppendCandidate, InboxScan, MovePlan
from h5forge.spec import DatasetSpec
from h5forge.store.verify import HealthReport
from h5forge.tasks import step
from h5forge.tasks.artifacts import log_report
from h5forge.tasks.progress import progress


@step(name="recover")
def recover_interrupted(out: Path) -> str | None:
    outcome = append.recover(out)
    if outcome:
        get_run_logger().warning("a previous append was interrupted: %s", outcome)
    return outcome


@step(name="scan-inbox")
def scan_inbox(spec: DatasetSpec, inbox: Path) -> InboxScan:
    scan = append.scan_inbox(spec, inbox)
    logger = get_run_logger()
    logger.info("inbox %s: %d sample(s) ready, %d waiting, %d rejected", inbox, len(scan.ready),
                len(scan.waiting), len(scan.rejections))
    for w in scan.waiting[:20]:
        logger.info("waiting: %s (%s): %s", w.sample_id, w.path, w.reason)
    return scan


@step(name="write-delta")
def write_delta(spec: DatasetSpec, scan: InboxScan, cand: AppendCandidate) -> WriteSummary:
    with progress(len(scan.ready), "clean+append", get_run_logger()) as display:
        summary = append.write_delta(spec, scan, cand, display.advance, display.status)
    dupes = sum(r.reason.startswith("duplicate") for r in summary.rejections)
    get_run_logger().info("new samples %s, %d duplicate(s), %d rejected in all", summary.counts, dupes,
                          summary.rejected)
    return summary


@step(name="write-thin-version")
def write_thin_version(spec: DatasetSpec, cand: AppendCandidate, summary: WriteSummary) -> WriteSummary:
    merged = append.write_thin_version(spec, cand, summary)
    get_run_logger().info("%s = %s + %s: %s samples over %d file(s)", version_name(cand.number),
                          version_name(cand.parent), cand.delta.name, merged.counts, merged.segments)
    return merged


@step(name="verify")
def verify_append(cand: AppendCandidate) -> HealthReport:
    return log_report(append.verify_append(cand))


@step(name="publish")
def publish_append(cand: AppendCandidate, report: HealthReport, plan: MovePlan) -> str:
    path = append.publish_append(cand, report, plan)
    where = append.processed_dir(Path(plan.inbox), plan.version)
    get_run_logger().info("published %s; inbox files moved to %s", path, where)
    return path
