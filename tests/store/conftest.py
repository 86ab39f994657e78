"""Fixtures of the store's tests."""

from __future__ import annotations

import pytest

from tests.helpers.files import make_version


@pytest.fixture
def four_versions(tmp_path, small_inventory, raw_demo):
    """An output folder of four published versions of the small demo inventory."""
    out = tmp_path / "out"
    for _ in range(4):
        make_version(out, small_inventory, raw_demo)
    return out
