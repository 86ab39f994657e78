"""A field kind from another package: tests/plugins/h5forge-example-kind (``kind: vector``), which
`make install-test` installs. Its entry point registers it with no edit to h5forge; the conformance
suite runs it as it runs h5forge's own kinds, and here a spec using it is built and read back."""

from __future__ import annotations

from importlib.metadata import distribution

import h5py
import numpy as np
import pytest
import yaml

from h5forge._format.names import SPLITS
from h5forge.kinds import REGISTRY
from tests.helpers.data import REPO

PLUGIN = REPO / "tests" / "plugins" / "h5forge-example-kind"


@pytest.fixture(scope="module")
def vector():
    if "vector" not in REGISTRY:
        pytest.fail(f"the kind of {PLUGIN.relative_to(REPO)} is not registered: `make install-test` installs it")
    return REGISTRY["vector"]


def test_the_kind_comes_from_its_own_package_and_h5forge_never_names_it(vector):
    (point,) = distribution("h5forge-example-kind").entry_points.select(group="h5forge.kinds")
    assert (point.name, point.value) == ("vector", "h5forge_example_kind:VectorKind")
    assert vector.__module__ == "h5forge_example_kind"
    named = [
        p
        for p in [*(REPO / "src").rglob("*.py"), REPO / "pyproject.toml"]
        if any(n in p.read_text() for n in ("h5forge_example_kind", "VectorKind", "VectorField"))
    ]
    assert named == []


def test_a_spec_with_the_kind_builds_and_reads_back(vector, tmp_path):
    import h5forge
    from h5forge.read._reader import SplitReader
    from h5forge.read.torch import H5Dataset

    folder = tmp_path / "raw" / "emb"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    saved = {f"s{i:02d}": rng.standard_normal(8) for i in range(12)}  # float64, stored as float32
    for sid, values in saved.items():
        np.save(folder / f"{sid}.npy", values)
    np.save(folder / "short.npy", np.zeros(3))
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        yaml.safe_dump(
            {
                "name": "emb",
                "source": {"root": "raw"},
                "output": {"dir": "out"},
                "fields": {"emb": {"kind": "vector", "files": "emb/*.npy", "length": 8}},
                "max_rejected": 1,
            }
        )
    )
    result = h5forge.build(spec)
    assert result.version == 1
    assert [(r.paths, r.reason) for r in result.rejections] == [
        (("emb/short.npy",), "not a .npy vector of 8 float32 values: its shape is (3,)")
    ]
    with h5py.File(result.path, "r") as f:
        splits = [s for s in SPLITS if int(f[s].attrs["count"])]
        assert f[splits[0]]["emb"].dtype == np.float32 and f[splits[0]]["emb"].shape[1:] == (8,)
    stored = {}
    for split in splits:
        with SplitReader(result.path, split) as r:
            stored.update(zip(r.ids(), r.read(range(len(r)))["emb"]))
    assert stored.keys() == saved.keys()
    assert all(np.array_equal(stored[sid], values.astype(np.float32)) for sid, values in saved.items())
    ds = H5Dataset(result.path, splits[0])
    assert np.array_equal(ds[0].numpy(), stored[ds.ids()[0]])  # a float32 tensor, as stored
