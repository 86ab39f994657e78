"""append-samples: inbox -> clean -> dedupe -> delta -> thin version -> verify -> publish -> move."""

from __future__ import annotations

from pathlib import Path

from prefect import flow, get_run_logger
from prefect.utilities.annotations import quote

from h5forge.errors import UsageError
from h5forge.flows.results import AppendResult
from h5forge.ingest.append import apply_moves, plan_moves, stage_append
from h5forge.spec import load_spec
from h5forge.store.output import claim_output, preflight
from h5forge.store.reports import write_quarantine
from h5forge.store.versions import output_lock_or_skip
from h5forge.tasks.append import (publish_append, recover_interrupted, scan_inbox, verify_append, write_delta,
                                  write_thin_version)
from h5forge.tasks.artifacts import publish_artifacts
from h5forge.tasks.build import apply_retention


@flow(name="append-samples")
def append_samples(spec_path: str, inbox: str | None = None, output: str | None = None,
                   dask_address: str | None = None, wait_for_lock: float = 0,
                   skip_if_busy: bool = False) -> AppendResult:
    """Append the complete samples waiting in ``inbox`` as a new version.

    Args:
        spec_path: the dataset spec (YAML).
        inbox: folder new samples are dropped into; default: the spec's ``source.inbox``.
        output: output folder; default: the spec's ``output.dir``.
        dask_address: tcp://host:port of an existing dask scheduler; default: a LocalCluster.
        wait_for_lock: seconds to wait while another run writes the same output folder; when
            the wait is over the run fails, unless ``skip_if_busy``.
        skip_if_busy: when the folder is still busy after ``wait_for_lock``, end the run without
            appending (logged as "skipped: …"); the samples stay in the inbox for the next run.
    """
    spec = load_spec(spec_path, output=output, dask_address=dask_address, inbox=inbox)
    if spec.source.inbox is None:
        raise UsageError("no inbox: pass one, or set source.inbox in the spec")
    preflight(spec, inbox=True)  # sources exist, the output folder is outside them and is this dataset's
    box = Path(spec.source.inbox)
    out = Path(spec.output.dir)
    with output_lock_or_skip(out, f"append-samples {spec.name}", wait_for_lock, skip_if_busy) as busy:
        if busy:
            get_run_logger().warning("skipped: %s", busy)
            return AppendResult(spec.name, skipped=busy)
        claim_output(out, spec.name)
        recover_interrupted(out)
        scan = scan_inbox(spec, box)
        waiting = len(scan.waiting)
        if not scan.ready:
            apply_moves(plan_moves(spec, scan, (), None))  # rejected inputs still go to quarantine/
            return AppendResult(spec.name, waiting=waiting, rejections=tuple(scan.rejections))
        cand = stage_append(out)
        summary = write_delta(spec, quote(scan), cand)  # quote: no walk over every sample
        if summary.samples == 0:
            cand.delta_partial.unlink(missing_ok=True)
            apply_moves(plan_moves(spec, scan, summary.rejections, None))
            get_run_logger().info("nothing new to append: every ready sample was a duplicate or rejected")
            return AppendResult(spec.name, waiting=waiting, rejections=summary.rejections)
        write_quarantine(out, cand.number, summary.rejections)
        merged = write_thin_version(spec, cand, quote(summary))
        report = verify_append(cand)
        publish_artifacts(spec.name, report, quote(merged), cand.number)
        plan = plan_moves(spec, scan, summary.rejections, cand.number)
        path = publish_append(cand, report, quote(plan))
        apply_retention(spec)
    return AppendResult(spec.name, cand.number, path, summary.samples, summary.counts, merged.counts, waiting,
                        summary.rejections)
