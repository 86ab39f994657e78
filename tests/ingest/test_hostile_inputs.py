"""Hostile inputs in the raw folder and the inbox: each is one rejection with its reason, never a
traceback, and the build or the next append goes on."""

from __future__ import annotations

import json
import os

import h5forge
from h5forge._format.names import QUARANTINE_DIR
from tests.helpers.data import age_files, demo_spec, drop_samples
from tests.helpers.files import all_ids


def _spec(raw, out, inbox=None):
    spec = demo_spec(raw, out)
    spec = spec.model_copy(update={"max_rejected": 0.5})
    if inbox is not None:
        spec = spec.model_copy(update={"source": spec.source.model_copy(update={"inbox": inbox.resolve()}),
                                       "append": spec.append.model_copy(update={"settle_seconds": 0})})
    return spec


def _rejections(out, version) -> dict[str, str]:
    rows = json.loads((out / QUARANTINE_DIR / f"dataset_v{version:04d}.rejections.json").read_text())
    return {r["sample_id"]: r["reason"] for r in rows}


def test_an_int_value_beyond_int64_is_one_rejection_in_build_and_append(raw_copy, raw_new, tmp_path):
    records = json.loads((raw_copy / "annotations.json").read_text())
    huge = {records[0]["id"]: 1e30, records[1]["id"]: 2**63}
    for r in records:
        if r["id"] in huge:
            r["num_cells"] = huge[r["id"]]
    (raw_copy / "annotations.json").write_text(json.dumps(records))
    out, inbox = tmp_path / "out", tmp_path / "inbox"
    result = h5forge.build(_spec(raw_copy, out, inbox))
    reasons = _rejections(out, result.version)
    for sid in huge:
        assert "beyond the int64 range" in reasons[sid], reasons[sid]
    stored = {i for ids in all_ids(out / "dataset_latest.h5").values() for i in ids}
    assert not stored & set(huge)

    new = drop_samples(raw_new, inbox, ["cell_000000", "cell_000001"], rename="new_")
    sidecar = inbox / f"{new[0]}.json"
    sidecar.write_text(json.dumps({**json.loads(sidecar.read_text()), "num_cells": 2**63}))
    age_files(inbox)
    appended = h5forge.append(_spec(raw_copy, out, inbox))
    assert appended.added == 1
    assert any(r.sample_id == new[0] and "beyond the int64 range" in r.reason for r in appended.rejections)
    for rel in (f"images/{new[0]}.png", f"masks/{new[0]}.png", f"{new[0]}.json"):  # refused whole
        assert not (inbox / rel).exists() and (inbox / "quarantine" / rel).exists(), rel
    assert "beyond the int64 range" in (inbox / "quarantine" / "images" / f"{new[0]}.png.reason").read_text()
    stored = {i for ids in all_ids(out / "dataset_latest.h5").values() for i in ids}
    assert new[1] in stored and new[0] not in stored


def test_an_id_with_a_control_character_is_refused_at_discovery_and_the_rest_published(raw_copy, tmp_path):
    """A class folder or file named with a newline, a carriage return or U+2028: refused with the
    reason; the version publishes, and its preview draws (it held such an id before)."""
    records = json.loads((raw_copy / "annotations.json").read_text())
    for n, name in enumerate(["new\nline", "cr\rx", "sep\u2028x"]):
        for folder in ("images", "masks"):
            (raw_copy / folder / f"{name}.png").write_bytes((raw_copy / folder / f"{records[n]['id']}.png").read_bytes())
        records.append({**records[n], "id": name})  # otherwise a good sample: files and a record
    (raw_copy / "annotations.json").write_text(json.dumps(records))
    out = tmp_path / "out"
    result = h5forge.build(_spec(raw_copy, out))
    reasons = _rejections(out, result.version)
    for name, code in (("new\nline", "000A"), ("cr\rx", "000D"), ("sep\u2028x", "2028")):
        assert f"holds a control character (U+{code})" in reasons[name], reasons.get(name)
    stored = {i for ids in all_ids(out / "dataset_latest.h5").values() for i in ids}
    assert not any(c in i for i in stored for c in "\n\r\u2028")
    assert (out / "reports" / f"dataset_v{result.version:04d}.preview.png").is_file()


def test_a_hash_cache_nested_too_deep_is_no_cache(raw_copy, tmp_path):
    from h5forge._format.names import HASH_CACHE

    out = tmp_path / "out"
    first = h5forge.build(_spec(raw_copy, out))
    (out / HASH_CACHE).write_text("[" * 100_000 + "]" * 100_000)
    again = h5forge.build(_spec(raw_copy, out))
    assert again.unchanged and again.version == first.version  # every file hashed again: the same inputs


def test_hostile_inbox_sidecars_are_quarantined_and_the_appends_go_on(raw_copy, raw_new, tmp_path):
    """A sidecar nested 100,000 deep, a folder named d.json, a FIFO named f.json and a symlink to
    /dev/zero: each is one rejection with its reason; the good sample beside them is appended,
    and so is the next one."""
    out, inbox = tmp_path / "out", tmp_path / "inbox"
    h5forge.build(_spec(raw_copy, out, inbox))
    good = drop_samples(raw_new, inbox, ["cell_000000"], rename="new_")
    inbox.mkdir(exist_ok=True)
    (inbox / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    (inbox / "d.json").mkdir()
    os.mkfifo(inbox / "f.json")
    (inbox / "z.json").symlink_to("/dev/zero")
    age_files(inbox)
    first = h5forge.append(_spec(raw_copy, out, inbox))
    assert first.added == 1
    reasons = {r.sample_id: r.reason for r in first.rejections}
    assert reasons["deep"] == "annotation sidecar is nested too deep to read"
    assert reasons["d"] == "annotation sidecar cannot be read: not a regular file (a folder, device, pipe or socket)"
    assert reasons["f"] == "annotation sidecar cannot be read: not a regular file (a folder, device, pipe or socket)"
    assert reasons["z"].startswith("annotation sidecar cannot be read: symlink leads outside the source folder")
    stored = {i for ids in all_ids(out / "dataset_latest.h5").values() for i in ids}
    assert good[0] in stored
    more = drop_samples(raw_new, inbox, ["cell_000001"], rename="new_")
    age_files(inbox)
    second = h5forge.append(_spec(raw_copy, out, inbox))
    assert second.added == 1 and second.version == first.version + 1
    assert more[0] in {i for ids in all_ids(out / "dataset_latest.h5").values() for i in ids}


def test_an_annotation_file_linked_to_dev_zero_is_refused_unread(raw_copy, tmp_path):
    import pytest

    from h5forge.errors import H5forgeError

    (raw_copy / "annotations.json").unlink()
    (raw_copy / "annotations.json").symlink_to("/dev/zero")
    out = tmp_path / "out"
    with pytest.raises(H5forgeError):
        h5forge.build(_spec(raw_copy, out))
    reasons = json.loads(next((out / QUARANTINE_DIR).glob("*.rejections.json")).read_text())
    [why] = [r["reason"] for r in reasons if r["path"] == "annotations.json"]
    assert why.startswith("annotation file cannot be read: symlink leads outside the source folder (to /dev/zero)")
    spec = _spec(raw_copy, out)  # allowed to leave the folder: /dev/zero is still no regular file
    spec = spec.model_copy(update={"source": spec.source.model_copy(update={"allow_symlinks_outside": True})})
    with pytest.raises(H5forgeError):
        h5forge.build(spec)
    reasons = json.loads(sorted((out / QUARANTINE_DIR).glob("*.rejections.json"))[-1].read_text())
    [why] = [r["reason"] for r in reasons if r["path"] == "annotations.json"]
    assert why == "annotation file cannot be read: not a regular file (a folder, device, pipe or socket)"


def test_a_hostile_image_sends_its_whole_sample_to_the_inbox_quarantine(raw_copy, raw_new, tmp_path):
    """A FIFO, a symlink to /dev/zero and a folder at an image's path in the inbox, each beside a
    good mask: the sample is refused at discovery, and every file of it, the mask too, goes to
    quarantine/ with a reason file; nothing of it stays in the inbox."""
    out, inbox = tmp_path / "out", tmp_path / "inbox"
    h5forge.build(_spec(raw_copy, out, inbox))
    ids = drop_samples(raw_new, inbox, ["cell_000000", "cell_000001", "cell_000002", "cell_000003"], rename="new_")
    good, hostile = ids[0], dict(zip(ids[1:], ("fifo", "dev-zero", "folder")))
    for sid, how in hostile.items():
        image = inbox / "images" / f"{sid}.png"
        image.unlink()
        {"fifo": os.mkfifo, "dev-zero": lambda p: p.symlink_to("/dev/zero"), "folder": os.mkdir}[how](image)
    age_files(inbox)
    result = h5forge.append(_spec(raw_copy, out, inbox))
    assert result.added == 1
    reasons = {r.sample_id: r.reason for r in result.rejections}
    assert reasons[ids[1]] == "not a regular file: a FIFO (named pipe)"
    quarantine = inbox / "quarantine"
    for sid in hostile:
        for folder in ("images", "masks"):
            assert not os.path.lexists(inbox / folder / f"{sid}.png"), f"{folder}/{sid}.png left in the inbox"
            assert os.path.lexists(quarantine / folder / f"{sid}.png"), f"{folder}/{sid}.png not quarantined"
        assert (quarantine / "images" / f"{sid}.png.reason").read_text() == reasons[sid] + "\n"
        why = f"sample {sid!r} refused (images/{sid}.png: {reasons[sid]})\n"
        assert (quarantine / "masks" / f"{sid}.png.reason").read_text() == why
        assert (quarantine / f"{sid}.json.reason").read_text() == why
        assert not (inbox / f"{sid}.json").exists()
    assert sorted(p.name for p in (inbox / "processed" / f"v{result.version:04d}" / "images").iterdir()) == [
        f"{good}.png"
    ]
