"""An output folder belongs to one dataset, lies outside its sources, and its ``dataset_latest.h5``
resolves inside it to a published version; anything else is refused in one line before any file
is written."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import h5forge
from h5forge.errors import LatestBroken, OutputTaken, SpecError
from h5forge._format.names import LATEST
from h5forge._store.versions import latest, published
from tests.helpers.data import REPO
from tests.ingest.test_inputs_trust import library_build, make_pairs, spec_data, write_spec

H5FORGE = str(Path(sys.executable).parent / "h5forge")


def cli(*args):
    return subprocess.run([H5FORGE, *map(str, args)], capture_output=True, text=True, timeout=900, cwd=REPO)


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def two_folders(tmp_path):
    """Two output folders of one raw folder, each with v1 and v2 (one sample more) published."""
    from h5forge.spec import parse_spec

    raw = tmp_path / "raw"
    make_pairs(raw, [f"s{i}" for i in range(6)])
    specs = {}
    for name in ("here", "elsewhere"):
        data = spec_data(raw, tmp_path / name)
        data["source"]["inbox"] = str(tmp_path / "inbox")
        specs[name] = parse_spec(data, tmp_path)
        write_spec(tmp_path / f"{name}.yaml", data)
    for version in (1, 2):
        if version == 2:
            make_pairs(raw, ["s6"], seed=100)  # new inputs: the second build has something to publish
        for spec in specs.values():
            path, _ = library_build(spec)
            assert path.name == f"dataset_v000{version}.h5"
    return tmp_path, tmp_path / "here", tmp_path / "elsewhere"


def repoint(out: Path, target: str) -> None:
    (out / LATEST).unlink()
    os.symlink(target, out / LATEST)


@pytest.mark.parametrize("target, why", [
    ("{elsewhere}/dataset_v0002.h5", "points outside {here}"),
    ("../elsewhere/dataset_v0002.h5", "points outside {here}"),
    ("dataset_v0009.h5", "points at dataset_v0009.h5, which does not exist"),
    ("dataset_v0002.delta.h5", "is not a published version"),
])
def test_latest_outside_the_folder_or_dangling_is_refused_everywhere(two_folders, target, why):
    from h5forge._ingest.append import stage_append
    from h5forge._store.versions import stage

    tmp, here, elsewhere = two_folders
    if target.endswith("delta.h5"):
        (here / "dataset_v0002.delta.h5").write_bytes(b"")
    repoint(here, target.format(elsewhere=elsewhere))
    why = why.format(here=here)
    for call in (lambda: latest(here), lambda: stage(here), lambda: stage_append(here)):
        with pytest.raises(LatestBroken) as err:
            call()
        assert why in str(err.value) and "h5forge rollback" in str(err.value)
    for args in (("versions", here), ("verify", here / LATEST)):
        r = cli(*args)
        assert r.returncode == 1, r.stdout + r.stderr
        [line] = r.stderr.strip().splitlines()
        assert line.startswith("error: ") and why in line, line
    r = cli("rollback", here, "v0001")  # the way out
    assert r.returncode == 0, r.stderr
    assert latest(here) == 1


def test_a_build_and_an_append_refuse_a_latest_that_points_outside(two_folders):
    tmp, here, elsewhere = two_folders
    repoint(here, str(elsewhere / "dataset_v0002.h5"))
    before = sorted(p.name for p in here.iterdir())
    with pytest.raises(LatestBroken):
        h5forge.build(tmp / "here.yaml")
    make_pairs(tmp / "inbox", ["new0"])
    with pytest.raises(LatestBroken):
        h5forge.append(tmp / "here.yaml")
    assert sorted(p.name for p in here.iterdir()) == before
    assert os.readlink(here / LATEST) == str(elsewhere / "dataset_v0002.h5")


# ---- 5: one dataset per output folder, outside its sources -------------------------------------

def test_a_second_dataset_cannot_take_over_an_output_folder(two_folders):
    tmp, here, _ = two_folders
    data = yaml.safe_load((tmp / "here.yaml").read_text())
    data.update(name="intruder", output={"dir": str(here), "keep": 1})
    spec_path = write_spec(tmp / "intruder.yaml", data)
    files = {p.name: sha(p) for p in here.glob("dataset_v*.h5")}
    with pytest.raises(OutputTaken) as err:
        h5forge.build(spec_path)
    assert str(err.value) == (f"output folder {here} holds the dataset 'cells'; the dataset 'intruder' needs "
                              "an output folder of its own")
    assert {p.name: sha(p) for p in here.glob("dataset_v*.h5")} == files and latest(here) == 2
    r = cli("build", spec_path)
    assert r.returncode == 2 and r.stderr.strip() == f"error: {err.value}", r.stderr
    # the folder's own dataset still builds there
    result = h5forge.build(tmp / "here.yaml")
    assert result.skipped is None and result.version == 2 and result.unchanged  # unchanged inputs: nothing new


def test_the_owner_is_recorded_even_before_a_version_survives(tmp_path):
    """A folder whose versions were all deleted still belongs to its dataset (the marker file)."""
    from h5forge.spec import parse_spec
    from h5forge._store.output import OWNER_FILE, claim_output

    raw = tmp_path / "raw"
    make_pairs(raw, ["a"])
    out = tmp_path / "out"
    library_build(parse_spec(spec_data(raw, out, name="first", max_rejected=1.0), tmp_path))
    claim_output(out, "first")
    assert (out / OWNER_FILE).read_text().strip() == '{"name": "first"}'
    for p in published(out).values():
        os.chmod(p, 0o644)
        p.unlink()
    (out / LATEST).unlink()
    with pytest.raises(OutputTaken, match="holds the dataset 'first'"):
        claim_output(out, "second")


@pytest.mark.parametrize("where", ["raw", "raw/out", "inbox", "inbox/deeper/out"])
def test_an_output_folder_in_the_sources_is_refused(tmp_path, where):
    raw = tmp_path / "raw"
    make_pairs(raw, ["a", "b"])
    out = tmp_path / where
    data = spec_data(raw, out)
    data["source"]["inbox"] = str(tmp_path / "inbox")
    (tmp_path / "inbox").mkdir()
    spec_path = write_spec(tmp_path / "spec.yaml", data)
    listing = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*"))
    with pytest.raises(SpecError) as err:
        h5forge.build(spec_path)
    folder = "source.root" if where.startswith("raw") else "source.inbox"
    assert str(err.value).startswith(f"output.dir {out} is ")
    assert f"{folder} {tmp_path / where.split('/')[0]}" in str(err.value)
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")) == listing


def test_an_output_folder_reached_through_a_symlink_into_the_source_is_refused(tmp_path):
    from h5forge.spec import parse_spec
    from h5forge._store.output import check_folders

    raw = tmp_path / "raw"
    make_pairs(raw, ["a"])
    (raw / "sub").mkdir()
    os.symlink(raw / "sub", tmp_path / "link")
    with pytest.raises(SpecError, match="is inside source.root"):
        check_folders(parse_spec(spec_data(raw, tmp_path / "link" / "out"), tmp_path))
    check_folders(parse_spec(spec_data(raw, tmp_path / "beside"), tmp_path))  # beside the source: fine
    shutil.rmtree(raw / "sub")


def test_a_read_only_output_folder_is_refused_in_one_line_and_left_as_it_is(tmp_path):
    """A folder the writer cannot write (a read-only mount): build, append and rollback say so in one
    line, exit 2, and change nothing; the versions still read and verify."""
    from h5forge.errors import UsageError
    from h5forge.spec import parse_spec
    from h5forge._store.verify import verify_file
    from tests.helpers.tmpfs import mounted_tmpfs

    raw = tmp_path / "raw"
    make_pairs(raw, [f"s{i}" for i in range(6)])
    with mounted_tmpfs(tmp_path) as mnt:
        out = mnt / "out"
        data = spec_data(raw, out)
        data["source"]["inbox"] = str(tmp_path / "inbox")
        spec = parse_spec(data, tmp_path)
        library_build(spec)
        make_pairs(raw, ["s6"], seed=100)
        library_build(spec)
        make_pairs(tmp_path / "inbox", ["new"], seed=200)
        os.utime(tmp_path / "inbox" / "images" / "new.png", (1, 1))
        os.utime(tmp_path / "inbox" / "masks" / "new.png", (1, 1))
        before = {p.name: sha(p) for p in out.iterdir() if p.is_file()}
        subprocess.run(["mount", "-o", "remount,ro", str(mnt)], check=True)

        done = cli("rollback", out, "v1")
        assert done.returncode == 2, done.stdout + done.stderr
        assert "Traceback" not in done.stderr
        assert f"error: cannot write to the output folder {out} (Read-only file system)" in " ".join(done.stderr.split())
        for run in (h5forge.build, h5forge.append):
            with pytest.raises(UsageError, match=r"cannot write to the output folder .* \(Read-only file system\)"):
                run(spec)
        assert latest(out) == 2 and list(published(out)) == [1, 2]
        assert {p.name: sha(p) for p in out.iterdir() if p.is_file()} == before
        assert sorted(p.name for p in (tmp_path / "inbox" / "images").iterdir()) == ["new.png"]
        assert verify_file(out / LATEST, resample=0, latency_reads=0).ok


def test_a_rollback_of_a_folder_that_is_no_output_folder_changes_nothing(tmp_path):
    """A mistyped folder: one line, and no folder or lock file made there."""
    done = cli("rollback", tmp_path / "typo", "v1")
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert f"error: {tmp_path / 'typo'} does not exist" in " ".join(done.stderr.split())
    assert not (tmp_path / "typo").exists()
    (tmp_path / "empty").mkdir()
    done = cli("rollback", tmp_path / "empty", "v1")
    assert done.returncode == 2 and "no published version in" in done.stderr, done.stderr
    assert list((tmp_path / "empty").iterdir()) == []
