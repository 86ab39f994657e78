"""The single writer with several samples per chunk: every row it is given is written, whatever
chunk boundary the rows written so far end on (a checkpoint, a take-over or copied rows can leave a
field's dataset ending inside a chunk while the small columns have nothing left to write)."""

from __future__ import annotations

import h5py
import numpy as np
import pytest

from h5forge._ingest import writer as writer_module
from h5forge._ingest.clean import clean_batch
from h5forge._ingest.discover import discover
from h5forge._ingest.writer import DatasetWriter
from tests.helpers.files import make_raw, spec_for


def _train_only(spec):
    return spec.model_copy(update={"splits": spec.splits.model_copy(update={"ratios": {"train": 1.0}})})


def _contents(path):
    with h5py.File(path, "r") as f:
        g = f["train"]
        return int(g.attrs["count"]), {k: g[k][()] for k in ("images", "masks", "ids")}


@pytest.mark.parametrize("codec", ["lz4", "none", "zstd"])
def test_rows_waiting_for_their_chunk_are_written_when_the_small_columns_have_none_left(tmp_path, monkeypatch, codec):
    # small columns written every 8 rows, sample fields in chunks of 4: after 6 rows and a
    # checkpoint the fields end inside a chunk, and the next 8 rows flush the small columns whole
    # while 2 rows of each field still wait for their chunk
    monkeypatch.setattr(writer_module, "SMALL_ROWS", 8)
    raw = make_raw(tmp_path / "raw", n=14)
    spec = _train_only(spec_for(raw, tmp_path / "out", chunk_rows=4, codec=codec))
    inv = discover(spec)
    first, second = clean_batch(spec, inv.root, inv.samples[:6]), clean_batch(spec, inv.root, inv.samples[6:])
    assert len(first) == 6 and len(second) == 8

    w = DatasetWriter(tmp_path / "checkpointed.h5", spec, version=1)
    w.add(first)
    assert w.checkpoint()["counts"]["train"] == 6
    w.add(second)
    w.finish()
    whole = DatasetWriter(tmp_path / "whole.h5", spec, version=1)
    whole.add(clean_batch(spec, inv.root, inv.samples))
    whole.finish()

    count, got = _contents(tmp_path / "checkpointed.h5")
    _, want = _contents(tmp_path / "whole.h5")
    assert count == 14
    for name, values in want.items():
        assert len(got[name]) == 14, name
        assert np.array_equal(got[name], values), name
