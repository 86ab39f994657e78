"""Start an append as a deployment run on a Prefect server (what `h5forge watch --deployment` does)."""

from __future__ import annotations

from pathlib import Path
from typing import cast

import httpx
from prefect.client.schemas.objects import FlowRun
from prefect.deployments import run_deployment

from h5forge.errors import H5forgeError, UsageError


def check_append_deployment(deployment: str, spec_path: str | Path) -> None:
    """``deployment`` exists, runs append-samples, and appends the dataset of ``spec_path``: the inbox
    handed to it must not go into the versions of another spec's dataset."""
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound
    from prefect.settings import PREFECT_API_URL

    with get_client(sync_client=True) as client:
        try:
            dep = client.read_deployment_by_name(deployment)
        except httpx.TransportError as err:  # nothing answers there
            raise H5forgeError(f"cannot reach the Prefect server at {PREFECT_API_URL.value()}: {err}") from None
        except ObjectNotFound:
            raise UsageError(
                f"no deployment {deployment!r} on the Prefect server at {PREFECT_API_URL.value()}"
            ) from None
        flow = client.read_flow(dep.flow_id).name
    if flow != "append-samples":
        raise UsageError(f"the deployment {deployment!r} runs the flow {flow!r}, not append-samples")
    theirs = (dep.parameters or {}).get("spec_path")
    if theirs is not None and Path(str(theirs)).expanduser().resolve() != Path(spec_path).expanduser().resolve():
        raise UsageError(
            f"the deployment {deployment!r} appends with the spec {theirs}, not {spec_path}; serve this spec's "
            "deployments (h5forge serve, with --suffix) and name its append deployment"
        )


def trigger_append(deployment: str, inbox: Path, output: str | None = None, dask_address: str | None = None) -> int:
    """Schedule one run of ``deployment`` for ``inbox`` and return at once (0: nothing known to wait)."""
    parameters = {"inbox": str(inbox)}
    if output is not None:
        parameters["output"] = str(Path(output).expanduser().resolve())  # the run's working folder is not ours
    if dask_address is not None:
        parameters["dask_address"] = dask_address
    run = cast(FlowRun, run_deployment(name=deployment, parameters=parameters, timeout=0))  # called sync
    print(f"scheduled flow run {run.name} of {deployment} for {inbox}")
    return 0
