"""Files other tools read: `import h5forge` registers the compression plugins for plain h5py; `export
--codec gzip-1` writes a copy with only filters built into every HDF5; Debian's h5dump (hdf5-tools,
which `make test` installs where it is missing) prints a stored sample equal to h5forge's values, for the default lz4 file with
HDF5_PLUGIN_PATH and for the gzip-1 copy without it; xarray reads the copy through h5netcdf with
named dimensions and no plugin loaded.

h5dump missing is a failure with the install line, never a skip: these are the only tests of what a
user of the HDF5 tools sees."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import h5py
import hdf5plugin
import numpy as np
import pytest

from h5forge.read._reader import SplitReader
from tests.helpers.files import build_file
from tests.test_cli import run

BUILT_IN_FILTERS = {1, 2, 3}  # deflate, shuffle, fletcher32: in every HDF5 library


@pytest.fixture(scope="module")
def version(raw_demo, tmp_path_factory) -> Path:
    """The demo spec's default codec (lz4), 64x64 pictures to keep it small."""
    return build_file(tmp_path_factory.mktemp("portable") / "dataset_v0001.h5", raw_demo, codec="lz4")


@pytest.fixture(scope="module")
def gzip_copy(version, tmp_path_factory) -> Path:
    dest = tmp_path_factory.mktemp("copy") / "portable.h5"
    result = run("export", version, dest, "--codec", "gzip-1")
    assert result.returncode == 0, result.stderr
    assert f"wrote {dest}" in result.stdout and "reading it needs any HDF5 reader (deflate)" in result.stdout
    return dest


def _python(code: str, **env) -> subprocess.CompletedProcess:
    """``code`` in a fresh interpreter (filters registered in this one do not leak into it)."""
    clean = {k: v for k, v in os.environ.items() if k != "HDF5_PLUGIN_PATH"}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**clean, **env},
                          timeout=600)


def _datasets(f: h5py.File) -> dict[str, h5py.Dataset]:
    found: dict[str, h5py.Dataset] = {}
    f.visititems(lambda name, obj: found.__setitem__(name, obj) if isinstance(obj, h5py.Dataset) else None)
    return found


def _filters(ds: h5py.Dataset) -> set[int]:
    plist = ds.id.get_create_plist()
    return {plist.get_filter(i)[0] for i in range(plist.get_nfilters())}


def test_import_h5forge_lets_plain_h5py_read_lz4(version):
    read = f"import h5py; print(h5py.File({str(version)!r}, 'r')['train/images'][0].sum())"
    bare = _python(read)
    assert bare.returncode == 1
    assert "OSError: Can't synchronously read data (can't open directory (/usr/local/lib/plugin). " \
           "Please verify its existence)" in bare.stderr
    registered = _python("import h5forge; " + read)
    assert registered.returncode == 0, registered.stderr
    with h5py.File(version, "r") as f:
        assert int(registered.stdout) == int(f["train/images"][0].sum())


def test_export_gzip1_holds_only_built_in_filters_and_the_same_values(version, gzip_copy):
    with h5py.File(version, "r") as src, h5py.File(gzip_copy, "r") as copy:
        assert src.attrs["codec"] == "lz4" and 32004 in _filters(src["train/images"])
        assert copy.attrs["codec"] == "gzip-1" and copy.attrs["codec_needs"] == "any HDF5 reader (deflate)"
        assert copy.attrs["self_contained"] and copy.attrs["exported_from"] == version.name
        theirs, ours = _datasets(src), _datasets(copy)
        assert sorted(theirs) == sorted(ours)
        for name, ds in ours.items():
            assert _filters(ds) <= BUILT_IN_FILTERS, (name, _filters(ds))
            assert ds.dtype == theirs[name].dtype and ds.shape == theirs[name].shape, name
            assert np.array_equal(ds[()], theirs[name][()]), name
        assert _filters(copy["train/images"]) == {1} and copy["train/images"].compression_opts == 1


def test_export_none_stores_arrays_unfiltered_and_an_unknown_codec_is_one_line(version, tmp_path):
    dest = tmp_path / "raw.h5"
    assert run("export", version, dest, "--codec", "none").returncode == 0
    with h5py.File(dest, "r") as copy, h5py.File(version, "r") as src:
        assert _filters(copy["train/images"]) == set() and copy.attrs["codec_needs"] == "any HDF5 reader"
        assert np.array_equal(copy["val/masks"][()], src["val/masks"][()])
    bad = run("export", version, tmp_path / "x.h5", "--codec", "brotli")
    assert bad.returncode == 2 and not (tmp_path / "x.h5").exists()
    assert bad.stderr.strip().startswith("error: unknown codec 'brotli'; choose one of none, lzf, gzip-1")
    assert len(bad.stderr.strip().splitlines()) == 1


def _h5dump() -> str:
    found = shutil.which("h5dump")
    if found is None:
        pytest.fail("h5dump not found: `make test-tools` installs it (Debian's hdf5-tools), as `make test` does")
    return found


def _dump_row(path: Path, dataset: str, row: int, shape: tuple[int, ...], tmp: Path, plugins: bool) -> bytes:
    """The bytes h5dump writes for one row of ``dataset`` (binary output, native byte order)."""
    out = tmp / f"{path.stem}-{dataset.replace('/', '_')}-{row}-{plugins}.bin"
    env = {k: v for k, v in os.environ.items() if k != "HDF5_PLUGIN_PATH"}
    if plugins:
        env["HDF5_PLUGIN_PATH"] = hdf5plugin.PLUGIN_PATH
    start, count = ",".join(["%d" % row] + ["0"] * len(shape)), ",".join(["1", *map(str, shape)])
    done = subprocess.run([_h5dump(), "-d", dataset, "-s", start, "-c", count, "-b", "NATIVE", "-o", str(out),
                           str(path)], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr
    return out.read_bytes()


@pytest.mark.parametrize("split,row", [("train", 0), ("val", 2)])
def test_h5dump_prints_what_h5forge_reads(version, gzip_copy, tmp_path, split, row):
    values = SplitReader(version, split=split, fields=("images", "masks")).read_one(row)
    for name in ("images", "masks"):
        want = np.ascontiguousarray(values[name], dtype=np.uint8).tobytes()
        shape = values[name].shape
        assert _dump_row(version, f"/{split}/{name}", row, shape, tmp_path, plugins=True) == want
        assert _dump_row(gzip_copy, f"/{split}/{name}", row, shape, tmp_path, plugins=False) == want
    # the truth docs/codecs.md states: without the plugin path h5dump silently writes nothing for lz4
    assert _dump_row(version, f"/{split}/images", row, values["images"].shape, tmp_path, plugins=False) == b""


def test_xarray_reads_the_portable_copy_with_named_dimensions_and_no_plugin(gzip_copy, version):
    code = ("import sys, xarray as xr\n"
            f"ds = xr.open_dataset({str(gzip_copy)!r}, group='val', engine='h5netcdf')\n"
            "print(ds['images'].dims, ds['masks'].dims, ds['ids'].dims, ds.sizes['sample'])\n"
            "print(int(ds['images'].values.astype('int64').sum()), ds['ids'].values.tolist())\n"
            "print('hdf5plugin' in sys.modules)")
    done = _python(code)
    assert done.returncode == 0, done.stderr
    dims, total, loaded = done.stdout.strip().splitlines()
    with h5py.File(version, "r") as f:
        n = int(f["val"].attrs["count"])
        ids = [v.decode() for v in f["val/ids"][()]]
        assert total == f"{int(f['val/images'][()].astype(np.int64).sum())} {ids}"
    assert dims == ("('sample', 'images_axis1', 'images_axis2', 'images_axis3') "
                    f"('sample', 'masks_axis1', 'masks_axis2', 'masks_axis3') ('sample',) {n}")
    assert loaded == "False"
