"""Tasks of the append flow (thin wrappers over h5forge.store.append)."""

from __future__ import annotations

from pathlib import Path

from prefect import get_run_logger, task
from prefect.cache_policies import NONE

from h5forge.store import append
from h5forge.store.append import AppendCandidate, InboxScan
from h5forge.spec import DatasetSpec
from h5forge.store.verify import HealthReport
from h5forge.store.versions import version_name
from h5forge.tasks.artifacts import log_report


@task(name="recover", cache_policy=NONE, persist_result=False)
def recover_interrupted(out: Path) -> str | None:
    outcome = append.recover(out)
    if outcome:
        get_run_logger().warning("a previous append was interrupted: %s", outcome)
    return outcome


@task(name="scan-inbox", cache_policy=NONE, persist_result=False)
def scan_inbox(spec: DatasetSpec, inbox: Path) -> InboxScan:
    scan = append.scan_inbox(spec, inbox)
    logger = get_run_logger()
    logger.info("inbox %s: %d sample(s) ready, %d waiting, %d rejected", inbox, len(scan.ready),
                len(scan.waiting), len(scan.rejections))
    for w in scan.waiting[:20]:
        logger.info("waiting: %s (%s): %s", w.sample_id, w.path, w.reason)
    return scan


@task(name="write-delta", cache_policy=NONE, persist_result=False)
def write_delta(spec: DatasetSpec, scan: InboxScan, cand: AppendCandidate) -> dict:
    summary = append.write_delta(spec, scan, cand)
    dupes = sum(r["reason"].startswith("duplicate") for r in summary["rejections"])
    get_run_logger().info("new samples %s, %d duplicate(s), %d rejected in all", summary["counts"], dupes,
                          summary["rejected"])
    return summary


@task(name="write-thin-version", cache_policy=NONE, persist_result=False)
def write_thin_version(spec: DatasetSpec, cand: AppendCandidate, summary: dict) -> dict:
    merged = append.write_thin_version(spec, cand, summary)
    get_run_logger().info("%s = %s + %s: %s samples over %d file(s)", version_name(cand.number),
                          version_name(cand.parent), cand.delta.name, merged["counts"], merged["segments"])
    return merged


@task(name="verify", cache_policy=NONE, persist_result=False)
def verify_append(cand: AppendCandidate) -> HealthReport:
    report = append.verify_append(cand)
    log_report(report)
    return report


@task(name="publish", cache_policy=NONE, persist_result=False)
def publish_append(cand: AppendCandidate, report: HealthReport, plan: dict) -> str:
    path = append.publish_append(cand, report, plan)
    get_run_logger().info("published %s; inbox files moved to %s", path, plan["moves"][0][1].rsplit("/", 2)[0]
                          if plan["moves"] else "-")
    return path
