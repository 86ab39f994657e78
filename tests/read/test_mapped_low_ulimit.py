"""Mapped versions (``storage.assemble: mapped``, thin versions after appends) read under a low
``ulimit -n``: every row equals ``h5forge export``'s self-contained copy of the same version, an
unreadable or missing file is an error naming it, and ``verify`` reads the way the readers read.

HDF5 keeps every virtual-dataset source it read open and reads one it cannot open as the fill
value; each check runs in a child process whose ``RLIMIT_NOFILE`` is set below the number of files
the version maps, before anything is imported."""

from __future__ import annotations

import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest

import h5forge
from h5forge._format.row_files import row_files_of
from h5forge._store.thin import export
from tests.helpers.fd_limit import under_fd_limit
from tests.helpers.data import age_files, demo_spec, drop_samples, write_spec_file

LIMIT = 32
MAPPED_SAMPLES = 72  # one file per sample (batch_size 1): twice the limit

READ_ALL = """
import numpy as np
from h5forge.read._reader import SplitReader
from h5forge.read.torch import H5Dataset
version, copy = sys.argv[1], sys.argv[2]
splits = ("train", "val", "test")
# every reader opened before any is read, as a training script holding train, val and test does
readers = {s: SplitReader(version, s) for s in splits}
for r in readers.values():
    r.read([])
wrong = rows = 0
for s in splits:
    want = SplitReader(copy, s)
    for i in range(len(want)):
        a, b = readers[s].read([i]), want.read([i])
        rows += 1
        wrong += any(not np.array_equal(a[k], b[k]) for k in b)
    want.close()
for s in splits:
    ds, ref = H5Dataset(version, s), H5Dataset(copy, s)
    for i in range(len(ds)):  # a sample: a tensor per field
        a, b = ds[i], ref[i]
        rows += 1
        wrong += any(not np.array_equal(x.numpy(), y.numpy()) for x, y in zip(a, b, strict=True))
    for got, want in zip(ds.loader(batch_size=8, shuffle=False), ref.loader(batch_size=8, shuffle=False)):
        rows += len(want[0])
        wrong += sum(
            not all(np.array_equal(x[j].numpy(), y[j].numpy()) for x, y in zip(got, want, strict=True))
            for j in range(len(want[0]))
        )
print(json.dumps({"rows": rows, "wrong": int(wrong)}))
"""

VERIFY = """
from h5forge._store.verify import verify_file
report = verify_file(sys.argv[1], resample=0, latency_reads=5, workers=1)
print(json.dumps({"ok": report.ok, "errors": report.errors}))
"""

READ_ONE_SPLIT = """
from h5forge.errors import ReadError
from h5forge.read._reader import SplitReader
r = SplitReader(sys.argv[1], sys.argv[2])
try:
    values = r.read(range(len(r)))
    print(json.dumps({"error": None, "max": int(values["images"].max())}))
except ReadError as err:
    print(json.dumps({"error": str(err)}))
"""


def _child(body: str, *args: str | Path) -> dict:
    return under_fd_limit(LIMIT, body, *args)


@pytest.fixture(scope="module")
def mapped_version(tmp_path_factory) -> tuple[Path, Path]:
    """A mapped version built one sample per worker file, and its exported copy."""
    from h5forge._demo import generate

    root = tmp_path_factory.mktemp("mapped")
    generate(root / "raw", n=MAPPED_SAMPLES, seed=3, bad=False, workers=1)
    spec = demo_spec(root / "raw", root / "out", assemble="mapped")
    spec = spec.model_copy(
        update={"compute": spec.compute.model_copy(update={"batch_size": 1, "inline_below": 1_000_000})}
    )
    version = Path(h5forge.build(spec).path)
    assert len(row_files_of(version)) == MAPPED_SAMPLES > LIMIT
    copy = root / "copy.h5"
    export(version, copy)
    return version, copy


def test_every_row_of_a_mapped_version_reads_as_its_copy_under_a_low_ulimit(mapped_version):
    version, copy = mapped_version
    got = _child(READ_ALL, version, copy)
    assert got == {"rows": 3 * MAPPED_SAMPLES, "wrong": 0}  # SplitReader, ds[i] and the loader


def test_verify_under_a_low_ulimit_is_healthy_only_when_every_mapped_file_reads(mapped_version, tmp_path):
    version, _ = mapped_version
    assert _child(VERIFY, version) == {"ok": True, "errors": []}
    out = tmp_path / "out"
    shutil.copytree(version.parent, out, symlinks=True)
    listed = row_files_of(out / version.name)
    gone, cut = out / listed[3]["file"], out / listed[-2]["file"]
    gone.unlink()
    report = _child(VERIFY, out / version.name)
    assert not report["ok"] and any(str(gone) in e for e in report["errors"])
    shutil.copy(version.parent / listed[3]["file"], gone)
    data = cut.read_bytes()
    cut.chmod(0o644)
    cut.write_bytes(data[: len(data) // 2])  # a worker file cut short: its rows are not there
    report = _child(VERIFY, out / version.name)
    assert not report["ok"] and any(str(cut) in e for e in report["errors"])


def test_a_mapped_file_cut_short_is_a_read_error_naming_it_never_zeros(mapped_version, tmp_path):
    version, _ = mapped_version
    out = tmp_path / "out"
    shutil.copytree(version.parent, out, symlinks=True)
    cut = out / row_files_of(out / version.name)[-1]["file"]
    data = cut.read_bytes()
    cut.chmod(0o644)
    cut.write_bytes(data[: len(data) // 2])
    split = next(s for s, n in row_files_of(out / version.name)[-1]["counts"].items() if n)
    got = _child(READ_ONE_SPLIT, out / version.name, split)
    assert got["error"] is not None and str(cut) in got["error"]


def test_a_thin_version_after_many_one_sample_appends_reads_as_its_copy_under_a_low_ulimit(
    raw_demo, raw_new, tmp_path
):
    out, inbox = tmp_path / "out", tmp_path / "inbox"
    spec_file = write_spec_file(raw_demo, out, tmp_path / "spec.yaml", inbox=inbox)
    assert h5forge.build(spec_file).version == 1
    appends = LIMIT - 6  # with the version, its copy and the process's own, more files than the limit
    for k in range(appends):
        drop_samples(raw_new, inbox, [f"cell_{k:06d}"], rename=f"a{k}_")
        age_files(inbox)
        assert h5forge.append(spec_file).added == 1
    latest = Path(out / "dataset_latest.h5").resolve()
    assert len(row_files_of(latest)) == appends + 1
    copy = tmp_path / "copy.h5"
    export(latest, copy)
    with h5py.File(copy, "r") as c:
        total = sum(int(c[s].attrs["count"]) for s in ("train", "val", "test"))
    got = _child(READ_ALL, latest, copy)
    assert got == {"rows": 3 * total, "wrong": 0}
    assert _child(VERIFY, latest) == {"ok": True, "errors": []}


def test_mapped_reads_keep_at_most_their_budget_of_files_open(mapped_version):
    from h5forge._format.mapped import MappedDataset, SourceFiles

    version, copy = mapped_version

    files = SourceFiles(capacity=3)
    with h5py.File(version, "r") as f, h5py.File(copy, "r") as c:
        mapped = MappedDataset(f["train/images"], files)
        want = c["train/images"]
        for row in range(len(mapped)):
            assert np.array_equal(mapped.row(row), want[row])
            assert len(files) <= 3
        assert np.array_equal(mapped[()], want[()])
    files.close_all()


def test_verify_gives_back_every_mapped_file_it_read(mapped_version):
    """A long-lived process (a watch folder's) verifies each version it publishes: a mapped file that
    verify left open, its read-latency check's included, would hold its disk space once deleted."""
    from h5forge._format.mapped import SOURCES
    from h5forge._store.verify import verify_file

    version, _ = mapped_version
    SOURCES.close_all()
    report = verify_file(version, workers=1, latency_reads=8, resample=0)
    assert report.ok, report.errors
    assert report.checks["read latency"].startswith("p50 ")
    assert len(SOURCES) == 0
