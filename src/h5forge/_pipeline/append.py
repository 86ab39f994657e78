"""append: inbox -> clean -> dedupe -> delta -> thin version -> verify -> publish -> move.

The order of the steps is stated here once; ``flows/append.py`` runs this same function with
each step as a Prefect task.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from h5forge.errors import UsageError
from h5forge._format.names import version_name
from h5forge._format.row_files import row_files_of
from h5forge._format.summary import WriteSummary
from h5forge._ingest import append as steps
from h5forge._ingest.append import AppendCandidate, InboxScan, MovePlan, apply_moves, plan_moves, stage_append
from h5forge._ingest.leaks import append_leaks, leak_warnings
from h5forge._pipeline.build import apply_retention, recover_interrupted, resolve_spec
from h5forge._pipeline.main_module import leaves_main_alone
from h5forge._pipeline.reports import log_report, show_health
from h5forge._pipeline.results import AppendResult
from h5forge._pipeline.runner import PLAIN, Runner, log
from h5forge._samples import rejected_count
from h5forge.spec import DatasetSpec
from h5forge._store.output import claim_output, preflight
from h5forge._store.reports import write_quarantine
from h5forge._store.thin import chain_length, compact_advice
from h5forge._store.verify import HealthReport
from h5forge._store.versions import latest, output_lock_or_skip


@leaves_main_alone
def append(
    spec: DatasetSpec | str | Path,
    *,
    inbox: str | Path | None = None,
    output: str | Path | None = None,
    dask_address: str | None = None,
    wait_for_lock: float = 0,
    skip_if_busy: bool = False,
    runner: Runner = PLAIN,
) -> AppendResult:
    """Append the complete samples waiting in ``inbox`` as a new version.

    Args:
        spec: the dataset spec, or the path of its YAML.
        inbox: folder new samples are dropped into; default: the spec's ``source.inbox``.
        output: output folder; default: the spec's ``output.dir``.
        dask_address: tcp://host:port of an existing dask scheduler; default: a LocalCluster.
        wait_for_lock: seconds to wait while another run writes the same output folder; when
            the wait is over the run fails, unless ``skip_if_busy``.
        skip_if_busy: when the folder is still busy after ``wait_for_lock``, return without
            appending (``result.skipped``); the samples stay in the inbox for the next run.
        runner: how each step runs (``h5forge._pipeline.runner``); default: plain calls.
    """
    spec = resolve_spec(spec, output, dask_address, inbox)
    if spec.source.inbox is None:
        raise UsageError("no inbox: pass one, or set source.inbox in the spec")
    preflight(spec, inbox=True)  # sources exist, the output folder is outside them and is this dataset's
    box, out, run = Path(spec.source.inbox), Path(spec.output.dir), runner.step
    with output_lock_or_skip(out, f"append-samples {spec.name}", wait_for_lock, skip_if_busy) as busy:
        if busy:
            log.warning("skipped: %s", busy)
            return AppendResult(spec.name, skipped=busy)
        claim_output(out, spec.name)
        run("recover", recover_interrupted, out)
        scan = run("scan-inbox", scan_inbox, spec, box, out)
        waiting = rejected_count(scan.waiting)
        if not scan.ready:
            apply_moves(plan_moves(spec, scan, (), None))  # rejected inputs still go to quarantine/
            return AppendResult(spec.name, waiting=waiting, rejections=tuple(scan.rejections))
        cand = stage_append(out)
        summary = run("write-delta", write_delta, spec, scan, cand, runner)
        if summary.samples == 0:
            cand.delta_partial.unlink(missing_ok=True)
            apply_moves(plan_moves(spec, scan, summary.rejections, None))
            log.info("nothing new to append: every ready sample was a duplicate or rejected")
            return AppendResult(spec.name, waiting=waiting, rejections=summary.rejections)
        write_quarantine(out, cand.number, summary.rejections)
        found = leaks_found(spec, cand)  # warnings, with the verify report
        merged = run("write-thin-version", write_thin_version, spec, cand, summary)
        report = run("verify", verify_append, cand, found)
        run("report", show_health, runner, spec.name, report, merged, cand.number)
        plan = plan_moves(spec, scan, summary.rejections, cand.number)
        path = run("publish", publish_append, cand, report, plan)
        run("retention", apply_retention, spec)
        chain = chain_length(row_files_of(Path(path)))
        advice = compact_advice(cand.number, chain)
        if advice:
            log.warning("%s", advice)
    return AppendResult(
        spec.name,
        cand.number,
        path,
        summary.samples,
        summary.counts,
        merged.counts,
        waiting,
        summary.rejections,
        chain=chain,
        warnings=tuple(report.warnings),
    )


def scan_inbox(spec: DatasetSpec, inbox: Path, out: Path) -> InboxScan:
    scan = steps.scan_inbox(spec, inbox)
    parent = latest(out)
    steps.refuse_waits_for_held_ids(scan, None if parent is None else out / version_name(parent))
    log.info(
        "inbox %s: %d sample(s) ready, %d waiting, %d rejected",
        inbox,
        len(scan.ready),
        rejected_count(scan.waiting),
        rejected_count(scan.rejections),
    )
    for w in scan.waiting[:20]:
        row = w.as_dict()  # its text encodable: a record's id may hold a lone surrogate
        log.info("waiting: %s (%s): %s", row["sample_id"], row["path"], row["reason"])
    return scan


def write_delta(spec: DatasetSpec, scan: InboxScan, cand: AppendCandidate, runner: Runner) -> WriteSummary:
    with runner.progress(len(scan.ready), "clean+append") as display:
        summary = steps.write_delta(spec, scan, cand, display.advance, display.status)
    dupes = sum(r.reason.startswith("duplicate") for r in summary.rejections)
    log.info("new samples %s, %d duplicate(s), %d rejected in all", summary.counts, dupes, summary.rejected)
    return summary


def write_thin_version(spec: DatasetSpec, cand: AppendCandidate, summary: WriteSummary) -> WriteSummary:
    merged = steps.write_thin_version(spec, cand, summary)
    log.info(
        "%s = %s + %s: %s samples over %d file(s)",
        version_name(cand.number),
        version_name(cand.parent),
        cand.delta.name,
        merged.counts,
        merged.row_files,
    )
    return merged


def leaks_found(spec: DatasetSpec, cand: AppendCandidate) -> list[str]:
    """Warnings for the raw inputs the new samples share with another split or other label files,
    in this append or in latest (``_ingest.leaks``), by the digests the delta and latest store."""
    found = leak_warnings(append_leaks(spec, cand.out / version_name(cand.parent), cand.delta_partial))
    for line in found:
        log.warning("%s", line)
    return found


def verify_append(cand: AppendCandidate, found: Sequence[str] = ()) -> HealthReport:
    """The append's health report, with its own warnings (``found``, logged already)."""
    return log_report(steps.verify_append(cand, found), logged=found)


def publish_append(cand: AppendCandidate, report: HealthReport, plan: MovePlan) -> str:
    path = steps.publish_append(cand, report, plan)
    log.info("published %s; inbox files moved to %s", path, steps.processed_dir(Path(plan.inbox), cand.number))
    return path
