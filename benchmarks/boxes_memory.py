"""Peak memory of the ``boxes`` kind on a large COCO file (a cleaning worker) and on hostile ones
(20,000 objects on a picture, a polygon of 2 x 10^6 vertices), each case in a fresh process. Method:
benchmarks/README.md, "boxes_memory".
"""

import json
import shutil
import sys
from pathlib import Path

# The module imports only the standard library at the top: each case's child process imports it, and
# its peak is what the case costs.


def peaks() -> dict:
    """The process's own peak (VmHWM); ``ru_maxrss`` beside it (after a fork it may count the parent's pages)."""
    import resource

    with open("/proc/self/status") as fh:
        hwm = next(int(line.split()[1]) * 1024 for line in fh if line.startswith("VmHWM:"))
    return {"vm_hwm": hwm, "ru_maxrss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}


def child(step: str, spec_json: str, refs: str | None = None) -> dict:
    """``discover``: the build's process, pickling the samples it found to ``refs``; ``clean``: a cleaning
    worker given those samples, or (without ``refs``) discovery and cleaning in one process."""
    import pickle

    from h5forge._ingest.clean import clean_batch
    from h5forge._ingest.discover import discover
    from h5forge.spec import parse_spec

    data = json.loads(spec_json)
    spec = parse_spec(data, Path(data["source"]["root"]))
    if step == "discover":
        inv = discover(spec)
        Path(refs).write_bytes(pickle.dumps((inv.root, inv.samples)))
        return {"samples": len(inv.samples), "payload": len(pickle.dumps(inv.samples)), **peaks()}
    if refs:
        (root, samples), rejected = pickle.loads(Path(refs).read_bytes()), []
    else:
        inv = discover(spec)
        root, samples, rejected = inv.root, inv.samples, inv.rejections
    batch = clean_batch(spec, root, samples, encode=False)
    return {
        "taken": len(batch.ids),
        "rejected": [[r.sample_id, r.reason[:160]] for r in [*rejected, *batch.rejections]],
        **peaks(),
    }


def in_child(*args: str) -> dict:
    from benchmarks.common import child_json

    try:
        return child_json("boxes_memory", "--child", *args)
    except RuntimeError as e:
        return {"error": str(e).strip().splitlines()[-1]}


def png(path: Path, h: int, w: int) -> None:
    import numpy as np
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (h, w, 3), dtype=np.uint8)).save(path)


def coco_spec(root: Path, images: list[dict], annotations, masks: bool) -> str:
    """The COCO file, written a piece at a time (the generator never holds it whole), and its spec as JSON."""
    with open(root / "instances.json", "w") as fh:
        fh.write('{"categories": [{"id": 1, "name": "thing"}], "images": ' + json.dumps(images) + ', "annotations": [')
        for i, a in enumerate(annotations):
            fh.write(("," if i else "") + json.dumps(a))
        fh.write("]}")
    boxes = {"kind": "boxes", "like": "images", "coco": "instances.json", "classes": ["thing"], "masks": masks}
    return json.dumps(
        {
            "name": "boxes-memory",
            "source": {"root": str(root)},
            "output": {"dir": str(root.parent / "out")},
            "fields": {"images": {"kind": "image", "files": "images/*.png", "size": [128, 128]}, "boxes": boxes},
        }
    )


def large_file(root: Path, n_annotations: int, n_pictures: int, on_disk: int = 40) -> str:
    for i in range(on_disk):
        png(root / "images" / f"p{i:06d}.png", 64, 64)
    images = [{"id": i + 1, "file_name": f"p{i:06d}.png", "height": 64, "width": 64} for i in range(n_pictures)]
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
    return coco_spec(root, images, boxes, masks=False)


def beside_a_good_picture(root: Path, bad: list[dict], good: dict) -> str:
    """A good picture with one box (``good``: more of its annotation), and a bad one with the ``bad`` annotations."""
    for name in ("good", "bad"):
        png(root / "images" / f"{name}.png", 128, 128)
    images = [
        {"id": i, "file_name": f"{name}.png", "height": 128, "width": 128} for i, name in ((1, "good"), (2, "bad"))
    ]
    good = {"id": 1, "image_id": 1, "category_id": 1, "bbox": [10, 10, 20, 20], "iscrowd": 0, **good}
    return coco_spec(
        root,
        images,
        [good, *({"id": k + 2, "image_id": 2, "category_id": 1, "iscrowd": 0, **a} for k, a in enumerate(bad))],
        masks=True,
    )


def many_objects(root: Path, n: int) -> str:
    return beside_a_good_picture(root, [{"bbox": [k % 100, k % 90, 20, 30]} for k in range(n)], {})


def long_polygon(root: Path, n: int) -> str:
    zigzag = [v for k in range(n) for v in (k % 127, 0 if k % 2 else 127)]
    return beside_a_good_picture(
        root, [{"bbox": [0, 0, 127, 127], "segmentation": [zigzag]}], {"segmentation": [[10, 10, 30, 10, 30, 30]]}
    )


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        return print(json.dumps(child(*sys.argv[2:])))
    from benchmarks.common import CACHE, RESULTS, cli

    # --label names the results file (before, after: the command run in two trees)
    args = cli(
        __doc__,
        dict(annotations=10_000, pictures=200, objects=200, vertices=20_000),
        annotations=1_000_000,
        pictures=20_000,
        objects=20_000,
        vertices=2_000_000,
        only="worker,objects,polygon",
        label="",
    )
    work, figures, only = CACHE / "boxes_memory", {}, args.only.split(",")
    shutil.rmtree(work, ignore_errors=True)
    if "worker" in only:
        spec = large_file(work / "large" / "raw", args.annotations, args.pictures)
        figures["worker"] = {
            "coco_bytes": (work / "large" / "raw" / "instances.json").stat().st_size,
            "parent": in_child("discover", spec, str(work / "refs.pkl")),
            "worker": in_child("clean", spec, str(work / "refs.pkl")),
        }
    if "objects" in only:
        figures["objects"] = in_child("clean", many_objects(work / "objects" / "raw", args.objects))
    if "polygon" in only:
        figures["polygon"] = in_child("clean", long_polygon(work / "polygon" / "raw", args.vertices))
    out = RESULTS / ("smoke" if args.smoke else "") / f"boxes_memory{'_' + args.label if args.label else ''}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps({"command": " ".join(["python -m benchmarks.boxes_memory", *sys.argv[1:]]), **figures}, indent=1)
    )
    for name, f in figures.items():
        print(name, json.dumps(f)[:600])
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
