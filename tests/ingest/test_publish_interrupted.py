"""A build SIGKILLed after its version is published but before latest points at it: the next writer
of the folder (a build, an append, a rollback) points latest at it first, so a nightly neither
builds the same version again under the next number nor leaves behind a version that was never
latest. A version a rollback left behind latest is no such version, and stays where it is.

Real processes (``h5forge.build`` in a child, no Prefect), real files."""

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import h5forge
from h5forge._store.verify import verify_file
from h5forge._store.versions import latest, published
from tests.helpers.data import REPO, write_spec_file
from tests.helpers.files import all_ids, strays

H5FORGE = str(Path(sys.executable).parent / "h5forge")


def _killed_build(spec_file: Path) -> None:
    child = subprocess.run(
        [sys.executable, "-c", "import sys, h5forge; h5forge.build(sys.argv[1])", str(spec_file)],
        cwd=REPO, capture_output=True, text=True, timeout=900,
        env={**os.environ, "H5FORGE_KILL_AT": "publish:before-latest"},
    )
    assert child.returncode == -signal.SIGKILL, child.stdout + child.stderr


def _ids(path: Path) -> list[str]:
    return sorted(sum(all_ids(path).values(), []))


@pytest.fixture
def killed(raw_demo, tmp_path):
    """v1 built; then a pixel of one picture changed and the build of it killed between publishing
    v2 and pointing latest at it."""
    from PIL import Image

    raw, out = tmp_path / "raw", tmp_path / "out"
    shutil.copytree(raw_demo, raw)
    spec_file = write_spec_file(raw, out, tmp_path / "spec.yaml")  # its inbox, tmp_path/inbox, empty
    (tmp_path / "inbox").mkdir()
    h5forge.build(str(spec_file))
    picture = raw / "images" / "cell_000003.png"
    with Image.open(picture) as img:
        changed = img.copy()
    changed.putpixel((0, 0), tuple(255 - v for v in changed.getpixel((0, 0))))
    changed.save(picture)
    _killed_build(spec_file)
    assert latest(out) == 1 and list(published(out)) == [1, 2]
    return out, spec_file


@pytest.mark.parametrize("writer", ["build", "append"])
def test_the_next_writer_points_latest_at_the_version_a_killed_build_published(killed, writer):
    out, spec_file = killed
    v2 = _ids(out / "dataset_v0002.h5")
    result = h5forge.build(str(spec_file)) if writer == "build" else h5forge.append(str(spec_file))
    assert latest(out) == 2 and list(published(out)) == [1, 2]
    if writer == "build":
        assert result.unchanged  # the inputs v2 was built from: nothing built again
    assert _ids(out / "dataset_latest.h5") == v2
    assert verify_file(out / "dataset_latest.h5").ok
    assert strays(out) == []


def test_a_rollback_after_the_killed_build_stays(killed):
    out, spec_file = killed
    done = subprocess.run([H5FORGE, "rollback", str(out), "v1"], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    assert latest(out) == 1 and strays(out) == []
    h5forge.append(str(spec_file))  # nothing in the inbox: the rolled-back folder is left as it is
    assert latest(out) == 1 and list(published(out)) == [1, 2]


@pytest.mark.parametrize("name", [".publishing", ".append-journal.json"])
@pytest.mark.parametrize("planted", ["fifo", "folder", "garbage"])
def test_a_record_of_a_killed_writer_that_cannot_be_read_never_hangs_or_moves_latest(raw_demo, tmp_path, name, planted):
    """A FIFO or a folder at the publish marker's or the append journal's path stops the next writer
    with a line naming it (a FIFO is never opened for a writer to wait on); so does a journal of no
    JSON, while a marker of no version's number is dropped (the kill came before it was whole)."""
    from h5forge.errors import UsageError

    raw, out = tmp_path / "raw", tmp_path / "out"
    shutil.copytree(raw_demo, raw)
    spec_file = write_spec_file(raw, out, tmp_path / "spec.yaml")
    (tmp_path / "inbox").mkdir()
    h5forge.build(str(spec_file))
    record = out / name
    {"fifo": os.mkfifo, "folder": os.mkdir, "garbage": lambda p: Path(p).write_bytes(b"\xff2\n")}[planted](record)
    if planted == "garbage" and name == ".publishing":
        assert h5forge.build(str(spec_file)).unchanged
        assert not record.exists() and latest(out) == 1
    else:
        with pytest.raises(UsageError, match=rf"{name} (is not a regular file|cannot be read)"):
            h5forge.build(str(spec_file))
        assert latest(out) == 1
