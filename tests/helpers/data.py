"""Specs and raw input for the tests: the demo spec pointed at temporary folders, inbox drops."""

from __future__ import annotations

import shutil
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent.parent
# the tests' raw_demo holds every defect beside only 40 good samples: 10 of 50 inputs (20 %), above
# the demo spec's limit; the specs the tests build from it take a quarter
TESTS_MAX_REJECTED = 0.25


def demo_spec(raw: Path, out: Path, **storage):
    """The demo spec pointed at ``raw`` and ``out``."""
    from h5forge.spec import load_spec, override

    spec = load_spec(REPO / "config" / "demo.yaml")
    spec = spec.model_copy(update={"source": spec.source.model_copy(update={"root": raw.resolve()})})
    if storage:
        spec = spec.model_copy(update={"storage": spec.storage.model_copy(update=storage)})
    return override(spec.model_copy(update={"max_rejected": TESTS_MAX_REJECTED}), output=out)


def write_spec_file(raw: Path, out: Path, path: Path, inbox: Path | None = None, append: dict | None = None,
                    **compute) -> Path:
    """A YAML spec file like config/demo.yaml, pointed at ``raw``, ``out`` and ``inbox``."""
    import yaml

    data = yaml.safe_load((REPO / "config" / "demo.yaml").read_text())
    data["source"]["root"] = str(raw)
    data["source"]["inbox"] = str(inbox or path.parent / "inbox")
    data["output"]["dir"] = str(out)
    data["compute"] = {**data.get("compute", {}), **compute}
    data["append"] = {"settle_seconds": 0.5, "batch_window_seconds": 0.5, "poll_seconds": 2, **(append or {})}
    data["max_rejected"] = TESTS_MAX_REJECTED
    path.write_text(yaml.safe_dump(data))
    return path


def drop_samples(src_raw: Path, inbox: Path, ids: list[str], rename: str = "") -> list[str]:
    """Copy samples of a raw folder into an inbox as a user would (temp name, then rename).

    Each sample gets a ``<id>.json`` sidecar record; ``rename`` prefixes the new ids.
    """
    import json
    import os

    records = {r["id"]: r for r in json.loads((src_raw / "annotations.json").read_text())}
    new_ids = []
    for sid in ids:
        new = rename + sid
        for folder in ("images", "masks"):
            (inbox / folder).mkdir(parents=True, exist_ok=True)
            tmp = inbox / folder / f".{new}.png.tmp"
            shutil.copy(src_raw / folder / f"{sid}.png", tmp)
            os.replace(tmp, inbox / folder / f"{new}.png")
        (inbox / f"{new}.json").write_text(json.dumps({**records[sid], "id": new}))
        new_ids.append(new)
    return new_ids


def age_files(folder: Path, seconds: float = 10) -> None:
    """Backdate mtimes so the inbox settle delay is over without sleeping."""
    import os
    import time

    past = time.time() - seconds
    for p in folder.rglob("*"):
        if p.is_file():
            os.utime(p, (past, past))
