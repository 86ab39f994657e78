"""Outside tests/flows and tests/deployments Prefect is pointed at a port nobody listens on, from a
module's fixtures on (tests/conftest.py), so no test here can reach or start a Prefect server."""

import os

import pytest

from tests.conftest import NO_PREFECT_SERVER


@pytest.fixture(scope="module")
def api_url_in_a_module_fixture():
    return os.environ.get("PREFECT_API_URL")


def test_prefect_is_pointed_nowhere_in_tests_and_their_module_fixtures(api_url_in_a_module_fixture):
    assert api_url_in_a_module_fixture == os.environ["PREFECT_API_URL"] == NO_PREFECT_SERVER
