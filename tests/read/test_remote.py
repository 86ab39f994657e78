"""Reading a version from a real HTTP server (nginx) and an S3 endpoint (moto's server mode, see
tests/helpers/object_servers.py) on 127.0.0.1: the same values as the local file, a bounded number
of requests, verified rows, and the faults a network brings."""

from __future__ import annotations

import os
import pickle
import shutil

import numpy as np
import pytest

from h5forge.errors import ReadError
from h5forge._format.objects import RemoteChanged, RemoteMissing, Retry, pointer_bytes
from h5forge.read._remote import RemoteSplitReader, plan_spans
from h5forge.read._reader import SplitReader
from h5forge.read.torch import H5Dataset
from tests.helpers.files import build_file, make_raw
from tests.helpers.object_servers import FaultProxy, Nginx, S3Server, nginx_binary, served_folder

pytestmark = pytest.mark.skipif(nginx_binary() is None, reason="nginx is not installed (apt-get install nginx-light)")

FAST = Retry(attempts=4, backoff=0.01, max_backoff=0.05, timeout=30)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A folder nginx serves, holding an lz4 version, a none-codec version and their raw folder."""
    root = served_folder()
    raw = make_raw(tmp_path_factory.mktemp("raw"), n=48)
    build_file(root / "dataset_v0001.h5", raw, codec="lz4")
    build_file(root / "dataset_v0002.h5", raw, version=2, codec="none")
    server = Nginx(root).start()
    yield server, root
    server.stop()
    shutil.rmtree(root)


def local_and_remote(served, name="dataset_v0001.h5", **kw):
    server, root = served
    return SplitReader(root / name, "train"), RemoteSplitReader(f"{server.url}/{name}", "train", retry=FAST, **kw)


def test_rows_over_http_equal_the_local_file(served):
    local, remote = local_and_remote(served)
    assert len(remote) == len(local) and remote.version == 1
    idx = [7, 0, 3, 3, len(local) - 1, -2]
    want, got = local.read(idx), remote.read(idx)
    assert set(got) == set(want)
    for name in want:
        assert np.array_equal(got[name], want[name]), name
    one = remote.read_one(5)
    assert all(np.array_equal(one[k], local.read_one(5)[k]) for k in one)
    assert remote.ids() == local.ids()


def test_open_is_a_few_requests_and_a_run_of_rows_is_one(served):
    server, root = served
    before = len(server.access_log())
    remote = RemoteSplitReader(f"{server.url}/dataset_v0001.h5", "train", retry=FAST)
    at_open = len(server.access_log()) - before
    assert 1 <= at_open <= 8  # a HEAD and the metadata's blocks, whatever the number of rows
    remote.read(range(0, 16))  # 16 neighbouring rows: each field's chunks lie end to end
    assert remote.requests <= len(remote._tables) == 2
    assert remote.bytes_fetched <= 1.2 * sum(int(t.sizes[:16].sum()) for t in remote._tables.values())


def test_merging_keeps_far_ranges_apart():
    plan = plan_spans([(100, 200), (0, 50), (5000, 5100), (203, 300)], gap=10)
    assert [(a, b) for a, b, _ in plan] == [(0, 50), (100, 300), (5000, 5100)]
    assert plan[1][2] == [0, 3]


def test_loader_workers_shuffled_give_the_local_batches(served):
    server, root = served
    local = H5Dataset(root / "dataset_v0001.h5", "train")
    remote = H5Dataset(f"{server.url}/dataset_v0001.h5", "train", verify_rows=True)
    want = list(local.loader(batch_size=8, num_workers=2, shuffle=True, seed=3))
    got = list(remote.loader(batch_size=8, num_workers=2, shuffle=True, seed=3))
    assert len(got) == len(want)
    for g, w in zip(got, want):
        for a, b in zip(g, w):
            assert np.array_equal(a.numpy(), b.numpy())


def test_pickling_carries_no_connection(served):
    _, remote = local_and_remote(served)
    remote.read([1])
    assert remote.obj._fs is not None
    copy = pickle.loads(pickle.dumps(remote))
    assert copy.obj._fs is None and copy.obj._pid is None  # a worker opens its own pool
    assert np.array_equal(copy.read([1])["images"], remote.read([1])["images"])


def test_a_pointer_is_followed_to_the_version_it_names(served, tmp_path):
    server, root = served
    (root / "sub").mkdir(exist_ok=True)
    shutil.copy(root / "dataset_v0002.h5", root / "sub" / "dataset_v0002.h5")
    size = (root / "sub" / "dataset_v0002.h5").stat().st_size
    (root / "sub" / "dataset_latest.h5").write_bytes(pointer_bytes("dataset_v0002.h5", 2, size))
    ds = H5Dataset(f"{server.url}/sub/dataset_latest.h5", "train")
    assert ds.version == 2 and ds.real_path.endswith("/sub/dataset_v0002.h5")
    (root / "sub" / "dataset_latest.h5").write_bytes(pointer_bytes("dataset_v0002.h5", 2, size + 1))
    with pytest.raises(ReadError, match="replaced after it was published"):
        H5Dataset(f"{server.url}/sub/dataset_latest.h5", "train")


def flip_byte_of_row(root, name: str, row: int, server) -> str:
    """A copy of ``name`` with one byte flipped inside the chunk of train images row ``row``."""
    reader = RemoteSplitReader(f"{server.url}/{name}", "train")
    table = reader._tables["images"]
    where = int(table.offsets[row]) + int(table.sizes[row]) // 2
    bad = root / f"flipped-{name}"
    shutil.copy(root / name, bad)
    with open(bad, "r+b") as fh:
        fh.seek(where)
        value = fh.read(1)[0]
        fh.seek(where)
        fh.write(bytes([value ^ 0x10]))
    return bad.name


def test_a_flipped_byte_is_an_error_naming_the_row(served):
    server, root = served
    bad = flip_byte_of_row(root, "dataset_v0002.h5", 6, server)  # codec none: the bytes decode, the checksum catches it
    remote = RemoteSplitReader(f"{server.url}/{bad}", "train", verify_rows=True, retry=FAST)
    remote.read([0, 1, 5, 7])  # the other rows are fine
    with pytest.raises(ReadError, match=r"train\[6\] \(id '[^']+'\) does not match its checksum"):
        remote.read([4, 6])
    unchecked = RemoteSplitReader(f"{server.url}/{bad}", "train", retry=FAST)
    unchecked.read([6])  # without verify_rows the damage is read: verify_rows is what catches it
    from h5forge._store.remote import verify_remote

    report = verify_remote(f"{server.url}/{bad}")
    assert not report.ok and any("train[6]" in e for e in report.errors)
    assert verify_remote(f"{server.url}/dataset_v0002.h5").ok


def test_a_damaged_lz4_chunk_is_an_error_naming_the_row(served):
    server, root = served
    bad = flip_byte_of_row(root, "dataset_v0001.h5", 9, server)
    remote = RemoteSplitReader(f"{server.url}/{bad}", "train", verify_rows=True, retry=FAST)
    with pytest.raises(ReadError, match=r"(row 9\b|train\[9\])"):
        remote.read([9])


def test_missing_and_forbidden_objects_are_one_clear_error(served):
    server, root = served
    with pytest.raises(RemoteMissing, match=r"dataset_v0042\.h5: no such object \(404\)"):
        H5Dataset(f"{server.url}/dataset_v0042.h5?X-Amz-Signature=sekrit", "train")
    try:
        H5Dataset(f"{server.url}/dataset_v0042.h5?X-Amz-Signature=sekrit", "train")
    except RemoteMissing as err:
        assert "sekrit" not in str(err)  # a presigned URL's signature never appears in a message
    secret = root / "secret.h5"
    shutil.copy(root / "dataset_v0001.h5", secret)
    os.chmod(secret, 0)
    try:
        with pytest.raises(RemoteMissing, match=r"secret\.h5: access denied \(403\)"):
            H5Dataset(f"{server.url}/secret.h5", "train")
    finally:
        secret.unlink()


def test_an_object_replaced_mid_epoch_stops_the_epoch(served):
    server, root = served
    shutil.copy(root / "dataset_v0001.h5", root / "moving.h5")
    remote = RemoteSplitReader(f"{server.url}/moving.h5", "train", retry=FAST)
    remote.read([0, 1])
    tmp = root / ".moving.tmp"
    shutil.copy(root / "dataset_v0002.h5", tmp)  # another version under the same name
    os.replace(tmp, root / "moving.h5")
    with pytest.raises(RemoteChanged, match="changed while it was being read"):
        remote.read([2, 3])


@pytest.fixture
def proxy(served):
    server, _ = served
    p = FaultProxy(server.port).start()
    yield p
    p.stop()


def test_5xx_drops_and_latency_are_retried(served, proxy):
    server, root = served
    local = SplitReader(root / "dataset_v0001.h5", "train")
    remote = RemoteSplitReader(
        f"{proxy.url}/dataset_v0001.h5", "train", retry=Retry(attempts=5, backoff=0.01, timeout=1.0)
    )
    proxy.plan = [("503", 0), ("drop", 0), ("delay", 3.0), ("503", 0)]  # the delay outlasts the 1 s timeout
    got = remote.read([3, 30])
    want = local.read([3, 30])
    assert all(np.array_equal(got[k], want[k]) for k in want)
    assert not proxy.plan  # every fault was met, and got past


def test_retries_are_bounded(served, proxy):
    remote = RemoteSplitReader(f"{proxy.url}/dataset_v0001.h5", "train", retry=FAST)
    proxy.plan = [("503", 0)] * 50
    with pytest.raises(ReadError, match="still failing after 4 tries"):
        remote.read([3])
    proxy.plan = []


def test_an_answer_holding_other_bytes_than_asked_for_is_never_a_row(served, proxy):
    # codec none: bytes one further on would decode as a row; the answers' Content-Range is honest
    server, root = served
    local = SplitReader(root / "dataset_v0002.h5", "train")
    one_range = RemoteSplitReader(f"{proxy.url}/dataset_v0002.h5", "train", ("images",), retry=FAST)
    two_ranges = RemoteSplitReader(f"{proxy.url}/dataset_v0002.h5", "train", retry=FAST)
    assert np.array_equal(one_range.read_one(3)["images"], local.read_one(3)["images"])
    proxy.plan = [("shift", 1)] * 50
    with pytest.raises(ReadError, match=r"still failing after 4 tries .*holds no part with bytes"):
        one_range.read_one(3)  # one range per request
    proxy.plan = [("shift", 1)] * 50
    with pytest.raises(ReadError, match=r"still failing after 4 tries .*holds no part with bytes"):
        two_ranges.read_one(3)  # a multi-range request, then one range at a time
    proxy.plan = []


@pytest.fixture(scope="module")
def s3(served):
    server = S3Server().start()
    server.make_bucket("team")
    yield server
    server.stop()


def s3_object(served, s3, monkeypatch, name: str):
    """The served folder's ``name`` put at ``s3://team/c/``, the credentials in the environment;
    the folder."""
    _, root = served
    for key, value in s3.env.items():
        monkeypatch.setenv(key, value)
    import fsspec

    fsspec.filesystem("s3", skip_instance_cache=True).put_file(str(root / name), f"team/c/{name}")
    return root


def test_rows_over_s3_with_credentials_from_the_environment(served, s3, monkeypatch):
    root = s3_object(served, s3, monkeypatch, "dataset_v0001.h5")
    local = SplitReader(root / "dataset_v0001.h5", "train")
    remote = RemoteSplitReader("s3://team/c/dataset_v0001.h5", "train", verify_rows=True, retry=FAST)
    idx = [11, 2, 2, -1]
    got, want = remote.read(idx), local.read(idx)
    assert all(np.array_equal(got[k], want[k]) for k in want)
    with pytest.raises(RemoteMissing, match=r"s3://team/c/dataset_v0099\.h5: no such object") as caught:
        RemoteSplitReader("s3://team/c/dataset_v0099.h5", "train", retry=FAST)
    assert s3.env["AWS_SECRET_ACCESS_KEY"] not in str(caught.value)
    assert s3.env["AWS_ACCESS_KEY_ID"] not in str(caught.value)


def test_an_s3_answer_holding_other_bytes_than_asked_for_is_never_a_row(served, s3, monkeypatch):
    root = s3_object(served, s3, monkeypatch, "dataset_v0002.h5")
    remote = RemoteSplitReader("s3://team/c/dataset_v0002.h5", "train", ("images",), retry=FAST)
    fs = remote.obj.fs
    call = fs._call_s3

    async def shifted(method, *args, **kwargs):  # moto answers, honestly, a range one byte further on
        if method == "get_object" and "Range" in kwargs:
            a, b = map(int, kwargs["Range"].removeprefix("bytes=").split("-"))
            kwargs["Range"] = f"bytes={a + 1}-{b + 1}"
        return await call(method, *args, **kwargs)

    monkeypatch.setattr(fs, "_call_s3", shifted)
    with pytest.raises(ReadError, match=r"still failing after 4 tries .*holds no part with bytes"):
        remote.read_one(3)
    monkeypatch.setattr(fs, "_call_s3", call)
    want = SplitReader(root / "dataset_v0002.h5", "train").read_one(3)["images"]
    assert np.array_equal(remote.read_one(3)["images"], want)


def test_a_chunk_cache_serves_the_second_epoch_and_stays_within_its_bound(served, tmp_path):
    server, root = served
    local = SplitReader(root / "dataset_v0001.h5", "train")
    url = f"{server.url}/dataset_v0001.h5"
    first = RemoteSplitReader(url, "train", cache_dir=tmp_path / "cache", retry=FAST)
    idx = list(range(len(local)))
    first.read(idx)
    fetched = first.requests
    second = RemoteSplitReader(url, "train", cache_dir=tmp_path / "cache", verify_rows=True, retry=FAST)
    got, want = second.read(idx[::-1]), local.read(idx[::-1])
    assert all(np.array_equal(got[k], want[k]) for k in want)
    assert fetched > 0 and second.requests == 0 and second.cache.hits == 2 * len(idx)  # no network at all
    one_chunk = int(first._tables["images"].sizes[0])
    small = RemoteSplitReader(url, "train", cache_dir=tmp_path / "small", cache_bytes=3 * one_chunk, retry=FAST)
    small.read(idx)
    kept = sum(p.stat().st_size for p in (tmp_path / "small").rglob("*-*") if p.is_file())
    assert 0 < kept <= 3 * one_chunk
    with pytest.raises(ReadError, match="for versions read from a store"):
        H5Dataset(root / "dataset_v0001.h5", "train", cache_dir=tmp_path / "c")


def test_the_lightning_module_trains_from_a_pointer(served):
    from h5forge.read.lightning import H5DataModule

    server, root = served
    (root / "lit").mkdir(exist_ok=True)
    shutil.copy(root / "dataset_v0001.h5", root / "lit" / "dataset_v0001.h5")
    size = (root / "lit" / "dataset_v0001.h5").stat().st_size
    (root / "lit" / "dataset_latest.h5").write_bytes(pointer_bytes("dataset_v0001.h5", 1, size))
    module = H5DataModule(f"{server.url}/lit/dataset_latest.h5", batch_size=8, verify_rows=True)
    module.setup("fit")
    assert module.version_path == f"{server.url}/lit/dataset_v0001.h5"  # what every rank reads
    local = H5DataModule(root / "dataset_v0001.h5", batch_size=8)
    for got, want in zip(module.train_dataloader(), local.train_dataloader()):
        assert all(np.array_equal(a.numpy(), b.numpy()) for a, b in zip(got, want))
    assert sum(len(b[0]) for b in module.val_dataloader()) == len(local.dataset("val"))


def test_a_batch_is_one_multi_range_request_where_the_server_answers_one(served, proxy):
    server, root = served
    local = SplitReader(root / "dataset_v0001.h5", "train")
    rows = [0, 5, 10, 15, 20, 25, 30, 35, 2, 7, 12, 17, 22, 27, 32, 36]  # 32 chunks, none neighbours
    remote = RemoteSplitReader(f"{server.url}/dataset_v0001.h5", "train", retry=FAST)
    got, want = remote.read(rows), local.read(rows)
    assert all(np.array_equal(got[k], want[k]) for k in want)
    assert remote.requests == 1 and remote.obj._multi  # nginx answers multipart/byteranges
    through = RemoteSplitReader(f"{proxy.url}/dataset_v0001.h5", "train", retry=FAST)
    proxy.plan = [("200", 0)]  # a server that will not answer several ranges at once
    got = through.read(rows)
    assert all(np.array_equal(got[k], want[k]) for k in want)
    assert not through.obj._multi and through.requests > 1  # one range at a time from then on


def _read_in_child(remote, row, send) -> None:
    got = remote.read([row])["images"]
    send.send((remote.obj._pid == os.getpid(), got.tobytes()))


def test_a_forked_process_opens_its_own_connections(served):
    import multiprocessing

    _, remote = local_and_remote(served)
    remote.read([2])  # the parent's filesystem and connection pool exist
    parent_pid = remote.obj._pid
    ctx = multiprocessing.get_context("fork")
    recv, send = ctx.Pipe(duplex=False)
    child = ctx.Process(target=_read_in_child, args=(remote, 4, send))
    child.start()
    own, data = recv.recv()
    child.join(120)
    assert child.exitcode == 0 and own and parent_pid == os.getpid()
    assert data == remote.read([4])["images"].tobytes()


HANG_PROBE = """
import gc, sys, threading, time, h5py
from h5forge.read._remote import RemoteSplitReader
url, local = sys.argv[1], sys.argv[2]
held = h5py.File(local, "r")
stop = threading.Event()
def make_cycles():  # garbage holding h5py objects: whichever thread's allocation runs the collector frees it
    while not stop.is_set():
        for _ in range(50):
            box = [held["train"]]
            box.append(box)
        time.sleep(0.001)
gc.set_threshold(100)
cycles = threading.Thread(target=make_cycles)
cycles.start()
for _ in range(30):
    RemoteSplitReader(url, "train").read([0, 1, 2])
stop.set()
cycles.join()  # not a daemon: one stopped at exit while it held h5py's lock would hang the exit
print("read")
"""


def test_a_collection_on_fsspecs_thread_does_not_hang_a_read_through_h5py(served):
    """h5py holds its lock while HDF5 reads through fsspec's file, whose reads run on fsspec's own
    thread: a garbage collection there that frees an h5py object would wait for that lock forever."""
    import subprocess
    import sys

    server, root = served
    try:
        done = subprocess.run(
            [sys.executable, "-c", HANG_PROBE, f"{server.url}/dataset_v0001.h5", str(root / "dataset_v0001.h5")],
            capture_output=True,
            text=True,
            timeout=600,
        )
    except subprocess.TimeoutExpired:
        pytest.fail("a read through h5py over fsspec hung")
    assert done.returncode == 0 and done.stdout.strip() == "read", done.stderr
