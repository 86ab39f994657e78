"""--version, info and doctor as a user runs them: real subprocesses on real built versions."""

import json
import os
import subprocess
import sys
from collections import Counter
from importlib.metadata import version
from pathlib import Path

import h5py
import hdf5plugin
import pytest

from h5forge._ingest.splits import assign_split
from tests.helpers.data import REPO, demo_spec
from tests.test_cli import build_without_prefect

PY = sys.executable
H5FORGE = str(Path(PY).parent / "h5forge")


def run(*args, env=None, prefix=()):
    clean = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "HDF5_PLUGIN_PATH")}
    r = subprocess.run([*(prefix or [H5FORGE]), *map(str, args)], capture_output=True, text=True, timeout=900,
                       env={**clean, **(env or {})}, cwd=REPO)
    assert "Traceback" not in r.stdout + r.stderr, r.stdout + r.stderr
    return r


@pytest.fixture(scope="module")
def built(raw_demo, tmp_path_factory):
    out = tmp_path_factory.mktemp("inspect") / "out"
    return build_without_prefect(raw_demo, out, codec="zstd"), out


def test_version_matches_the_installed_package():
    r = run("--version")
    assert r.returncode == 0 and r.stdout == f"h5forge {version('h5forge')}\n"


def test_info_json_counts_exactly(built, raw_demo):
    path, _ = built
    r = run("info", path, "--json")
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    records = {x["id"]: x for x in json.loads((raw_demo / "annotations.json").read_text())}
    spec = demo_spec(raw_demo, path.parent)
    good = [i for i in records if i.startswith("cell_")]
    split_of = {i: assign_split(i, spec.splits) for i in good}
    assert info["samples"] == 40 and info["counts"] == dict(Counter(split_of[i] for i in good)) == {
        "train": 30, "val": 4, "test": 6}
    for split in ("train", "val", "test"):
        ids = [i for i in good if split_of[i] == split]
        by_value = info["splits"][split]["samples_by_value"]
        assert by_value["label"] == dict(Counter(records[i]["label"] for i in ids))
        assert by_value["stain"] == dict(Counter(records[i]["stain"] for i in ids))
        with h5py.File(path, "r") as f:  # pixels per class, as the mask field counted them
            masks = f[split]["masks"][()]
        pixels = info["splits"][split]["stats"]["masks_class_pixels"]
        assert pixels == {"0": int((masks == 0).sum()), "1": int((masks == 1).sum())}
    assert info["codec"] == "zstd" and info["spec"]["fields"]["images"] == {
        "kind": "image", "shape": [3, 224, 224], "dtype": "uint8", "codec": "zstd"}
    assert info["lineage"]["kind"] == "full" and info["lineage"]["parent"] is None
    sizes = info["sizes"]
    assert sizes["array_bytes_raw"] == 40 * (3 + 1) * 224 * 224 and 0 < sizes["array_bytes_stored"] < sizes["array_bytes_raw"]
    assert sizes["file_bytes"] == sizes["on_disk_bytes"] == path.stat().st_size
    rejected = info["rejected"]
    assert rejected["total"] == 10
    reasons = {r["inputs"][0]["id"]: (r["stage"], r["reason"]) for r in rejected["by_reason"]}
    assert reasons["bad_mask128"] == ("clean", "mask values [0, 128] not allowed: a mask must hold {0,1} or {0,255}")
    assert reasons["bad_orphan_record"] == ("discover", "annotation record without files")
    assert sum(r["count"] for r in rejected["by_reason"]) == 10


def test_info_of_a_folder_lists_versions_and_shows_the_latest(built):
    _, out = built
    r = run("info", out)
    assert r.returncode == 0, r.stderr
    assert "v0001" in r.stdout and "latest →" in r.stdout and "rejected inputs (the build): 10" in r.stdout
    assert "1 x [clean] empty file (0 bytes): images/bad_empty.png" in r.stdout
    assert "zstd (needs hdf5plugin (Zstd filter 32015))" in r.stdout


def test_info_refuses_what_is_not_a_version(tmp_path):
    assert run("info", tmp_path / "nope.h5").returncode == 1
    with h5py.File(tmp_path / "other.h5", "w") as f:
        f["x"] = [1]
    r = run("info", tmp_path / "other.h5")
    assert r.returncode == 1 and "other.h5: not an h5forge file" in r.stderr
    r = run("info", tmp_path)
    assert r.returncode == 1 and "no published version" in r.stderr


def lines(stdout: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in stdout.splitlines():
        label, _, text = line.partition(":")
        out.setdefault(label.strip(), []).append(text.strip())
    return out


def test_doctor_reports_the_machine(built):
    path, out = built
    r = run("doctor", path)
    assert r.returncode == 0, r.stdout + r.stderr
    got = lines(r.stdout)
    assert got["h5py / HDF5"] == [f"h5py {h5py.version.version}, HDF5 {h5py.version.hdf5_version}"]
    assert got["hdf5plugin"] == [hdf5plugin.version]
    assert "lz4 32004" in got["filters available"][0] and "zstd 32015" in got["filters available"][0]
    assert got["HDF5_PLUGIN_PATH"] == [f"export HDF5_PLUGIN_PATH={hdf5plugin.PLUGIN_PATH}"]
    assert got["Prefect API"][0].startswith("ephemeral (no server configured)")
    assert got["CPUs"][0].startswith(f"{os.cpu_count()} (")
    assert got["dask"][0].startswith(f"dask {version('dask')}, distributed {version('distributed')}")
    assert got["file records"] == ["needs hdf5plugin (Zstd filter 32015)"]
    assert any(x.startswith("zstd (32015, hdf5plugin): available (6 dataset(s)") for x in got["file needs"])
    assert got["free disk"][0].endswith(f"at {out}")
    assert got["result"] == ["ok"]


UNREGISTERED = ("import sys, h5py, h5forge; h5py.h5z.unregister_filter(32015); "
                "from h5forge._cli import main; sys.argv = ['h5forge', *sys.argv[1:]]; main()")


def test_doctor_exits_1_when_a_file_or_spec_needs_a_filter_this_hdf5_lacks(built, tmp_path):
    path, _ = built
    # an HDF5 without the Zstd filter, as on a machine where hdf5plugin is not loaded
    r = run("doctor", path, prefix=[PY, "-c", UNREGISTERED])
    assert r.returncode == 1, r.stdout
    got = lines(r.stdout)
    assert "MISSING zstd (32015, hdf5plugin): not available in this HDF5 (6 dataset(s), e.g. " \
           "dataset_v0001.h5:test/images)" in got["file needs"]
    assert got["result"][0].startswith("1 problem(s): file needs: zstd (32015, hdf5plugin)")
    spec = tmp_path / "zstd.yaml"
    import yaml

    data = yaml.safe_load((REPO / "config" / "demo.yaml").read_text())
    data["storage"]["codec"] = "zstd"
    data["source"]["root"] = str(path.parent)
    data["output"]["dir"] = str(tmp_path / "out")
    spec.write_text(yaml.safe_dump(data))
    r = run("doctor", "--spec", spec, prefix=[PY, "-c", UNREGISTERED])
    assert r.returncode == 1
    assert lines(r.stdout)["spec codec"] == ["MISSING zstd: zstd (32015, hdf5plugin): not available in this HDF5"]
    ok = run("doctor", "--spec", spec)
    assert ok.returncode == 0 and lines(ok.stdout)["spec codec"] == ["zstd: zstd (32015, hdf5plugin): available"]
    assert lines(ok.stdout)["free disk"][0].endswith(f"at {tmp_path}")  # the output folder's nearest parent


def test_doctor_spec_with_a_missing_source_and_an_unreachable_prefect_api(tmp_path):
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    r = run("doctor", "--spec", REPO / "config" / "demo.yaml",
            env={"PREFECT_API_URL": f"http://127.0.0.1:{port}/api"})
    assert r.returncode == 1
    got = lines(r.stdout)
    assert got["Prefect API"][0].startswith(f"MISSING http://127.0.0.1:{port}/api does not answer (ConnectError")
    if not (REPO / "data" / "raw" / "demo").is_dir():
        assert got["spec source"] == [f"MISSING {REPO / 'data' / 'raw' / 'demo'}: no such folder (source.root)"]
    r = run("doctor", tmp_path / "nope.h5")
    assert r.returncode == 1 and "nope.h5: no such file" in r.stderr


def test_version_imports_no_command_module_and_flags_show_no_type():
    # the installed console script, run as it is, reporting the modules it imported when it ends
    script = Path(H5FORGE).read_text()
    report = ("import atexit, sys; atexit.register(lambda: print(' '.join(sorted(sys.modules)), file=sys.stderr)); "
              "sys.argv = ['h5forge', '--version']; exec(compile(SCRIPT, 'h5forge', 'exec'))")
    r = run(prefix=[PY, "-c", f"SCRIPT = {script!r}; " + report])
    assert r.stdout == f"h5forge {version('h5forge')}\n"
    loaded = set(r.stderr.split())
    assert "h5forge" in loaded  # the report is of this run
    assert loaded.isdisjoint({"typer", "click", "rich", "pydantic", "yaml", "prefect", "dask", "PIL",
                              "h5forge._cli.dataset", "h5forge._cli.app", "h5forge.spec"})
    for args in (["--help"], ["build", "--help"], ["verify", "--help"]):
        shown = run(*args).stdout
        assert "--help" in shown and "<bool>" not in shown


def imported_by(*args, cwd, env):
    """The modules ``h5forge *args`` imported, as the installed console script runs it."""
    script = Path(H5FORGE).read_text()
    report = ("import atexit, sys; atexit.register(lambda: print('MODULES', ' '.join(sorted(sys.modules)), "
              f"file=sys.stderr)); sys.argv = ['h5forge', *{list(map(str, args))!r}]; "
              "exec(compile(SCRIPT, 'h5forge', 'exec'))")
    clean = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "HDF5_PLUGIN_PATH")}
    r = subprocess.run([PY, "-c", f"SCRIPT = {script!r}; " + report], capture_output=True, text=True, timeout=900,
                       env={**clean, **env}, cwd=cwd)
    modules = r.stderr.rsplit("MODULES ", 1)[1].split()
    return r, {m.split(".")[0] for m in modules}


def test_doctor_without_a_configured_server_imports_neither_prefect_nor_dask(tmp_path):
    """Importing Prefect took most of doctor's time; with no API URL configured there is nothing to
    ask it, and without --dask-address nothing to ask dask."""
    r, top = imported_by("doctor", cwd=REPO, env={"PREFECT_HOME": str(tmp_path)})  # the repo's prefect.toml: no URL
    assert r.returncode == 0, r.stdout + r.stderr
    assert lines(r.stdout)["Prefect API"][0].startswith("ephemeral (no server configured)")
    assert "h5py" in top and not top & {"prefect", "prefect_dask", "dask", "distributed", "httpx"}


def prefect_says(cwd, env):
    """The API URL Prefect itself resolves in ``cwd`` with ``env``."""
    clean = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    code = "from prefect.settings import PREFECT_API_URL; print(PREFECT_API_URL.value())"
    return subprocess.run([PY, "-c", code], capture_output=True, text=True, timeout=900, env={**clean, **env},
                          cwd=cwd).stdout.strip()


@pytest.mark.parametrize("where", ["prefect.toml", "pyproject.toml", ".env", "profiles.toml"])
def test_doctor_finds_an_api_url_set_in_any_prefect_settings_file(tmp_path, where):
    """Each file Prefect reads an API URL from makes doctor probe that URL: the one Prefect resolves."""
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}/api"
    home, cwd = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    cwd.mkdir()
    text = {"prefect.toml": f'[api]\nurl = "{url}"\n', "pyproject.toml": f'[tool.prefect.api]\nurl = "{url}"\n',
            ".env": f"PREFECT_API_URL={url}\n",
            "profiles.toml": f'active = "remote"\n[profiles.remote]\nPREFECT_API_URL = "{url}"\n'}[where]
    (home if where == "profiles.toml" else cwd).joinpath(where).write_text(text)
    env = {"PREFECT_HOME": str(home)}
    assert prefect_says(cwd, env) == url
    r, top = imported_by("doctor", cwd=cwd, env=env)
    assert r.returncode == 1
    assert lines(r.stdout)["Prefect API"][0].startswith(f"MISSING {url} does not answer (ConnectError")


def test_read_shows_a_batch_as_the_framework_free_reader_returns_it(built):
    path, _ = built
    r = run("read", path, "--split", "val", "--fields", "images,masks,label", "--batch-size", "3")
    assert r.returncode == 0, r.stderr
    with h5py.File(path) as f:
        n = int(f["val"].attrs["count"])
        images, masks = f["val/images"][:3], f["val/masks"][:3]
        labels = [x.decode() for x in f["val/meta/label"][:3]]
        ids = [x.decode() for x in f["val/ids"][:3]]
    lines = [line.strip("│ ").split("│") for line in r.stdout.splitlines() if line.startswith("│")]
    rows = {cells[0].strip(): [c.strip() for c in cells[1:]] for cells in lines}
    assert r.stdout.splitlines()[0] == f"{path} val: rows 0..2 of {n}"
    assert rows["images"] == [str(images.shape), "uint8", f"{images.min()}..{images.max()}"]
    assert rows["masks"] == [str(masks.shape), "uint8", f"{masks.min()}..{masks.max()}"]
    assert rows["label"] == ["(3,)", "str", ", ".join(labels)]
    assert r.stdout.splitlines()[-1] == "ids: " + ", ".join(ids)


@pytest.mark.parametrize("args,message", [
    (("--split", "nope"), "no split 'nope'"),
    (("--fields", "pictures"), "pictures"),
])
def test_read_of_what_the_file_lacks_is_one_line(built, args, message):
    path, _ = built
    r = run("read", path, *args)
    assert r.returncode != 0 and r.stdout == ""
    assert r.stderr.startswith("error: ") and message in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_read_of_a_missing_file_is_one_line(tmp_path):
    r = run("read", tmp_path / "dataset_latest.h5")
    assert (r.returncode, r.stderr) == (2, f"error: {tmp_path / 'dataset_latest.h5'}: no such dataset file\n")
