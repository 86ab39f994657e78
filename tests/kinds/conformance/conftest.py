"""Fixtures of the kind conformance suite: ``example`` is parametrized over every registered kind."""

from __future__ import annotations

import pytest

from h5forge.kinds import REGISTRY
from tests.kinds.conformance.examples import Examples


@pytest.fixture(scope="session")
def examples(tmp_path_factory) -> Examples:
    return Examples(tmp_path_factory.mktemp("kinds"))


@pytest.fixture(params=list(REGISTRY))
def kind_name(request) -> str:
    return request.param


@pytest.fixture
def example(examples, kind_name):
    return examples.built(kind_name)
