"""Training from a server: one shuffled epoch of the loader over loopback HTTP (nginx) and S3 (moto's
server mode) against the same version read from the local disk.

    python -m benchmarks.read_remote [--smoke] [--n 2000 --size 224 --rounds 1 --workers 2,4 --s3-max-mb 64]
    python -m benchmarks.read_remote --n 200 --results read_remote_s3   # small enough for moto's S3
    python -m benchmarks.read_remote --n 500 --rounds 3 --workers 2 --results read_remote_peers

Figures per source and worker count (each a probe process): time to the first batch of a cold
epoch (the open included), epoch samples/s, requests per sample and bytes fetched per stored byte
(nginx's access log for HTTP: every request, the open's metadata included; for S3 the reader's own
counters in one process). S3 runs only for a version of at most ``--s3-max-mb``: moto's server
copies the whole object for every ranged GET (``FakeKey.value``), so on a large version its time
measures moto. In the same rounds, the peers stream their own formats of the same samples from the
same servers (benchmarks/remote_peers.py: webdataset from nginx, mosaic-streaming and litdata from
the S3 endpoint). Method: benchmarks/README.md, "read_remote".
"""

import gc
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks import remote_peers
from benchmarks.common import REPO, cli, log, machine, peers_venv, ratio, save
from benchmarks.read_peers import prepare

SOURCES = ("local", "http", "s3")
BUCKET = "bench"
PEERS_VENV = REPO / "build" / "peers-remote-venv"


def probe(url: str, workers: int, batch: int, seed: int) -> dict:
    """(In a fresh process.) One shuffled epoch of ``H5Dataset(url).loader``: timings and the sum of every value."""
    import torch

    from h5forge.read.torch import H5Dataset

    torch.set_num_threads(1)  # as in the peers' probes

    t0 = time.perf_counter()
    ds = H5Dataset(url, "train", image_dtype="uint8", mask_dtype="uint8")
    opened = time.perf_counter() - t0
    loader = ds.loader(batch_size=batch, num_workers=workers, shuffle=True, seed=seed)
    total, first, n = 0, None, 0
    for images, masks in loader:
        if first is None:
            first = time.perf_counter() - t0
        n += len(images)
        total += int(images.sum(dtype=torch.int64)) + int(masks.sum(dtype=torch.int64))
    epoch = time.perf_counter() - t0
    del loader  # its workers end and are reaped: their CPU joins this process's children's
    gc.collect()
    cpu = remote_peers.client_cpu_s()
    return {"open_s": round(opened, 4), "first_batch_s": round(first or 0.0, 4), "epoch_s": round(epoch, 3),
            "samples": n, "samples_per_s": round(n / epoch, 1), "client_cpu_ms_per_sample": round(cpu / n * 1000, 3),
            "sum": total}


def counted(url: str, n: int) -> dict:
    """(In a fresh process.) Requests and bytes of one shuffled pass in this process (the reader's counters)."""
    import numpy as np

    from h5forge.read.remote import RemoteSplitReader

    reader = RemoteSplitReader(url, "train", ("images", "masks"))
    stored = sum(int(t.sizes.sum()) for t in reader._tables.values())
    order = np.random.default_rng(0).permutation(len(reader))
    for start in range(0, len(order), 32):
        reader.read(order[start:start + 32])
    return {"requests_per_sample": round(reader.requests / len(reader), 3),
            "fetched_per_stored_byte": round(reader.bytes_fetched / stored, 4), "stored_bytes": stored}


def _run_probe(what: str, env: dict, *args: str, python: str = sys.executable, module: str = "read_remote") -> dict:
    cmd = [python, "-m", f"benchmarks.{module}", "--probe", what, *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env=env, timeout=3600)
    if proc.returncode != 0:
        raise RuntimeError(f"{what} {args} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _http_log(server) -> tuple[int, int]:
    """Requests and body bytes in nginx's access log (combined format: the size follows the status)."""
    lines = server.access_log()
    sent = 0
    for line in lines:
        parts = line.split('"')
        if len(parts) > 2:
            fields = parts[2].split()
            if len(fields) >= 2 and fields[1].isdigit():
                sent += int(fields[1])
    return len(lines), sent


def main() -> None:
    if "--probe" in sys.argv:
        return _probe_main()
    args = cli(__doc__, dict(n=64, size=64, rounds=1, workers="2"), n=2000, size=224, rounds=1, workers="2,4", batch=32,
               s3_max_mb=64, results="read_remote")
    sys.path.insert(0, str(REPO))
    from tests.helpers.object_servers import Nginx, S3Server, served_folder

    from h5forge.store.remote import push

    t0, load_start = time.perf_counter(), [round(x, 2) for x in os.getloadavg()]
    data = prepare(args.n, args.size, codecs=("lz4",))
    version = Path(os.path.realpath(data / "lz4.h5"))
    www = served_folder()
    out = version.parent  # the built version's output folder: push publishes its latest
    push(out, f"file://{www}")  # the layout a bucket gets: the version, its chunk index, the pointer
    peers_py = peers_venv(PEERS_VENV, not args.smoke, remote_peers.PINS, pth=True)
    nginx, s3 = Nginx(www).start(), S3Server().start()
    os.environ.update(s3.env)
    # the peers' endpoint settings: S3_ENDPOINT_URL is mosaic's; litdata's chunk downloads (obstore)
    # refuse a plain-http endpoint unless AWS_ALLOW_HTTP says so
    env = {**os.environ, "S3_ENDPOINT_URL": s3.url, "AWS_ALLOW_HTTP": "true", "PYTHONPATH": str(REPO)}
    sources = SOURCES if version.stat().st_size <= args.s3_max_mb * 1e6 else ("local", "http")
    upload_s = None
    try:
        s3.make_bucket(BUCKET)
        peers = _stage_peers(peers_py, data, www, nginx, s3, env) if peers_py else {}
        if "s3" in sources:
            t_up = time.perf_counter()
            push(out, f"s3://{BUCKET}/cells")
            upload_s = round(time.perf_counter() - t_up, 2)
        urls = {"local": str(version), "http": f"{nginx.url}/dataset_latest.h5",
                "s3": f"s3://{BUCKET}/cells/dataset_latest.h5"}
        workers = [int(w) for w in str(args.workers).split(",")]
        runs: dict[str, list[dict]] = {}
        for r in range(args.rounds):
            for w in workers:
                everyone = (*sources, *peers)
                for source in everyone if r % 2 == 0 else everyone[::-1]:
                    Path(nginx.tmp, "access.log").write_text("")  # nginx appends: the log restarts at 0
                    if source in peers:
                        res = _run_probe(source, env, peers[source], str(w), str(args.batch), str(r),
                                         python=str(peers_py), module="remote_peers")
                    else:
                        res = _run_probe("epoch", env, urls[source], str(w), str(args.batch), str(r))
                    if source in ("http", "webdataset_http"):
                        requests, sent = _http_log(nginx)
                        res["requests_per_sample"] = round(requests / res["samples"], 3)
                        res["bytes_fetched"] = sent
                    runs.setdefault(f"{source}_w{w}", []).append(res)
                    log(f"round {r + 1} {source:15s} {w} workers: {res['samples_per_s']:8.0f} samples/s, "
                        f"first batch {res['first_batch_s']:.3f} s")
        counts = {source: _run_probe("count", env, urls[source], str(args.n)) for source in sources if source != "local"}
        Path(nginx.tmp, "access.log").write_text("")
        opened = _run_probe("open", env, urls["http"], "0")
        opened["requests"], opened["bytes"] = _http_log(nginx)
        index = next(www.glob("*.chunks.npz"))  # without push's chunk index object: HDF5's own is walked
        index.rename(www / "aside.npz")
        Path(nginx.tmp, "access.log").write_text("")
        walked = _run_probe("open", env, urls["http"], "0")
        walked["requests"], walked["bytes"] = _http_log(nginx)
        (www / "aside.npz").rename(index)
    finally:
        nginx.stop()
        s3.stop()
        shutil.rmtree(www, ignore_errors=True)
    sums = {k: {x["sum"] for x in v} for k, v in runs.items()}
    if len({s for v in sums.values() for s in v}) != 1:
        raise SystemExit(f"sources disagree on the data: {sums}")
    stored = counts["http"]["stored_bytes"]
    rate = {k: round(statistics.median(x["samples_per_s"] for x in v)) for k, v in runs.items()}
    first = {k: round(statistics.median(x["first_batch_s"] for x in v), 3) for k, v in runs.items()}
    cpu = {k: round(statistics.median(x["client_cpu_ms_per_sample"] for x in v), 3) for k, v in runs.items()}
    http_bytes = {k: round(statistics.median(x["bytes_fetched"] for x in v) / stored, 4)
                  for k, v in runs.items() if "http" in k}
    http_requests = {k: statistics.median(x["requests_per_sample"] for x in v) for k, v in runs.items() if "http" in k}
    ratios = {}
    for w in workers:
        ratios[f"http_vs_local_w{w}"] = ratio(rate[f"http_w{w}"], rate[f"local_w{w}"])
        if "s3" in sources:
            ratios[f"s3_vs_local_w{w}"] = ratio(rate[f"s3_w{w}"], rate[f"local_w{w}"])
        for peer in peers:  # above 1: h5forge is ahead (over HTTP, and over the peer's own server)
            for ours in dict.fromkeys(("http", peer.rsplit("_", 1)[1])):
                if ours in sources:
                    ratios[f"{ours}_vs_{peer}_samples_per_s_w{w}"] = ratio(rate[f"{ours}_w{w}"], rate[f"{peer}_w{w}"])
                    ratios[f"{peer}_vs_{ours}_first_batch_s_w{w}"] = ratio(first[f"{peer}_w{w}"], first[f"{ours}_w{w}"])
    save(args.results, {"machine": machine(), "loadavg_start": load_start, "args": vars(args), "ratios": ratios,
                         "samples_per_s": rate, "first_batch_s": first, "client_cpu_ms_per_sample": cpu,
                         "http_requests_per_sample_with_workers": http_requests,
                         "http_fetched_per_stored_byte_with_workers": http_bytes,
                         "one_process_counters": counts, "http_open": opened, "http_open_walking_hdf5_index": walked, "s3_upload_s": upload_s,
                         "s3": "measured" if "s3" in sources else f"skipped: a version over {args.s3_max_mb} MB",
                         "peers": {"pins": remote_peers.PINS, "streams": peers} if peers
                         else "skipped: the peers' venv is not installed (the full-size run installs it)",
                         "version_bytes": version.stat().st_size, "runs": runs,
                         "seconds": round(time.perf_counter() - t0)}, args.smoke, module="read_remote")


def _stage_peers(peers_py: Path, data: Path, www: Path, nginx, s3, env: dict) -> dict[str, str]:
    """The peers' formats of the same samples on the same servers: webdataset's shards in nginx's folder,
    MDS and litdata chunks in the bucket. Name -> where its reader streams from."""
    for args in (["benchmarks.read_peers", "--write-peers", "--data"], ["benchmarks.remote_peers", "--write"]):
        subprocess.run([str(peers_py), "-m", *args, str(data)], check=True, cwd=REPO, env=env)
    shards = sorted((data / "peers" / "wds").glob("*.tar"))
    (www / "wds").mkdir(mode=0o755)
    for shard in shards:
        shutil.copyfile(shard, www / "wds" / shard.name)
        (www / "wds" / shard.name).chmod(0o644)
    remote_peers.upload(data / "peers" / "mds", BUCKET, "mds", s3.url)
    remote_peers.upload(data / "peers-litdata", BUCKET, "litdata", s3.url)
    return {"webdataset_http": json.dumps([f"{nginx.url}/wds/{p.name}" for p in shards]),
            "mosaic_s3": f"s3://{BUCKET}/mds", "litdata_s3": f"s3://{BUCKET}/litdata"}


def _probe_main() -> None:
    what, *rest = sys.argv[sys.argv.index("--probe") + 1:]
    if what == "epoch":
        url, workers, batch, seed = rest[:4]
        print(json.dumps(probe(url, int(workers), int(batch), int(seed))))
    elif what == "open":
        from h5forge.read.remote import RemoteSplitReader

        t0 = time.perf_counter()
        RemoteSplitReader(rest[0], "train", ("images", "masks"))
        print(json.dumps({"seconds": round(time.perf_counter() - t0, 4)}))
    else:
        url, n = rest[:2]
        print(json.dumps(counted(url, int(n))))


if __name__ == "__main__":
    main()
