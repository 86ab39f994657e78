"""build-dataset: spec -> discover -> clean on dask -> write -> verify -> publish -> report."""

from __future__ import annotations

from prefect import flow, get_run_logger
from prefect.utilities.annotations import quote

from h5forge.flows.results import BuildResult
from h5forge.format.names import version_name
from h5forge.ingest.rejected import check_rejected
from h5forge.spec import load_spec
from h5forge.store.output import claim_output, preflight
from h5forge.store.versions import output_lock_or_skip
from h5forge.tasks.artifacts import publish_artifacts, publish_diff, publish_preview
from h5forge.tasks.build import (apply_retention, clean_and_write, discover_samples, fingerprint_inputs,
                                 publish_version, stage_version, unchanged_version, verify_candidate)


@flow(name="build-dataset")
def build_dataset(spec_path: str, output: str | None = None, dask_address: str | None = None,
                  wait_for_lock: float = 0, skip_if_busy: bool = False) -> BuildResult:
    """Full rebuild of the dataset described by ``spec_path`` into a new published version.

    Args:
        spec_path: the dataset spec (YAML).
        output: output folder; default: the spec's ``output.dir``.
        dask_address: tcp://host:port of an existing dask scheduler; default: a LocalCluster.
        wait_for_lock: seconds to wait while another run writes the same output folder; when
            the wait is over the run fails, unless ``skip_if_busy``.
        skip_if_busy: when the folder is still busy after ``wait_for_lock``, end the run without
            building (logged as "skipped: …") instead of failing.
    """
    spec = load_spec(spec_path, output=output, dask_address=dask_address)
    preflight(spec)  # sources exist, the output folder is outside them and is this dataset's
    with output_lock_or_skip(spec.output.dir, f"build-dataset {spec.name}", wait_for_lock, skip_if_busy) as busy:
        if busy:
            get_run_logger().warning("skipped: %s", busy)
            return BuildResult(spec.name, skipped=busy)
        claim_output(spec.output.dir, spec.name)
        inventory = discover_samples(spec)
        inputs = fingerprint_inputs(spec, quote(inventory))
        same = unchanged_version(spec, quote(inputs))
        if same is not None:  # same raw inputs, same rules: a new version would be a copy
            return BuildResult(spec.name, same, str(spec.output.dir / version_name(same)), unchanged=True)
        candidate = stage_version(spec)
        # quote: Prefect would otherwise walk every sample of the inventory looking for futures
        summary = clean_and_write(spec, quote(inventory), candidate, quote(inputs))
        check_rejected(spec, inventory, summary, candidate)  # above max_rejected: nothing is published
        report = verify_candidate(candidate)
        publish_artifacts(spec.name, report, quote(summary), candidate.number)
        published = publish_version(candidate, report)
        publish_diff(spec.name, candidate)
        publish_preview(spec.name, published, candidate.number)
        removed = apply_retention(spec)
    return BuildResult(spec.name, candidate.number, published, summary.counts, summary.rejected,
                       summary.compression_ratio, summary.timings, report.checks, removed)
