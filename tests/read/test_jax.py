"""The JAX adapter against a real version file (jax is in the test extra).

The TensorFlow reader's tests are in test_tf_reader.py: tensorflow-cpu needs an older h5py than
h5forge pins, so they run in the second venv that `make test-tf` builds.

jax is imported only in child processes: it starts threads, and the other test modules fork
(DataLoader workers, dask) after this one; forking a process with those threads running can deadlock.
"""

from __future__ import annotations

import pickle
import subprocess
import sys

import numpy as np
import pytest

from tests.helpers.data import REPO
from tests.helpers.files import build_file, make_raw, truth


def in_child(function: str, *args: str) -> None:
    """Run ``<this module>.<function>(*args)`` in a fresh interpreter; fail with its output."""
    code = f"import sys; from {__name__} import {function}; {function}(*sys.argv[1:])"
    proc = subprocess.run([sys.executable, "-c", code, *args], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    base = tmp_path_factory.mktemp("tfjax")
    raw = make_raw(base / "raw", n=120)
    path = build_file(base / "out" / "dataset_v0001.h5", raw, chunk_rows=4)
    return {"path": path, "truth": truth(path)}


def test_jax_source_and_batches(data):
    from h5forge.read.jax import Source, batches
    from h5forge.read._sampler import epoch_order, shard

    t = data["truth"]
    src = Source(data["path"], split="train", fields=("images", "masks"))
    assert len(src) == len(t["ids"])
    rec = src[5]
    assert rec["images"].dtype == np.float32 and rec["masks"].dtype == np.int32
    assert np.array_equal(rec["images"], t["images"][5].astype(np.float32) / 255)
    clone = pickle.loads(pickle.dumps(src))  # Grain workers get a copy: path, no handle
    assert np.array_equal(clone[7]["masks"], t["masks"][7])

    got = list(batches(src, batch_size=16, seed=3, epoch=1))
    order = epoch_order(len(src), src.chunk_rows, seed=3, epoch=1)
    n = len(order) // 16 * 16
    imgs = np.concatenate([b["images"] for b in got])
    assert imgs.shape == (n, 3, 64, 64)
    assert np.array_equal(imgs, t["images"][order[:n]].astype(np.float32) / 255)
    assert np.array_equal(np.concatenate([b["masks"] for b in got]), t["masks"][order[:n]])

    in_child("jax_checks", str(data["path"]))
    # DDP-style: two processes' shards are disjoint and equal
    a = [b["masks"] for b in batches(src, batch_size=4, num_replicas=2, rank=0, seed=1)]
    b = [b["masks"] for b in batches(src, batch_size=4, num_replicas=2, rank=1, seed=1)]
    assert len(a) == len(b) == len(src) // 2 // 4
    order = epoch_order(len(src), src.chunk_rows, seed=1, epoch=0)
    for rank, got_masks in ((0, a), (1, b)):
        mine = shard(order, 2, rank)[: len(got_masks) * 4]
        assert np.array_equal(np.concatenate(got_masks), t["masks"][mine])


def test_jax_source_refuses_an_index_that_is_not_an_integer(data):
    from h5forge.read.jax import Source

    src = Source(data["path"], split="train", fields=("masks",), return_index=True)
    for bad in (1.7, True, np.float64(2.9)):
        with pytest.raises(TypeError, match="integers"):
            src[bad]
    with pytest.raises(TypeError, match="integers"):
        src.get_batch([0.5, 1.9])
    assert src[np.int64(2)]["index"] == 2 and np.array_equal(src[np.int64(2)]["masks"], data["truth"]["masks"][2])


def jax_checks(path: str) -> None:
    import jax

    from h5forge.read.jax import batches

    on_device = next(batches(path, "train", batch_size=8, as_jax=True))
    assert isinstance(on_device["images"], jax.Array) and on_device["masks"].dtype == jax.numpy.int32
    assert on_device["images"].shape == (8, 3, 64, 64)

