"""``init`` accounts for every file under the root (used, a known sidecar, or named in a note with
the reason it is left out) and says what a build of the folder as it is will reject; the build
says how many files no glob takes; a small folder's one bad input does not fail the build."""

from __future__ import annotations

import csv
import logging

import h5py
import numpy as np
from PIL import Image

import h5forge
from h5forge._format.layout import decode_str
from h5forge._pipeline.build import discover_samples
from h5forge.spec import override, parse_spec
from tests.init.test_infer import SPLITS, build, infer, photo


def faces_tree(raw):
    """Class folders at the top and under split folders (the Kaggle 'faces' layout)."""
    files = []
    for where in ("", "Train/", "Validation/"):
        for c, cls in enumerate(("faces", "nonfaces")):
            folder = raw / f"{where}{cls}"
            folder.mkdir(parents=True, exist_ok=True)
            for k in range(3):
                photo(len(files)).convert("RGB").save(folder / f"{cls}{k}.jpg")  # no two files alike
                files.append(f"{where}{cls}/{cls}{k}")
    return files


def stored(path):
    with h5py.File(path, "r") as f:
        return {s: sorted(decode_str(f[s]["ids"][()])) for s in SPLITS}


def test_class_folders_at_two_depths_are_all_taken(tmp_path):
    raw = tmp_path / "faces"
    ids = faces_tree(raw)
    (raw / "README.txt").write_text("where these came from")
    inferred, spec, spec_path = infer(raw, tmp_path)
    assert inferred.layout == "classify"
    assert spec.fields["images"].files == ("*/*/*.jpg", "*/*.jpg")
    assert spec.annotations.folders == {"label": -1, "split": -2} and spec.splits.column == "split"
    assert any(n.startswith("1 file under the folder is taken by no glob: README.txt") for n in inferred.notes)
    path, summary = build(spec_path, tmp_path / "out")
    assert summary.rejections == ()
    assert h5forge.build(override(spec, output=tmp_path / "out2")).unclaimed == 1  # README.txt
    got = stored(path)
    assert sorted(i for s in SPLITS for i in got[s]) == sorted(ids)
    in_split_folders = {s: [i.split("/")[0] for i in got[s] if i.count("/") == 2] for s in SPLITS}
    assert in_split_folders == {"train": ["Train"] * 6, "val": ["Validation"] * 6, "test": []}


def test_with_a_csv_a_file_outside_the_split_folders_gets_the_ratio_split(tmp_path):
    raw = tmp_path / "faces"
    ids = faces_tree(raw)
    with (raw / "labels.csv").open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["file", "quality"])
        w.writerows([f"{sid}.jpg", k % 3] for k, sid in enumerate(ids))
    inferred, spec, spec_path = infer(raw, tmp_path)
    assert spec.annotations.file == "labels.csv" and spec.annotations.folders == {"label": -1, "split": -2}
    path, summary = build(spec_path, tmp_path / "out")
    assert summary.rejections == ()
    got = stored(path)
    assert sorted(i for s in SPLITS for i in got[s]) == sorted(ids)
    with h5py.File(path, "r") as f:  # outside the split folders, the split column holds the split it got
        top = {i: v for s in SPLITS for i, v in zip(decode_str(f[s]["ids"][()]), decode_str(f[s]["meta"]["split"][()]))
               if i.count("/") == 1}
    assert len(top) == 6 and top == {i: s for s in SPLITS for i in got[s] if i.count("/") == 1}


def test_the_build_says_how_many_files_no_glob_takes(tmp_path, caplog):
    raw = tmp_path / "raw"
    (raw / "images").mkdir(parents=True)
    for k in range(4):
        photo(k).save(raw / "images" / f"p{k}.png")
        photo(k).convert("RGB").save(raw / "images" / f"q{k}.jpg")
    (raw / "images" / "notes.txt").write_text("x")
    spec = parse_spec({"name": "g", "source": {"root": str(raw)}, "output": {"dir": str(tmp_path / "out")},
                       "fields": {"images": {"kind": "image", "files": "images/*.png", "size": [32, 32]}}}, tmp_path)
    with caplog.at_level(logging.INFO, logger="h5forge._pipeline"):
        inv = discover_samples(spec)
    assert len(inv.samples) == 4 and inv.unclaimed == 5
    assert ("5 file(s) under" in caplog.text and "are taken by no glob of the spec (e.g. images/notes.txt, "
            "images/q0.jpg" in caplog.text)


def test_one_bad_input_of_a_small_folder_does_not_fail_the_build(tmp_path):
    raw = tmp_path / "raw"
    (raw / "images").mkdir(parents=True)
    for k in range(6):
        photo(k).save(raw / "images" / f"p{k}.png")
    (raw / "images" / "p6.png").write_bytes(b"not a png")
    spec = parse_spec({"name": "s", "source": {"root": str(raw)}, "output": {"dir": str(tmp_path / "out")},
                       "fields": {"images": {"kind": "image", "files": "images/*.png", "size": [32, 32]}}}, tmp_path)
    assert spec.max_rejected == 0.1 and spec.rejected_limit(7) == 1 and spec.rejected_limit(30) == 3
    result = h5forge.build(spec)
    assert result.rejected == 1 and sum(result.counts.values()) == 6


def test_init_says_what_it_expects_to_reject(tmp_path):
    raw = tmp_path / "cells"
    (raw / "images").mkdir(parents=True)
    (raw / "masks").mkdir()
    for k in range(9):
        pic = photo(k)
        pic.save(raw / "images" / f"c{k}.png")
        if k != 4:
            grey = np.asarray(pic.convert("L"))
            Image.fromarray(((grey > grey.mean()) * 255).astype(np.uint8)).save(raw / "masks" / f"c{k}.png")
    inferred, spec, spec_path = infer(raw, tmp_path)
    expected = [n for n in inferred.notes if n.startswith("a build of the folder as it is rejects")]
    assert expected == ["a build of the folder as it is rejects 1 of 9 inputs at discovery "
                        "(1 x incomplete sample: no file for masks (masks/*.png)); max_rejected 0.1 allows 1"]
    path, summary = build(spec_path, tmp_path / "out")
    assert [r.sample_id for r in summary.rejections] == ["c4"]
    result = h5forge.build(override(spec, output=tmp_path / "out2"))
    assert result.rejected == 1
