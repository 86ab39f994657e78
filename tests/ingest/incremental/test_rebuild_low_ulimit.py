"""A nightly rebuild of a version whose rows lie in more files than ``ulimit -n`` allows open at
once (``storage.assemble: mapped``, one row file per batch) takes its unchanged rows from them with
a bounded set open, and equals the same rebuild made without the limit; a process with no
descriptor left to open one gets an error naming the limit, never a bare ``OSError``.

Each limited run is a child process whose ``RLIMIT_NOFILE`` is set before anything is imported."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml
from PIL import Image, ImageOps

import h5forge
from h5forge._format.row_files import row_files_of
from tests.helpers.fd_limit import under_fd_limit
from tests.helpers.data import REPO
from tests.helpers.files import make_raw
from tests.ingest.incremental.test_rebuild import assert_same

LIMIT = 32
SAMPLES = 72  # one row file per sample (batch_size 1): more than twice the limit

REBUILD = """
import h5forge
result = h5forge.build(sys.argv[1])
print(json.dumps({"version": result.version, "reused": result.timings["reused"]}))
"""

# every descriptor taken but the ones the source would need: opening it must say so
NO_DESCRIPTOR_LEFT = """
import os
from h5forge.errors import TooManyOpenFiles
from h5forge._ingest.incremental.reuse import Source, hold
held = []
try:
    while True:
        held.append(os.open(os.devnull, os.O_RDONLY))
except OSError:
    pass
try:
    hold([Source(sys.argv[1])], 0)
    print(json.dumps({"error": None}))
except TooManyOpenFiles as err:
    print(json.dumps({"error": str(err)}))
"""


def _child(body: str, *args: str | Path) -> dict:
    return under_fd_limit(LIMIT, body, *args, timeout=600)


def _spec_file(raw: Path, out: Path, path: Path) -> Path:
    data = yaml.safe_load((REPO / "config" / "demo.yaml").read_text())
    data["source"] = {"root": str(raw)}
    data["output"]["dir"] = str(out)
    data["storage"]["assemble"] = "mapped"
    data["compute"] = {"workers": 1, "batch_size": 1, "inline_below": 1_000_000}
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.fixture(scope="module")
def mapped(tmp_path_factory) -> tuple[Path, Path]:
    """The raw folder, one picture changed since, and an output folder holding a mapped version of
    it (before the change) on more row files than the limit."""
    root = tmp_path_factory.mktemp("mapped_rebuild")
    raw = make_raw(root / "raw", n=SAMPLES, seed=3)
    out = root / "out"
    version = Path(h5forge.build(_spec_file(raw, out, root / "spec.yaml")).path)
    assert len(row_files_of(version)) == SAMPLES > LIMIT
    picture = next(iter(sorted((raw / "images").glob("*.png"))))
    with Image.open(picture) as img:
        ImageOps.invert(img.convert("RGB")).save(picture)
    return raw, out


def test_a_rebuild_of_a_mapped_version_under_a_low_ulimit_equals_one_without_it(mapped, tmp_path):
    raw, pristine = mapped
    limited, free = tmp_path / "limited", tmp_path / "free"
    for out in (limited, free):
        shutil.copytree(pristine, out, symlinks=True)
    got = _child(REBUILD, _spec_file(raw, limited, tmp_path / "limited.yaml"))
    want = h5forge.build(_spec_file(raw, free, tmp_path / "free.yaml"))
    assert got == {"version": 2, "reused": want.timings["reused"]} and want.version == 2
    assert want.timings["reused"] == want.samples - 1  # every unchanged row taken from the row files
    assert_same(limited / "dataset_v0002.h5", free / "dataset_v0002.h5")  # ids, checksums, values, statistics


def test_sources_held_open_stay_within_the_budget(mapped):
    from h5forge._ingest.incremental.reuse import Source, hold

    _, out = mapped
    version = out / "dataset_v0001.h5"
    sources = [Source(version.parent / seg["file"]) for seg in row_files_of(version)]
    try:
        for k in [*range(len(sources)), 0, 1, 0, 5]:
            hold(sources, k, budget=3)
            assert sources[k].file is not None
            assert sum(s.file is not None for s in sources) <= 3
    finally:
        for s in sources:
            s.close()


def test_a_source_with_no_descriptor_left_is_an_error_naming_the_limit(mapped):
    _, out = mapped
    got = _child(NO_DESCRIPTOR_LEFT, out / "dataset_v0001.h5")
    assert got["error"] is not None and f"ulimit -n is {LIMIT}" in got["error"]
