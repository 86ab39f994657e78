"""What a run shows besides its result: the health report in the log, the reports a runner shows
(the health report, the rejected inputs, per-split counts and sizes, the diff from the previous
version), and the preview sheet written to ``reports/``."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path
from typing import Sequence

from h5forge.errors import H5forgeError
from h5forge._figures import size
from h5forge._format import markdown
from h5forge._format.names import version_name
from h5forge._format.summary import WriteSummary, bounded_rows
from h5forge._pipeline.runner import Runner, log
from h5forge._store.verify import HealthReport
from h5forge._store.versions import Candidate

PREVIEW_SAMPLES = 16


def artifact_key(name: str, what: str) -> str:
    """Keys allow lowercase letters, digits and dashes only."""
    return re.sub(r"[^a-z0-9-]+", "-", f"{name}-{what}".lower()).strip("-")


def log_report(report: HealthReport, logged: Sequence[str] = ()) -> HealthReport:
    """Every check, error and warning of a health report, in the run log, but the warnings the
    run ``logged`` when it found them."""
    for check, result in report.checks.items():
        log.info("verify %s: %s", check, result)
    for err in report.errors:
        log.error("verify: %s", err)
    for warning in report.warnings:
        if warning not in logged:
            log.warning("verify: %s", warning)
    return report


def show_health(runner: Runner, name: str, report: HealthReport, summary: WriteSummary, version: int) -> None:
    """Titled with the version as it is published (the report was made on its temporary file)."""
    file = version_name(version)
    runner.markdown(
        artifact_key(name, "health"), replace(report, path=file).to_markdown(), f"health report of {file} ({name})"
    )
    # the stage says where an input was turned away (discover, clean, append); the reason is whole
    # bounded: the first rows, then one counting the rest (the quarantine report lists them all)
    rejections = [
        {"sample_id": r["sample_id"], "path": r["path"], "stage": r["stage"], "reason": r["reason"]}
        for r in bounded_rows(summary.rejections)
    ]
    runner.table(
        artifact_key(name, "rejections"),
        rejections or [{"sample_id": "", "path": "", "stage": "", "reason": "none"}],
        f"{summary.rejected} rejected input(s) of {file} ({name})",
    )
    runner.table(
        artifact_key(name, "splits"),
        [{"split": s, "samples": n, "stored": size(summary.split_bytes.get(s, 0))} for s, n in summary.counts.items()],
        f"samples and stored size per split of {file} ({name})",
    )


def show_diff(runner: Runner, name: str, candidate: Candidate) -> str | None:
    """The sample-level changes from the version latest pointed at before this run to the one just
    published (none for a first version). Returns the report's key."""
    from h5forge._views.diff import diff_versions

    previous = candidate.out / version_name(candidate.parent) if candidate.parent else None
    if previous is None or not previous.is_file():
        log.info("no diff: %s has no earlier version", version_name(candidate.number))
        return None
    try:
        changes = diff_versions(previous, candidate.final)
    except H5forgeError as err:  # the version is published already; a report must not fail the run
        log.warning("no diff report: %s", err)
        return None
    key = artifact_key(name, "diff")
    runner.markdown(key, changes.to_markdown(), f"changes from v{candidate.parent:04d} to v{candidate.number:04d}")
    counted = (changes.added, changes.removed, changes.content_changed, changes.columns_changed, changes.moved_split)
    what = "%d added, %d removed, %d changed, %d relabelled, %d moved split"
    log.info("diff v%04d -> v%04d: " + what, candidate.parent, candidate.number, *map(len, counted))
    return key


def write_preview_sheet(runner: Runner, name: str, published: str, number: int) -> str | None:
    """A contact sheet of the published version, written to ``reports/dataset_vNNNN.preview.png``;
    a runner that shows artifacts also gets it as Markdown embedding a shrunk JPEG copy as a
    ``data:image/jpeg`` URI (the Prefect UI renders those; a path on the build machine shows
    nothing in a browser). The sheet is drawn once; the copy is made from it in memory. Returns
    the sheet's path (None when no sheet could be drawn)."""
    from h5forge._views.preview import artifact_data_uri, preview_path, write_preview

    png = preview_path(Path(published).parent, number)
    try:
        sheet = write_preview(published, png, n=PREVIEW_SAMPLES, compress_level=1)  # a report: speed first
    except (H5forgeError, OSError) as err:  # the version is published already; a picture must not fail the run
        log.warning("no preview: %s", err)
        return None
    if runner.shows_artifacts:
        split = sheet.samples[0].split
        runner.markdown(
            artifact_key(name, "preview"),
            f"# Preview: {version_name(number)}\n\n{len(sheet.ids)} random samples of `{split}` "
            f"(seed 0), drawn by their field kinds.\n\n![preview of {version_name(number)}]"
            f"({artifact_data_uri(sheet.image)})\n\nFull size: {markdown.text(png)}\n",
            f"{len(sheet.ids)} random {split} samples of {version_name(number)} ({name})",
        )
    log.info("preview of %d samples: %s", len(sheet.ids), png)
    return str(png)
