"""Foreground flow runs (the CLI's build and append) send no heartbeats unless asked to, so they do
not wait for Prefect's heartbeat thread at their end; other runs keep Prefect's default."""

from __future__ import annotations

import time

import pytest
from prefect import flow
from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, get_current_settings, temporary_settings

from h5forge.flows.foreground import foreground_run

pytestmark = pytest.mark.e2e  # real flow runs on the session's Prefect server


@flow
def heartbeat_seen_by_the_run() -> int | None:
    return get_current_settings().flows.heartbeat_frequency


def test_a_foreground_run_sends_no_heartbeats_and_does_not_wait_for_their_thread(prefect_server):
    assert heartbeat_seen_by_the_run() == 180  # Prefect's default, for every other run
    with foreground_run():
        started = time.perf_counter()
        assert heartbeat_seen_by_the_run() is None
        took = time.perf_counter() - started
    assert heartbeat_seen_by_the_run() == 180  # only inside the block
    # the heartbeat thread sleeps in 1 s steps and is joined at the run's end: a run that never
    # starts it ends without that wait (an empty run took 0.1-0.3 s here, 1.1 s with it)
    started = time.perf_counter()
    heartbeat_seen_by_the_run()
    with_heartbeats = time.perf_counter() - started
    assert with_heartbeats >= 0.9 and took < with_heartbeats


def test_a_heartbeat_frequency_the_user_set_is_kept(prefect_server):
    with temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: 60}), foreground_run():
        assert heartbeat_seen_by_the_run() == 60
