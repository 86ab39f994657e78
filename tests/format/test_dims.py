"""Named dimensions: every axis of every dataset of a split has a dimension scale in its own file, in
a full version, a thin version (virtual datasets over the parent and a delta) and an export; xarray
reads a split through h5netcdf with those names, values equal to h5py's."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import xarray as xr

import h5forge
from h5forge._format.names import SPLITS  # importing h5forge registers the filters h5netcdf's reads need
from h5forge.spec import DatasetSpec
from h5forge._store.thin import export
from tests.helpers.data import age_files, demo_spec, drop_samples


def dims_of(path) -> dict[str, tuple[str, ...]]:
    """{split/dataset: its dimension names}, checking each scale is in the same file and as long as its axis."""
    out: dict[str, tuple[str, ...]] = {}
    with h5py.File(path, "r") as f:
        for split in SPLITS:
            g = f[split]

            def visit(name, ds):
                if not isinstance(ds, h5py.Dataset) or ds.is_scale:
                    return
                names = []
                for axis, dim in enumerate(ds.dims):
                    assert len(dim) == 1, f"{split}/{name} axis {axis} has {len(dim)} scales"
                    scale = dim[0]
                    assert scale.file.filename == f.filename and scale.parent.name == f"/{split}"
                    assert scale.shape == (ds.shape[axis],) and scale.id.get_storage_size() == 0
                    names.append(scale.name.rsplit("/", 1)[1])
                out[f"{split}/{name}"] = tuple(names)

            g.visititems(visit)
            assert g["sample"].shape == (int(g.attrs["count"]),)
    return out


IMAGE_DIMS = {
    "train/images": ("sample", "images_axis1", "images_axis2", "images_axis3"),
    "train/masks": ("sample", "masks_axis1", "masks_axis2", "masks_axis3"),
    "train/ids": ("sample",), "train/checksum": ("sample",),
    "train/source_files": ("sample", "source_field"), "train/source_sha256": ("sample", "source_field"),
    "train/meta/label": ("sample",), "train/meta/num_cells": ("sample",),
}


def test_full_thin_and_exported_versions_name_every_axis(raw_demo, raw_new, tmp_path, build_spec):
    out, inbox = tmp_path / "out", tmp_path / "inbox"
    spec = demo_spec(raw_demo, out)
    spec = DatasetSpec.model_validate({**spec.model_dump(mode="json"),
                                       "source": {**spec.source.model_dump(mode="json"), "inbox": str(inbox)}})
    v1, _ = build_spec(spec.model_dump(mode="json"))
    v1 = Path(v1)
    drop_samples(raw_new, inbox, [f"cell_{i:06d}" for i in range(12)], rename="late_")
    age_files(inbox)
    assert h5forge.append(spec).added == 12
    thin, copy = out / "dataset_v0002.h5", export(out / "dataset_latest.h5", tmp_path / "copy.h5")

    for path in (v1, out / "dataset_v0002.delta.h5", thin, copy):
        dims = dims_of(path)
        for key, want in IMAGE_DIMS.items():
            assert dims[key] == want, (path.name, key)
    with h5py.File(thin, "r") as f:
        assert f["train/images"].is_virtual and f["train/meta/label"].is_virtual
        n_train = int(f["train"].attrs["count"])
        images = f["train/images"][()]
        labels = [v.decode() for v in f["train/meta/label"][()]]
    assert n_train > int(h5py.File(v1, "r")["train"].attrs["count"])  # the append reached train

    for path in (thin, copy):
        ds = xr.open_dataset(path, group="train", engine="h5netcdf")
        assert ds["images"].dims == IMAGE_DIMS["train/images"] and ds.sizes["sample"] == n_train
        assert np.array_equal(ds["images"].values, images)
        meta = xr.open_dataset(path, group="train/meta", engine="h5netcdf")
        assert meta["label"].dims == ("sample",) and list(meta["label"].values) == labels
        ds.close()
        meta.close()


def test_a_ragged_field_names_its_element_axis_through_an_append(tmp_path, build_spec):
    from tests.kinds.test_signal import appended_recordings

    _, _, result = appended_recordings(tmp_path, build_spec)
    thin = Path(result.path)
    copy = export(thin, tmp_path / "copy.h5")
    for path in (thin, copy):
        dims = dims_of(path)
        assert dims["train/acc"] == ("acc_element",) and dims["train/acc_lengths"] == ("sample",)
        ds = xr.open_dataset(path, group="train", engine="h5netcdf")
        assert ds.sizes["acc_element"] == (2 + 3 + 4 + 6) * 1000 and ds.sizes["sample"] == 4
        assert list(ds["acc_lengths"].values) == [2000, 3000, 4000, 6000]
        ds.close()
