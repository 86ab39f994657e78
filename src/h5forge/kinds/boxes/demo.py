"""The ``boxes`` demo folder: pictures of simple objects and their boxes in a COCO instances file.

    ROOT/images/<prefix><nnnn>.png   ROOT/annotations/instances_default.json

Each picture holds 0-4 objects of three classes, some at the border so a centre crop clips them.
``bad=True`` adds a truncated PNG, an unlisted category and a box of negative width. Seeded.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np

CLASSES = ("square", "disc", "bar")
COCO_FILE = "annotations/instances_default.json"


def _scene(rng: np.random.Generator, h: int, w: int):
    from PIL import Image, ImageDraw

    pixels = rng.integers(40, 90, (h, w, 3), dtype=np.uint8)
    img = Image.fromarray(pixels)
    draw = ImageDraw.Draw(img)
    objects = []
    for _ in range(int(rng.integers(0, 5))):
        cls = int(rng.integers(0, len(CLASSES)))
        bw, bh = int(rng.integers(12, w // 2)), int(rng.integers(12, h // 2))
        if CLASSES[cls] == "bar":
            bh = max(6, bh // 3)
        x, y = int(rng.integers(-bw // 3, w - 2 * bw // 3)), int(rng.integers(-bh // 3, h - 2 * bh // 3))
        colour = tuple(int(c) for c in rng.integers(120, 256, 3))
        shape = draw.ellipse if CLASSES[cls] == "disc" else draw.rectangle
        shape([x, y, x + bw - 1, y + bh - 1], fill=colour)
        x0, y0, x1, y1 = max(x, 0), max(y, 0), min(x + bw, w), min(y + bh, h)
        objects.append((cls, [x0, y0, x1 - x0, y1 - y0]))
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue(), objects


def _annotation(ann_id: int, image_id: int, category_id: int, bbox: list[int]) -> dict:
    return {
        "id": ann_id,
        "image_id": image_id,
        "category_id": category_id,
        "bbox": bbox,
        "area": bbox[2] * bbox[3],
        "iscrowd": 0,
    }


def generate(root: str | Path, n: int = 60, seed: int = 0, bad: bool = True, prefix: str = "obj_") -> dict[str, str]:
    """Write the folder; returns {path: what is wrong} for the defects (``bad``)."""
    root = Path(root)
    (root / "images").mkdir(parents=True, exist_ok=True)
    (root / "annotations").mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    images: list[dict] = []
    annotations: list[dict] = []
    defects: dict[str, str] = {}
    for i in range(n + (3 if bad else 0)):
        name = f"{prefix}{i:04d}.png"
        h, w = int(rng.integers(96, 161)), int(rng.integers(96, 161))
        data, objects = _scene(rng, h, w)
        entry = {"id": i + 1, "file_name": name, "height": h, "width": w}
        boxes = [_annotation(len(annotations) + k + 1, i + 1, cls + 1, box) for k, (cls, box) in enumerate(objects)]
        if i >= n:  # the defects
            what = i - n
            if what == 0:
                data = data[: len(data) // 2]
                defects[f"images/{name}"] = "truncated PNG"
            elif what == 1:
                boxes.append(_annotation(len(annotations) + len(boxes) + 1, i + 1, 99, [4, 4, 10, 10]))
                defects[f"images/{name}"] = "an annotation of an unknown category"
            else:
                boxes.append(_annotation(len(annotations) + len(boxes) + 1, i + 1, 1, [20, 20, -8, 10]))
                defects[f"images/{name}"] = "a box of negative width"
        (root / "images" / name).write_bytes(data)
        images.append(entry)
        annotations += boxes
    categories = [{"id": k + 1, "name": c, "supercategory": "shape"} for k, c in enumerate(CLASSES)]
    coco = {
        "info": {"description": "h5forge boxes demo"},
        "images": images,
        "annotations": annotations,
        "categories": categories,
    }
    (root / COCO_FILE).write_text(json.dumps(coco, indent=1))
    return defects
