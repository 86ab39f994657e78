"""The production deployments of one dataset, for `h5forge serve` (prefect.yaml holds the same for
`prefect deploy --all` + a process worker).

build-dataset/nightly   full, compact rebuild on a cron schedule (default 02:00, explicit time zone)
append-samples/inbox    append what waits in the inbox; polls on an interval when no watcher runs
verify-dataset/weekly   recompute every checksum of the latest version
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect.flows import EntrypointType
from prefect.schedules import Cron, Interval

from h5forge.flows.append import append_samples
from h5forge.flows.build import build_dataset
from h5forge.flows.verify import verify_dataset

NIGHTLY_CRON = "0 2 * * *"
WEEKLY_CRON = "0 3 * * 0"

# When another run writes the same output folder (an append, a manual build): the nightly waits
# for it up to an hour, then fails, so a rebuild that did not happen shows as a failed run; the
# inbox poll skips at once, as its next poll takes what waits. prefect.yaml says the same.
NIGHTLY_WHEN_BUSY = {"wait_for_lock": 3600, "skip_if_busy": False}
INBOX_WHEN_BUSY = {"wait_for_lock": 0, "skip_if_busy": True}


def dataset_deployments(
    spec_path: str | Path,
    output: str | None = None,
    dask_address: str | None = None,
    timezone: str = "UTC",
    nightly_cron: str = NIGHTLY_CRON,
    poll_seconds: float = 300,
    weekly_cron: str = WEEKLY_CRON,
    suffix: str = "",
) -> list:
    """``suffix`` tells apart the deployments of several datasets served by one Prefect server."""
    spec = str(Path(spec_path).expanduser().resolve())  # runs start in other working directories
    common = {"spec_path": spec, "output": None if output is None else str(Path(output).expanduser().resolve())}
    # module entrypoints: the runner imports flows.* from the installed package, from any directory
    opts: dict[str, Any] = {"entrypoint_type": EntrypointType.MODULE_PATH, "concurrency_limit": 1, "tags": ["h5forge"]}
    return [
        build_dataset.to_deployment(
            name=f"nightly{suffix}",
            schedules=[Cron(nightly_cron, timezone=timezone)],
            parameters={**common, "dask_address": dask_address, **NIGHTLY_WHEN_BUSY},
            description="Full rebuild into a compact, verified version",
            **opts,
        ),
        append_samples.to_deployment(
            name=f"inbox{suffix}",
            schedules=[Interval(poll_seconds, timezone=timezone)],
            parameters={**common, "dask_address": dask_address, **INBOX_WHEN_BUSY},
            description="Append the samples waiting in the inbox (polling fallback of `h5forge watch`)",
            **opts,
        ),
        verify_dataset.to_deployment(
            name=f"weekly{suffix}",
            schedules=[Cron(weekly_cron, timezone=timezone)],
            parameters=common,
            description="Recompute every checksum of the latest version",
            **opts,
        ),
    ]
