"""Appending with the annotations in a CSV file: the inbox file is pruned, the taken records land in
processed/ in the same format, and a rebuild finds them there."""

from __future__ import annotations

import csv
import json
import shutil

from h5forge.ingest import append
from h5forge.ingest.discover import discover
from h5forge.spec import DatasetSpec
from tests.helpers.data import age_files


def test_append_with_csv_annotations(raw_demo, tmp_path, build_spec):
    records = {r["id"]: r for r in json.loads((raw_demo / "annotations.json").read_text())}
    good = sorted(i for i in records if i.startswith("cell_"))
    root, inbox = tmp_path / "raw", tmp_path / "inbox"

    def place(folder, ids):
        for sub in ("images", "masks"):
            (folder / sub).mkdir(parents=True, exist_ok=True)
            for sid in ids:
                shutil.copy(raw_demo / sub / f"{sid}.png", folder / sub / f"{sid}.png")
        with (folder / "labels.csv").open("w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=["id", "label", "num_cells"])
            w.writeheader()
            w.writerows({"id": i, "label": records[i]["label"], "num_cells": records[i]["num_cells"]} for i in ids)

    place(root, good[:20])
    place(inbox, good[20:26])
    age_files(inbox)
    data = {"name": "csv", "source": {"root": str(root), "inbox": str(inbox)}, "output": {"dir": str(tmp_path / "out")},
            "fields": {"images": {"kind": "image", "files": "images/*.png", "size": [64, 64]},
                       "masks": {"kind": "mask", "files": "masks/*.png", "like": "images"}},
            "annotations": {"file": "labels.csv", "columns": {"label": "str", "num_cells": "int"}}}
    build_spec(data)
    spec = DatasetSpec.model_validate(data)
    scan = append.scan_inbox(spec, inbox)
    assert len(scan.ready) == 6 and not scan.rejections
    cand = append.stage_append(spec.output.dir)
    summary = append.write_delta(spec, scan, cand)
    append.write_thin_version(spec, cand, summary)
    report = append.verify_append(cand)
    append.publish_append(cand, report, append.plan_moves(spec, scan, summary.rejections, cand.number))
    assert not (inbox / "labels.csv").exists()  # every record was taken
    processed = append.processed_dir(inbox, cand.number) / "labels.csv"
    with processed.open() as fh:
        assert sorted(r["id"] for r in csv.DictReader(fh)) == good[20:26]
    rebuilt = discover(spec)
    assert sorted(s.id for s in rebuilt.samples) == good[:26] and not rebuilt.rejections
