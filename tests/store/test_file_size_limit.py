"""A file-size limit (``ulimit -f``, a batch system's RLIMIT_FSIZE, a filesystem's largest file)
reached while a version is written ends the run as a full disk does: one line that says so,
nothing published, no temporary file left; a rerun without the limit publishes. Real child
processes (the plain pipeline, no Prefect) under a real limit."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

import h5forge
from h5forge._store.verify import verify_file
from h5forge._store.versions import latest, published
from tests.helpers.data import REPO, age_files, drop_samples, write_spec_file
from tests.helpers.files import all_ids, strays

LIMIT = 256 * 1024  # bytes: far less than a version of the demo's samples


def _limited(what: str, spec_file: Path) -> subprocess.CompletedProcess:
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (LIMIT, LIMIT))

    return subprocess.run(
        [sys.executable, "-c", f"import sys, h5forge; h5forge.{what}(sys.argv[1])", str(spec_file)],
        cwd=REPO, capture_output=True, text=True, timeout=900, preexec_fn=limit, env=dict(os.environ),
    )


def test_a_file_size_limit_ends_a_build_and_an_append_in_one_line(raw_demo, raw_new, tmp_path):
    out, inbox = tmp_path / "out", tmp_path / "inbox"
    spec_file = write_spec_file(raw_demo, out, tmp_path / "spec.yaml", inbox=inbox)

    child = _limited("build", spec_file)
    assert child.returncode == 1, child.stderr[-3000:]
    last = child.stderr.strip().splitlines()[-1]
    assert last.startswith("h5forge.errors.DiskFull: file too large for "), last
    assert "nothing was published" in last and ".dataset_v0001.h5.partial" in last
    assert published(out) == {} and latest(out) is None and strays(out) == []

    first = h5forge.build(str(spec_file))
    assert first.version == 1
    new = drop_samples(raw_new, inbox, [f"cell_{i:06d}" for i in range(40)], rename="k_")
    age_files(inbox)
    child = _limited("append", spec_file)
    assert child.returncode == 1, child.stderr[-3000:]
    last = child.stderr.strip().splitlines()[-1]
    assert last.startswith("h5forge.errors.DiskFull: file too large for "), last
    assert latest(out) == 1 and list(published(out)) == [1] and strays(out) == []
    assert sorted(p.stem for p in (inbox / "images").iterdir()) == sorted(new)  # the inbox as it was

    assert h5forge.append(str(spec_file)).version == 2
    ids = sum(all_ids(out / "dataset_latest.h5").values(), [])
    assert sorted(ids) == sorted(sum(all_ids(out / "dataset_v0001.h5").values(), []) + new)
    assert verify_file(out / "dataset_latest.h5", resample=0).ok
