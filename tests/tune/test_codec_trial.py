"""``h5forge codecs``: the table's stored/raw against a direct measurement (the same samples written
by hand with h5py and that codec), the recommendation rule, and the command end to end."""

from __future__ import annotations

import os
import re
import sys

import h5py
import hdf5plugin
import numpy as np
import pytest
from PIL import Image
from typer.testing import CliRunner

from h5forge._cli import app
from h5forge.errors import UsageError
from h5forge._format.codecs import CODECS
from h5forge._format.layout import decode_str
from h5forge._tune.codec_trial import CodecResult, recommend, spec_for, trial, with_codec
from tests.helpers.data import REPO
from tests.helpers.demo_build import build_demo

DIRECT = {"gzip-1": {"compression": "gzip", "compression_opts": 1}, "zstd": dict(hdf5plugin.Zstd(clevel=3)),
          "none": {}}


@pytest.fixture(scope="module")
def measured(raw_demo):
    spec = spec_for(raw_demo, REPO / "config" / "demo.yaml")
    return trial(spec, sample=12, codecs=["none", "gzip-1", "zstd"], reads=20, batches=2)


@pytest.fixture(scope="module")
def built(raw_demo, tmp_path_factory):
    return build_demo(raw_demo, tmp_path_factory.mktemp("codecs"))


def stored_arrays(path, ids):
    """images and masks of ``ids`` as the build stored them, whatever their split."""
    out = {"images": [], "masks": []}
    with h5py.File(os.path.realpath(path), "r") as f:
        where = {sid: (s, r) for s in ("train", "val", "test") for r, sid in enumerate(decode_str(f[s]["ids"][()]))}
        for sid in ids:
            split, row = where[sid]
            for name in out:
                out[name].append(f[split][name][row])
    return {k: np.stack(v) for k, v in out.items()}


@pytest.mark.parametrize("codec", ["none", "gzip-1", "zstd"])
def test_stored_over_raw_equals_a_direct_measurement(measured, built, tmp_path, codec):
    """Same samples, same chunks (one sample each), same filter: the same compressed bytes.
    Tolerance: 0.1 % of the ratio (the chunks are compressed identically, so it is exact here)."""
    assert len(measured.ids) + measured.rejected == 12  # raw_demo holds defects: some may be sampled
    arrays = stored_arrays(built, measured.ids)
    raw = stored = 0
    with h5py.File(tmp_path / f"{codec}.h5", "w") as f:
        for name, block in arrays.items():
            ds = f.create_dataset(name, data=block, chunks=(1, *block.shape[1:]), **DIRECT[codec])
            raw += block.nbytes
            stored += ds.id.get_storage_size()
    row = next(r for r in measured.results if r.codec == codec)
    assert row.raw_bytes == raw == len(measured.ids) * (3 + 1) * 224 * 224
    assert row.ratio == pytest.approx(stored / raw, rel=1e-3)
    if codec == "none":
        assert row.ratio == 1.0


def test_every_measure_is_measured(measured):
    by = {r.codec: r for r in measured.results}
    assert list(by) == ["none", "gzip-1", "zstd"]
    assert all(r.write_ms_per_sample > 0 and r.read_p50_ms > 0 and r.batch_cpu_ms > 0 for r in by.values())
    assert by["zstd"].ratio < by["none"].ratio and by["gzip-1"].ratio < by["none"].ratio
    assert measured.recommended in by and measured.reason


def result(codec, ratio, p50, cpu):
    return CodecResult(codec, 1000, round(1000 * ratio), 1.0, p50, cpu, "")


def test_each_goal_picks_by_its_own_rule():
    rows = [result("none", 1.0, 0.10, 2.0), result("lz4", 0.50, 0.12, 2.1), result("zstd", 0.40, 0.14, 3.9),
            result("gzip-1", 0.38, 0.40, 9.0)]
    assert recommend(rows, "disk", 32)[0] == "gzip-1"
    assert recommend(rows, "read", 32)[0] == "lz4"  # 1.05x the lowest CPU: as fast, and half the bytes
    assert recommend(rows, "balanced", 32)[0] == "zstd"  # gzip-1 is smaller but reads at 4.5x
    rows[2] = result("zstd", 0.40, 0.14, 4.1)  # 2.05x the lowest and 0.066 ms/sample more: out
    assert recommend(rows, "balanced", 32)[0] == "lz4"
    assert recommend(rows, "balanced", 64)[0] == "zstd"  # 2.1 ms more over 64 samples: 0.033 ms each
    codec, reason = recommend([result("none", 1.0, 0.10, 2.0), result("lz4", 0.97, 0.10, 2.0)], "disk")
    assert codec == "none" and "saves only 3.0%" in reason
    with pytest.raises(UsageError, match="unknown goal 'fast'; choose from balanced, disk, read"):
        recommend(rows, "fast")


def test_balanced_takes_a_quarter_of_the_bytes_at_1_8x_the_reader_cpu():
    """The case that picked ``none`` before: lz4 stored 0.241 of the bytes at 1.8x none's CPU."""
    rows = [result("none", 1.0, 0.10, 20.0), result("lz4", 0.241, 0.15, 36.0)]
    codec, reason = recommend(rows, batch=32)
    assert codec == "lz4"
    assert reason.endswith("lz4 stores 0.241 of raw at 1.80x the lowest reader CPU")
    assert recommend(rows, "read", 32)[0] == "none"


def test_balanced_pays_a_small_absolute_cost_even_at_several_times_a_tiny_lowest():
    rows = [result("none", 1.0, 0.05, 0.57), result("lz4", 0.52, 0.07, 1.30), result("zstd", 0.40, 0.17, 4.86)]
    codec, reason = recommend(rows, batch=32)  # lz4: 2.3x, but 0.023 ms more per sample
    assert codec == "lz4" and "at most 2.17 ms" in reason


def rule(rows, goal, batch):
    """The rule of the module doc, restated over the measured numbers."""
    lowest = min(r.batch_cpu_ms for r in rows)
    budget = {"disk": float("inf"), "read": 1.1 * lowest, "balanced": max(2 * lowest, lowest + 0.05 * batch)}[goal]
    best = min((r for r in rows if r.batch_cpu_ms <= budget), key=lambda r: (r.ratio, r.batch_cpu_ms))
    return best.codec if best.ratio <= 0.95 else "none"


def measured_rows(output):
    """codec -> (stored/raw, reader CPU ms/batch) parsed from the printed table."""
    rows = {}
    for line in output.splitlines():
        cells = [c.strip() for c in line.strip("│┃ ").split("│")]
        if len(cells) == 6 and cells[0] in CODECS:
            rows[cells[0]] = result(cells[0], float(cells[1]), float(cells[3]), float(cells[4]))
    return rows


def test_codecs_command_recommends_what_its_table_implies_for_each_goal(tmp_path, monkeypatch):
    """A segmentation folder (3-class masks): the printed recommendation under each --for is the
    rule applied to the printed numbers, and the other goals' picks are stated too."""
    from h5forge._demo import generate_segment_multiclass

    # the CLI's console took its width when first imported (COLUMNS then, or 80): wide enough here
    # that no line of the table wraps, however long tmp_path is
    monkeypatch.setattr(sys.modules["h5forge._cli.app"].out, "width", 400)

    raw = tmp_path / "seg"
    generate_segment_multiclass(raw, n=24, seed=0, bad=False)
    for goal in ("disk", "read", "balanced", None):
        args = ["codecs", str(raw), "--sample", "16", "--codecs", "none,lz4,zstd,gzip-4", "--chart",
                str(tmp_path / "c.png")] + (["--for", goal] if goal else [])
        res = CliRunner().invoke(app, args)
        assert res.exit_code == 0, res.output
        rows = measured_rows(res.output)
        assert list(rows) == ["none", "lz4", "zstd", "gzip-4"], res.output
        assert rows["none"].ratio == 1.0 and rows["gzip-4"].ratio < 0.5  # masks and flat images compress
        batch = int(re.search(r"reader CPU ms/batch of (\d+)", res.output).group(1))
        picked = rule(list(rows.values()), goal or "balanced", batch)
        assert f"recommended for {goal or 'balanced'}: {picked} (" in res.output
        others = [g for g in ("balanced", "disk", "read") if g != (goal or "balanced")]
        assert f"other constraints (--for) would pick {others[0]}: " in res.output
    res = CliRunner().invoke(app, ["codecs", str(raw), "--for", "speed", "--sample", "2"])
    assert res.exit_code == 2 and "unknown goal 'speed'" in res.output


def test_a_field_kind_with_its_own_codec_is_measured_with_the_trial_codec(tmp_path):
    from h5forge._demo import generate_signals
    from h5forge.kinds import stored_kinds

    raw = tmp_path / "raw"
    generate_signals(raw, n=2, seed=0, bad=False)
    spec = spec_for(raw, None)  # inferred as init does: signal fields pick bitshuffle-lz4 themselves
    assert {k.stored().codec for k in stored_kinds(spec).values() if k.stored().bulk} == {"bitshuffle-lz4"}
    assert {k.stored().codec for k in stored_kinds(with_codec(spec, "zstd")).values() if k.stored().bulk} == {"zstd"}


def test_codecs_command_prints_the_table_and_draws_the_chart(raw_demo, tmp_path):
    chart = tmp_path / "codecs.png"
    res = CliRunner().invoke(app, ["codecs", str(raw_demo), "--spec", str(REPO / "config" / "demo.yaml"),
                                   "--sample", "6", "--codecs", "none,lz4", "--chart", str(chart)])
    assert res.exit_code == 0, res.output
    # seeded: the same 6 inputs every run, one of them a defect of the demo folder
    assert "codecs on 5 samples of demo (1 sampled input(s) rejected)" in res.output
    assert "recommended for balanced: " in res.output
    assert "lz4" in res.output and "stored/raw" in res.output
    with Image.open(chart) as img:
        assert img.format == "PNG" and img.width > 400
    res = CliRunner().invoke(app, ["codecs", str(raw_demo), "--codecs", "brotli", "--sample", "2"])
    assert res.exit_code == 2 and "unknown codec(s) brotli" in res.output


def test_a_folder_init_cannot_read_says_so(tmp_path):
    (tmp_path / "notes.txt").write_text("nothing to see")
    with pytest.raises(UsageError, match="no layout h5forge knows"):
        spec_for(tmp_path, None)
