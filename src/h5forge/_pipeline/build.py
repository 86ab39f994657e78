"""build: spec -> discover -> fingerprint -> clean on dask and write -> verify -> publish -> reports.

The order of the steps is stated here once; ``flows/build.py`` runs this same function with each
step as a Prefect task.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Sequence

import h5py

from h5forge.errors import VerificationFailed
from h5forge._format.names import version_name
from h5forge._format.row_files import counts_of
from h5forge._format.summary import WriteSummary
from h5forge._ingest import build as steps, discover as discovery
from h5forge._ingest.append import recover as recover_append
from h5forge._ingest.discover import Inventory
from h5forge._ingest.duplicates import drop_duplicates
from h5forge._ingest.leaks import build_leaks, leak_warnings
from h5forge._ingest.incremental.hash_cache import known_digests
from h5forge._ingest.incremental.inputs import Inputs, rules_hash
from h5forge._ingest.incremental.rebuild import inputs_of, killed_build_rows, previous_sources, unchanged_since
from h5forge._ingest.parallel import ClusterAhead, cluster_ahead, inline_limit
from h5forge._ingest.rejected import check_rejected
from h5forge._ingest.removals import check_removals, named
from h5forge._pipeline.main_module import leaves_main_alone
from h5forge._pipeline.reports import log_report, show_diff, show_health, write_preview_sheet
from h5forge._pipeline.results import BuildResult
from h5forge._pipeline.runner import PLAIN, Runner, log
from h5forge.spec import DatasetSpec, load_spec, override
from h5forge._store import versions
from h5forge._store.output import claim_output, preflight
from h5forge._store.reports import write_health
from h5forge._store.verify import HealthReport, verify_file
from h5forge._store.versions import Candidate, finish_publish, output_lock_or_skip, publish


@leaves_main_alone
def build(
    spec: DatasetSpec | str | Path,
    *,
    output: str | Path | None = None,
    dask_address: str | None = None,
    wait_for_lock: float = 0,
    skip_if_busy: bool = False,
    runner: Runner = PLAIN,
) -> BuildResult:
    """Full rebuild of the dataset described by ``spec`` (a spec or its YAML) into a new published version.

    Args:
        spec: the dataset spec, or the path of its YAML.
        output: output folder; default: the spec's ``output.dir``.
        dask_address: tcp://host:port of an existing dask scheduler; default: a LocalCluster.
        wait_for_lock: seconds to wait while another run writes the same output folder; when
            the wait is over the run fails, unless ``skip_if_busy``.
        skip_if_busy: when the folder is still busy after ``wait_for_lock``, return without
            building (``result.skipped`` says why) instead of failing.
        runner: how each step runs (``h5forge._pipeline.runner``); default: plain calls.
    """
    spec = resolve_spec(spec, output, dask_address)
    preflight(spec)  # sources exist, the output folder is outside them and is this dataset's
    run = runner.step
    with output_lock_or_skip(spec.output.dir, f"build-dataset {spec.name}", wait_for_lock, skip_if_busy) as busy:
        if busy:
            log.warning("skipped: %s", busy)
            return BuildResult(spec.name, skipped=busy)
        claim_output(spec.output.dir, spec.name)
        run("recover", recover_interrupted, spec.output.dir)
        # a build that will clean on a cluster starts its dask workers now, while it discovers, and verifies on them
        with cluster_ahead(spec, lambda: cleans_on_a_cluster(spec)) as ahead:
            inventory = run("discover", discover_samples, spec)
            inputs = run("fingerprint", fingerprint_inputs, spec, inventory)
            same = run("unchanged", unchanged_version, spec, inputs)
            if same is not None:  # same raw inputs, same rules: a new version would be a copy
                path = spec.output.dir / version_name(same)
                return BuildResult(spec.name, same, str(path), counts_in(path), unchanged=True)
            candidate = run("stage-version", stage_version, spec)
            summary = run("clean-and-write", clean_and_write, spec, inventory, candidate, inputs, runner, ahead)
            found = leaks_found(spec, inventory, inputs, summary)  # warnings, with the verify report
            check_rejected(spec, inventory, summary, candidate)  # above max_rejected: nothing is published
            leaving = run("removals", samples_leaving, spec, candidate)  # unless allowed: nothing is published
            report = run("verify", verify_candidate, candidate, summary, ahead, found)
            if not report.ok:  # nothing is published: the run shows why before it fails
                run("report", show_health, runner, spec.name, report, summary, candidate.number)
            published = run("publish", publish_version, candidate, report)
            if ahead is not None:
                ahead.close_soon()  # the workers' work is done: they stop while the reports are written
            # the reports describe a published version: one that fails is logged, the version stays
            run("report", reported, "health", report_health, runner, spec.name, candidate, report, summary)
            if runner.shows_artifacts:
                run("diff", reported, "diff", show_diff, runner, spec.name, candidate)
            run("preview", reported, "preview", write_preview_sheet, runner, spec.name, published, candidate.number)
        removed = run("retention", apply_retention, spec)
    return BuildResult(
        spec.name,
        candidate.number,
        published,
        summary.counts,
        summary.rejected,
        summary.compression_ratio,
        summary.timings,
        report.checks,
        removed,
        left_latest=leaving,
        unclaimed=inventory.unclaimed,
        rejections=summary.rejections,
        warnings=tuple(report.warnings),
    )


def cleans_on_a_cluster(spec: DatasetSpec) -> bool:
    """Whether the build will clean at least ``parallel.inline_limit`` inputs on a LocalCluster
    (``parallel.where_to_clean`` decides the same way), known before discovery: no version under
    these field rules to take rows from (a rebuild learns what changed only from the hashes), and
    beyond the rows a killed build made durable, if one did, that many inputs, counted by a look
    ahead of discovery."""
    rules = rules_hash(spec)
    if previous_sources(spec.output.dir, rules):
        return False
    return discovery.at_least(spec, (killed_build_rows(spec.output.dir, rules) or 0) + inline_limit(spec))


def recover_interrupted(out: Path) -> str | None:
    """Settle what a killed writer left, first thing under the folder's lock, by every writer: a
    killed append's inbox moves (its journal) are finished when its version was published, else
    forgotten; a version published by a writer killed before latest moved is made latest. A build
    that went ahead would miss the samples still in the inbox, or publish the version number the
    journal names, which the next append would then take for its own and file the inbox samples
    under; or build again, from scratch, the version it was killed publishing."""
    outcomes = []
    if outcome := recover_append(out):
        log.warning("a previous append was interrupted: %s", outcome)
        outcomes.append(outcome)
    if outcome := finish_publish(out):
        log.warning("a previous run was interrupted: %s", outcome)
        outcomes.append(outcome)
    return "; ".join(outcomes) or None


def reported(what: str, show: Callable[..., Any], *args: Any) -> Any:
    """A report of a published version; a failure to make it is logged, and the run goes on."""
    try:
        return show(*args)
    except Exception as err:  # noqa: BLE001 - the version is published: a report must not fail the run
        log.warning("the %s report of the published version was not made: %s", what, err)
        return None


def report_health(runner: Runner, name: str, candidate: Candidate, report: HealthReport, summary: WriteSummary) -> None:
    """The published version's health report: its files in ``reports/``, and as the runner shows it."""
    write_health(candidate.out, candidate.number, report)
    show_health(runner, name, report, summary, candidate.number)


def resolve_spec(spec: DatasetSpec | str | Path, output, dask_address, inbox=None) -> DatasetSpec:
    if isinstance(spec, DatasetSpec):
        return override(spec, output=output, dask_address=dask_address, inbox=inbox)
    return load_spec(spec, output=output, dask_address=dask_address, inbox=inbox)


def discover_samples(spec: DatasetSpec) -> Inventory:
    inventory = discovery.discover(spec)
    inventory.digests = known_digests(spec.output.dir, inventory.root, inventory.states)
    dropped = drop_duplicates(spec, inventory)
    if dropped:
        log.warning("%d sample(s) hold the raw content of an earlier one: rejected as duplicates", dropped)
    log.info(
        "found %d complete samples under %s (%s); %d input(s) rejected at discovery",
        len(inventory.samples),
        inventory.root,
        inventory.split_counts(),
        inventory.rejected,
    )
    if inventory.unclaimed:
        log.warning(
            "%d file(s) under %s are taken by no glob of the spec (e.g. %s): not part of the dataset",
            inventory.unclaimed,
            inventory.root,
            ", ".join(inventory.unclaimed_examples),
        )
    return inventory


def fingerprint_inputs(spec: DatasetSpec, inventory: Inventory) -> Inputs:
    inputs = inputs_of(spec, inventory)
    if inputs.deferred:
        log.info("no version made under these field rules: the raw files are hashed as they are cleaned")
    else:
        log.info("hashed the raw files of %d samples in %.2f s", len(inputs.samples), inputs.hash_seconds)
    return inputs


def unchanged_version(spec: DatasetSpec, inputs: Inputs) -> int | None:
    """The latest version, when it was built from these very inputs and rules (nothing to publish)."""
    number = unchanged_since(spec.output.dir, inputs)
    if number is not None:
        log.info("unchanged since v%04d: same raw inputs and field rules; nothing published", number)
    return number


def counts_in(path: Path) -> dict[str, int]:
    """The samples of each split of a published version."""
    with h5py.File(os.path.realpath(path), "r") as f:
        return counts_of(f)


def stage_version(spec: DatasetSpec) -> Candidate:
    candidate = versions.stage(spec.output.dir)
    log.info(
        "writing %s (parent: %s)", version_name(candidate.number), candidate.parent and version_name(candidate.parent)
    )
    return candidate


def clean_and_write(
    spec: DatasetSpec,
    inventory: Inventory,
    candidate: Candidate,
    inputs: Inputs | None,
    runner: Runner,
    cluster: ClusterAhead | None = None,
) -> WriteSummary:
    with runner.progress(len(inventory.samples), "clean+write") as display:
        summary = steps.write_version(spec, inventory, candidate, display.advance, display.status, inputs, cluster)
    log.info(
        "wrote %d samples %s, %d rejected, compression ratio %.3f",
        summary.samples,
        summary.counts,
        summary.rejected,
        summary.compression_ratio,
    )
    return summary


def leaks_found(spec: DatasetSpec, inventory: Inventory, inputs: Inputs, summary: WriteSummary) -> list[str]:
    """Warnings for the raw inputs the published samples share across splits or labels
    (``_ingest.leaks``), found by the digests the build made once its samples are cleaned."""
    rejected = {r.sample_id for r in summary.rejections}
    kept = [ref for ref in inventory.samples if ref.id not in rejected]
    found = leak_warnings(build_leaks(spec, inventory.root, kept, inputs.hexes))
    for line in found:
        log.warning("%s", line)
    return found


def samples_leaving(spec: DatasetSpec, candidate: Candidate) -> list[str]:
    leaving = check_removals(spec, candidate)
    if leaving:
        assert candidate.parent is not None  # samples leave only a parent version
        log.warning(
            "%d sample(s) of %s leave latest (output.allow_removals): %s",
            len(leaving),
            version_name(candidate.parent),
            named(leaving),
        )
    return leaving


def verify_candidate(
    candidate: Candidate, summary: WriteSummary, cluster: ClusterAhead | None = None, found: Sequence[str] = ()
) -> HealthReport:
    """Verify the written candidate, its checksums on the workers that cleaned it while they are up:
    every row's, or the summary's ``checksum_sample`` rows of each split. The build's own warnings
    (``found``, logged already) join the report's. A failed report is written at once (nothing
    will be published); a passing one after the publish (``report_health``)."""
    executor = cluster.executor() if cluster is not None else None
    files = [candidate.partial, *(sorted(candidate.rows_folder.iterdir()) if candidate.rows_folder.is_dir() else [])]
    with versions.flushing(files):  # written to the disk while verify reads them: the publish's fsync waits less
        report = verify_file(
            candidate.partial, checksum_sample=summary.checksum_sample, executor=executor, walk_heap=False
        )
    log_report(report)
    report.warnings.extend(found)
    if not report.ok:
        write_health(candidate.out, candidate.number, report)
    return report


def publish_version(candidate: Candidate, report: HealthReport) -> str:
    """Publish a verified candidate; a failed one is deleted and latest stays where it was."""
    if not report.ok:
        candidate.discard()
        raise VerificationFailed(report.errors)
    path = str(publish(candidate))
    log.info("published %s; dataset_latest.h5 now points at it", path)
    return path


def apply_retention(spec: DatasetSpec) -> list[str]:
    removed = versions.retain(spec.output.dir, spec.output.keep, spec.output.retire_after_seconds)
    if removed:
        log.info("retention (keep %d): removed %s", spec.output.keep, ", ".join(p.name for p in removed))
    return [str(p) for p in removed]
