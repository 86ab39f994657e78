"""Versions on a bucket prefix (moto's S3 server on 127.0.0.1, a mock's server mode: see
tests/helpers/object_servers.py): push publishes with one pointer PUT, readers pin what they
opened, rollback and retention work on the prefix, thin versions go up whole, and the CLI's
messages never show a credential."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import fsspec
import numpy as np
import pytest

import h5forge
from h5forge.errors import ReadError, VersionError
from h5forge.read._reader import SplitReader
from h5forge._format.objects import RemoteMissing, Retry
from h5forge.read._remote import RemoteSplitReader
from h5forge._store.remote import latest_of, listed, push, retain, rollback, verify_remote
from h5forge._store.versions import set_latest
from tests.helpers.data import age_files, drop_samples
from tests.helpers.files import build_file, make_raw
from tests.helpers.object_servers import S3Server, nginx_binary

FAST = Retry(attempts=3, backoff=0.01, max_backoff=0.05, timeout=30)


@pytest.fixture(scope="module")
def s3():
    server = S3Server().start()
    old = {k: os.environ.get(k) for k in server.env}
    os.environ.update(server.env)  # credentials the standard way: the environment
    yield server
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    server.stop()


@pytest.fixture
def bucket(s3, request):
    name = "b-" + request.node.name.replace("_", "-")[:40].lower().strip("-")
    s3.make_bucket(name)
    return f"s3://{name}/cells"


@pytest.fixture(scope="module")
def two_versions(tmp_path_factory):
    """An output folder with two published versions (different content), latest -> v0001."""
    out = tmp_path_factory.mktemp("out")
    raw1 = make_raw(tmp_path_factory.mktemp("raw1"), n=30)
    raw2 = make_raw(tmp_path_factory.mktemp("raw2"), n=40, seed=1)
    build_file(out / "dataset_v0001.h5", raw1, version=1, codec="lz4")
    build_file(out / "dataset_v0002.h5", raw2, version=2, codec="lz4")
    set_latest(out, 1)
    return out


def rows_equal(remote, local_path) -> None:
    local = SplitReader(local_path, "train")
    idx = list(range(len(local)))
    got, want = remote.read(idx), local.read(idx)
    assert all(np.array_equal(got[k], want[k]) for k in want)


def test_push_publishes_and_readers_keep_the_version_they_opened(two_versions, bucket):
    out = two_versions
    set_latest(out, 1)
    first = push(out, bucket)
    assert first.version == 1 and first.uploaded and first.object == f"{bucket}/dataset_v0001.h5"
    pinned = RemoteSplitReader(f"{bucket}/dataset_latest.h5", "train", retry=FAST)
    assert pinned.version == 1
    set_latest(out, 2)
    push(out, bucket)
    assert latest_of(bucket) == 2 and sorted(listed(bucket)) == [1, 2]
    rows_equal(pinned, out / "dataset_v0001.h5")  # opened before the push: still v1, whole
    fresh = RemoteSplitReader(f"{bucket}/dataset_latest.h5", "train", verify_rows=True, retry=FAST)
    assert fresh.version == 2
    rows_equal(fresh, out / "dataset_v0002.h5")
    assert not push(out, bucket).uploaded  # pushing the same version again uploads nothing

    rollback(bucket, 1)
    assert RemoteSplitReader(f"{bucket}/dataset_latest.h5", "train").version == 1
    with pytest.raises(VersionError, match="not a version on this prefix"):
        rollback(bucket, 7)

    assert retain(bucket, keep=1) == []  # latest (v1) and the newest (v2) are both kept
    rollback(bucket, 2)
    assert retain(bucket, keep=1) == [f"{bucket}/dataset_v0001.h5"]
    assert sorted(listed(bucket)) == [2]
    with pytest.raises(RemoteMissing, match=r"dataset_v0001\.h5: no such object \(404\)"):
        pinned.read([0])  # a reader on a deleted version: one clear error, never another version's rows
    set_latest(out, 1)


def test_a_published_version_is_never_overwritten(two_versions, bucket, tmp_path):
    out = two_versions
    set_latest(out, 1)
    push(out, bucket)
    other = tmp_path / "other"
    other.mkdir()
    shutil.copy(out / "dataset_v0002.h5", other / "dataset_v0001.h5")  # another file under the same name
    set_latest(other, 1)
    with pytest.raises(VersionError, match="already holds a different version 1"):
        push(other, bucket)
    assert latest_of(bucket) == 1
    assert verify_remote(f"{bucket}/dataset_latest.h5").ok


def test_a_thin_version_goes_up_whole(dataset, raw_new, s3, bucket):
    spec_file, out, inbox = dataset
    drop_samples(raw_new, inbox, ["cell_000001", "cell_000002"], rename="t_")
    age_files(inbox)
    assert h5forge.append(spec_file).version == 2
    pushed = push(out, bucket)
    assert pushed.version == 2 and pushed.uploaded
    assert [e["object"] for e in listed(bucket).values()] == ["dataset_v0002.h5"]  # no delta: the copy is whole
    report = verify_remote(f"{bucket}/dataset_latest.h5")
    assert report.ok, report.errors
    remote = RemoteSplitReader(f"{bucket}/dataset_latest.h5", "train", verify_rows=True, retry=FAST)
    rows_equal(remote, out / "dataset_latest.h5")
    assert remote.ids() == SplitReader(out / "dataset_latest.h5", "train").ids()


def test_cli_push_versions_verify_rollback(two_versions, s3, bucket):
    out = two_versions
    set_latest(out, 2)
    env = {**os.environ, **s3.env}
    h5forge_cli = [os.path.join(os.path.dirname(sys.executable), "h5forge")]

    def run(*args: str) -> subprocess.CompletedProcess:
        done = subprocess.run([*h5forge_cli, *args], env=env, capture_output=True, text=True, timeout=600)
        for secret in (s3.env["AWS_SECRET_ACCESS_KEY"], s3.env["AWS_ACCESS_KEY_ID"]):
            assert secret not in done.stdout + done.stderr
        return done

    pushed = run("push", str(out), bucket, "--keep", "2")
    assert pushed.returncode == 0, pushed.stderr
    assert f"v0002 uploaded: {bucket}/dataset_v0002.h5" in pushed.stdout
    listing = run("versions", bucket)
    assert listing.returncode == 0 and "latest →" in listing.stdout and "v0002" in listing.stdout
    verified = run("verify", f"{bucket}/dataset_latest.h5")
    assert verified.returncode == 0 and "HEALTHY" in verified.stdout
    missing = run("verify", f"{bucket}/dataset_v0009.h5")
    assert missing.returncode == 1 and "no such object (404)" in missing.stdout
    never = run("rollback", bucket, "v0001")  # v0001 was never pushed here
    assert never.returncode != 0 and "not a version on this prefix" in never.stderr
    assert latest_of(bucket) == 2
    notabucket = run("push", str(out), str(out))
    assert notabucket.returncode == 2 and "not a bucket address" in notabucket.stderr


def test_a_pointer_to_a_replaced_object_is_refused(two_versions, bucket):
    out = two_versions
    set_latest(out, 1)
    push(out, bucket)
    fs = fsspec.filesystem("s3", skip_instance_cache=True)
    fs.put_file(str(out / "dataset_v0002.h5"), bucket[len("s3://") :] + "/dataset_v0001.h5")  # behind push's back
    with pytest.raises(ReadError, match="replaced after it was published"):
        RemoteSplitReader(f"{bucket}/dataset_latest.h5", "train")


@pytest.mark.skipif(nginx_binary() is None, reason="nginx is not installed (apt-get install nginx-light)")
def test_the_chunk_index_object_makes_the_open_a_few_requests(tmp_path_factory):
    """push to a folder (file://) that nginx serves: the open reads the chunk index in one GET
    instead of walking HDF5's chunk index node by node through the file."""
    from tests.helpers.object_servers import Nginx, served_folder

    out = tmp_path_factory.mktemp("many")
    build_file(out / "dataset_v0001.h5", make_raw(tmp_path_factory.mktemp("rawmany"), n=400), codec="lz4")
    set_latest(out, 1)
    www = served_folder()
    server = Nginx(www).start()
    try:
        push(out, f"file://{www}/cells")
        assert (www / "cells" / "dataset_v0001.h5.chunks.npz").is_file()
        url = f"{server.url}/cells/dataset_latest.h5"

        def opened() -> tuple[RemoteSplitReader, int]:
            before = len(server.access_log())
            reader = RemoteSplitReader(url, "train", retry=FAST)
            return reader, len(server.access_log()) - before

        indexed, with_index = opened()
        (www / "cells" / "dataset_v0001.h5.chunks.npz").rename(www / "cells" / "aside.npz")
        walked, without = opened()
        assert with_index < without and with_index <= 10, (with_index, without)
        for path, table in walked._tables.items():
            assert np.array_equal(indexed._tables[path].offsets, table.offsets)
            assert np.array_equal(indexed._tables[path].sizes, table.sizes)
        rows_equal(indexed, out / "dataset_v0001.h5")
        # an index made for another object (here: another file's digest) is never used
        (www / "cells" / "aside.npz").rename(www / "cells" / "dataset_v0001.h5.chunks.npz")
        from h5forge._format.objects import parse_chunk_index

        data = (www / "cells" / "dataset_v0001.h5.chunks.npz").read_bytes()
        assert parse_chunk_index(data, indexed.obj, "another-digest") is None
    finally:
        server.stop()
        shutil.rmtree(www)


def test_an_object_replaced_under_a_running_reader_stops_it(two_versions, bucket):
    out = two_versions
    set_latest(out, 1)
    push(out, bucket)
    reader = RemoteSplitReader(f"{bucket}/dataset_v0001.h5", "train", retry=FAST)
    reader.read([0, 1])
    fs = fsspec.filesystem("s3", skip_instance_cache=True)
    fs.put_file(str(out / "dataset_v0002.h5"), bucket[len("s3://") :] + "/dataset_v0001.h5")  # behind push's back
    with pytest.raises(ReadError, match="changed while it was being read"):
        reader.read([2, 3])
