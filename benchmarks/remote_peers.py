"""The peers of ``read_remote``: webdataset, mosaic-streaming and litdata streaming their own formats of
the same samples from the same servers (webdataset's .tar shards from nginx, MDS and litdata chunks
from the S3 endpoint), each with its documented streaming reader, a fresh local cache, shuffled.

Run by ``benchmarks.read_remote`` in the peers' venv (``--write`` makes litdata's chunks, ``--probe``
times one cold epoch); method: benchmarks/README.md, "read_remote".
"""

import gc
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import log

# litdata beside read_peers' pins: it streams the same samples in its own chunk format
PINS = ["webdataset==1.0.2", "mosaicml-streaming==0.13.0", "lmdb==3.0.0", "litdata==0.2.76"]
NAMES = ("webdataset_http", "mosaic_s3", "litdata_s3")
FIELDS = ("images", "masks")


def write_litdata(data: Path) -> Path:
    """(In the peers' venv.) The .npy arrays as litdata's chunks (its ``optimize``, 64 MB chunks)."""
    import litdata
    import numpy as np

    out = data / "peers-litdata"
    if (out / ".complete").exists():
        return out
    shutil.rmtree(out, ignore_errors=True)
    n = np.load(data / "images.npy", mmap_mode="r").shape[0]
    litdata.optimize(fn=_sample, inputs=[(str(data), i) for i in range(n)], output_dir=str(out),
                     chunk_bytes="64MB", num_workers=1, mode="overwrite")
    (out / ".complete").write_text("ok")
    return out


def _sample(item):
    import numpy as np

    data, i = item
    return {k: np.array(np.load(Path(data) / f"{k}.npy", mmap_mode="r")[i]) for k in FIELDS}


def upload(folder: Path, bucket: str, prefix: str, endpoint: str) -> None:
    """Every file under ``folder`` to ``s3://bucket/prefix/`` (credentials from the environment)."""
    import boto3

    s3 = boto3.client("s3", endpoint_url=endpoint)
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and not p.name.startswith(".")):
        s3.upload_file(str(path), bucket, f"{prefix}/{path.relative_to(folder)}")


def loader(name: str, where: str, workers: int, batch: int, seed: int, cache: str):
    """The peer's own streaming dataset and loader as its documentation shows them."""
    import torch
    from torch.utils.data import DataLoader

    if name == "webdataset_http":
        import webdataset as wds

        urls = json.loads(where)
        ds = (wds.WebDataset(urls, shardshuffle=len(urls), seed=seed, empty_check=False).shuffle(1000, seed=seed)
              .decode().to_tuple("images.npy", "masks.npy").map_tuple(torch.from_numpy, torch.from_numpy))
        return DataLoader(ds, batch_size=batch, num_workers=workers)
    if name == "mosaic_s3":
        from streaming import StreamingDataset
        from streaming.base.util import clean_stale_shared_memory

        clean_stale_shared_memory()

        class Tuples(StreamingDataset):
            def __getitem__(self, i):
                s = super().__getitem__(i)
                return torch.from_numpy(s["images"]), torch.from_numpy(s["masks"])

        ds = Tuples(remote=where, local=cache, shuffle=True, shuffle_seed=seed, batch_size=batch)
        return DataLoader(ds, batch_size=batch, num_workers=workers)
    from litdata import StreamingDataLoader, StreamingDataset
    from litdata.streaming import downloader

    # litdata's obstore chunk path builds its client without allow_http, so it refuses a plain-http
    # endpoint; its boto3 path (the one it takes without obstore) honours endpoint_url
    downloader._OBSTORE_AVAILABLE = False

    class LitTuples(StreamingDataset):
        def __getitem__(self, i):
            s = super().__getitem__(i)
            return torch.from_numpy(s["images"]), torch.from_numpy(s["masks"])

    ds = LitTuples(where, cache_dir=cache, shuffle=True, seed=seed,
                   storage_options={"endpoint_url": os.environ["AWS_ENDPOINT_URL"]})
    return StreamingDataLoader(ds, batch_size=batch, num_workers=workers)


def probe(name: str, where: str, workers: int, batch: int, seed: int) -> dict:
    """(In a fresh process of the peers' venv.) One cold shuffled epoch: timings and the sum of every value."""
    import torch

    torch.set_num_threads(1)
    cache = tempfile.mkdtemp(prefix=f"h5forge-{name}-")
    try:
        t0 = time.perf_counter()
        total, first, n = 0, None, 0
        for images, masks in loader(name, where, workers, batch, seed, cache):
            if first is None:
                first = time.perf_counter() - t0
            n += len(images)
            total += int(images.sum(dtype=torch.int64)) + int(masks.sum(dtype=torch.int64))
        epoch = time.perf_counter() - t0
        gc.collect()  # the loader and its workers end and are reaped: their CPU joins this process's children's
        cpu = client_cpu_s()
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    return {"first_batch_s": round(first or 0.0, 4), "epoch_s": round(epoch, 3), "samples": n,
            "samples_per_s": round(n / epoch, 1), "client_cpu_ms_per_sample": round(cpu / n * 1000, 3), "sum": total}


def client_cpu_s() -> float:
    """CPU seconds of this process and its reaped children (the loader's workers, once the epoch has
    ended, and what they started): the client's side, the servers' excluded."""
    import resource

    return sum(resource.getrusage(who).ru_utime + resource.getrusage(who).ru_stime
               for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))


def main() -> None:
    if sys.argv[1] == "--write":
        log(f"litdata chunks in {write_litdata(Path(sys.argv[2]))}")
    else:
        name, where, workers, batch, seed = sys.argv[2:7]
        print(json.dumps(probe(name, where, int(workers), int(batch), int(seed))), flush=True)


if __name__ == "__main__":
    main()
