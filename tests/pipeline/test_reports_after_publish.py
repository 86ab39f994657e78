"""The reports of a build (health report files and artifacts, diff, preview) are made after the
version is published: one that cannot be made is a warning, and the version stays published."""

from __future__ import annotations

import logging

import h5forge
from h5forge._store.versions import latest
from tests.helpers.data import demo_spec


def test_reports_that_cannot_be_written_leave_the_build_published(tmp_path, raw_demo, caplog):
    out = tmp_path / "out"
    out.mkdir()
    (out / "reports").write_text("a file where the reports folder goes")
    with caplog.at_level(logging.WARNING, logger="h5forge"):
        result = h5forge.build(demo_spec(raw_demo, out))
    assert result.version == 1 and latest(out) == 1
    assert result.health["checksums"].startswith("ok (") and sum(result.counts.values()) == 40
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(m.startswith("the health report of the published version was not made: ") for m in warned), warned
    assert any(m.startswith("no preview: ") for m in warned), warned
