"""What `pip install .` puts into site-packages: one package, with the flows inside it."""

from __future__ import annotations

import subprocess
import sys

from tests.helpers.data import REPO


def test_install_holds_one_top_level_package(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                    "--target", str(tmp_path), str(REPO)], check=True, capture_output=True)
    top = sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith(".dist-info") and p.name != "bin")
    assert top == ["h5forge"]
    for sub in ("flows", "tasks", "deployments", "format", "kinds", "ingest", "store", "read"):
        assert (tmp_path / "h5forge" / sub / "__init__.py").is_file(), sub
