"""Foreground flow runs (the CLI's build and append) send no heartbeats unless asked to, so they do
not wait for Prefect's heartbeat thread at their end; other runs keep Prefect's default."""

from __future__ import annotations

import threading

import pytest
from prefect import flow
from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, get_current_settings, temporary_settings

from h5forge.flows.foreground import foreground_run

pytestmark = pytest.mark.e2e  # real flow runs on the session's Prefect server


@flow
def heartbeat_seen_by_the_run() -> int | None:
    return get_current_settings().flows.heartbeat_frequency


def heartbeat_threads() -> int:
    """Live threads running Prefect's heartbeat loop (the thread a run joins at its end)."""
    return sum(any(getattr(a, "__name__", "") == "heartbeat_loop" for a in getattr(t, "_args", ()))
               for t in threading.enumerate())


@flow
def heartbeat_threads_during_the_run() -> int:
    return heartbeat_threads()


def test_a_foreground_run_sends_no_heartbeats_and_does_not_wait_for_their_thread(prefect_server):
    assert heartbeat_seen_by_the_run() == 180  # Prefect's default, for every other run
    assert heartbeat_threads_during_the_run() == 1  # ...with its heartbeat thread, joined at the end
    with foreground_run():
        assert heartbeat_seen_by_the_run() is None
        # no heartbeat thread is started, so the run's end has none to wait for
        assert heartbeat_threads_during_the_run() == 0
    assert heartbeat_seen_by_the_run() == 180  # only inside the block
    assert heartbeat_threads() == 0  # the default runs' threads ended with their runs


def test_a_heartbeat_frequency_the_user_set_is_kept(prefect_server):
    with temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: 60}), foreground_run():
        assert heartbeat_seen_by_the_run() == 60
