"""build-dataset: the pipeline's build (``h5forge._pipeline.build``), each step a Prefect task."""

from __future__ import annotations

from prefect import flow

from h5forge._pipeline import build
from h5forge._pipeline.results import BuildResult
from h5forge.flows.paths import absolute_in_deployment_runs
from h5forge.tasks import PrefectRunner


@flow(name="build-dataset")
def build_dataset(
    spec_path: str,
    output: str | None = None,
    dask_address: str | None = None,
    wait_for_lock: float = 0,
    skip_if_busy: bool = False,
) -> BuildResult:
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
    absolute_in_deployment_runs(spec_path=spec_path, output=output)
    with PrefectRunner() as runner:
        return build(
            spec_path,
            output=output,
            dask_address=dask_address,
            wait_for_lock=wait_for_lock,
            skip_if_busy=skip_if_busy,
            runner=runner,
        )
