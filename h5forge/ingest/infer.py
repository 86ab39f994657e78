"""``h5forge init``: a commented spec inferred from a raw folder."""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from pathlib import Path

from PIL import Image

from h5forge.errors import UsageError
from h5forge.spec import parse_spec

_PICTURES = (".png", ".jpg", ".jpeg", ".tif", ".tiff", ".bmp")
_ID_KEYS = ("id", "sample_id", "name", "file", "filename", "file_name", "image")


def _picture_folder(raw: Path, names: tuple[str, ...]) -> tuple[str, str] | None:
    for name in names:
        d = raw / name
        if d.is_dir():
            exts = Counter(p.suffix.lower() for p in d.iterdir() if p.suffix.lower() in _PICTURES)
            if exts:
                return name, exts.most_common(1)[0][0]
    return None


def _round_up(v: int, to: int = 32) -> int:
    return -(-v // to) * to


def _columns(records: list[dict], id_key: str) -> dict[str, str]:
    kinds: dict[str, str] = {}
    for key in sorted({k for r in records for k in r} - {id_key}):
        values = [r[key] for r in records if key in r and r[key] is not None]
        if not values or any(isinstance(v, (list, dict)) for v in values):
            continue
        if all(isinstance(v, bool) for v in values):
            kinds[key] = "bool"
        elif all(isinstance(v, int) and not isinstance(v, bool) for v in values):
            kinds[key] = "int"
        elif all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            kinds[key] = "float"
        else:
            kinds[key] = "str"
    return kinds


def infer_spec(raw: Path, spec_path: Path) -> str:
    """YAML text of a spec for ``raw``; paths in it are relative to ``spec_path``'s folder."""
    raw = raw.resolve()
    if not raw.is_dir():
        raise UsageError(f"{raw} is not a folder")
    images = _picture_folder(raw, ("images", "imgs", "image", "img"))
    if images is None:
        raise UsageError(f"no images/ folder with pictures under {raw}")
    masks = _picture_folder(raw, ("masks", "mask", "labels", "annotations_masks"))
    sample = sorted((raw / images[0]).glob(f"*{images[1]}"))[:200]
    sizes, modes = [], Counter()
    for p in sample:
        try:
            with Image.open(p) as im:
                if im.size[0] * im.size[1] <= 64_000_000:  # bombs and corrupt headers say nothing
                    sizes.append(im.size)
                    modes[im.mode] += 1
        except (OSError, SyntaxError, ValueError, Image.DecompressionBombError):  # unreadable: says nothing
            continue
    if not sizes:
        raise UsageError(f"no readable picture in {raw / images[0]}")
    # the 95th percentile, so a few outsized pictures are cropped rather than padding everything
    ordered_h, ordered_w = sorted(h for _, h in sizes), sorted(w for w, _ in sizes)
    height = _round_up(ordered_h[int(0.95 * (len(sizes) - 1))])
    width = _round_up(ordered_w[int(0.95 * (len(sizes) - 1))])
    grey = all(m in ("L", "I;16", "I", "1") for m in modes)
    ann_file = next((p for p in sorted(raw.glob("*.json")) if "annotation" in p.name.lower()), None)
    ann_file = ann_file or next(iter(sorted(raw.glob("*.json"))), None)
    stems = {p.stem for p in sample}
    id_key, columns, index_by = "id", {}, []
    if ann_file is not None:
        try:
            data = json.loads(ann_file.read_text())
        except json.JSONDecodeError as e:
            raise UsageError(f"{ann_file} is not valid JSON: {e}") from None
        records = data["samples"] if isinstance(data, dict) and "samples" in data else data
        if not isinstance(records, list) or not records or not isinstance(records[0], dict):
            raise UsageError(f"{ann_file} must hold a JSON list of records")
        id_key = max(_ID_KEYS, key=lambda k: sum(Path(str(r.get(k, ""))).stem in stems for r in records[:500]))
        columns = _columns(records, id_key)
        for col, kind in columns.items():
            distinct = {r.get(col) for r in records}
            if kind in ("str", "bool", "int") and 1 < len(distinct) <= 50:
                index_by.append(col)
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", raw.name).strip("-.") or "dataset"
    rel_root = os.path.relpath(raw, spec_path.parent.resolve())
    out_dir = os.path.relpath(Path.cwd() / "data" / name, spec_path.parent.resolve())
    lines = [
        f"# h5forge spec inferred by `h5forge init` from {raw}",
        "# Relative paths are resolved against this file's folder. Review, then `h5forge build` it.",
        f"name: {name}",
        "description: ''",
        "source:",
        f"  root: {rel_root}",
        "fields:",
        "  images:",
        "    kind: image",
        f"    files: {images[0]}/*{images[1]}",
        f"    size: [{height}, {width}]   # (height, width): 95th percentile of {len(sizes)} sampled, rounded up to 32;",
        "                          # smaller pictures are padded evenly, never stretched",
        f"    channels: {1 if grey else 3}             # sampled modes: {dict(modes)}",
        "    larger: crop           # for bigger pictures: crop (centre) | shrink (keep aspect, pad) | reject",
        "    fill: 0                # padding value",
    ]
    if masks:
        lines += [
            "  masks:",
            "    kind: mask             # single channel, values {0,1} or {0,255}; stored as {0,1}",
            f"    files: {masks[0]}/*{masks[1]}",
            "    like: images           # must have its image's size; padded/cropped the same way",
        ]
    if ann_file is not None:
        cols = ", ".join(f"{k}: {v}" for k, v in columns.items())
        lines += [
            "annotations:",
            f"  file: {ann_file.relative_to(raw).as_posix()}",
            f"  id_key: {id_key}             # record key naming the sample (an id or a file name)",
            f"  columns: {{{cols}}}",
            f"  index_by: [{', '.join(index_by)}]   # columns to precompute row-index arrays for",
            "  required: true            # a sample without a record is quarantined",
        ]
    lines += [
        "splits:",
        "  ratios: {train: 0.8, val: 0.1, test: 0.1}   # stable: a sample's split depends on its id only",
        "storage:",
        "  codec: lz4               # lz4 (fast) | zstd-1 (smaller) | gzip-1 (portable) | none ... (README: codec choice)",
        "  chunk_rows: 1            # samples per HDF5 chunk",
        "output:",
        f"  dir: {out_dir}",
        "  keep: 5                  # published versions kept",
        "compute:",
        "  workers: 2               # LocalCluster processes; or dask_address: tcp://host:8786",
    ]
    text = "\n".join(lines) + "\n"
    import yaml

    parse_spec(yaml.safe_load(text), spec_path.parent.resolve(), str(spec_path))  # must be valid
    return text
