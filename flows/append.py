"""append-samples: the pipeline's append (``h5forge._pipeline.append``), each step a Prefect task."""

from __future__ import annotations

from prefect import flow

from h5forge._pipeline import append
from h5forge._pipeline.results import AppendResult
from h5forge.flows.paths import absolute_in_deployment_runs
from h5forge.tasks import PrefectRunner


@flow(name="append-samples")
def append_samples(
    spec_path: str,
    inbox: str | None = None,
    output: str | None = None,
    dask_address: str | None = None,
    wait_for_lock: float = 0,
    skip_if_busy: bool = False,
) -> AppendResult:
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
    absolute_in_deployment_runs(spec_path=spec_path, inbox=inbox, output=output)
    with PrefectRunner() as runner:
        return append(
            spec_path,
            inbox=inbox,
            output=output,
            dask_address=dask_address,
            wait_for_lock=wait_for_lock,
            skip_if_busy=skip_if_busy,
            runner=runner,
        )
