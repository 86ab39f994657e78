"""Rows compressed by the cleaning workers and placed as stored chunks give the same file, value for
value and checksum for checksum, as rows compressed by the writer through HDF5's filter; h5py reads
the chunks through the filter as usual."""

import h5py
import numpy as np
import pytest

import h5forge
from h5forge._format.chunk_codec import EncodedRows, encode
from h5forge._ingest.clean import clean_batch
from h5forge._ingest.discover import discover
from h5forge._ingest.parallel import batches
from h5forge._ingest.writer import DatasetWriter
from h5forge.kinds import stored_kinds
from tests.helpers.data import demo_spec

FIELDS = ("images", "masks")


def _write(path, spec, inventory, encode_rows: bool):
    with DatasetWriter(path, spec, version=1) as writer:
        writer.add_rejections(inventory.rejections)
        for batch in batches(inventory.samples, 7):
            writer.add(clean_batch(spec, inventory.root, batch, encode=encode_rows))
        return writer.finish()


def _datasets(path) -> dict[str, np.ndarray]:
    out = {}
    with h5py.File(path, "r") as f:
        f.visititems(lambda name, obj: out.__setitem__(name, np.asarray(obj[()])) if isinstance(obj, h5py.Dataset) else None)
    return out


def _assert_same_values(a, b):
    da, db = _datasets(a), _datasets(b)
    assert sorted(da) == sorted(db)
    for name in da:
        assert da[name].dtype == db[name].dtype, name
        np.testing.assert_array_equal(da[name], db[name], err_msg=name)
    return da


@pytest.mark.parametrize("codec", ["lz4", "gzip-1", "none"])
def test_worker_chunks_equal_writer_compression(tmp_path, raw_demo, codec):
    spec = demo_spec(raw_demo, tmp_path / "out", codec=codec)
    inventory = discover(spec)
    good = [s for s in inventory.samples if s.id.startswith("cell_")][:3]
    first = clean_batch(spec, inventory.root, good)
    for field in FIELDS:
        assert isinstance(first.arrays[field], EncodedRows) and first.arrays[field].codec == codec
    plain = clean_batch(spec, inventory.root, good, encode=False)
    assert first.digests == plain.digests
    assert first.arrays["images"][0] == encode(codec, plain.arrays["images"][0])
    s1 = _write(tmp_path / "workers.h5", spec, inventory, True)
    s0 = _write(tmp_path / "writer.h5", spec, inventory, False)
    values = _assert_same_values(tmp_path / "workers.h5", tmp_path / "writer.h5")
    assert s1.samples == s0.samples == 40 and values["train/checksum"].size > 0
    # the workers' chunks were placed as they are (not decoded and recompressed by the writer);
    # HDF5's filter may pick other LZ4 matches (its own LZ4 build) but decodes to the same row
    with h5py.File(tmp_path / "workers.h5", "r") as a:
        for split in ("train", "val", "test"):
            for field in FIELDS:
                d = a[split][field]
                for i in range(d.shape[0]):
                    mask, chunk = d.id.read_direct_chunk((i, *(0,) * (d.ndim - 1)))
                    assert mask == 0 and chunk == encode(codec, values[f"{split}/{field}"][i])

def test_codec_without_an_exact_encoder_stays_with_the_writer(tmp_path, raw_demo):
    spec = demo_spec(raw_demo, tmp_path / "out", codec="zstd")
    inventory = discover(spec)
    batch = clean_batch(spec, inventory.root, inventory.samples[:3])
    assert all(isinstance(batch.arrays[f], np.ndarray) for f in FIELDS)
    several = demo_spec(raw_demo, tmp_path / "out", codec="gzip-1", chunk_rows=4)  # zlib streams do not join
    batch = clean_batch(several, inventory.root, inventory.samples[:3])
    assert all(isinstance(batch.arrays[f], np.ndarray) for f in FIELDS)


@pytest.mark.parametrize("codec", ["lz4", "none"])
def test_worker_chunks_join_into_chunks_of_several_rows(tmp_path, raw_demo, codec):
    """Several samples per chunk: the writer joins the workers' row chunks without recompressing
    them (each row an LZ4 block of the chunk), to the values the writer compressing stores."""
    spec = demo_spec(raw_demo, tmp_path / "out", codec=codec, chunk_rows=4)
    inventory = discover(spec)
    _write(tmp_path / "workers.h5", spec, inventory, True)
    _write(tmp_path / "writer.h5", spec, inventory, False)
    values = _assert_same_values(tmp_path / "workers.h5", tmp_path / "writer.h5")
    with h5py.File(tmp_path / "workers.h5", "r") as a:
        for split in ("train", "val", "test"):
            for field in FIELDS:
                d, rows = a[split][field], values[f"{split}/{field}"]
                assert d.chunks[0] == 4
                for start in range(0, len(rows) - 3, 4):  # whole chunks (the last, partial one is HDF5's)
                    mask, chunk = d.id.read_direct_chunk((start, *(0,) * (d.ndim - 1)))
                    assert mask == 0 and chunk == EncodedRows.of(codec, rows[start : start + 4]).joined(4)[0]


def test_chunks_for_another_pipeline_are_decoded_and_written(tmp_path, raw_demo):
    """A batch encoded for gzip-1 handed to a writer of an lz4 file: the rows are decoded and
    compressed by HDF5, the values stay the same."""
    lz4, gzip = (demo_spec(raw_demo, tmp_path / "out", codec=c) for c in ("lz4", "gzip-1"))
    inventory = discover(lz4)
    with DatasetWriter(tmp_path / "mixed.h5", lz4, version=1) as writer:
        writer.add_rejections(inventory.rejections)
        for batch in batches(inventory.samples, 7):
            writer.add(clean_batch(gzip, inventory.root, batch))
        writer.finish()
    _write(tmp_path / "writer.h5", lz4, inventory, False)
    _assert_same_values(tmp_path / "mixed.h5", tmp_path / "writer.h5")


def test_take_counts_statistics_from_the_chunks(tmp_path, raw_demo):
    spec = demo_spec(raw_demo, tmp_path / "out")
    inventory = discover(spec)
    refs = [s for s in inventory.samples if s.id.startswith("cell_")][:8]
    encoded, plain = (clean_batch(spec, inventory.root, refs, encode=e).take(stored_kinds(spec), [0, 3, 5], [])
                      for e in (True, False))
    assert len(encoded) == 3
    assert encoded.stats.keys() == plain.stats.keys()
    for path, per_split in plain.stats.items():
        for split, counts in per_split.items():
            np.testing.assert_array_equal(encoded.stats[path][split], counts)
    np.testing.assert_array_equal(encoded.arrays["images"].decoded(), plain.arrays["images"])


def test_build_on_dask_workers_equals_writer_compression(tmp_path, raw_demo):
    """A build on a LocalCluster (the workers compress) against the writer compressing; verify passes
    (the build publishes only a verified version)."""
    spec = demo_spec(raw_demo, tmp_path / "out")
    spec = spec.model_copy(update={"compute": spec.compute.model_copy(update={"inline_below": 0, "workers": 1})})
    result = h5forge.build(spec)
    assert result.timings["cleaned_in"] == "LocalCluster(1)"
    assert result.health["checksums"].startswith("ok")
    _write(tmp_path / "writer.h5", spec, discover(spec), False)
    _assert_same_values(result.path, tmp_path / "writer.h5")


def test_batches_with_and_without_chunks_keep_their_order(tmp_path, raw_demo):
    """Chunks are placed as they arrive while array rows wait for a block: rows still land in order."""
    spec = demo_spec(raw_demo, tmp_path / "out")
    inventory = discover(spec)
    with DatasetWriter(tmp_path / "mixed.h5", spec, version=1) as writer:
        writer.add_rejections(inventory.rejections)
        for k, batch in enumerate(batches(inventory.samples, 5)):
            writer.add(clean_batch(spec, inventory.root, batch, encode=k % 3 == 2))
        writer.finish()
    _write(tmp_path / "writer.h5", spec, inventory, False)
    _assert_same_values(tmp_path / "mixed.h5", tmp_path / "writer.h5")
