"""What a run shows besides its result: the verification in the run log, and Prefect artifacts
(the health report, the rejected inputs, per-split counts and sizes)."""

from __future__ import annotations

import re
from dataclasses import replace

from prefect import get_run_logger
from prefect.artifacts import create_markdown_artifact, create_table_artifact

from h5forge.format.names import version_name
from h5forge.format.summary import WriteSummary, bounded_rows
from h5forge.store.figures import size
from h5forge.store.verify import HealthReport
from h5forge.store.versions import Candidate
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
def publish_artifacts(name: str, report: HealthReport, summary: WriteSummary, version: int) -> None:
    """Titled with the version as it is published (the report was made on its temporary file)."""
    file = version_name(version)
    create_markdown_artifact(key=artifact_key(name, "health"),
                             markdown=replace(report, path=file).to_markdown(),
                             description=f"health report of {file} ({name})")
    # the stage says where an input was turned away (discover, clean, append); the reason is whole
    # bounded: the first rows, then one counting the rest (the quarantine report lists them all)
    rejections = [{"sample_id": r["sample_id"], "path": r["path"], "stage": r["stage"], "reason": r["reason"]}
                  for r in bounded_rows(summary.rejections)]
    create_table_artifact(key=artifact_key(name, "rejections"),
                          table=rejections or [{"sample_id": "", "path": "", "stage": "", "reason": "none"}],
                          description=f"{summary.rejected} rejected input(s) of {file} ({name})")
    create_table_artifact(
        key=artifact_key(name, "splits"),
        table=[{"split": s, "samples": n, "stored": size(summary.split_bytes.get(s, 0))}
               for s, n in summary.counts.items()],
        description=f"samples and stored size per split of {file} ({name})")

PREVIEW_SAMPLES = 16


@step(name="preview")
def publish_preview(name: str, published: str, number: int) -> str | None:
    """A contact sheet of the published version, written to ``reports/dataset_vNNNN.preview.png``
    and shown in the run as a Markdown artifact embedding a shrunk JPEG copy as a
    ``data:image/jpeg`` URI: the Prefect 3.9 UI renders such images in Markdown artifacts (its
    sanitizer lets ``data:image/`` through on ``img``), while a path on the build machine shows
    nothing in a browser. The sheet is drawn once; the copy is made from it in memory. Returns the
    artifact key (None when no sheet could be drawn)."""
    from pathlib import Path

    from h5forge.errors import H5forgeError
    from h5forge.format.names import version_name
    from h5forge.store.preview import artifact_data_uri, preview_path, write_preview

    logger = get_run_logger()
    png = preview_path(Path(published).parent, number)
    try:
        sheet = write_preview(published, png, n=PREVIEW_SAMPLES, compress_level=1)  # a report: speed first
    except (H5forgeError, OSError) as err:  # the version is published already; a picture must not fail the run
        logger.warning("no preview: %s", err)
        return None
    key = artifact_key(name, "preview")
    split = sheet.samples[0].split
    create_markdown_artifact(
        key=key, description=f"{len(sheet.ids)} random {split} samples of {version_name(number)} ({name})",
        markdown=f"# Preview: {version_name(number)}\n\n{len(sheet.ids)} random samples of `{split}` "
                 f"(seed 0), drawn by their field kinds.\n\n![preview of {version_name(number)}]"
                 f"({artifact_data_uri(sheet.image)})\n\nFull size: `{png}`\n")
    logger.info("preview of %d samples: %s", len(sheet.ids), png)
    return key


@step(name="diff")
def publish_diff(name: str, candidate: Candidate) -> str | None:
    """The sample-level changes from the version latest pointed at before this run to the one just
    published, as a Markdown artifact (none for a first version). Returns the artifact key."""
    from h5forge.errors import H5forgeError
    from h5forge.format.names import version_name
    from h5forge.store.diff import diff_versions

    logger = get_run_logger()
    previous = candidate.out / version_name(candidate.parent) if candidate.parent else None
    if previous is None or not previous.is_file():
        logger.info("no diff: %s has no earlier version", version_name(candidate.number))
        return None
    try:
        changes = diff_versions(previous, candidate.final)
    except H5forgeError as err:  # the version is published already; a report must not fail the run
        logger.warning("no diff artifact: %s", err)
        return None
    key = artifact_key(name, "diff")
    create_markdown_artifact(key=key, markdown=changes.to_markdown(),
                             description=f"changes from v{candidate.parent:04d} to v{candidate.number:04d}")
    logger.info("diff v%04d -> v%04d: %d added, %d removed, %d changed, %d relabelled, %d moved split",
                candidate.parent, candidate.number, len(changes.added), len(changes.removed),
                len(changes.content_changed), len(changes.columns_changed), len(changes.moved_split))
    return key
