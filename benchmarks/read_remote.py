"""Training from a server: one shuffled epoch of the loader over loopback HTTP (nginx) and S3 (moto's
server) against the same version read locally; in the same rounds, webdataset, mosaic-streaming and
litdata streaming their own formats of the same samples from the same servers (in the peers' venv).
Method: benchmarks/README.md, "read_remote".
"""

import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import REPO, child_json, cli, log, med, own_cpu, peers_venv, ratio, save
from benchmarks.read_peers import FIELDS, peer_dataset, prepare

BUCKET = "bench"
PEERS_VENV = REPO / "build" / "peers-remote-venv"
# litdata beside read_peers' pins: it streams the same samples in its own chunk format
PINS = ["webdataset==1.0.2", "mosaicml-streaming==0.13.0", "lmdb==3.0.0", "litdata==0.2.76"]


def timed_epoch(loader, t0: float) -> dict:
    """One pass of ``loader``: time to the first batch and the epoch since ``t0``, the client's CPU (this
    process and its reaped workers) per sample, and the sum of every value (equal across sources)."""
    import gc

    import torch

    total, first, n = 0, None, 0
    for images, masks in loader:
        first = first or time.perf_counter() - t0
        n += len(images)
        total += int(images.sum(dtype=torch.int64)) + int(masks.sum(dtype=torch.int64))
    epoch = time.perf_counter() - t0
    del loader
    gc.collect()  # the loader's workers end and are reaped: their CPU joins this process's children's
    return {
        "first_batch_s": round(first or 0.0, 4),
        "epoch_s": round(epoch, 3),
        "samples": n,
        "samples_per_s": round(n / epoch, 1),
        "client_cpu_ms_per_sample": round(own_cpu() / n * 1000, 3),
        "sum": total,
    }


def epoch(url: str, workers: int, batch: int, seed: int) -> dict:
    """(In a fresh process.) One shuffled epoch of ``H5Dataset(url).loader``, the open included."""
    import torch

    from h5forge.read.torch import H5Dataset

    torch.set_num_threads(1)  # as in the peers' probes
    t0 = time.perf_counter()
    ds = H5Dataset(url, "train", image_dtype="uint8", mask_dtype="uint8")
    opened = time.perf_counter() - t0
    return {
        "open_s": round(opened, 4),
        **timed_epoch(ds.loader(batch_size=batch, num_workers=workers, shuffle=True, seed=seed), t0),
    }


def peer_epoch(name: str, where: str, workers: int, batch: int, seed: int) -> dict:
    """(In a fresh process of the peers' venv.) One cold shuffled epoch of the peer's own loader, a new cache."""
    import torch
    from torch.utils.data import DataLoader

    torch.set_num_threads(1)
    cache = tempfile.mkdtemp(prefix=f"h5forge-{name}-")
    try:
        t0 = time.perf_counter()
        ds = peer_dataset(name, json.loads(where) if name.startswith("webdataset") else where, seed, batch, cache)
        if name.startswith("litdata"):
            from litdata import StreamingDataLoader as DataLoader
        return timed_epoch(DataLoader(ds, batch_size=batch, num_workers=workers), t0)
    finally:
        shutil.rmtree(cache, ignore_errors=True)


def counted(url: str) -> dict:
    """(In a fresh process.) Requests and bytes of one shuffled pass in this process (the reader's counters)."""
    import numpy as np

    from h5forge.read._remote import RemoteSplitReader

    reader = RemoteSplitReader(url, "train", FIELDS)
    stored = sum(int(t.sizes.sum()) for t in reader._tables.values())
    order = np.random.default_rng(0).permutation(len(reader))
    for start in range(0, len(order), 32):
        reader.read(order[start : start + 32])
    return {
        "requests_per_sample": round(reader.requests / len(reader), 3),
        "fetched_per_stored_byte": round(reader.bytes_fetched / stored, 4),
        "stored_bytes": stored,
    }


def opened(url: str) -> dict:
    from h5forge.read._remote import RemoteSplitReader

    t0 = time.perf_counter()
    RemoteSplitReader(url, "train", FIELDS)
    return {"seconds": round(time.perf_counter() - t0, 4)}


def write_litdata(data: str) -> dict:
    """(In the peers' venv.) The .npy arrays as litdata's chunks (its ``optimize``, 64 MB chunks)."""
    import litdata
    import numpy as np

    out = Path(data) / "peers-litdata"
    if not (out / ".complete").exists():
        shutil.rmtree(out, ignore_errors=True)
        n = np.load(out.parent / "images.npy", mmap_mode="r").shape[0]
        litdata.optimize(
            fn=litdata_sample,
            inputs=[(str(data), i) for i in range(n)],
            output_dir=str(out),
            chunk_bytes="64MB",
            num_workers=1,
            mode="overwrite",
        )
        (out / ".complete").write_text("ok")
    return {}


def litdata_sample(item):
    import numpy as np

    data, i = item
    return {k: np.array(np.load(Path(data) / f"{k}.npy", mmap_mode="r")[i]) for k in FIELDS}


def upload(folder: Path, prefix: str, endpoint: str) -> None:
    """Every file under ``folder`` to ``s3://BUCKET/prefix/`` (credentials from the environment)."""
    import boto3

    s3 = boto3.client("s3", endpoint_url=endpoint)
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and not p.name.startswith(".")):
        s3.upload_file(str(path), BUCKET, f"{prefix}/{path.relative_to(folder)}")


def stage_peers(peers_py: Path, data: Path, www: Path, nginx, s3, env: dict) -> dict[str, str]:
    """The peers' formats of the same samples on the same servers: webdataset's shards in nginx's folder,
    MDS and litdata chunks in the bucket. Name -> where its reader streams from."""
    child_json("read_peers", "--child", "write_peers", data, python=peers_py, env=env)
    child_json("read_remote", "--child", "write_litdata", data, python=peers_py, env=env)
    shards = sorted((data / "peers" / "wds").glob("*.tar"))
    (www / "wds").mkdir(mode=0o755)
    for shard in shards:
        shutil.copyfile(shard, www / "wds" / shard.name)
        (www / "wds" / shard.name).chmod(0o644)
    upload(data / "peers" / "mds", "mds", s3.url)
    upload(data / "peers-litdata", "litdata", s3.url)
    return {
        "webdataset_http": json.dumps([f"{nginx.url}/wds/{p.name}" for p in shards]),
        "mosaic_s3": f"s3://{BUCKET}/mds",
        "litdata_s3": f"s3://{BUCKET}/litdata",
    }


def http_log(nginx) -> tuple[int, int]:
    """Requests and body bytes in nginx's access log (combined format: the size follows the status), which restarts."""
    lines, sent = nginx.access_log(), 0
    for line in lines:
        parts = line.split('"')
        fields = parts[2].split() if len(parts) > 2 else []
        sent += int(fields[1]) if len(fields) >= 2 and fields[1].isdigit() else 0
    Path(nginx.tmp, "access.log").write_text("")  # nginx appends: the log restarts at 0
    return len(lines), sent


def ratios_of(rate: dict, first: dict, sources, peers, workers) -> dict:
    """Each source against local; above 1: h5forge is ahead of a peer (over HTTP, and over the peer's own server)."""
    out = {}
    for w in workers:
        out |= {
            f"{s}_vs_local_w{w}": ratio(rate[f"{s}_w{w}"], rate[f"local_w{w}"]) for s in ("http", "s3") if s in sources
        }
        for peer in peers:
            for ours in (o for o in dict.fromkeys(("http", peer.rsplit("_", 1)[1])) if o in sources):
                out[f"{ours}_vs_{peer}_samples_per_s_w{w}"] = ratio(rate[f"{ours}_w{w}"], rate[f"{peer}_w{w}"])
                out[f"{peer}_vs_{ours}_first_batch_s_w{w}"] = ratio(first[f"{peer}_w{w}"], first[f"{ours}_w{w}"])
    return out


def main() -> None:
    smoke = dict(n=64, size=64, rounds=1, workers="2")
    args = cli(__doc__, smoke, n=2000, size=224, rounds=1, workers="2,4", batch=32, s3_max_mb=64, results="read_remote")
    sys.path.insert(0, str(REPO))
    from tests.helpers.object_servers import Nginx, S3Server, served_folder

    from h5forge._store.remote import push

    data = prepare(args.n, args.size, codecs=("lz4",))
    version, www = Path(os.path.realpath(data / "lz4.h5")), served_folder()
    push(version.parent, f"file://{www}")  # the layout a bucket gets: the version, its chunk index, the pointer
    peers_py = peers_venv(PEERS_VENV, not args.smoke, PINS, pth=True)
    nginx, s3 = Nginx(www).start(), S3Server().start()
    os.environ.update(s3.env)
    # the peers' endpoint settings: S3_ENDPOINT_URL is mosaic's; litdata's chunk downloads (obstore)
    # refuse a plain-http endpoint unless AWS_ALLOW_HTTP says so
    env = {**os.environ, "S3_ENDPOINT_URL": s3.url, "AWS_ALLOW_HTTP": "true"}
    sources = ("local", "http", "s3") if version.stat().st_size <= args.s3_max_mb * 1e6 else ("local", "http")
    upload_s, workers, runs = None, [int(w) for w in str(args.workers).split(",")], {}
    try:
        s3.make_bucket(BUCKET)
        peers = stage_peers(peers_py, data, www, nginx, s3, env) if peers_py else {}
        if "s3" in sources:
            t_up = time.perf_counter()
            push(version.parent, f"s3://{BUCKET}/cells")
            upload_s = round(time.perf_counter() - t_up, 2)
        urls = {"local": str(version), "http": f"{nginx.url}/dataset_latest.h5"}
        urls["s3"] = f"s3://{BUCKET}/cells/dataset_latest.h5"
        for r in range(args.rounds):
            for w in workers:
                everyone = (*sources, *peers)
                for source in everyone if r % 2 == 0 else everyone[::-1]:
                    http_log(nginx)
                    if source in peers:  # the peer's own reader, in the peers' venv
                        how, python = ("peer_epoch", source, peers[source]), peers_py
                    else:
                        how, python = ("epoch", urls[source]), sys.executable
                    res = child_json("read_remote", "--child", *how, w, args.batch, r, python=python, env=env)
                    if source in ("http", "webdataset_http"):
                        requests, res["bytes_fetched"] = http_log(nginx)
                        res["requests_per_sample"] = round(requests / res["samples"], 3)
                    runs.setdefault(f"{source}_w{w}", []).append(res)
                    log(
                        f"round {r + 1} {source:15s} {w} workers: {res['samples_per_s']:8.0f} samples/s, "
                        f"first batch {res['first_batch_s']:.3f} s"
                    )
        counts = {s: child_json("read_remote", "--child", "counted", urls[s], env=env) for s in sources if s != "local"}
        http_log(nginx)
        http_open = child_json("read_remote", "--child", "opened", urls["http"], env=env)
        http_open["requests"], http_open["bytes"] = http_log(nginx)
        index = next(www.glob("*.chunks.npz"))  # without push's chunk index object: HDF5's own is walked
        index.rename(www / "aside.npz")
        walked = child_json("read_remote", "--child", "opened", urls["http"], env=env)
        walked["requests"], walked["bytes"] = http_log(nginx)
        (www / "aside.npz").rename(index)
    finally:
        nginx.stop()
        s3.stop()
        shutil.rmtree(www, ignore_errors=True)
    sums = {k: {x["sum"] for x in v} for k, v in runs.items()}
    if len({s for v in sums.values() for s in v}) != 1:
        raise SystemExit(f"sources disagree on the data: {sums}")
    of = lambda key, nd, only="": {k: med((x[key] for x in v), nd) for k, v in runs.items() if only in k}  # noqa: E731
    rate, first = {k: round(v) for k, v in of("samples_per_s", 4).items()}, of("first_batch_s", 3)
    http_bytes = {k: round(v / counts["http"]["stored_bytes"], 4) for k, v in of("bytes_fetched", 4, "http").items()}
    skipped = "skipped: the peers' venv is not installed (the full-size run installs it)"
    result = {
        "ratios": ratios_of(rate, first, sources, peers, workers),
        "samples_per_s": rate,
        "first_batch_s": first,
        "client_cpu_ms_per_sample": of("client_cpu_ms_per_sample", 3),
        "http_requests_per_sample_with_workers": of("requests_per_sample", 4, "http"),
        "http_fetched_per_stored_byte_with_workers": http_bytes,
        "one_process_counters": counts,
        "http_open": http_open,
        "http_open_walking_hdf5_index": walked,
        "s3_upload_s": upload_s,
        "s3": "measured" if "s3" in sources else f"skipped: a version over {args.s3_max_mb} MB",
        "peers": {"pins": PINS, "streams": peers} if peers else skipped,
        "version_bytes": version.stat().st_size,
        "runs": runs,
    }
    save(args.results, result)


if __name__ == "__main__":
    main()
