"""What `pip install .` puts into site-packages: one package, with the flows inside it; and the reader
alone (`pip install h5forge`, no build extra) works on a training machine."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import h5py
import numpy as np
import pytest

from tests.helpers.data import REPO, write_spec_file
from tests.helpers.files import build_file


def test_install_holds_one_top_level_package(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                    "--target", str(tmp_path), str(REPO)], check=True, capture_output=True)
    top = sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith(".dist-info") and p.name != "bin")
    assert top == ["h5forge"]
    for sub in ("flows", "tasks", "deployments", "_format", "kinds", "_ingest", "_store", "read"):
        assert (tmp_path / "h5forge" / sub / "__init__.py").is_file(), sub


@pytest.mark.slow  # pip resolves and unpacks the reader's dependencies (~45 s, ~300 MB)
def test_the_reader_installs_and_reads_without_the_build_extra(tmp_path, raw_demo):
    """`pip install h5forge` on a training machine: no Prefect, dask or Pillow; the readers read a real
    version, export writes a portable copy that verify checks, and a build-side command names the extra in
    one line."""
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-build-isolation", "--target", str(target),
                    str(REPO)], check=True, capture_output=True)
    installed = {p.name.split("-")[0].lower() for p in target.glob("*.dist-info")}
    assert {"h5forge", "h5py", "hdf5plugin", "numpy"} <= installed
    assert not installed & {"prefect", "prefect_dask", "dask", "distributed", "pillow", "torch"}
    version = build_file(tmp_path / "out" / "dataset_v0001.h5", raw_demo, codec="lz4")  # built here, read there

    def isolated(code: str, *argv: str) -> subprocess.CompletedProcess:
        # -I -S: no site-packages of this venv, so only what the target holds (and the stdlib) imports
        return subprocess.run([sys.executable, "-I", "-S", "-c", f"import sys; sys.path.insert(0, {str(target)!r})\n"
                               + code, *argv], capture_output=True, text=True, timeout=900)

    read = isolated("import importlib.util\n"
                    "print([m for m in ('prefect', 'dask', 'distributed', 'PIL') if importlib.util.find_spec(m)])\n"
                    "from h5forge.read._reader import SplitReader\n"
                    "import h5forge.read._sampler, h5forge.read._collate\n"
                    f"row = SplitReader({str(version)!r}, split='val').read_one(1)\n"
                    "print(int(row['images'].astype('int64').sum()), int(row['masks'].sum()))")
    assert read.returncode == 0, read.stderr
    missing, sums = read.stdout.strip().splitlines()
    assert missing == "[]"
    with h5py.File(version, "r") as f:
        assert sums == f"{int(f['val/images'][1].astype(np.int64).sum())} {int(f['val/masks'][1].sum())}"
    cli = "from h5forge._cli import app; sys.argv = ['h5forge', *sys.argv[1:]]; app()"
    copy = isolated(cli, "export", str(version), str(tmp_path / "copy.h5"), "--codec", "gzip-1")
    assert copy.returncode == 0, copy.stderr
    with h5py.File(tmp_path / "copy.h5", "r") as c, h5py.File(version, "r") as f:
        assert c.attrs["codec"] == "gzip-1" and np.array_equal(c["train/images"][()], f["train/images"][()])
    checked = isolated(cli, "verify", str(tmp_path / "copy.h5"), "--resample", "0")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    # the default re-derivation needs the decoders: skipped with a warning, not a verdict on the file
    plain = isolated(cli, "verify", str(tmp_path / "copy.h5"), "--json")
    assert plain.returncode == 0, plain.stdout + plain.stderr
    health = json.loads(plain.stdout)
    assert health["ok"] is True and health["checks"]["sources"] == "skipped (no build extra)"
    assert any("needs the build extra" in w and "PIL" in w for w in health["warnings"])
    demo = isolated(cli, "demo-data", str(tmp_path / "raw"), "--n", "2")
    assert demo.returncode == 2 and demo.stderr.strip() == (
        "error: this command needs h5forge's build extra (no module 'PIL' here): pip install 'h5forge[build]'")


@pytest.mark.slow  # a build on dask workers in a fresh process
def test_python_run_beside_a_clone_named_h5forge_imports_the_package(tmp_path, raw_demo):
    """A clone in ./h5forge, Python run from its parent: the installed package is imported, not the
    clone's folder as a namespace package (whose filters would be missing), and the README's Python
    quick start builds, verifies and reads a batch there."""
    beside = tmp_path / "work"
    beside.mkdir()
    os.symlink(REPO, beside / "h5forge")  # the folder a `git clone … h5forge` leaves
    spec = write_spec_file(raw_demo, tmp_path / "out", tmp_path / "spec.yaml")
    script = (
        "import h5forge\n"
        "print(h5forge.__file__)\n"
        f"result = h5forge.build({str(spec)!r})\n"
        "from h5forge import verify\n"
        f"verify({str(tmp_path / 'out')!r})\n"
        "from h5forge.read import SplitReader\n"
        f"batch = SplitReader({str(tmp_path / 'out' / 'dataset_latest.h5')!r}, 'train').read([0, 1, 2, 3])\n"
        "print(result.version, batch['images'].shape[0])\n"
    )
    run = subprocess.run([sys.executable, "-c", script], cwd=beside, capture_output=True, text=True, timeout=900,
                         env={**os.environ, "PYTHONPATH": ""})
    assert run.returncode == 0, run.stderr[-3000:]
    package, built = run.stdout.strip().splitlines()[-2:]
    assert package == str(REPO / "src" / "h5forge" / "__init__.py")
    assert built == "1 4"
