"""Appending from an inbox: thin versions, exactly once, waiting pairs, rebuild."""

import hashlib
import os

import h5py
import numpy as np

import h5forge
from h5forge._format.layout import decode_str
from h5forge._ingest.splits import assign_split
from h5forge._store.verify import verify_file
from h5forge._store.versions import latest
from tests.helpers.data import age_files, demo_spec, drop_samples, write_spec_file
from tests.helpers.files import all_ids

def sha(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def test_append_extends_every_split_and_leaves_the_old_version_alone(dataset, raw_new):
    spec_file, out, inbox = dataset
    v1 = out / "dataset_v0001.h5"
    before = sha(v1)
    old_ids = all_ids(v1)
    new_ids = drop_samples(raw_new, inbox, [f"cell_{i:06d}" for i in range(10)], rename="new_")
    age_files(inbox)
    result = h5forge.append(spec_file)
    assert result.version == 2 and result.added == 10 and result.rejected == 0
    assert sha(v1) == before  # byte for byte
    assert latest(out) == 2
    spec = demo_spec(raw_new, out)
    ids = all_ids(out / "dataset_latest.h5")
    for split in ("train", "val", "test"):
        expected_new = sorted(i for i in new_ids if assign_split(i, spec.splits) == split)
        assert ids[split] == old_ids[split] + expected_new  # old rows first, in order; splits stable
    with h5py.File(out / "dataset_v0002.h5", "r") as f, h5py.File(out / "dataset_v0002.delta.h5", "r") as d, \
            h5py.File(v1, "r") as base:
        assert f["train/images"].is_virtual
        n_old = base["train"].attrs["count"]
        assert np.array_equal(f["train/images"][:n_old], base["train/images"][()])
        assert np.array_equal(f["train/images"][n_old:], d["train/images"][()])
        assert np.array_equal(f["train/masks"][n_old:], d["train/masks"][()])
        hist = base["train"].attrs["images_histogram"] + d["train"].attrs["images_histogram"]
        assert np.array_equal(f["train"].attrs["images_histogram"], hist)
        stacked = f["train/images"][()].astype(np.float64) / 255
        assert np.allclose(f["train"].attrs["images_mean"], stacked.mean(axis=(0, 2, 3)), atol=1e-9)
        assert np.allclose(f["train"].attrs["images_std"], stacked.std(axis=(0, 2, 3)), atol=1e-6)
        labels = decode_str(f["train/meta/label"][()])
        rows = f["index/train/label/rows"][()]
        offsets = f["index/train/label/offsets"][()]
        values = decode_str(f["index/train/label/values"][()])
        for k, value in enumerate(values):
            assert all(labels[r] == value for r in rows[offsets[k]:offsets[k + 1]])
    assert verify_file(out / "dataset_latest.h5").ok
    moved = sorted(p.name for p in (inbox / "processed" / "v0002" / "images").iterdir())
    assert moved == sorted(f"{i}.png" for i in new_ids)
    assert not list((inbox / "images").iterdir())


def test_duplicates_and_id_conflicts_are_quarantined(dataset, raw_demo, raw_new):
    spec_file, out, inbox = dataset
    drop_samples(raw_demo, inbox, ["cell_000003"], rename="copy_of_")  # same content, new name
    drop_samples(raw_new, inbox, ["cell_000001"])  # an id v1 holds, other content
    drop_samples(raw_new, inbox, ["cell_000002"], rename="fresh_")
    age_files(inbox)
    result = h5forge.append(spec_file)
    assert result.added == 1
    reasons = {r.sample_id: r.reason for r in result.rejections}
    assert reasons["copy_of_cell_000003"].startswith("duplicate: identical content is already in the dataset as 'cell_000003'")
    assert "already in the dataset with other content" in reasons["cell_000001"]
    reason_file = inbox / "quarantine" / "images" / "copy_of_cell_000003.png.reason"
    assert reason_file.read_text().startswith("duplicate")
    # the same files dropped again are duplicates of v2 now: nothing is added twice
    drop_samples(raw_new, inbox, ["cell_000002"], rename="fresh_")
    age_files(inbox)
    again = h5forge.append(spec_file)
    assert again.version is None and again.added == 0
    assert latest(out) == 2
    ids = sum(all_ids(out / "dataset_latest.h5").values(), [])
    assert len(ids) == len(set(ids)) == 41


def test_partial_pairs_and_unsettled_files_wait(dataset, raw_demo, raw_new):
    spec_file, out, inbox = dataset
    spec_file = write_spec_file(raw_demo, out, spec_file, inbox=inbox, append={"settle_seconds": 30})
    drop_samples(raw_new, inbox, ["cell_000004", "cell_000005"], rename="w_")
    (inbox / "masks" / "w_cell_000004.png").rename(inbox.parent / "held_back.png")
    age_files(inbox, seconds=60)
    os.utime(inbox / "images" / "w_cell_000005.png")  # just written: not settled for 30 s
    result = h5forge.append(spec_file)
    assert result.version is None and result.waiting == 2
    assert (inbox / "images" / "w_cell_000004.png").exists()  # untouched, not quarantined
    (inbox.parent / "held_back.png").rename(inbox / "masks" / "w_cell_000004.png")
    age_files(inbox, seconds=60)
    result = h5forge.append(spec_file)
    assert result.added == 2 and result.waiting == 0


def test_nightly_rebuild_is_compact_and_keeps_appended_samples(dataset, raw_new):
    spec_file, out, inbox = dataset
    new_ids = drop_samples(raw_new, inbox, ["cell_000010", "cell_000011"], rename="n_")
    age_files(inbox)
    h5forge.append(spec_file)
    thin_ids = all_ids(out / "dataset_latest.h5")
    result = h5forge.build(spec_file)
    assert result.version == 3
    rebuilt = all_ids(out / "dataset_latest.h5")
    assert {s: sorted(v) for s, v in rebuilt.items()} == {s: sorted(v) for s, v in thin_ids.items()}
    assert set(new_ids) <= set(sum(rebuilt.values(), []))
    with h5py.File(out / "dataset_v0003.h5", "r") as f:
        assert not f["train/images"].is_virtual and "row_files" not in f.attrs and "segments" not in f.attrs
    with h5py.File(out / "dataset_v0002.h5", "r") as thin, h5py.File(out / "dataset_v0003.h5", "r") as full:
        for split in ("train", "val", "test"):
            a = dict(zip(decode_str(thin[split]["ids"][()]), thin[split]["checksum"][()]))
            b = dict(zip(decode_str(full[split]["ids"][()]), full[split]["checksum"][()]))
            assert a == b  # same samples, same stored bytes
