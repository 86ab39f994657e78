"""The command line as a user runs it: real subprocesses, exit codes and messages."""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import h5py
import pytest
import yaml

import h5forge
from h5forge.spec import load_spec
from h5forge._store.versions import latest
from tests.helpers.data import demo_spec, write_spec_file

H5FORGE = str(Path(sys.executable).parent / "h5forge")


def run(*args, cwd=None):
    return subprocess.run([H5FORGE, *map(str, args)], capture_output=True, text=True, cwd=cwd, timeout=900)


def build_without_prefect(raw, out, **storage) -> Path:
    """The demo spec over ``raw`` built into ``out`` by the pipeline; the published file."""
    result = h5forge.build(demo_spec(raw, out, **storage))
    assert not result.unchanged, result
    return Path(result.path)


@pytest.fixture(scope="module")
def dataset(raw_demo, tmp_path_factory):
    """v1, and v2 of the same samples under another codec (other rules: a new version)."""
    out = tmp_path_factory.mktemp("cli") / "out"
    build_without_prefect(raw_demo, out)
    build_without_prefect(raw_demo, out, codec="zstd")
    return out


def flip_byte(path: Path, split="train", field="images", row=0, at=100):
    with h5py.File(path, "r") as f:
        info = f[split][field].id.get_chunk_info(row)
    os.chmod(path, 0o644)
    with open(path, "r+b") as fh:
        fh.seek(info.byte_offset + min(at, info.size - 1))
        b = fh.read(1)
        fh.seek(-1, 1)
        fh.write(bytes([b[0] ^ 0x01]))


def test_verify_healthy_file_exits_0(dataset):
    r = run("verify", dataset / "dataset_latest.h5")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "HEALTHY" in r.stdout and re.search(r"^ +checksums +ok \(40 samples\) *$", r.stdout, re.M)


def test_verify_quick_neither_recomputes_checksums_nor_re_derives_samples(dataset):
    full = json.loads(run("verify", "--json", dataset / "dataset_latest.h5").stdout)
    assert full["checks"]["checksums"].startswith("ok") and full["checks"]["sources"].startswith("ok")
    r = run("verify", "--quick", "--json", dataset / "dataset_latest.h5")
    assert r.returncode == 0, r.stdout + r.stderr
    quick = json.loads(r.stdout)
    assert quick["ok"] and "checksums" not in quick["checks"] and "sources" not in quick["checks"]
    asked = json.loads(run("verify", "--quick", "--resample", "3", "--json", dataset / "dataset_latest.h5").stdout)
    assert "3 samples" in asked["checks"]["sources"]  # asked for, they are re-derived


@pytest.mark.parametrize("codec, expect", [
    ("none", "stored data does not match its checksum"),
    ("zstd", "train["),
])
def test_verify_fails_loudly_on_a_flipped_byte(raw_demo, tmp_path, codec, expect):
    path = build_without_prefect(raw_demo, tmp_path / "out", codec=codec)
    copy = tmp_path / "tampered.h5"
    shutil.copy(path, copy)
    flip_byte(copy, at=7000)
    r = run("verify", copy)
    assert r.returncode == 1, r.stdout
    assert "BROKEN" in r.stdout and expect in r.stdout
    assert "Traceback" not in r.stdout + r.stderr


def test_verify_missing_and_foreign_files(tmp_path):
    r = run("verify", tmp_path / "nope.h5")
    assert r.returncode == 1 and "no such file" in r.stdout
    with h5py.File(tmp_path / "other.h5", "w") as f:
        f["x"] = [1, 2, 3]
    r = run("verify", tmp_path / "other.h5")
    assert r.returncode == 1 and "not an h5forge file" in r.stdout


def test_versions_and_rollback(dataset):
    r = run("versions", dataset)
    assert r.returncode == 0 and "v0001" in r.stdout and "v0002" in r.stdout
    assert "latest →" in r.stdout
    r = run("rollback", dataset, "v1")
    assert r.returncode == 0, r.stderr
    assert latest(dataset) == 1
    r = run("rollback", dataset, "v0009")
    assert r.returncode == 2 and "is not a published version" in r.stderr
    assert latest(dataset) == 1
    assert run("rollback", dataset, "2").returncode == 0 and latest(dataset) == 2


def test_a_closed_standard_output_changes_no_exit_code_and_prints_no_traceback(dataset, tmp_path):
    """`h5forge versions DIR >&-`: Python has no sys.stdout; the command's outcome is its exit code."""
    def closed(*args):
        return subprocess.run([H5FORGE, *map(str, args)], stdout=None, stderr=subprocess.PIPE, text=True,
                              preexec_fn=lambda: os.close(1), timeout=900)

    r = closed("versions", dataset)
    assert (r.returncode, r.stderr) == (0, "")
    r = closed("verify", "--quick", tmp_path / "nope.h5")
    assert (r.returncode, r.stderr) == (1, "")
    r = closed("rollback", dataset, "v0009")
    assert r.returncode == 2 and r.stderr.strip() == f"error: {dataset / 'dataset_v0009.h5'} is not a published version"

def test_rollback_of_a_path_that_is_no_output_folder_is_one_line_and_creates_nothing(dataset, tmp_path):
    r = run("rollback", dataset / "dataset_v0001.h5", "v1")  # the version file, not its folder
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.strip() == f"error: {dataset / 'dataset_v0001.h5'} is not a folder: give the dataset's output folder"
    missing = tmp_path / "no-such-folder"
    r = run("rollback", missing, "v1")
    assert r.returncode == 2 and r.stderr.strip() == f"error: {missing} does not exist: give the dataset's output folder"
    assert not missing.exists()  # no folder, no lock file made for it


@pytest.fixture(scope="module")
def two_versions(raw_demo, tmp_path_factory):
    out = tmp_path_factory.mktemp("named") / "out"
    build_without_prefect(raw_demo, out)
    build_without_prefect(raw_demo, out, codec="zstd")
    return out


@pytest.mark.parametrize("name", ["dataset_v0001.h5", "dataset_v0002.h5", "dataset_latest.h5", "dataset_v0007.h5",
                                  "dataset_v0007.delta.h5", "dataset_v0001.rows/x.h5"])
@pytest.mark.parametrize("command, what", [
    (lambda out, raw, dest: ("export", out / "dataset_latest.h5", dest, "--codec", "gzip-1"), "the copy"),
    (lambda out, raw, dest: ("preview", out / "dataset_latest.h5", "--out", dest), "the preview"),
    (lambda out, raw, dest: ("init", raw, "--out", dest, "--force"), "the spec"),
    (lambda out, raw, dest: ("codecs", raw, "--sample", "4", "--codecs", "none", "--chart", dest), "the chart"),
])
def test_no_command_writes_under_the_names_of_an_output_folders_versions(raw_demo, two_versions, name, command, what):
    """A file written under a name the folder's versions use would replace a published version (export,
    preview, init and codecs all wrote theirs there, exit 0), turn the latest link into a file, or put a
    version there that no build published."""
    out = two_versions
    (out / "dataset_v0001.rows").mkdir(exist_ok=True)
    before = {p.name: (p.is_symlink(), p.read_bytes()) for p in out.glob("dataset_*.h5")}
    r = run(*command(out, raw_demo, out / name))
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.strip() == f"error: {out / name} is a name the versions of the output folder {out} use; " \
                               f"write {what} elsewhere"
    assert {p.name: (p.is_symlink(), p.read_bytes()) for p in out.glob("dataset_*.h5")} == before
    assert latest(out) == 2 and not list(out.glob(".*partial")) and not list(out.glob("dataset_v0001.rows/*"))


def test_exports_kept_under_their_version_names_in_a_folder_of_their_own(two_versions, tmp_path):
    """A folder of exported copies is no output folder (no latest link, lock or dataset marker): a
    second copy goes there beside the first, each under the name of the version it copies."""
    archive = tmp_path / "archive"
    archive.mkdir()
    for number in (1, 2):
        dest = archive / f"dataset_v{number:04d}.h5"
        r = run("export", two_versions / dest.name, dest, "--codec", "gzip-1")
        assert r.returncode == 0, r.stdout + r.stderr
    # beside them, the readers' leases the export's verify held (readers/), as any read of a version leaves
    assert sorted(p.name for p in archive.iterdir() if p.is_file()) == ["dataset_v0001.h5", "dataset_v0002.h5"]
    for number in (1, 2):
        with h5py.File(archive / f"dataset_v{number:04d}.h5", "r") as f:
            assert int(f.attrs["version"]) == number


def test_init_writes_a_valid_commented_spec(raw_demo, tmp_path):
    spec_path = tmp_path / "config" / "mydata.yaml"
    r = run("init", raw_demo, "--out", spec_path, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    text = spec_path.read_text()
    assert "# " in text and "kind: mask" in text
    spec = load_spec(spec_path)
    assert spec.source.root == raw_demo.resolve()
    assert spec.fields["images"].size == (256, 256)  # 95th percentile of 150-260 px, rounded up to 32
    assert spec.annotations.columns == {"focus_score": "float", "label": "str", "num_cells": "int", "stain": "str"}
    assert "label" in spec.annotations.index_by
    assert spec.output.dir == (tmp_path / "data" / "demo").resolve()
    assert run("init", raw_demo, "--out", spec_path).returncode == 2  # no silent overwrite


@pytest.mark.parametrize("command", ["build", "append", "watch"])
@pytest.mark.parametrize("where", ["file", "below a file"])
def test_an_output_folder_that_is_a_file_is_one_line_before_anything_starts(raw_demo, tmp_path, command, where):
    """Before: the flow run started and failed with FileExistsError's traceback."""
    a_file = tmp_path / "notes.txt"
    a_file.write_text("mine\n")
    output = a_file if where == "file" else a_file / "out"
    spec = write_spec_file(raw_demo, tmp_path / "out", tmp_path / "spec.yaml", inbox=tmp_path / "inbox")
    (tmp_path / "inbox").mkdir()
    r = run(command, spec, "--output", output)  # no Prefect server here: a flow run would fail otherwise
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.strip() == f"error: output folder {output.resolve()} cannot be made: {a_file} is not a folder"
    assert a_file.read_text() == "mine\n"


def test_build_rejects_a_bad_spec_before_starting_anything(tmp_path):
    bad = tmp_path / "bad.yaml"
    data = yaml.safe_load((Path(__file__).parent.parent / "config" / "demo.yaml").read_text())
    data["storage"]["codec"] = "snappy"
    bad.write_text(yaml.safe_dump(data))
    r = run("build", bad)
    assert r.returncode == 2
    assert "storage.codec: Value error, unknown codec 'snappy'" in r.stderr
    assert "Traceback" not in r.stderr
