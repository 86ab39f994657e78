"""A dataset written by an h5forge that named a mapped version's files its "segments" (the
``segments`` attribute, the ``dataset_v0001.segments/`` rows folder, ``storage.assemble:
segments``) reads, verifies, exports and takes appends as one written today.

The fixture (``data/mapped_before_row_files.tar.xz``) was written by that h5forge: 8 demo samples
built as a mapped version over 3 worker files (v1), then 3 appended as a thin version (v2)."""

from __future__ import annotations

import tarfile
from pathlib import Path

import h5py
import numpy as np
import pytest
import yaml

import h5forge
from h5forge._demo import generate
from h5forge._format.names import SPLITS, Attr
from h5forge._format.row_files import row_files_of, virtual_sources
from h5forge._store.thin import export
from h5forge._store.verify import verify_file
from h5forge._views.info import lineage
from tests.helpers.data import age_files, drop_samples

FIXTURE = Path(__file__).parent / "data" / "mapped_before_row_files.tar.xz"


@pytest.fixture
def older(tmp_path) -> Path:
    with tarfile.open(FIXTURE) as tar:
        tar.extractall(tmp_path, filter="data")
    return tmp_path


def _rows(path: Path) -> dict:
    with h5py.File(path, "r") as f:
        return {
            split: {key: f[split][key][()].tolist() for key in ("ids", "checksum", "images", "masks")}
            for split in SPLITS
        }


def test_the_older_files_are_what_this_test_means(older):
    out = older / "out"
    assert (out / "dataset_v0001.segments").is_dir() and not list(out.glob("*.rows"))
    for name in ("dataset_v0001.h5", "dataset_v0002.h5"):
        with h5py.File(out / name, "r") as f:
            assert Attr.ROW_FILES_BEFORE in f.attrs and Attr.ROW_FILES not in f.attrs
    assert yaml.safe_load((older / "spec.yaml").read_text())["storage"]["assemble"] == "segments"


def test_an_older_mapped_version_and_the_thin_one_over_it_read_and_verify(older):
    out = older / "out"
    v1, v2 = out / "dataset_v0001.h5", out / "dataset_v0002.h5"
    assert [Path(r["file"]).parent.name for r in row_files_of(v1)] == ["dataset_v0001.segments"] * 3
    assert [r["file"] for r in row_files_of(v2)][-1] == "dataset_v0002.delta.h5"
    for path in (v1, v2):
        report = verify_file(path, source_root=older / "raw")
        assert report.ok, report.errors
        assert report.checks["dependencies"].startswith("ok (")
    lin = lineage(h5py.File(v1, "r"), v1)
    assert lin["kind"] == "thin" and lin["assembled"] and all(r["present"] for r in lin["row_files"])
    assert not lineage(h5py.File(v2, "r"), v2)["assembled"]
    # v2 reads v1's rows, then the appended ones
    first, both = _rows(v1), _rows(v2)
    for split in SPLITS:
        n = len(first[split]["ids"])
        assert {k: v[:n] for k, v in both[split].items()} == first[split]
    assert sum(len(both[s]["ids"]) for s in SPLITS) == 11
    assert np.asarray(both["train"]["images"]).any()  # real rows, not a missing file's fill values


def test_an_older_thin_version_exports_self_contained_and_equal(older, tmp_path):
    v2 = older / "out" / "dataset_v0002.h5"
    copy = export(v2, tmp_path / "export.h5")
    with h5py.File(copy, "r") as f:
        assert Attr.ROW_FILES not in f.attrs and Attr.ROW_FILES_BEFORE not in f.attrs
        assert not virtual_sources(f)
    assert _rows(copy) == _rows(v2)
    assert verify_file(copy, source_root=older / "raw").ok


def test_an_append_onto_an_older_version_lists_its_files_under_the_new_name(older, tmp_path):
    spec = yaml.safe_load((older / "spec.yaml").read_text())
    spec["source"].update(root=str(older / "raw"), inbox=str(older / "inbox"))
    spec["output"]["dir"] = str(older / "out")
    (older / "spec.yaml").write_text(yaml.safe_dump(spec))
    generate(tmp_path / "new", n=1, seed=13, bad=False, workers=1, size_range=(40, 56), prefix="new_")
    drop_samples(tmp_path / "new", older / "inbox", ["new_000000"])
    age_files(older / "inbox")
    result = h5forge.append(str(older / "spec.yaml"))
    assert result.version == 3
    v3 = older / "out" / "dataset_v0003.h5"
    with h5py.File(v3, "r") as f:
        assert Attr.ROW_FILES in f.attrs and Attr.ROW_FILES_BEFORE not in f.attrs
    files = [r["file"] for r in row_files_of(v3)]
    assert files[:3] == [r["file"] for r in row_files_of(older / "out" / "dataset_v0001.h5")]
    assert verify_file(v3, source_root=older / "raw").ok
    assert sum(len(v["ids"]) for v in _rows(v3).values()) == 12
