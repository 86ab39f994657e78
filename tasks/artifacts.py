"""What a run shows besides its result: the verification in the run log, and Prefect artifacts
(the health report, the rejected inputs, per-split counts and sizes)."""

from __future__ import annotations

import re

from prefect import get_run_logger
from prefect.artifacts import create_markdown_artifact, create_table_artifact

from h5forge.format.summary import WriteSummary
from h5forge.store.verify import HealthReport
from h5forge.tasks import step


def artifact_key(name: str, what: str) -> str:
    """Keys allow lowercase letters, digits and dashes only."""
    return re.sub(r"[^a-z0-9-]+", "-", f"{name}-{what}".lower()).strip("-")


def log_report(report: HealthReport) -> HealthReport:
    """Every check, error and warning of a health report, in the run log."""
    logger = get_run_logger()
    for check, result in report.checks.items():
        logger.info("verify %s: %s", check, result)
    for err in report.errors:
        logger.error("verify: %s", err)
    for warning in report.warnings:
        logger.warning("verify: %s", warning)
    return report


@step(name="report")
def publish_artifacts(name: str, report: HealthReport, summary: WriteSummary) -> None:
    create_markdown_artifact(key=artifact_key(name, "health"), markdown=report.to_markdown(),
                             description=f"health report of {name}")
    rejections = [r.as_dict() for r in summary.rejections]
    create_table_artifact(key=artifact_key(name, "rejections"),
                          table=rejections or [{"sample_id": "", "path": "", "reason": "none", "stage": ""}],
                          description=f"{len(rejections)} rejected input(s)")
    create_table_artifact(
        key=artifact_key(name, "splits"),
        table=[{"split": s, "samples": n, "stored_bytes": summary.split_bytes.get(s, 0)}
               for s, n in summary.counts.items()],
        description="samples and stored bytes per split")
