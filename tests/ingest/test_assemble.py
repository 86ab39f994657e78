"""Mapped versions (``storage.assemble: mapped``): the version maps its sample arrays onto the row
files the cleaning workers wrote, and equals the copy-assembled one
(ids, checksums, sample keys, split digests, values); its files live, are verified, exported,
appended onto, compacted, rolled back to, read and removed with it."""

from __future__ import annotations

import json
import os
import shutil
import stat

import h5py
import numpy as np
import pytest
import yaml
from distributed import LocalCluster

import h5forge
from h5forge._format.catalog import sample_keys
from h5forge._format.names import SPLITS, Attr, rows_folder_name
from h5forge._format.row_files import row_files_of, virtual_sources
from h5forge._ingest.assemble import MappedWriter, clean_to_file
from h5forge._ingest.discover import discover
from h5forge.spec import DatasetSpec
from h5forge._store.thin import export
from h5forge._store.verify import verify_file
from h5forge._store.versions import output_lock, published, retain, set_latest
from h5forge._views.info import lineage
from tests.helpers.data import age_files, demo_spec, drop_samples, write_spec_file


def _spec(raw, out, assemble: str, **compute) -> DatasetSpec:
    spec = demo_spec(raw, out, assemble=assemble)
    return spec.model_copy(update={"compute": spec.compute.model_copy(update={"batch_size": 8, **compute})})


def _what_must_match(path) -> dict:
    """What must not depend on how the version was assembled."""
    out = {}
    with h5py.File(path, "r") as f:
        out["catalog"] = [f["inputs"][name][()].tobytes() for name in ("content", "content_at", "ids")]
        for split in SPLITS:
            g = f[split]
            out[split] = {
                "digest": str(g.attrs[Attr.DIGEST]),
                "ids": g["ids"][()].tolist(),
                "checksum": g["checksum"][()].tolist(),
                "keys": sample_keys(f, split).tolist(),
                "images": g["images"][()].tobytes(),
                "masks": g["masks"][()].tobytes(),
            }
    return out


def test_a_mapped_version_on_dask_equals_the_copy_version_and_maps_the_workers_files(tmp_path, raw_demo):
    copy = h5forge.build(_spec(raw_demo, tmp_path / "copy", "copy"))
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
        spec = _spec(raw_demo, tmp_path / "seg", "mapped", dask_address=cluster.scheduler_address, inline_below=0)
        seg = h5forge.build(spec)
    assert seg.counts == copy.counts and sum(seg.counts.values()) == 40
    assert _what_must_match(seg.path) == _what_must_match(copy.path)
    assert seg.compression_ratio == copy.compression_ratio  # the summary counts the row files' bytes
    folder = tmp_path / "seg" / rows_folder_name(1)
    listed = row_files_of(tmp_path / "seg" / "dataset_v0001.h5")
    assert sorted(folder.iterdir()) == sorted(tmp_path / "seg" / s["file"] for s in listed)  # nothing else left
    assert len(listed) == -(-len(discover(spec).samples) // 8)  # one file per batch of 8 inputs
    with h5py.File(seg.path, "r") as f, h5py.File(copy.path, "r") as c:
        assert f.attrs[Attr.SELF_CONTAINED] is np.False_ and c.attrs.get(Attr.ROW_FILES) is None
        for split in SPLITS:
            assert f[split]["images"].is_virtual and not f[split]["ids"].is_virtual
            assert len(f[split]["images"].virtual_sources()) == sum(1 for s in listed if s["counts"][split])
        assert f["train/images"].id.get_storage_size() == 0  # no chunk placed by the publisher
        assert virtual_sources(f) == {str(tmp_path / "seg" / s["file"]) for s in listed}
    assert {stat.S_IMODE(p.stat().st_mode) for p in folder.iterdir()} == {0o444}  # read-only, like the version


def test_verify_names_a_damaged_or_a_missing_row_file(tmp_path, raw_demo):
    seg = h5forge.build(_spec(raw_demo, tmp_path / "seg", "mapped"))
    assert verify_file(seg.path).ok
    files = [tmp_path / "seg" / s["file"] for s in row_files_of(seg.path)]
    moved = tmp_path / "damaged"
    shutil.copytree(tmp_path / "seg", moved, symlinks=True)
    victim = moved / files[1].relative_to(tmp_path / "seg")
    os.chmod(victim, 0o644)
    with h5py.File(victim, "r+") as f:  # a value changed behind the version's back
        ds = f["train/images"]
        _, chunk = ds.id.read_direct_chunk((0, 0, 0, 0))
        row = ds[0]
        row[0, 0, 0] ^= 0xFF
        ds[0] = row
        assert ds.id.read_direct_chunk((0, 0, 0, 0))[1] != chunk
    report = verify_file(moved / "dataset_latest.h5")
    assert not report.ok and any("checksum" in e for e in report.errors)
    victim.unlink()
    report = verify_file(moved / "dataset_latest.h5")
    assert not report.ok
    assert any(victim.name in e and "missing" in e for e in report.errors), report.errors


def test_build_append_rebuild_rollback_and_read_with_the_torch_loader(tmp_path, raw_demo, raw_new):
    pytest.importorskip("torch")
    from h5forge.read.torch import H5Dataset

    spec_file = write_spec_file(raw_demo, tmp_path / "out", tmp_path / "spec.yaml", inbox=tmp_path / "inbox")
    data = yaml.safe_load(spec_file.read_text())
    data.setdefault("storage", {})["assemble"] = "mapped"
    data["compute"]["batch_size"] = 8
    spec_file.write_text(yaml.safe_dump(data))
    out, inbox = tmp_path / "out", tmp_path / "inbox"
    first = h5forge.build(spec_file)
    assert first.version == 1 and (out / rows_folder_name(1)).is_dir()
    drop_samples(raw_new, inbox, [f"cell_{i:06d}" for i in range(3)], rename="a_")
    age_files(inbox)
    appended = h5forge.append(spec_file)
    assert appended.version == 2
    thin = row_files_of(out / "dataset_v0002.h5")  # the workers' files, then the delta
    assert [s["file"] for s in thin[:-1]] == [s["file"] for s in row_files_of(out / "dataset_v0001.h5")]
    assert thin[-1]["file"] == "dataset_v0002.delta.h5"
    assert verify_file(out / "dataset_v0002.h5").ok
    for number, assembled in ((1, True), (2, False)):  # what `h5forge info` calls each
        with h5py.File(out / f"dataset_v000{number}.h5", "r") as f:
            lin = lineage(f, out / f"dataset_v000{number}.h5")
            assert lin["kind"] == "thin" and lin["assembled"] is assembled
    rebuilt = h5forge.build(spec_file)  # every row taken from the thin version's files: compacted
    assert rebuilt.version == 3 and rebuilt.timings["reused"] == sum(rebuilt.counts.values())
    assert sum(rebuilt.counts.values()) == sum(first.counts.values()) + 3
    with h5py.File(out / "dataset_v0003.h5", "r") as f:
        assert Attr.ROW_FILES not in f.attrs and not f["train/images"].is_virtual
    assert not (out / rows_folder_name(3)).exists()
    assert verify_file(out / "dataset_v0003.h5").ok
    with h5py.File(out / "dataset_v0003.h5", "r") as new, h5py.File(out / "dataset_v0002.h5", "r") as old:
        for split in SPLITS:  # the same rows (a rebuild orders the appended ones among the others)
            assert sorted(zip(new[split]["ids"][()], new[split]["checksum"][()])) == sorted(
                zip(old[split]["ids"][()], old[split]["checksum"][()])
            )

    set_latest(out, 1)  # rollback to the mapped version
    loader = H5Dataset(out / "dataset_latest.h5", "train", fields="images").loader(batch_size=4, shuffle=False)
    seen = [b for b in loader]
    with h5py.File(out / "dataset_v0001.h5", "r") as f:
        want = f["train/images"][()]  # torch's default: the stored uint8 values
        assert sum(len(b) for b in seen) == len(want) == first.counts["train"]
    np.testing.assert_array_equal(np.concatenate([b.numpy() for b in seen]), want)


def test_export_of_a_mapped_version_is_self_contained_and_retention_removes_its_files(tmp_path, raw_demo):
    spec = _spec(raw_demo, tmp_path / "seg", "mapped")
    first = h5forge.build(spec)
    copy = export(first.path, tmp_path / "copy.h5")
    with h5py.File(copy, "r") as c:
        assert not c["train/images"].is_virtual and c.attrs[Attr.SELF_CONTAINED]
    assert _what_must_match(copy) == _what_must_match(first.path)
    assert verify_file(copy).ok
    data = spec.model_dump(mode="json")
    data["annotations"]["index_by"] = []  # another spec: a version of its own
    h5forge.build(DatasetSpec.model_validate(data))
    assert list(published(tmp_path / "seg")) == [1, 2]
    removed = retain(tmp_path / "seg", keep=1)
    assert {p.name for p in removed} == {"dataset_v0001.h5", rows_folder_name(1)}
    assert not (tmp_path / "seg" / rows_folder_name(1)).exists()
    assert (tmp_path / "seg" / rows_folder_name(2)).is_dir() and verify_file(tmp_path / "seg" / "dataset_v0002.h5").ok


def test_a_killed_workers_partial_file_is_never_mapped_and_is_removed(tmp_path, raw_demo):
    spec = _spec(raw_demo, tmp_path / "out", "mapped")
    inventory = discover(spec)
    good = [s for s in inventory.samples if s.id.startswith("cell_")]
    path = tmp_path / "out" / "v.h5"
    path.parent.mkdir()
    with MappedWriter(path, spec, version=1) as writer:
        target = writer.row_files_to
        killed = writer.folder / ".0123abcd.h5.partial"
        killed.write_bytes(b"half a file")  # a worker died while writing its batch
        for i in range(0, len(good), 8):
            writer.add(clean_to_file(spec, str(inventory.root), good[i : i + 8], target))
        writer.finish()
    assert not killed.exists()
    names = [s["file"] for s in row_files_of(path)]
    assert len(names) == 5 and all(not n.endswith(".partial") for n in names)
    assert verify_file(path).ok


def test_a_killed_builds_rows_folder_is_removed_when_the_next_run_takes_the_folder(tmp_path):
    out = tmp_path / "out"
    left = out / rows_folder_name(1)
    left.mkdir(parents=True)
    (left / "0123.h5").write_bytes(b"a batch of an unpublished version")
    with output_lock(out):
        assert not left.exists()


def test_a_checkpoint_of_a_mapped_build_offers_no_row_to_resume(tmp_path, raw_demo):
    spec = _spec(raw_demo, tmp_path / "out", "mapped")
    inventory = discover(spec)
    good = [s for s in inventory.samples if s.id.startswith("cell_")]
    (tmp_path / "out").mkdir()
    with MappedWriter(tmp_path / "out" / "v.h5", spec, version=1) as writer:
        writer.add(clean_to_file(spec, str(inventory.root), good[:8], writer.row_files_to))
        state = writer.checkpoint()  # the version file holds no sample array before it finishes
        assert state["counts"] == {s: 0 for s in SPLITS}
        assert json.dumps(state)


def test_a_workers_file_the_publisher_cannot_see_stops_the_build_with_the_reason(tmp_path, raw_demo):
    from h5forge.errors import UsageError

    spec = _spec(raw_demo, tmp_path / "out", "mapped")
    inventory = discover(spec)
    good = [s for s in inventory.samples if s.id.startswith("cell_")]
    (tmp_path / "out").mkdir()
    with pytest.raises(UsageError, match="is not visible from this machine.*share the output folder"):
        with MappedWriter(tmp_path / "out" / "v.h5", spec, version=1) as writer:
            batch = clean_to_file(spec, str(inventory.root), good[:8], writer.row_files_to)
            (writer.folder / batch.row_file["file"]).unlink()  # written on a worker's own disk
            writer.add(batch)
    assert not (tmp_path / "out" / "v.h5").exists() and not (tmp_path / "out" / rows_folder_name(1)).exists()
