"""Start an append as a deployment run on a Prefect server (what `h5forge watch --deployment` does)."""

from __future__ import annotations

from pathlib import Path
from typing import cast

from prefect.client.schemas.objects import FlowRun
from prefect.deployments import run_deployment


def trigger_append(deployment: str, inbox: Path) -> int:
    """Schedule one run of ``deployment`` for ``inbox`` and return at once (0: nothing known to wait)."""
    run = cast(FlowRun, run_deployment(name=deployment, parameters={"inbox": str(inbox)}, timeout=0))  # called sync
    print(f"scheduled flow run {run.name} of {deployment} for {inbox}")
    return 0
