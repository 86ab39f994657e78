"""Retention never deletes a file that a kept version reads: with ``keep: 2`` and
``retire_after_seconds: 0``, four one-sample appends (each followed by retention) leave latest
HEALTHY, every delta it reads present, and a fifth append and a rollback still work."""

from __future__ import annotations

from pathlib import Path

import subprocess
import sys

import yaml

import h5forge
from h5forge._store.thin import row_files_of
from h5forge._store.verify import verify_file
from h5forge._store.versions import latest, published
from tests.helpers.data import REPO, age_files, drop_samples
from tests.helpers.files import make_raw


def spec_file(tmp_path: Path, raw: Path) -> Path:
    data = yaml.safe_load((REPO / "config" / "demo.yaml").read_text())
    data["source"] = {"root": str(raw), "inbox": str(tmp_path / "inbox")}
    data["output"] = {"dir": str(tmp_path / "out"), "keep": 2, "retire_after_seconds": 0}
    data["fields"]["images"]["size"] = [64, 64]
    data["append"] = {"settle_seconds": 0}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_one_sample_appends_under_tight_retention_keep_every_file_latest_reads(tmp_path):
    raw = make_raw(tmp_path / "raw", n=12, seed=1)
    spare = make_raw(tmp_path / "spare", n=6, seed=8)
    spec = spec_file(tmp_path, raw)
    out = tmp_path / "out"
    h5forge.build(spec)
    for k in range(5):
        drop_samples(spare, tmp_path / "inbox", [f"cell_{k:06d}"], rename="new_")
        age_files(tmp_path / "inbox")
        result = h5forge.append(spec)
        assert result.version == k + 2 and result.added == 1
        link = out / "dataset_latest.h5"
        report = verify_file(link, resample=0, latency_reads=0)
        assert report.ok, report.errors
        assert all((out / s["file"]).is_file() for s in row_files_of(link))
        assert sum(result.counts.values()) == 12 + k + 1
    assert sorted(published(out)) == [1, 5, 6]  # the base the kept thin versions read stays too
    assert [s["file"] for s in row_files_of(out / "dataset_v0006.h5")] == [
        "dataset_v0001.h5", *[f"dataset_v{v:04d}.delta.h5" for v in range(2, 7)]]
    cli = Path(sys.executable).parent / "h5forge"
    done = subprocess.run([str(cli), "rollback", str(out), "v0005"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert latest(out) == 5 and verify_file(out / "dataset_latest.h5", resample=0, latency_reads=0).ok
