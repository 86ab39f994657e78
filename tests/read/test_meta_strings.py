"""A text annotation column comes back as ``str`` everywhere: ``ds.meta(column)``, ``ds[i]`` and
the loader's batches agree, with non-ASCII text intact."""

from __future__ import annotations

import json

import h5py

import h5forge
from h5forge._format.layout import decode_str
from h5forge.read.torch import H5Dataset
from h5forge.spec import DatasetSpec
from tests.helpers.files import make_raw

NOTES = ["café au lait", "Müller ✓", "plain", "日本語のメモ", ""]


def test_meta_items_and_loader_return_the_same_str(tmp_path):
    raw = make_raw(tmp_path / "raw", n=10, seed=2)
    records = json.loads((raw / "annotations.json").read_text())
    want = {}
    for i, r in enumerate(records):
        r["note"] = NOTES[i % len(NOTES)]
        want[r["id"]] = r["note"]
    (raw / "annotations.json").write_text(json.dumps(records, ensure_ascii=False), encoding="utf-8")
    spec = DatasetSpec.model_validate({
        "name": "notes", "source": {"root": str(raw)}, "output": {"dir": str(tmp_path / "out")},
        "fields": {"images": {"kind": "image", "files": "images/*.png", "size": [64, 64]}},
        "annotations": {"file": "annotations.json", "columns": {"note": "str", "label": "str"}},
        "splits": {"ratios": {"train": 1.0}}})
    path = h5forge.build(spec).path
    ds = H5Dataset(path, split="train", fields=("note",), return_index=True)
    with h5py.File(path, "r") as f:
        ids = decode_str(f["train"]["ids"][()])
    meta = ds.meta("note")
    assert [type(v) for v in meta] == [str] * len(ds)
    items = [ds[i] for i in range(len(ds))]
    assert [type(note) for note, _ in items] == [str] * len(ds)
    assert list(meta) == [note for note, _ in items]
    batched = {}
    for notes, rows in ds.loader(batch_size=4, num_workers=0, shuffle=False):
        assert all(type(n) is str for n in notes)
        batched.update(zip(rows.tolist(), notes))
    assert [batched[i] for i in range(len(ds))] == list(meta)
    assert sorted(meta) == sorted(want.values())
    assert [want[i] for i in ids] == list(meta)  # in row order, each sample's own note
