"""docs/other-tools.md quotes what plain h5py really says on an h5forge file without hdf5plugin:
a real demo-built version read in a child process that imports neither hdf5plugin nor h5forge."""

import os
import subprocess
import sys

import h5py

from tests.helpers.data import REPO
from tests.test_cli import build_without_prefect

READ = "import h5py, sys; h5py.File(sys.argv[1], 'r')['train/images'][0]"


def plain_h5py_error(path, plugin_path=None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "HDF5_PLUGIN_PATH"}
    if plugin_path:
        env["HDF5_PLUGIN_PATH"] = plugin_path
    r = subprocess.run([sys.executable, "-c", READ, str(path)], capture_output=True, text=True, timeout=120,
                       env=env)
    assert r.returncode == 1
    return r.stderr.strip().splitlines()[-1]


def test_the_doc_quotes_plain_h5pys_error_and_the_file_names_what_it_needs(raw_demo, tmp_path):
    path = build_without_prefect(raw_demo, tmp_path / "out")
    with h5py.File(path, "r") as f:
        assert f.attrs["codec_needs"] == "hdf5plugin (LZ4 filter 32004)"
    doc = (REPO / "docs" / "other-tools.md").read_text()
    error = plain_h5py_error(path)
    assert error in doc, error
    assert "can't open directory (/usr/local/lib/plugin)" in error  # the default folder h5py's HDF5 looks in
    elsewhere = plain_h5py_error(path, str(tmp_path / "nonexistent"))
    assert f"can't open directory ({tmp_path / 'nonexistent'})" in elsewhere  # as the doc says
    assert "`codec_needs` (`hdf5plugin (LZ4 filter 32004)`)" in doc
