"""Cleaning workers write their compressed chunks to chunk files and send back the rest of the
batch; the writer places the chunks from the files. The version is the one the workers would have
made sending their chunks: same ids, checksums, digests and stored chunk bytes."""

from __future__ import annotations

import h5py
import numpy as np
from distributed import LocalCluster

import h5forge
from h5forge._format.chunk_codec import EncodedRows
from h5forge._format.names import CHUNKS_DIR
from h5forge._format.summary import read_summary
from h5forge._ingest.clean import clean_batch
from h5forge._ingest.discover import discover
from h5forge._ingest.chunk_files import ChunkFileRows, read_chunk_file, write_chunk_file
from h5forge.spec import DatasetSpec
from tests.helpers.data import demo_spec
from tests.helpers.version_identity import stored_fingerprint


def _good(spec):
    inventory = discover(spec)
    return inventory, [s for s in inventory.samples if s.id.startswith("cell_")][:5]


def test_a_batch_goes_through_its_chunk_file_unchanged(tmp_path, raw_demo):
    spec = demo_spec(raw_demo, tmp_path / "out")
    inventory, refs = _good(spec)
    batch = clean_batch(spec, inventory.root, refs)
    folder = tmp_path / "mapped"
    folder.mkdir()
    placed = write_chunk_file(batch, folder)
    for field in ("images", "masks"):
        assert isinstance(placed.arrays[field], ChunkFileRows) and len(placed.arrays[field]) == 5
    (file,) = folder.iterdir()
    assert file.stat().st_size == sum(batch.arrays[f].nbytes for f in ("images", "masks"))
    back = read_chunk_file(placed, folder)
    assert back is not None and not list(folder.iterdir())  # read once, then deleted
    for field in ("images", "masks"):
        rows = back.arrays[field]
        assert isinstance(rows, EncodedRows)
        assert [bytes(c) for c in rows.chunks] == batch.arrays[field].chunks
        np.testing.assert_array_equal(rows.decoded(), batch.arrays[field].decoded())
    assert back.digests == batch.digests and back.ids == batch.ids


def test_a_worker_that_cannot_write_sends_its_chunks_and_a_missing_file_is_reported(tmp_path, raw_demo):
    spec = demo_spec(raw_demo, tmp_path / "out")
    inventory, refs = _good(spec)
    batch = clean_batch(spec, inventory.root, refs)
    assert write_chunk_file(batch, tmp_path / "not-there") is batch  # the chunks travel with the batch
    folder = tmp_path / "mapped"
    folder.mkdir()
    placed = write_chunk_file(batch, folder)
    (file,) = folder.iterdir()
    file.write_bytes(file.read_bytes()[:-1])  # cut short: not a whole chunk file
    assert read_chunk_file(placed, folder) is None
    file.unlink()
    assert read_chunk_file(placed, folder) is None  # written on storage this machine does not see



def test_a_build_on_dask_writes_through_chunk_files_and_equals_one_cleaned_in_process(tmp_path, raw_demo):
    base = demo_spec(raw_demo, tmp_path / "here")
    inline = h5forge.build(base)
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
        data = base.model_dump(mode="json")
        data["output"]["dir"] = str(tmp_path / "there")
        data["compute"].update(dask_address=cluster.scheduler_address, inline_below=0, batch_size=4)
        spread = h5forge.build(DatasetSpec.model_validate(data))
    assert spread.counts == inline.counts and sum(spread.counts.values()) == 40
    assert stored_fingerprint(spread.path) == stored_fingerprint(inline.path)
    with h5py.File(spread.path, "r") as f:
        timings = read_summary(f)["timings"]
    assert timings["batches_via_chunk_files"] >= 10  # 40 good samples in batches of 4
    assert not (tmp_path / "there" / CHUNKS_DIR).exists()


def test_the_chunk_files_a_killed_run_left_are_removed_when_the_next_run_takes_the_folder(tmp_path):
    from h5forge._store.versions import output_lock

    out = tmp_path / "out"
    left = out / CHUNKS_DIR
    left.mkdir(parents=True)
    (left / "0123.chunks").write_bytes(b"half a batch")
    with output_lock(out):
        assert not left.exists()
