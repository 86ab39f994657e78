"""The paths a flow run is given: a deployment run starts in the working folder of whatever runs it
(`h5forge serve`, a worker), never in the one of the user who asked for it, so a relative path there
would name a folder nobody meant."""

from __future__ import annotations

from pathlib import Path

from h5forge.errors import UsageError


def absolute_in_deployment_runs(**paths: str | None) -> None:
    """Refuse a relative path among ``paths`` (parameter name -> value) when the run is a deployment's."""
    from prefect.runtime import deployment

    if deployment.id is None:  # called in-process (the CLI, a notebook): the caller's working folder
        return
    for name, value in paths.items():
        if value is not None and not Path(value).expanduser().is_absolute():
            raise UsageError(
                f"parameter {name}={value!r} is a relative path; a deployment run starts in the working folder of "
                f"the process that runs it ({Path.cwd()}), not yours: give an absolute path"
            )
