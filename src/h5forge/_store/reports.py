"""Report files beside the versions: the quarantine list and the health report of each version."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Sequence

from h5forge._format import markdown
from h5forge._format.names import QUARANTINE_DIR, REPORTS_DIR, version_name, version_tag
from h5forge._format.summary import bounded_rows
from h5forge._samples import Rejection
from h5forge._store.verify import HealthReport
from h5forge._store.whole_files import replace_file


def write_quarantine(out: Path, number: int, rejections: Sequence[Rejection]) -> list[Path]:
    """``<out>/quarantine/dataset_vNNNN.rejections.json`` and ``.md``: every rejected input and why."""
    folder = out / QUARANTINE_DIR
    folder.mkdir(parents=True, exist_ok=True)
    tag = version_tag(number)
    rows = [r.as_dict() for r in rejections]
    js = folder / f"{tag}.rejections.json"
    replace_file(js, json.dumps(rows, indent=1, ensure_ascii=False))
    md = folder / f"{tag}.rejections.md"
    lines = [
        f"# Rejected inputs: {tag}",
        "",
        f"{sum(r.count for r in rejections)} input(s) were not added.",
        "",
        "| sample | file | stage | reason |",
        "|---|---|---|---|",
    ]
    lines += [
        f"| {markdown.text(r['sample_id'])} | {markdown.text(r['path'])} | {r['stage']} | "
        f"{markdown.text(r['reason'])} |"
        for r in bounded_rows(rejections)
    ]
    replace_file(md, "\n".join(lines) + "\n")
    return [js, md]


def write_health(out: Path, number: int, report: HealthReport, run: str = "") -> list[Path]:
    """``<out>/reports/dataset_vNNNN[.run][.failed].health.json`` and ``.md``.

    Both name the version as published, whatever file was verified (the candidate's temporary
    name, or ``dataset_latest.h5``)."""
    folder = out / REPORTS_DIR
    folder.mkdir(parents=True, exist_ok=True)
    report = replace(report, path=str(out / version_name(number)))
    tag = version_tag(number) + (f".{run}" if run else "") + ("" if report.ok else ".failed")
    js, md = folder / f"{tag}.health.json", folder / f"{tag}.health.md"
    replace_file(js, report.to_json())
    replace_file(md, report.to_markdown())
    return [js, md]
