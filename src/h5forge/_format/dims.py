"""Named dimensions: every axis of every dataset of a split is attached to an HDF5 dimension scale,
the sample axis to ``/<split>/sample``, so netCDF-aware readers (xarray through h5netcdf) show
``sample`` where they would otherwise invent ``phony_dim_0``.

A scale holds no values: it is netCDF's "dimension but not a variable" form (its NAME attribute says
so), a dataset whose storage is never allocated, so it costs nothing however many rows there are.
HDF5 neither checks nor grows a scale's length with the datasets it labels, so the scales are made
once a split's rows are final: when the writer finishes, when a thin version has mapped its virtual
datasets, when an export has copied its rows. Virtual datasets carry their own scales, in their own file.

Dimension-scale bookkeeping attributes hold object references into their own file; copying them
to another file would point at unrelated objects, so attribute copies go through ``plain_attrs``.
"""

from __future__ import annotations

import h5py

from h5forge._format.arrays import LENGTHS
from h5forge._format.names import SAMPLE_DIM, SOURCE_FIELD_DIM, SOURCE_FILES, SOURCE_SHA256

# netCDF-4's marker for a dimension without a coordinate variable (h5netcdf and netCDF-C read it)
NOT_A_VARIABLE = "This is a netCDF dimension but not a netCDF variable."
SCALE_DTYPE = "f4"
SCALE_ATTRS = frozenset({"CLASS", "NAME", "DIMENSION_LIST", "REFERENCE_LIST", "_Netcdf4Dimid", "_Netcdf4Coordinates"})


def plain_attrs(obj: h5py.HLObject) -> dict:
    """``obj``'s attributes without the dimension-scale references (valid only in its own file)."""
    return {k: v for k, v in obj.attrs.items() if k not in SCALE_ATTRS}


def _axis_names(name: str, ds: h5py.Dataset, ragged: bool) -> list[str]:
    """The dimension names of a dataset at ``name`` (relative to the split group); none for a scalar."""
    if ds.ndim == 0:
        return []
    stem = name.replace("/", "_")
    if name in (SOURCE_FILES, SOURCE_SHA256):  # (N, F): one column per raw-file field, the same F in both
        return [SAMPLE_DIM, SOURCE_FIELD_DIM]
    first = f"{stem}_element" if ragged else SAMPLE_DIM
    return [first, *(f"{stem}_axis{k}" for k in range(1, ds.ndim))]


def datasets_below(g: h5py.Group) -> dict[str, h5py.Dataset]:
    """Every dataset below ``g``, by its name relative to ``g``."""
    found: dict[str, h5py.Dataset] = {}

    def visit(name: str, obj) -> None:  # returning a value would stop the walk
        if isinstance(obj, h5py.Dataset):
            found[name] = obj

    g.visititems(visit)
    return found


def name_axes(g: h5py.Group, rows: int) -> None:
    """Give every axis of every dataset under the split group ``g`` (``rows`` samples) a named dimension
    scale: ``sample`` for the sample axis, ``<field>_element`` for a ragged field's values (their axis 0
    counts elements; the ``_lengths`` beside them count samples), ``<field>_axis<k>`` for the others.

    netCDF readers take all of a dataset's axes named or none (h5netcdf refuses a mix), so a dataset
    whose name would collide with an existing non-scale dataset is left without names at all."""
    datasets = datasets_below(g)
    scales: dict[str, h5py.Dataset] = {}
    for name, ds in datasets.items():
        dims = _axis_names(name, ds, (name + LENGTHS) in datasets)
        if not dims or any(d in datasets for d in dims) or (dims[0] == SAMPLE_DIM and ds.shape[0] != rows):
            continue
        for axis, dim in enumerate(dims):
            scale = scales.get(dim)
            if scale is None:
                scale = scales[dim] = g.create_dataset(dim, shape=(ds.shape[axis],), dtype=SCALE_DTYPE)  # never written
                scale.make_scale(f"{NOT_A_VARIABLE}{ds.shape[axis]:10d}")
            ds.dims[axis].attach_scale(scale)


def scale_problems(g: h5py.Group) -> list[str]:
    """What is wrong with the dimension scales under the split group ``g``. No digest covers them
    (HDF5 rewrites a scale's CLASS and NAME as scales are attached), but netCDF readers show them,
    and ``name_axes`` makes each one exactly: CLASS and NAME (``NOT_A_VARIABLE`` and the scale's
    length), float32, no storage, so that its values are the fill value, zero. Anything written
    into a scale allocates its storage."""
    problems = []
    for name, ds in datasets_below(g).items():
        if "CLASS" not in ds.attrs:
            continue
        where = f"/{g.name.strip('/')}/{name}"
        cls, label = ds.attrs["CLASS"], ds.attrs.get("NAME")
        want = f"{NOT_A_VARIABLE}{ds.shape[0]:10d}" if ds.ndim == 1 else None
        if _text(cls) != "DIMENSION_SCALE" or label is None or _text(label) != want:
            problems.append(f"{where} is a dimension scale whose CLASS or NAME is not as written")
        if ds.id.get_storage_size() != 0 or ds.dtype != SCALE_DTYPE or ds.fillvalue != 0:
            problems.append(f"{where} is a dimension scale that holds values (a scale is never written)")
    return problems


def _text(value) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
