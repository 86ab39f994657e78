"""Text UTF-8 cannot store (a lone surrogate in annotations.json, a file name that is not UTF-8)
and numbers a column cannot hold: each is one rejection with its reason, written in text every
report and the version file can store; the build or the append goes on with the good samples."""

from __future__ import annotations

import json
import shutil

import h5py

import h5forge
from h5forge._format.names import REJECTIONS
from h5forge._samples import Rejection, encodable
from tests.helpers.data import age_files, drop_samples
from tests.helpers.files import all_ids
from tests.ingest.test_hostile_inputs import _rejections, _spec

LATIN1 = "caf\udce9"  # the name b"caf\xe9" (Latin-1 "café") as Python holds an undecodable file name


def _stored(out) -> set[str]:
    return {i for ids in all_ids(out / "dataset_latest.h5").values() for i in ids}


def _table(out) -> list[list[str]]:
    with h5py.File(out / "dataset_latest.h5", "r") as f:
        return [[v.decode() for v in row] for row in f[REJECTIONS][:]]


def test_encodable_escapes_surrogates_and_keeps_other_text():
    assert encodable("plain") == "plain" and encodable("café ✓") == "café ✓"
    assert encodable(f"images/{LATIN1}.png") == "images/caf\\xe9.png"  # the byte the name holds
    assert encodable("x\ud800y") == "x\\ud800y"
    row = Rejection(LATIN1, (f"images/{LATIN1}.png",), "why \ud800").as_dict()
    assert row == {"sample_id": "caf\\xe9", "path": "images/caf\\xe9.png", "reason": "why \\ud800", "stage": "discover"}


def test_a_lone_surrogate_in_annotations_is_one_rejection_and_the_rest_published(raw_copy, raw_new, tmp_path):
    """A JSON "\\ud800" in a str value refuses its sample; as the id of a record without files it
    is that record's rejection. Both are written to the version file's rejections table."""
    records = json.loads((raw_copy / "annotations.json").read_text())
    bad = records[0]["id"]
    records[0]["label"] = "x\ud800y"
    records.append({**records[1], "id": "ghost\udc80"})  # a record without files
    (raw_copy / "annotations.json").write_text(json.dumps(records))  # the escapes, as valid JSON
    out, inbox = tmp_path / "out", tmp_path / "inbox"
    result = h5forge.build(_spec(raw_copy, out, inbox))
    reasons = _rejections(out, result.version)
    assert reasons[bad] == "annotation column 'label': holds a lone surrogate (U+D800), which HDF5's UTF-8 strings cannot store"
    assert reasons["ghost\\x80"] == "annotation record without files"
    stored = _stored(out)
    assert bad not in stored and records[1]["id"] in stored
    assert ["ghost\\x80", "annotations.json#ghost\\x80", "annotation record without files", "discover"] in _table(out)

    new = drop_samples(raw_new, inbox, ["cell_000000", "cell_000001"], rename="new_")
    sidecar = inbox / f"{new[0]}.json"
    sidecar.write_text(json.dumps({**json.loads(sidecar.read_text()), "stain": "\udfff"}))
    age_files(inbox)
    appended = h5forge.append(_spec(raw_copy, out, inbox))
    assert appended.added == 1
    [why] = [r.reason for r in appended.rejections if r.sample_id == new[0]]
    assert why == "annotation column 'stain': holds a lone surrogate (U+DFFF), which HDF5's UTF-8 strings cannot store"
    for rel in (f"images/{new[0]}.png", f"masks/{new[0]}.png", f"{new[0]}.json"):  # refused whole
        assert not (inbox / rel).exists() and (inbox / "quarantine" / rel).exists(), rel
    stored = _stored(out)
    assert new[1] in stored and new[0] not in stored


def test_a_file_name_that_is_not_utf8_is_one_rejection_and_the_rest_published(raw_copy, raw_new, tmp_path):
    records = json.loads((raw_copy / "annotations.json").read_text())
    good = records[0]["id"]
    for folder in ("images", "masks"):
        shutil.copy(raw_copy / folder / f"{good}.png", raw_copy / folder / f"{LATIN1}.png")
    out, inbox = tmp_path / "out", tmp_path / "inbox"
    result = h5forge.build(_spec(raw_copy, out, inbox))
    rows = json.loads(next((out / "quarantine").glob("*.rejections.json")).read_text())
    mine = [r for r in rows if r["sample_id"] == "caf\\xe9"]
    assert [r["path"] for r in mine] == ["images/caf\\xe9.png", "masks/caf\\xe9.png"]
    assert mine[0]["reason"] == "the file name is not valid UTF-8 (images/caf\\xe9.png); rename it"
    assert good in _stored(out) and not any("caf" in i for i in _stored(out))
    assert ["caf\\xe9", "images/caf\\xe9.png", mine[0]["reason"], "discover"] in _table(out)
    assert result.version == 1

    new = drop_samples(raw_new, inbox, ["cell_000000", "cell_000001"], rename="new_")
    for folder in ("images", "masks"):
        (inbox / folder / f"{new[0]}.png").rename(inbox / folder / f"{LATIN1}.png")
    (inbox / f"{new[0]}.json").unlink()
    age_files(inbox)
    appended = h5forge.append(_spec(raw_copy, out, inbox))
    assert appended.added == 1 and new[1] in _stored(out)
    for folder in ("images", "masks"):
        assert (inbox / "quarantine" / folder / f"{LATIN1}.png").exists()
        why = (inbox / "quarantine" / folder / f"{LATIN1}.png.reason").read_text()
        assert why == f"the file name is not valid UTF-8 ({folder}/caf\\xe9.png); rename it\n"
    assert not (inbox / "images" / f"{LATIN1}.png").exists()


def test_a_json_integer_beyond_float64_in_a_float_column_is_one_rejection(raw_copy, raw_new, tmp_path):
    records = json.loads((raw_copy / "annotations.json").read_text())
    bad = records[0]["id"]
    records[0]["focus_score"] = 10**400  # a valid JSON literal of 401 digits
    (raw_copy / "annotations.json").write_text(json.dumps(records))
    out, inbox = tmp_path / "out", tmp_path / "inbox"
    result = h5forge.build(_spec(raw_copy, out, inbox))
    why = "annotation column 'focus_score': 1000000000…0000 (401 digits) is beyond the float64 range a float column stores"
    assert _rejections(out, result.version)[bad] == why
    assert bad not in _stored(out) and records[1]["id"] in _stored(out)

    new = drop_samples(raw_new, inbox, ["cell_000000", "cell_000001"], rename="new_")
    sidecar = inbox / f"{new[0]}.json"
    sidecar.write_text(json.dumps({**json.loads(sidecar.read_text()), "focus_score": -(10**400)}))
    age_files(inbox)
    appended = h5forge.append(_spec(raw_copy, out, inbox))
    assert appended.added == 1
    [why] = [r.reason for r in appended.rejections if r.sample_id == new[0]]
    assert why == "annotation column 'focus_score': -100000000…0000 (401 digits) is beyond the float64 range a float column stores"
    assert (inbox / "quarantine" / "images" / f"{new[0]}.png").exists()
    assert new[1] in _stored(out) and new[0] not in _stored(out)
