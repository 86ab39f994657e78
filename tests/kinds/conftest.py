"""Building small datasets straight through the library (no Prefect) for the kind tests."""

from __future__ import annotations

import pytest


@pytest.fixture
def build_spec():
    """``build_spec(dict) -> (path of the published version, write summary)``."""
    from h5forge.ingest.build import publish_candidate, verify_candidate, write_version
    from h5forge.ingest.discover import discover
    from h5forge.spec import DatasetSpec
    from h5forge.store.versions import stage

    def build(data: dict):
        spec = DatasetSpec.model_validate(data)
        cand = stage(spec.output.dir)
        summary = write_version(spec, discover(spec), cand)
        report = verify_candidate(cand)
        assert report.ok, report.errors
        return publish_candidate(cand, report), summary

    return build
