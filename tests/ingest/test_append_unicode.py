"""Names that differ only by Unicode normalisation (macOS writes NFD, most tools NFC) are one name:
append refuses an inbox sample whose id the dataset holds in the other form, and class labels
match in either form."""

from __future__ import annotations

import unicodedata

import h5py
import numpy as np
from PIL import Image

import h5forge
from h5forge._format.layout import decode_str
from h5forge.spec import parse_spec
from tests.helpers.data import age_files

NFC, NFD = unicodedata.normalize("NFC", "café"), unicodedata.normalize("NFD", "café")


def _png(path, seed):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.random.default_rng(seed).integers(0, 255, (16, 16, 3), dtype=np.uint8)).save(path)


def _ids(path):
    with h5py.File(path, "r") as f:
        return sorted(i for s in ("train", "val", "test") for i in decode_str(f[s]["ids"][()]))


def test_an_inbox_id_in_the_other_normal_form_is_refused_and_the_rebuild_keeps_every_sample(tmp_path):
    raw, inbox = tmp_path / "raw", tmp_path / "inbox"
    assert NFC != NFD
    for k in range(6):
        _png(raw / "images" / f"s{k}.png", k)
    _png(raw / "images" / f"{NFD}.png", 100)
    _png(inbox / "images" / f"{NFC}.png", 200)  # the same name typed elsewhere, other content
    _png(inbox / "images" / "new.png", 300)
    age_files(inbox)
    spec = parse_spec({"name": "u", "source": {"root": str(raw), "inbox": str(inbox)},
                       "output": {"dir": str(tmp_path / "out")}, "splits": {"ratios": {"train": 1.0}},
                       "fields": {"images": {"kind": "image", "files": "images/*.png", "size": [16, 16]}}},
                      tmp_path)
    first = h5forge.build(spec)
    assert _ids(first.path) == sorted([*(f"s{k}" for k in range(6)), NFD])
    appended = h5forge.append(spec)
    reasons = {r.sample_id: r.reason for r in appended.rejections}
    assert appended.added == 1 and set(reasons) == {NFC}
    assert reasons[NFC].startswith(f"id {NFC!r} is already in the dataset with other content")
    assert (inbox / "quarantine" / "images" / f"{NFC}.png").is_file()
    rebuilt = h5forge.build(spec)
    assert rebuilt.rejected == 0
    assert _ids(rebuilt.path) == sorted([*(f"s{k}" for k in range(6)), NFD, "new"])


def test_class_folders_match_the_classes_in_either_normal_form(tmp_path):
    raw = tmp_path / "raw"
    muller_nfd, muller_nfc = unicodedata.normalize("NFD", "Müller"), unicodedata.normalize("NFC", "Müller")
    for k in range(3):
        _png(raw / "images" / muller_nfd / f"m{k}.png", k)
        _png(raw / "images" / "Bauer" / f"b{k}.png", 10 + k)
    spec = parse_spec({"name": "c", "source": {"root": str(raw)}, "output": {"dir": str(tmp_path / "out")},
                       "splits": {"ratios": {"train": 1.0}},
                       "annotations": {"columns": {"who": "str"}, "folders": {"who": -1}, "required": False},
                       "fields": {"images": {"kind": "image", "files": "images/*/*.png", "size": [16, 16]},
                                  "who_class": {"kind": "label", "column": "who", "classes": [muller_nfc, "Bauer"]}}},
                      tmp_path)
    result = h5forge.build(spec)
    assert result.rejected == 0 and result.counts["train"] == 6
    with h5py.File(result.path, "r") as f:
        ids, labels = decode_str(f["train"]["ids"][()]), f["train"]["who_class"][()].tolist()
    assert dict(zip(ids, labels)) == {**{f"m{k}": 0 for k in range(3)}, **{f"b{k}": 1 for k in range(3)}}
