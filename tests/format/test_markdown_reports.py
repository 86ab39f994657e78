"""Ids, paths, labels and reasons from users' files stay text in every Markdown report: rendered
by a real Markdown parser (markdown-it, CommonMark + tables as the Prefect UI renders them), they
make no HTML element, no link or image, and no extra table cell or row."""

from __future__ import annotations

import re

from markdown_it import MarkdownIt

from h5forge._format import markdown
from h5forge._samples import Rejection
from h5forge._store.reports import write_quarantine
from h5forge._store.verify import HealthReport
from h5forge._views.diff import VersionDiff

HOSTILE = ['<img src=x onerror="alert(1)">', "a|b|c", "line\nbreak", "cr\rinside", "sep\u2028arated",
           "[click](javascript:alert(1))", "![i](http://example.invalid/p.png)", "`code` *em* _u_", "back\\slash|"]


def _html(md: str) -> str:
    return MarkdownIt("commonmark").enable("table").render(md)


def _no_markup(html: str) -> None:
    tags = set(re.findall(r"<([a-z0-9]+)", html))
    assert tags <= {"h1", "h2", "p", "strong", "table", "thead", "tbody", "tr", "th", "td", "ul", "li"}, tags
    assert "javascript:" not in html or "<a " not in html


def _cells(html: str) -> list[list[str]]:
    rows = re.findall(r"<tr>(.*?)</tr>", html, flags=re.S)
    return [re.findall(r"<t[hd][^>]*>(.*?)</t[hd]>", r, flags=re.S) for r in rows]


def test_each_hostile_value_is_one_cell_shown_as_written():
    md = "| value |\n|---|\n" + "\n".join(f"| {markdown.text(v)} |" for v in HOSTILE) + "\n"
    html = _html(md)
    _no_markup(html)
    cells = _cells(html)
    assert len(cells) == 1 + len(HOSTILE) and all(len(r) == 1 for r in cells)
    import html as htmllib

    shown = [htmllib.unescape(r[0]) for r in cells[1:]]
    for value, seen in zip(HOSTILE, shown):
        assert seen == re.sub(r"[\n\r\u2028]", lambda m: f"\\u{ord(m.group()):04x}", value)


def test_the_quarantine_report_keeps_its_table(tmp_path):
    rejections = [Rejection(v, (f"images/{v}.png",), f"bad: {v}") for v in HOSTILE]
    [_, md] = write_quarantine(tmp_path, 1, rejections)
    html = _html(md.read_text())
    _no_markup(html)
    cells = _cells(html)
    assert len(cells) == 1 + len(HOSTILE) and all(len(r) == 4 for r in cells)


def test_the_health_report_and_the_diff_keep_their_structure():
    report = HealthReport(path="/out/dataset_v0001.h5")
    for v in HOSTILE:
        report.error("checksums", f"sample {v}: differs")
    report.warnings.append(HOSTILE[0])
    html = _html(report.to_markdown())
    _no_markup(html)
    assert html.count("<li>") == len(HOSTILE) + 1
    diff = VersionDiff(old={"path": "a.h5", "version": 1}, new={"path": "b.h5", "version": 2},
                       added=list(HOSTILE), columns_changed={v: {"label": [v, "cat"]} for v in HOSTILE},
                       labels={"label": {v: {"old": 0, "new": 1, "change": 1} for v in HOSTILE}})
    html = _html(diff.to_markdown())
    _no_markup(html)
    column_rows = [r for r in _cells(html) if len(r) == 4]
    assert all(len(r) == 4 for r in _cells(html) if len(r) > 2)
    assert len(column_rows) >= 2 * len(HOSTILE)
