"""Two fields of one shape and dtype, read and converted by ``ds[i]``: each sample's values are its
own field's, whichever way the version was written and stored."""

from __future__ import annotations

import os
import shutil

import h5py
import numpy as np
import pytest
from PIL import Image

import h5forge
from h5forge.read.torch import H5Dataset
from tests.helpers.files import make_raw, spec_for


@pytest.fixture(scope="module")
def raw(tmp_path_factory):
    """The demo's pictures, and beside them each picture turned: a second field of the same shape."""
    root = make_raw(tmp_path_factory.mktemp("same") / "raw", n=12)
    (root / "turned").mkdir()
    for p in (root / "images").glob("*.png"):
        with Image.open(p) as img:
            img.transpose(Image.Transpose.ROTATE_180).save(root / "turned" / p.name)
    return root


@pytest.mark.parametrize("codec", ["lz4", "none"])
@pytest.mark.parametrize("assemble", ["copy", "mapped"])
def test_each_field_reads_its_own_values(raw, tmp_path, codec, assemble):
    spec = spec_for(raw, tmp_path / "out", (32, 32), codec=codec, assemble=assemble)
    fields = dict(spec.fields)
    fields["turned"] = fields["images"].model_copy(update={"files": "turned/*.png"})
    path = h5forge.build(spec.model_copy(update={"fields": fields})).path
    with h5py.File(os.path.realpath(path), "r") as f:
        assert f["train/images"].is_virtual == (assemble == "mapped")
        stored = {k: f["train"][k][()] for k in ("images", "turned")}
    assert not np.array_equal(stored["images"], stored["turned"])
    ds = H5Dataset(path, "train", ("images", "turned"), image_dtype="float32")
    for i in range(len(ds)):
        images, turned = ds[i]
        np.testing.assert_array_equal(images.numpy(), stored["images"][i] / np.float32(255))
        np.testing.assert_array_equal(turned.numpy(), stored["turned"][i] / np.float32(255))
    shutil.rmtree(tmp_path / "out")
