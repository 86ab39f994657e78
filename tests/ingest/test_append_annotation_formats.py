"""Appending with the annotations in a CSV file: the inbox file is pruned, the taken records land in
processed/ in the same format, and a rebuild finds them there."""

from __future__ import annotations

import csv
import json
import shutil

import h5forge
from h5forge._ingest import append
from h5forge._ingest.discover import discover
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
    result = h5forge.append(spec)
    assert result.added == 6 and result.rejections == ()
    assert not (inbox / "labels.csv").exists()  # every record was taken
    processed = append.processed_dir(inbox, result.version) / "labels.csv"
    with processed.open() as fh:
        assert sorted(r["id"] for r in csv.DictReader(fh)) == good[20:26]
    rebuilt = discover(spec)
    assert sorted(s.id for s in rebuilt.samples) == good[:26] and not rebuilt.rejections


def _labelled_pngs(folder, names, labels):
    import zlib

    import numpy as np
    from PIL import Image

    (folder / "images").mkdir(parents=True, exist_ok=True)
    for k, name in enumerate(names):
        pixels = np.random.default_rng(zlib.crc32(name.encode())).integers(0, 255, (16, 16, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(folder / "images" / name)
    with (folder / "labels.csv").open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["file", "label"])
        w.writerows([name, labels[k % len(labels)]] for k, name in enumerate(names))


def _file_keyed_spec(tmp_path, **output):
    from h5forge.spec import parse_spec

    return parse_spec({"name": "bykey", "source": {"root": "raw", "inbox": "inbox"},
                       "output": {"dir": "out", **output}, "splits": {"ratios": {"train": 1.0}},
                       "fields": {"images": {"kind": "image", "files": "images/*.png", "size": [16, 16]}},
                       "annotations": {"file": "labels.csv", "id_key": "file", "columns": {"label": "str"}}},
                      tmp_path)


def _stored_ids(path):
    import h5py

    from h5forge._format.layout import decode_str

    with h5py.File(path, "r") as f:
        return sorted(decode_str(f["train"]["ids"][()]))


def test_append_keeps_the_records_of_a_csv_keyed_by_file_name_and_the_rebuild_keeps_every_sample(tmp_path):
    import h5forge

    raw_names = [f"r{k:02d}.png" for k in range(20)]
    _labelled_pngs(tmp_path / "raw", raw_names, ["a", "b"])
    _labelled_pngs(tmp_path / "inbox", ["new0.png"], ["b"])
    age_files(tmp_path / "inbox")
    spec = _file_keyed_spec(tmp_path)
    h5forge.build(spec)
    appended = h5forge.append(spec)
    assert appended.added == 1 and not appended.rejections
    with (append.processed_dir(tmp_path / "inbox", appended.version) / "labels.csv").open(newline="") as fh:
        assert list(csv.DictReader(fh)) == [{"file": "new0.png", "label": "b"}]  # same format, same key
    rebuilt = h5forge.build(spec)
    assert rebuilt.rejected == 0
    assert _stored_ids(rebuilt.path) == sorted([n[:-4] for n in raw_names] + ["new0"])


def test_a_rebuild_that_would_drop_published_samples_names_them_and_publishes_only_when_allowed(tmp_path):
    import os

    import pytest

    import h5forge
    from h5forge.errors import SamplesRemoved
    from h5forge._store.versions import latest

    names = [f"r{k:02d}.png" for k in range(12)]
    _labelled_pngs(tmp_path / "raw", names, ["a", "b"])
    first = h5forge.build(_file_keyed_spec(tmp_path))
    os.remove(tmp_path / "raw" / "images" / "r03.png")  # and its record: the user deleted the sample
    table = (tmp_path / "raw" / "labels.csv").read_text().splitlines(keepends=True)
    (tmp_path / "raw" / "labels.csv").write_text("".join(r for r in table if not r.startswith("r03.png")))
    (tmp_path / "raw" / "images" / "r07.png").write_bytes(b"no longer a png")
    with pytest.raises(SamplesRemoved, match=r"2 sample\(s\) of dataset_v0001.h5 would leave latest: r03, r07; nothing"
                                             r" published\. .*output.allow_removals: true"):
        h5forge.build(_file_keyed_spec(tmp_path))
    assert latest(tmp_path / "out") == first.version
    allowed = h5forge.build(_file_keyed_spec(tmp_path, allow_removals=True))
    assert allowed.left_latest == ["r03", "r07"]
    assert _stored_ids(allowed.path) == sorted(n[:-4] for n in names if n not in ("r03.png", "r07.png"))


def test_a_sidecar_record_without_the_key_column_gets_it_in_processed(tmp_path):
    import h5forge

    _labelled_pngs(tmp_path / "raw", [f"r{k:02d}.png" for k in range(10)], ["a", "b"])
    _labelled_pngs(tmp_path / "inbox", ["new0.png"], ["b"])
    (tmp_path / "inbox" / "labels.csv").unlink()
    (tmp_path / "inbox" / "new0.json").write_text(json.dumps({"label": "a"}))  # named by its file only
    age_files(tmp_path / "inbox")
    spec = _file_keyed_spec(tmp_path)
    h5forge.build(spec)
    appended = h5forge.append(spec)
    assert appended.added == 1 and not appended.rejections
    with (append.processed_dir(tmp_path / "inbox", appended.version) / "labels.csv").open(newline="") as fh:
        assert list(csv.DictReader(fh)) == [{"file": "new0", "label": "a"}]
    rebuilt = h5forge.build(spec)
    assert rebuilt.rejected == 0 and "new0" in _stored_ids(rebuilt.path)
