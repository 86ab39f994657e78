"""Fixtures of the store tests: a built v1 with its spec file and inbox, for appending."""

import pytest

from tests.helpers.data import write_spec_file


@pytest.fixture
def dataset(prefect_server, raw_demo, tmp_path):
    """A built v1 and its spec file; the inbox is tmp_path/inbox."""
    from h5forge.flows.build import build_dataset

    spec_file = write_spec_file(raw_demo, tmp_path / "out", tmp_path / "spec.yaml", inbox=tmp_path / "inbox")
    build_dataset(str(spec_file))
    return spec_file, tmp_path / "out", tmp_path / "inbox"
