"""A published version of config/demo.yaml over a raw folder, built by the library (no Prefect)."""

from __future__ import annotations

from pathlib import Path

import yaml

from tests.helpers.data import REPO


def build_demo(raw: Path, out: Path, **overrides) -> str:
    """Discover, write, verify and publish; returns the published file's path."""
    from h5forge.ingest.build import publish_candidate, verify_candidate, write_version
    from h5forge.ingest.discover import discover
    from h5forge.spec import DatasetSpec
    from h5forge.store.versions import stage

    data = yaml.safe_load((REPO / "config" / "demo.yaml").read_text())
    data["source"] = {"root": str(raw)}
    data["output"]["dir"] = str(out)
    data.update(overrides)
    spec = DatasetSpec.model_validate(data)
    cand = stage(spec.output.dir)
    write_version(spec, discover(spec), cand)
    return publish_candidate(cand, verify_candidate(cand))
