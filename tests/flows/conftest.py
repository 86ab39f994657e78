"""Only the tests here and in tests/deployments run Prefect: they share the session's one test server."""

import pytest

from tests.helpers import prefect_server as server


@pytest.fixture(scope="session")
def prefect_server(request):
    """The session's Prefect test server (tests/helpers/prefect_server.py), started on first use."""
    server.start(request.config)
