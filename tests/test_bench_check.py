"""`make bench-check`'s comparison of a re-run's figures with the committed ones, on fabricated results."""

import json

from benchmarks.check import SHORT, band, compare, line
from benchmarks.common import RESULTS


def verdicts(committed: dict, rerun: dict) -> dict:
    return {r["figure"]: r["verdict"] for r in compare(committed, rerun)}


def test_a_ratio_within_25_percent_agrees_and_one_beyond_is_named_off():
    committed = {"ratios": {"a_over_b": 2.0, "c_over_d": 2.0, "e_over_f": 2.0, "g_over_h": 2.0}}
    rerun = {"ratios": {"a_over_b": 2.49, "c_over_d": 1.51, "e_over_f": 2.51, "g_over_h": 1.49}}
    assert verdicts(committed, rerun) == {"a_over_b": "within", "c_over_d": "within", "e_over_f": "off", "g_over_h": "off"}


def test_the_spread_the_file_states_widens_the_band():
    committed = {"ratios": {"flow_over_plain": 1.064}, "spread": {"flow_over_plain": [1.019, 1.9]}}
    assert band(1.064, [1.019, 1.9], 0.25) == (1.019 * 0.75, 1.9 * 1.25)
    assert verdicts(committed, {"ratios": {"flow_over_plain": 2.3}}) == {"flow_over_plain": "within"}
    assert verdicts(committed, {"ratios": {"flow_over_plain": 2.4}}) == {"flow_over_plain": "off"}
    assert verdicts({"ratios": {"flow_over_plain": 1.064}}, {"ratios": {"flow_over_plain": 2.3}}) == {"flow_over_plain": "off"}


def test_a_missing_figure_or_a_changed_flag_is_off_and_text_is_not_compared():
    committed = {"ratios": {"speed": 1.2, "fds_constant": True, "smallest": "zstd-9 0.04", "gone": 3.0}}
    rerun = {"ratios": {"speed": 1.2, "fds_constant": False, "smallest": "lzf 0.2"}}
    assert verdicts(committed, rerun) == {"speed": "within", "fds_constant": "off", "gone": "off"}


def test_a_negative_figure_gets_a_band_on_both_sides():
    assert band(-2.0, None, 0.25) == (-2.5, -1.5)
    assert verdicts({"ratios": {"saved": -2.0}}, {"ratios": {"saved": -1.6}}) == {"saved": "within"}
    assert verdicts({"ratios": {"saved": -2.0}}, {"ratios": {"saved": 1.6}}) == {"saved": "off"}


def test_each_line_names_the_benchmark_the_figure_both_values_and_the_verdict():
    (row,) = compare({"ratios": {"x": 1.0}}, {"ratios": {"x": 1.5}})
    assert line("row_hash", row) == "row_hash: x: committed 1.0, re-run 1.5: off"


def test_every_benchmark_it_reruns_has_committed_figures_and_the_command_that_made_them():
    for name in SHORT:
        committed = json.loads((RESULTS / f"{name}.json").read_text())
        assert committed["command"].startswith("python -m benchmarks."), name
        assert [row for row in compare(committed, committed) if row["verdict"] != "within"] == [], name


def test_the_commands_of_the_committed_results_still_parse(tmp_path, monkeypatch):
    from benchmarks import check

    assert check.stale_commands() == []
    stale = tmp_path / "results"
    stale.mkdir()
    (stale / "row_hash.json").write_text(json.dumps({"command": "python -m benchmarks.row_hash --n 5 --gone 1"}))
    (stale / "decode.json").write_text(json.dumps({"command": "python -m benchmarks.decode --n 5 --reps 2"}))
    monkeypatch.setattr(check, "RESULTS", stale)
    (refused,) = check.stale_commands()
    assert refused.startswith("row_hash.json: python -m benchmarks.row_hash --n 5 --gone 1: ") and "--gone 1" in refused
