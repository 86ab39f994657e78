"""Report files beside the versions: the quarantine list and the health report of each version."""

from __future__ import annotations

import json
from pathlib import Path

from h5forge.store.verify import HealthReport


def write_quarantine(out: Path, tag: str, rows: list[dict]) -> list[Path]:
    """``<out>/quarantine/<tag>.rejections.json`` and ``.md``: every rejected input and why.

    ``rows`` are ``Rejection.as_dict()`` records.
    """
    folder = out / "quarantine"
    folder.mkdir(parents=True, exist_ok=True)
    js = folder / f"{tag}.rejections.json"
    js.write_text(json.dumps(rows, indent=1, ensure_ascii=False))
    md = folder / f"{tag}.rejections.md"
    lines = [f"# Rejected inputs: {tag}", "", f"{len(rows)} input(s) were not added.", "",
             "| sample | file | stage | reason |", "|---|---|---|---|"]
    lines += [f"| {r['sample_id']} | {r['path']} | {r['stage']} | {r['reason'].replace('|', '/')} |" for r in rows]
    md.write_text("\n".join(lines) + "\n")
    return [js, md]


def write_health(out: Path, tag: str, report: HealthReport) -> list[Path]:
    """``<out>/reports/<tag>.health.json`` and ``.md``."""
    folder = out / "reports"
    folder.mkdir(parents=True, exist_ok=True)
    js, md = folder / f"{tag}.health.json", folder / f"{tag}.health.md"
    js.write_text(report.to_json())
    md.write_text(report.to_markdown())
    return [js, md]
