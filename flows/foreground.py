"""Settings for a flow run that its caller waits for in its own process (``h5forge build`` and
``h5forge append`` on the command line).

Prefect 3.9 emits a flow-run heartbeat event every ``flows.heartbeat_frequency`` seconds (180 by
default) from a thread that sleeps in 1 s steps, and joins that thread when the run ends: every run
waits up to 1 s (0.5 s on average) for nothing. The heartbeats only matter to an automation that
marks silent runs as crashed, and a foreground command's user sees its crash on the console. So a
foreground run sends none unless the heartbeat frequency was set explicitly (environment, profile or
prefect.toml); runs of deployments (the nightly build, watch folders) never come through here and
keep Prefect's default.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator


@contextmanager
def foreground_run() -> Iterator[None]:
    from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, get_current_settings, temporary_settings

    if "heartbeat_frequency" in get_current_settings().flows.model_fields_set:  # the user asked for them
        yield
        return
    with temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}):
        yield
