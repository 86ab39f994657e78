"""Peak memory of the ``boxes`` kind on large and hostile COCO files, each measured in a fresh process.

    .venv/bin/python -m benchmarks.boxes_memory            # every case, full size
    .venv/bin/python -m benchmarks.boxes_memory --smoke    # tiny sizes, every code path

- **worker**: a COCO file of ``--annotations`` (10^6) objects over ``--pictures`` (20,000) image
  entries, of which 40 pictures exist. Discovery runs in one process (the build's parent), which
  pickles the 40 samples it found; a second process (a cleaning worker) cleans them: its peak is
  what each dask worker costs.
- **objects**: one picture with 20,000 annotations, ``masks: true``; **polygon**: one picture with
  one polygon of 2 x 10^6 vertices, ``masks: true``. Discovery and cleaning in one process, with a
  good picture beside the hostile one.

Peaks are the process's own: ``VmHWM`` (``ru_maxrss`` of ``resource.getrusage`` is printed beside
it; after a fork it may count the parent's pages). Results: ``results/boxes_memory.json``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import textwrap
from pathlib import Path

from benchmarks.common import CACHE, RESULTS

MIB = 1 << 20

PEAK = textwrap.dedent("""
    import resource

    def peaks():
        with open("/proc/self/status") as fh:
            hwm = next(int(line.split()[1]) * 1024 for line in fh if line.startswith("VmHWM:"))
        return {"vm_hwm": hwm, "ru_maxrss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
""")

DISCOVER = PEAK + textwrap.dedent("""
    import json, pickle, sys
    from pathlib import Path
    from h5forge.ingest.discover import discover
    from h5forge.spec import parse_spec

    data = json.loads(sys.argv[1])
    spec = parse_spec(data, Path(data["source"]["root"]))
    inv = discover(spec)
    Path(sys.argv[2]).write_bytes(pickle.dumps((inv.root, inv.samples)))
    print(json.dumps({"samples": len(inv.samples), "payload": len(pickle.dumps(inv.samples)), **peaks()}))
""")

CLEAN = PEAK + textwrap.dedent("""
    import json, pickle, sys
    from pathlib import Path
    from h5forge.ingest.clean import clean_batch
    from h5forge.ingest.discover import discover
    from h5forge.spec import parse_spec

    data = json.loads(sys.argv[1])
    spec = parse_spec(data, Path(data["source"]["root"]))
    if len(sys.argv) > 2:  # a worker: the samples the parent discovered
        root, refs = pickle.loads(Path(sys.argv[2]).read_bytes())
        rejected = []
    else:
        inv = discover(spec)
        root, refs, rejected = inv.root, inv.samples, inv.rejections
    batch = clean_batch(spec, root, refs, encode=False)
    print(json.dumps({"taken": len(batch.ids),
                      "rejected": [[r.sample_id, r.reason[:160]] for r in [*rejected, *batch.rejections]],
                      **peaks()}))
""")


def _child(code: str, *args: str) -> dict:
    res = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=3600)
    if res.returncode != 0:
        return {"error": res.stderr.strip().splitlines()[-1] if res.stderr.strip() else f"exit {res.returncode}"}
    return json.loads(res.stdout.strip().splitlines()[-1])


def _png(path: Path, h: int, w: int) -> None:
    import numpy as np
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (h, w, 3), dtype=np.uint8)).save(path)


def _spec(root: Path, masks: bool) -> dict:
    return {
        "name": "boxes-memory",
        "source": {"root": str(root)},
        "fields": {
            "images": {"kind": "image", "files": "images/*.png", "size": [128, 128]},
            "boxes": {
                "kind": "boxes",
                "like": "images",
                "coco": "instances.json",
                "classes": ["thing"],
                "masks": masks,
            },
        },
        "output": {"dir": str(root.parent / "out")},
    }


def _write_coco(path: Path, images: list[dict], annotations) -> None:
    """The COCO file written a piece at a time: the generator never holds it whole."""
    with open(path, "w") as fh:
        fh.write('{"categories": [{"id": 1, "name": "thing"}], "images": ')
        fh.write(json.dumps(images))
        fh.write(', "annotations": [')
        for i, a in enumerate(annotations):
            fh.write(("," if i else "") + json.dumps(a))
        fh.write("]}")


def large_file(root: Path, n_annotations: int, n_pictures: int, on_disk: int = 40) -> dict:
    images = [{"id": i + 1, "file_name": f"p{i:06d}.png", "height": 64, "width": 64} for i in range(n_pictures)]
    for i in range(on_disk):
        _png(root / "images" / f"p{i:06d}.png", 64, 64)
    boxes = (
        {
            "id": k + 1,
            "image_id": k % n_pictures + 1,
            "category_id": 1,
            "bbox": [k % 50, k % 40, 8, 6],
            "area": 48,
            "iscrowd": 0,
            "segmentation": [[1, 1, 9, 1, 9, 7, 1, 7]],
        }
        for k in range(n_annotations)
    )
    _write_coco(root / "instances.json", images, boxes)
    return _spec(root, masks=False)


def many_objects(root: Path, n: int) -> dict:
    _png(root / "images" / "good.png", 128, 128)
    _png(root / "images" / "bad.png", 128, 128)
    images = [
        {"id": 1, "file_name": "good.png", "height": 128, "width": 128},
        {"id": 2, "file_name": "bad.png", "height": 128, "width": 128},
    ]
    anns = [{"id": 1, "image_id": 1, "category_id": 1, "bbox": [10, 10, 20, 20], "iscrowd": 0}]
    anns += [
        {"id": k + 2, "image_id": 2, "category_id": 1, "bbox": [k % 100, k % 90, 20, 30], "iscrowd": 0}
        for k in range(n)
    ]
    _write_coco(root / "instances.json", images, anns)
    return _spec(root, masks=True)


def long_polygon(root: Path, n: int) -> dict:
    _png(root / "images" / "good.png", 128, 128)
    _png(root / "images" / "bad.png", 128, 128)
    images = [
        {"id": 1, "file_name": "good.png", "height": 128, "width": 128},
        {"id": 2, "file_name": "bad.png", "height": 128, "width": 128},
    ]
    zigzag = []
    for k in range(n):
        zigzag += [k % 127, 0 if k % 2 else 127]
    anns = [
        {
            "id": 1,
            "image_id": 1,
            "category_id": 1,
            "bbox": [10, 10, 20, 20],
            "iscrowd": 0,
            "segmentation": [[10, 10, 30, 10, 30, 30]],
        },
        {"id": 2, "image_id": 2, "category_id": 1, "bbox": [0, 0, 127, 127], "iscrowd": 0, "segmentation": [zigzag]},
    ]
    _write_coco(root / "instances.json", images, anns)
    return _spec(root, masks=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--annotations", type=int, default=1_000_000)
    ap.add_argument("--pictures", type=int, default=20_000)
    ap.add_argument("--only", nargs="*", default=["worker", "objects", "polygon"])
    ap.add_argument("--label", default="", help="a name for this tree's figures (e.g. before, after)")
    args = ap.parse_args()
    scale = 100 if args.smoke else 1
    work = CACHE / "boxes_memory"
    import shutil

    shutil.rmtree(work, ignore_errors=True)
    figures: dict[str, dict] = {}
    if "worker" in args.only:
        spec = large_file(work / "large" / "raw", args.annotations // scale, args.pictures // scale)
        size = (work / "large" / "raw" / "instances.json").stat().st_size
        parent = _child(DISCOVER, json.dumps(spec), str(work / "refs.pkl"))
        worker = _child(CLEAN, json.dumps(spec), str(work / "refs.pkl"))
        figures["worker"] = {"coco_bytes": size, "parent": parent, "worker": worker}
    if "objects" in args.only:
        figures["objects"] = _child(CLEAN, json.dumps(many_objects(work / "objects" / "raw", 20_000 // scale)))
    if "polygon" in args.only:
        figures["polygon"] = _child(CLEAN, json.dumps(long_polygon(work / "polygon" / "raw", 2_000_000 // scale)))
    out = RESULTS / ("smoke" if args.smoke else "") / f"boxes_memory{'_' + args.label if args.label else ''}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(figures, indent=1))
    for name, f in figures.items():
        print(name, json.dumps(f)[:600])
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
