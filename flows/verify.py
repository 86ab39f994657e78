"""verify-dataset: full verification of the latest version (``h5forge._pipeline.verify``)."""

from __future__ import annotations

from prefect import flow

from h5forge._pipeline import verify
from h5forge.spec import load_spec
from h5forge._store.verify import HealthReport
from h5forge.flows.paths import absolute_in_deployment_runs
from h5forge.tasks import PrefectRunner


@flow(name="verify-dataset")
def verify_dataset(spec_path: str, output: str | None = None) -> HealthReport:
    """Recompute every checksum of the latest version; the run fails if the dataset is broken."""
    absolute_in_deployment_runs(spec_path=spec_path, output=output)
    spec = load_spec(spec_path, output=output)
    with PrefectRunner() as runner:
        return verify(spec.output.dir, name=spec.name, runner=runner)
