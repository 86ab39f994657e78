"""Lightning's DDP (``strategy="ddp", devices=2`` on CPU, its default ``use_distributed_sampler=True``)
over h5forge loaders: a real two-process run, counting the rows each epoch trained and validated on."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import h5py
import pytest

from tests.helpers.files import build_file, make_raw

pytestmark = pytest.mark.e2e

SCRIPT = Path(__file__).with_name("lightning_ddp.py")


@pytest.fixture(scope="module")
def version(tmp_path_factory):
    base = tmp_path_factory.mktemp("lightning")
    return build_file(base / "out" / "dataset_v0001.h5", make_raw(base / "raw", n=61), chunk_rows=4, codec="lz4")


def _ddp_run(version: Path, out: Path, mode: str) -> dict:
    out.mkdir()
    run = subprocess.run([sys.executable, str(SCRIPT), str(version), str(out), mode], capture_output=True, text=True,
                         timeout=600, env={**__import__("os").environ, "MASTER_ADDR": "127.0.0.1"})
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-5000:]
    return {p.stem: json.loads(p.read_text()) for p in out.glob("*.json")}


def _check_every_epoch(seen: dict, counts: dict) -> None:
    for stage in ("train", "val"):
        n = counts[stage]
        for epoch in range(2):
            ranks = [seen[f"{stage}-rank{r}-epoch{epoch}"] for r in range(2)]
            assert len(ranks[0]) == len(ranks[1])  # equal shards: no rank waits for the other
            rows = ranks[0] + ranks[1]
            assert len(set(rows)) == len(rows)  # disjoint
            assert len(rows) == n - n % 2, (stage, epoch, len(rows), n)  # the whole split, less the odd one out


def _counts(version: Path) -> dict:
    with h5py.File(version, "r") as f:
        return {s: int(f[s].attrs["count"]) for s in ("train", "val", "test")}


def test_ddp_with_the_readers_loader_trains_on_every_sample(version, tmp_path):
    counts = _counts(version)
    assert counts["train"] > 20 and counts["val"] >= 4
    _check_every_epoch(_ddp_run(version, tmp_path / "seen", "loader"), counts)


def test_ddp_with_the_datamodule_trains_on_every_sample_and_predicts_each_once(version, tmp_path):
    counts = _counts(version)
    seen = _ddp_run(version, tmp_path / "seen", "datamodule")
    _check_every_epoch(seen, counts)
    predicted = seen["predict-rank0"] + seen["predict-rank1"]
    assert sorted(predicted) == list(range(counts["test"]))  # the test split, each sample once


def test_a_sharded_sampler_refuses_to_be_sharded_again(version):
    from lightning.fabric.utilities.distributed import DistributedSamplerWrapper

    from h5forge.read.torch import ChunkShuffleSampler, H5Dataset, ShardedTwice

    ds = H5Dataset(version, "train", fields=["images"])
    twice = DistributedSamplerWrapper(ChunkShuffleSampler(ds, num_replicas=2, rank=0), num_replicas=2, rank=0)
    with pytest.raises(ShardedTwice, match="use_distributed_sampler=False"):
        list(twice)
    # unsharded, it is the wrapper's to split: the two ranks read every sample once between them
    whole = [list(DistributedSamplerWrapper(ChunkShuffleSampler(ds, num_replicas=1, rank=0, shuffle=False),
                                            num_replicas=2, rank=r, shuffle=False)) for r in range(2)]
    assert set(whole[0] + whole[1]) == set(range(len(ds)))
