"""Annotation values reach the file as written, or are refused with a reason: CSV read by the csv
module (quoted line breaks, a byte-order mark), and no silent coercion between types."""

from __future__ import annotations

import csv
import json
import shutil

import pytest

from h5forge.errors import SpecError
from h5forge._ingest.discover import discover
from h5forge.spec import parse_spec
from tests.helpers.data import demo_spec


def _images_only(raw_demo, root, ids):
    for sub in ("images", "masks"):
        (root / sub).mkdir(parents=True, exist_ok=True)
        for sid in ids:
            shutil.copy(raw_demo / sub / f"{sid}.png", root / sub / f"{sid}.png")


def _spec(root, out, file, columns):
    spec = demo_spec(root, out)
    ann = spec.annotations.model_copy(update={"file": file, "columns": columns, "index_by": []})
    return spec.model_copy(update={"annotations": ann})


IDS = ["cell_000000", "cell_000001", "cell_000002", "cell_000003"]


@pytest.mark.parametrize("encoding", ["utf-8", "utf-8-sig"])
def test_csv_values_keep_line_breaks_and_a_byte_order_mark_is_not_part_of_the_header(raw_demo, tmp_path, encoding):
    root = tmp_path / "raw"
    _images_only(raw_demo, root, IDS)
    notes = {IDS[0]: "multi\nline", IDS[1]: "cr\rinside", IDS[2]: "para\u2028graph", IDS[3]: "plain"}
    with (root / "labels.csv").open("w", newline="", encoding=encoding) as fh:
        w = csv.writer(fh)
        w.writerow(["id", "n", "note"])
        for i, sid in enumerate(IDS):
            w.writerow([sid, i, notes[sid]])
    inv = discover(_spec(root, tmp_path / "out", "labels.csv", {"n": "int", "note": "str"}))
    assert not inv.rejections, [(r.sample_id, r.reason) for r in inv.rejections]
    got = {s.id: s.columns for s in inv.samples}
    assert got == {sid: {"n": i, "note": notes[sid]} for i, sid in enumerate(IDS)}


def test_json_values_of_another_type_are_refused_with_the_reason(raw_demo, tmp_path):
    root = tmp_path / "raw"
    _images_only(raw_demo, root, IDS)
    records = [{"id": IDS[0], "score": True, "label": "a"},
               {"id": IDS[1], "score": 0.5, "label": 5},
               {"id": IDS[2], "score": 0.5, "label": {"nested": [1, 2]}},
               {"id": IDS[3], "score": 2, "label": "b"}]
    (root / "labels.json").write_text(json.dumps(records))
    inv = discover(_spec(root, tmp_path / "out", "labels.json", {"score": "float", "label": "str"}))
    reasons = {r.sample_id: r.reason for r in inv.rejections}
    assert reasons == {IDS[0]: "annotation column 'score': True is true/false, expected float",
                       IDS[1]: "annotation column 'label': 5 is a number, expected str",
                       IDS[2]: "annotation column 'label': {'nested': [1, 2]} is an object, expected str"}
    assert [(s.id, s.columns) for s in inv.samples] == [(IDS[3], {"score": 2.0, "label": "b"})]


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_split_ratios_must_be_finite(tmp_path, bad):
    data = {"name": "x", "source": {"root": str(tmp_path)}, "output": {"dir": str(tmp_path / "out")},
            "fields": {"images": {"kind": "image", "files": "*.png", "size": [8, 8]}},
            "splits": {"ratios": {"train": 0.8, "val": 0.2, "test": bad}}}
    with pytest.raises(SpecError, match="splits.ratios: .*split ratios must be finite numbers"):
        parse_spec(data, tmp_path)


def test_the_discovery_log_counts_every_rejected_input(raw_demo, tmp_path, caplog):
    import logging

    from h5forge._pipeline.build import discover_samples

    root = tmp_path / "raw"
    _images_only(raw_demo, root, IDS)
    orphans = [f"gone_{k:03d}" for k in range(100)]  # more than discovery lists one by one
    (root / "labels.json").write_text(json.dumps([{"id": sid, "n": 1} for sid in IDS + orphans]))
    spec = _spec(root, tmp_path / "out", "labels.json", {"n": "int"})
    with caplog.at_level(logging.INFO, logger="h5forge._pipeline"):
        inv = discover_samples(spec)
    assert "4 complete samples" in caplog.text and "100 input(s) rejected at discovery" in caplog.text
    assert len(inv.rejections) < 100 and inv.rejected == 100


@pytest.mark.parametrize("suffix", ["json", "jsonl", "csv"])
def test_a_number_written_finite_beyond_float64_is_refused_and_an_infinity_written_as_one_kept(raw_demo, tmp_path, suffix):
    """Python reads ``1e400`` as inf: stored, the column would hold a value the file never wrote.
    An infinity the file writes as one (JSON's ``-Infinity``, CSV's ``inf``) is its value."""
    root = tmp_path / "raw"
    _images_only(raw_demo, root, IDS)
    written = {IDS[0]: "1e400", IDS[1]: "-2.5E+999", IDS[2]: "-Infinity" if suffix != "csv" else "-inf", IDS[3]: "0.25"}
    if suffix == "csv":
        (root / "labels.csv").write_text("id,score\n" + "".join(f"{sid},{v}\n" for sid, v in written.items()))
    else:
        records = [f'{{"id": "{sid}", "score": {v}}}' for sid, v in written.items()]
        (root / f"labels.{suffix}").write_text("\n".join(records) if suffix == "jsonl" else f"[{', '.join(records)}]")
    inv = discover(_spec(root, tmp_path / "out", f"labels.{suffix}", {"score": "float"}))
    quoted = repr if suffix == "csv" else str
    assert {r.sample_id: r.reason for r in inv.rejections} == {
        sid: f"annotation column 'score': {quoted(written[sid])} is beyond the float64 range a float column stores"
        for sid in IDS[:2]}
    assert {s.id: s.columns["score"] for s in inv.samples} == {IDS[2]: float("-inf"), IDS[3]: 0.25}


def test_files_of_a_sample_refused_for_its_record_are_not_called_taken_by_no_glob(raw_demo, tmp_path):
    """Every glob took them; the sample was refused with a reason: the "taken by no glob" warning,
    which tells a user to add a glob, is for files no field reads."""
    root = tmp_path / "raw"
    _images_only(raw_demo, root, IDS)
    (root / "README.txt").write_text("notes")
    records = [{"id": IDS[0], "score": "high"}, {"id": IDS[2], "score": 0.5}, {"id": IDS[3], "score": 1}]
    (root / "labels.json").write_text(json.dumps(records))  # IDS[1] has no record
    inv = discover(_spec(root, tmp_path / "out", "labels.json", {"score": "float"}))
    assert {r.sample_id for r in inv.rejections} == {IDS[0], IDS[1]}
    assert (inv.unclaimed, inv.unclaimed_examples) == (1, ["README.txt"])
