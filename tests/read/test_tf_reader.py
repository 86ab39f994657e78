"""The TensorFlow reader (h5forge.read.tf) against a real version file.

tensorflow-cpu accepts only an older h5py than the one pyproject.toml pins, so these tests carry the
`tf` marker: `make test` leaves them out and `make test-tf` runs them in the second venv it builds
(.venv-tf, requirements-tf.txt); .ci/run runs both, so none is skipped.

tensorflow is imported only in child processes: it starts threads, and the other test modules fork
(DataLoader workers, dask) after this one; forking a process with those threads running can deadlock.
"""

from __future__ import annotations

import os
import subprocess
import sys

import h5py
import numpy as np
import pytest

from tests.helpers.data import REPO
from tests.helpers.files import build_file, make_raw, truth

pytestmark = pytest.mark.tf


def in_child(function: str, *args: str) -> None:
    """Run ``<this module>.<function>(*args)`` in a fresh interpreter; fail with its output."""
    code = f"import sys; from {__name__} import {function}; {function}(*sys.argv[1:])"
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}  # TF's start-up chatter would bury a failure
    proc = subprocess.run([sys.executable, "-c", code, *args], cwd=REPO, capture_output=True, text=True,
                          timeout=600, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    base = tmp_path_factory.mktemp("tf")
    raw = make_raw(base / "raw", n=120)
    return build_file(base / "out" / "dataset_v0001.h5", raw, chunk_rows=4)


def meta(path: str, column: str, split: str = "train") -> np.ndarray:
    """An annotation column as h5py reads it (text decoded), the ground truth for the reader."""
    with h5py.File(os.path.realpath(path), "r") as f:
        values = f[split]["meta"][column][()]
    return np.array([v.decode() for v in values]) if values.dtype.kind in "OS" else values


def test_tf_dataset(data):
    in_child("tf_checks", str(data))


def tf_checks(path: str) -> None:
    import tensorflow as tf

    import h5forge.read.tf
    from h5forge.read._sampler import epoch_order

    t = truth(path)
    ds = h5forge.read.tf.dataset(path, split="train", fields=("images", "masks"), batch_size=16,
                                 shuffle=True, seed=2)
    spec = ds.element_spec
    assert spec[0].shape.as_list() == [None, 64, 64, 3] and spec[0].dtype == tf.float32
    assert spec[1].shape.as_list() == [None, 64, 64, 1] and spec[1].dtype == tf.int64
    n = len(t["ids"])
    for epoch in range(2):  # each pass over the dataset is the next epoch
        order = epoch_order(n, 4, seed=2, epoch=epoch)
        xs, ms = zip(*[(x.numpy(), m.numpy()) for x, m in ds])
        x, m = np.concatenate(xs), np.concatenate(ms)
        assert x.shape == (n, 64, 64, 3)
        assert np.array_equal(x, np.moveaxis(t["images"][order], 1, -1).astype(np.float32) / 255)
        assert np.array_equal(m, np.moveaxis(t["masks"][order], 1, -1).astype(np.int64))

    single = h5forge.read.tf.dataset(path, split="val", fields="masks", batch_size=None,
                                     channels_last=False, mask_dtype="uint8")
    tv = truth(path, "val")
    got = np.stack([e.numpy() for e in single])
    assert got.dtype == np.uint8 and np.array_equal(got, tv["masks"])
    fixed = h5forge.read.tf.dataset(path, batch_size=16, drop_remainder=True)
    assert fixed.element_spec[0].shape.as_list() == [16, 64, 64, 3]
    assert sum(1 for _ in fixed) == n // 16


def test_tf_int_column_with_index(data):
    in_child("int_column_checks", str(data))


def int_column_checks(path: str) -> None:
    """An int annotation column next to the images, shuffled, with each sample's row."""
    import tensorflow as tf

    import h5forge.read.tf
    from h5forge.read._sampler import epoch_order

    t = truth(path)
    num_cells = meta(path, "num_cells")
    n = len(t["ids"])
    ds = h5forge.read.tf.dataset(path, fields=("images", "num_cells"), return_index=True, batch_size=8,
                                 shuffle=True)
    images, cells, index = ds.element_spec
    assert images.shape.as_list() == [None, 64, 64, 3] and images.dtype == tf.float32
    assert cells.shape.as_list() == [None] and cells.dtype == tf.int64
    assert index.shape.as_list() == [None] and index.dtype == tf.int64

    batches = [(x, c, i) for x, c, i in ds]
    assert all(c.dtype == tf.int64 and i.dtype == tf.int64 for _, c, i in batches)
    assert [len(i) for _, _, i in batches[:-1]] == [8] * (len(batches) - 1)
    x, c, i = (np.concatenate([b[k].numpy() for b in batches]) for k in range(3))
    assert sorted(i.tolist()) == list(range(n))  # every row once ...
    assert np.array_equal(i, epoch_order(n, 4, seed=0, epoch=0))  # ... in the shuffled order
    assert not np.array_equal(i, np.arange(n))
    assert c.dtype == np.int64 and np.array_equal(c, num_cells[i])
    assert np.array_equal(x, np.moveaxis(t["images"][i], 1, -1).astype(np.float32) / 255)


def test_tf_text_columns(data):
    in_child("text_column_checks", str(data))


def text_column_checks(path: str) -> None:
    """str annotation columns come as tf.string, batched, per sample and alone."""
    import tensorflow as tf

    import h5forge.read.tf

    t = truth(path)
    labels = meta(path, "label")
    assert set(labels) <= {"healthy", "dividing", "infected"} and len(set(labels)) > 1
    ds = h5forge.read.tf.dataset(path, fields=("images", "label"), return_index=True, batch_size=8,
                                 shuffle=True, seed=5)
    images, label, index = ds.element_spec
    assert label.shape.as_list() == [None] and label.dtype == tf.string
    assert images.dtype == tf.float32 and index.dtype == tf.int64
    got, rows, xs = [], [], []
    for x, lab, i in ds:
        assert lab.dtype == tf.string and lab.shape[0] == i.shape[0] == x.shape[0]
        got += [v.decode() for v in lab.numpy()]
        rows += i.numpy().tolist()
        xs.append(x.numpy())
    assert sorted(rows) == list(range(len(labels)))
    assert got == labels[rows].tolist()
    assert np.array_equal(np.concatenate(xs), np.moveaxis(t["images"][rows], 1, -1).astype(np.float32) / 255)

    alone = h5forge.read.tf.dataset(path, fields=("label",), batch_size=8)  # one field: a tensor, not a tuple
    assert isinstance(alone.element_spec, tf.TensorSpec) and alone.element_spec.dtype == tf.string
    assert [v.decode() for b in alone for v in b.numpy()] == labels.tolist()

    val_stain = meta(path, "stain", "val")
    per_sample = h5forge.read.tf.dataset(path, split="val", fields="stain", batch_size=None)
    assert per_sample.element_spec.shape.as_list() == [] and per_sample.element_spec.dtype == tf.string
    assert [e.numpy().decode() for e in per_sample] == val_stain.tolist()
