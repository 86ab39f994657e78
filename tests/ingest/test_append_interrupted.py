"""An append SIGKILLed at a crash point, then another writer of the folder (a nightly build, a
rollback) before any append reruns: the killed append's journal is settled first, so no inbox
sample is lost, none is filed under a version that does not hold it, and a rollback stays.

Real processes (``h5forge.build`` / ``h5forge.append`` in a child, no Prefect), real files."""

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import h5py
import pytest

import h5forge
from h5forge._format.layout import decode_str
from h5forge._store.verify import verify_file
from h5forge._store.versions import latest, published
from tests.helpers.data import REPO, age_files, drop_samples, write_spec_file
from tests.helpers.files import all_ids, strays

H5FORGE = str(Path(sys.executable).parent / "h5forge")
NEW = [f"cell_{i:06d}" for i in range(6)]


def _killed_append(spec_file: Path, point: str) -> None:
    child = subprocess.run(
        [sys.executable, "-c", "import sys, h5forge; h5forge.append(sys.argv[1])", str(spec_file)],
        cwd=REPO, capture_output=True, text=True, timeout=900, env={**os.environ, "H5FORGE_KILL_AT": point},
    )
    assert child.returncode == -signal.SIGKILL, child.stdout + child.stderr


def _rows(path: Path) -> dict[str, dict[str, str]]:
    """Each split's row checksum by id."""
    with h5py.File(os.path.realpath(path), "r") as f:
        return {s: dict(zip(decode_str(f[s]["ids"][()]), decode_str(f[s]["checksum"][()])))
                for s in ("train", "val", "test")}


def _add_raw_sample(src: Path, raw: Path, sid: str, new_id: str) -> None:
    """One more sample in the raw folder, so that the next build publishes a new version."""
    for folder in ("images", "masks"):
        shutil.copy(src / folder / f"{sid}.png", raw / folder / f"{new_id}.png")
    records = json.loads((raw / "annotations.json").read_text())
    record = next(r for r in json.loads((src / "annotations.json").read_text()) if r["id"] == sid)
    (raw / "annotations.json").write_text(json.dumps([*records, {**record, "id": new_id}]))


@pytest.fixture
def folder(raw_demo, raw_new, tmp_path):
    """A built output folder and an inbox holding ``NEW`` (renamed ``k_…``), settled."""
    raw = tmp_path / "raw"
    shutil.copytree(raw_demo, raw)
    out, inbox = tmp_path / "out", tmp_path / "inbox"
    spec_file = write_spec_file(raw, out, tmp_path / "spec.yaml", inbox=inbox)
    h5forge.build(str(spec_file))
    new = drop_samples(raw_new, inbox, NEW, rename="k_")
    age_files(inbox)
    return raw, out, inbox, spec_file, new


@pytest.mark.parametrize("point", ["append:before-publish", "publish:before-latest", "append:before-move"])
def test_a_build_after_a_killed_append_loses_no_inbox_sample(point, folder, raw_new, tmp_path):
    raw, out, inbox, spec_file, new = folder
    base = sum(all_ids(out / "dataset_v0001.h5").values(), [])
    _killed_append(spec_file, point)
    _add_raw_sample(raw_new, raw, "cell_000050", "zz_000050")

    built = h5forge.build(str(spec_file))  # the nightly rebuild, before any append reruns
    h5forge.append(str(spec_file))  # then the watch folder's next append

    ids = sum(all_ids(out / "dataset_latest.h5").values(), [])
    assert sorted(ids) == sorted(base + ["zz_000050"] + new)  # none lost, none twice
    # the build publishes v0003 after the append's v0002, or v0002 when the append never published
    assert built.version == (2 if point == "append:before-publish" else 3)
    # every appended sample is filed under the version that took it
    for sid in new:
        (taken,) = list((inbox / "processed").glob(f"v*/images/{sid}.png"))
        version = int(taken.parent.parent.name[1:])
        assert sid in sum(all_ids(out / f"dataset_v{version:04d}.h5").values(), [])
    assert not list((inbox / "images").iterdir())
    assert verify_file(out / "dataset_latest.h5", resample=0).ok
    assert strays(out) == []
    # the values equal a fresh full build of the same inputs (raw folder plus processed/)
    fresh = h5forge.build(str(write_spec_file(raw, tmp_path / "fresh", tmp_path / "fresh.yaml", inbox=inbox)))
    assert _rows(out / "dataset_latest.h5") == _rows(Path(fresh.path))


def test_a_rollback_after_a_killed_append_stays(folder):
    raw, out, inbox, spec_file, new = folder
    _killed_append(spec_file, "append:before-move")  # v0002 published, its inbox moves not made
    assert latest(out) == 2
    done = subprocess.run([H5FORGE, "rollback", str(out), "v1"], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    assert latest(out) == 1
    # the killed append's moves are made: its samples are filed under v0002, none waits again
    assert sorted(p.name for p in (inbox / "processed" / "v0002" / "images").iterdir()) == sorted(f"{i}.png" for i in new)
    result = h5forge.append(str(spec_file))  # an append with nothing new leaves the rollback alone
    assert result.version is None
    assert latest(out) == 1 and list(published(out)) == [1, 2]
    assert sorted(sum(all_ids(out / "dataset_latest.h5").values(), [])) == sorted(
        sum(all_ids(out / "dataset_v0001.h5").values(), []))
    assert strays(out) == []
