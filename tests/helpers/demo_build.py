"""A published version of config/demo.yaml over a raw folder, built by the pipeline (no Prefect)."""

from __future__ import annotations

from pathlib import Path

import yaml

from tests.helpers.data import REPO, TESTS_MAX_REJECTED


def build_demo(raw: Path, out: Path, **overrides) -> str:
    """``h5forge.build`` of the demo spec over ``raw`` into ``out``; returns the published file's path."""
    import h5forge
    from h5forge.spec import DatasetSpec

    data = yaml.safe_load((REPO / "config" / "demo.yaml").read_text())
    data["source"] = {"root": str(raw)}
    data["output"]["dir"] = str(out)
    data["max_rejected"] = TESTS_MAX_REJECTED
    data.update(overrides)
    return h5forge.build(DatasetSpec.model_validate(data)).path
