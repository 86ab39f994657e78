"""Thin versions after appends: retention keeps what they read, export is self-contained, a missing
delta is an error."""

import shutil

import h5py
import numpy as np

import h5forge
from h5forge._format.layout import decode_str
from h5forge._store.thin import row_files_of
from h5forge._store.verify import verify_file
from h5forge._store.versions import published, retain
from tests.helpers.data import age_files, drop_samples

def test_retention_keeps_what_kept_versions_read_and_export_is_self_contained(dataset, raw_new, tmp_path):
    spec_file, out, inbox = dataset
    for k in range(3):
        drop_samples(raw_new, inbox, [f"cell_{i:06d}" for i in range(3 * k, 3 * k + 3)], rename=f"r{k}_")
        age_files(inbox)
        h5forge.append(spec_file)
    assert list(published(out)) == [1, 2, 3, 4]
    assert [s["file"] for s in row_files_of(out / "dataset_v0004.h5")] == [
        "dataset_v0001.h5", "dataset_v0002.delta.h5", "dataset_v0003.delta.h5", "dataset_v0004.delta.h5"]
    removed = retain(out, keep=1)
    assert sorted(p.name for p in removed) == ["dataset_v0002.h5", "dataset_v0003.h5"]
    assert (out / "dataset_v0001.h5").exists() and (out / "dataset_v0002.delta.h5").exists()
    assert verify_file(out / "dataset_latest.h5").ok
    copy = tmp_path / "elsewhere" / "copy.h5"
    copy.parent.mkdir()
    from h5forge._store.thin import export

    export(out / "dataset_latest.h5", copy)
    with h5py.File(copy, "r") as c, h5py.File(out / "dataset_v0004.h5", "r") as f:
        assert not c["train/images"].is_virtual and c.attrs["self_contained"]
        assert np.array_equal(c["train/images"][()], f["train/images"][()])
        assert decode_str(c["val/ids"][()]) == decode_str(f["val/ids"][()])
    shutil.rmtree(out)  # the copy needs nothing from the old folder
    assert verify_file(copy, resample=0).ok


def test_a_missing_delta_is_an_error_never_silent_zeros(dataset, raw_new, tmp_path):
    spec_file, out, inbox = dataset
    drop_samples(raw_new, inbox, ["cell_000006"], rename="m_")
    age_files(inbox)
    h5forge.append(spec_file)
    moved = tmp_path / "moved"
    shutil.copytree(out, moved, symlinks=True)
    (moved / "dataset_v0002.delta.h5").unlink()
    report = verify_file(moved / "dataset_latest.h5")
    assert not report.ok
    assert any("dataset_v0002.delta.h5" in e and "missing" in e for e in report.errors)


def test_an_append_past_the_documented_chain_length_says_what_to_run(dataset, raw_new, monkeypatch, caplog):
    from h5forge._store import thin

    monkeypatch.setattr(thin, "MAX_THIN_CHAIN", 2)
    spec_file, out, inbox = dataset
    chains, advice = [], []
    for k in range(3):
        drop_samples(raw_new, inbox, [f"cell_{k:06d}"], rename=f"c{k}_")
        age_files(inbox)
        caplog.clear()
        with caplog.at_level("WARNING", logger="h5forge"):
            result = h5forge.append(spec_file)
        chains.append(result.chain)
        advice.append([r.getMessage() for r in caplog.records if "h5forge build" in r.getMessage()])
    assert chains == [1, 2, 3]
    assert advice[:2] == [[], []]
    assert advice[2] == [
        "dataset_v0004.h5 reads the delta files of 3 appends (more than 2): "
        "run `h5forge build SPEC` to publish a compact, self-contained version"
    ]
    assert thin.compact_advice(4, 3, str(spec_file)).endswith(
        f"run `h5forge build {spec_file}` to publish a compact, self-contained version"
    )
