"""Raw folders in the layouts ``h5forge init`` knows, written sample by sample from packages' bundled
pictures (scikit-image's ``skimage.data``, scikit-learn's digits) with Pillow, and what each sample
must become in a version, decoded here with Pillow and the spec's pad/crop rule alone (none of
h5forge's cleaning code), for the lifecycle state machine (tests/pipeline/test_lifecycle.py)."""

from __future__ import annotations

import csv
import io
import json
import os
import struct
import zlib
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import numpy as np
from PIL import Image

CLASSES = ("3", "5", "8")  # the class folders every class layout starts with (init reads them once)
LABELS = ("round", "long")


@lru_cache(maxsize=None)
def _pictures() -> tuple[np.ndarray, ...]:
    from skimage import data

    return tuple(np.ascontiguousarray(p) for p in (data.astronaut(), data.coffee(), data.chelsea(), data.rocket()))


@lru_cache(maxsize=None)
def _grey() -> np.ndarray:
    from skimage import data

    return data.camera()


@lru_cache(maxsize=None)
def _digits() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits

    d = load_digits()
    return d.images, d.target


def _stamp(arr: np.ndarray, serial: int) -> np.ndarray:
    """The serial in the first pixels: every sample's raw content differs from every other's."""
    out = arr.copy()
    flat = out.reshape(-1)
    flat[:4] = np.frombuffer(serial.to_bytes(4, "little"), np.uint8)
    return out


def _png(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="PNG")
    return buf.getvalue()


# hostile inputs that are no file's bytes: what ``write_file`` makes at a picture's path instead
FIFO, DEV_ZERO, FOLDER = "fifo", "symlink to /dev/zero", "folder"
HOSTILE = (FIFO, DEV_ZERO, FOLDER, "png-bomb", "truncated")


@lru_cache(maxsize=None)
def png_bomb(side: int = 10_000) -> bytes:
    """A grey PNG of ``side`` x ``side`` (100 M pixels, over the default max_pixels) whose pixels,
    all zero, compress to about 100 kB: a few hundred bytes of header promise 100 MB decoded."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    deflate = zlib.compressobj(9)
    row = bytes(side + 1)  # filter byte 0, then the row
    idat = b"".join(deflate.compress(row) for _ in range(side)) + deflate.flush()
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", side, side, 8, 0, 0, 0, 0))
            + chunk(b"IDAT", idat) + chunk(b"IEND", b""))


def write_file(path: Path, data: bytes | str) -> None:
    """As a user's copy lands: a hidden temp name, then a rename (the watcher never sees half a file).
    ``data`` may name a hostile input that is no file (FIFO, DEV_ZERO, FOLDER): that is made instead."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(data, str):
        tmp = path.with_name(f".{path.name}.tmp")
        {FIFO: os.mkfifo, DEV_ZERO: lambda p: os.symlink("/dev/zero", p), FOLDER: os.mkdir}[data](tmp)
        os.replace(tmp, path)
        return
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def fit(arr: np.ndarray, th: int, tw: int, fill: int = 0, like: tuple[int, int] | None = None,
        k: int = 1) -> np.ndarray:
    """HWC -> CHW at (k th, k tw): larger sides centre-cropped, smaller padded evenly with ``fill``
    (the odd pixel at the bottom / right): the rule the spec states. ``like``: the (h, w) of the
    partner whose crop and pad, times ``k``, this picture follows (a super-resolution pair)."""
    h, w = like or arr.shape[:2]
    ch, cw = min(h, th), min(w, tw)
    top, left = (h - ch) // 2, (w - cw) // 2
    pt, pl = (th - ch) // 2, (tw - cw) // 2
    out = np.full((arr.shape[2], k * th, k * tw), fill, arr.dtype)
    out[:, k * pt:k * (pt + ch), k * pl:k * (pl + cw)] = \
        arr[k * top:k * (top + ch), k * left:k * (left + cw)].transpose(2, 0, 1)
    return out


def decode_rgb(data: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


def decode_grey(data: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(data)).convert("L"))[..., None]


@dataclass
class Sample:
    """A sample as the user gave it: its files (relative to the folder holding it), its record."""

    sid: str
    files: dict[str, str]  # field -> path relative to its root
    data: dict[str, bytes]  # field -> the file's bytes
    columns: dict[str, object] = field(default_factory=dict)
    split: str | None = None  # from the folders, when the layout says so


@dataclass(frozen=True)
class Draw:
    """What hypothesis chose for one sample: a picture, a place in it, a size, a class."""

    serial: int
    picture: int
    y: int
    x: int
    h: int
    w: int
    label: int
    count: int
    split: int = 0


class Layout:
    """One layout ``init`` knows; subclasses write samples and say what they must become."""

    name = ""
    annotation: str | None = None  # the annotation file's name in the raw folder (and the inbox)
    id_key = "id"

    def sample(self, d: Draw) -> Sample:
        raise NotImplementedError

    def defective(self, d: Draw, how: str) -> Sample:
        """A sample with one file that must be rejected (``how``: corrupt, empty, a hostile input or
        a layout's own)."""
        s = self.bad(d)
        first = next(iter(s.files))
        if how in (FIFO, DEV_ZERO, FOLDER):
            s.data[first] = how
        elif how == "png-bomb":
            s.data[first] = png_bomb()
        elif how == "truncated":  # a real picture cut in its pixel data
            s.data[first] = s.data[first][: len(s.data[first]) // 2]
        else:
            s.data[first] = b"" if how == "empty" else _png(np.zeros((8, 8, 3), np.uint8))[:40]
        return s

    def defects(self) -> tuple[str, ...]:
        return ("corrupt", "empty", *HOSTILE)

    def bad(self, d: Draw) -> Sample:
        """A good sample of this draw under a name that says it is a defect's."""
        s = self.sample(d)
        return self.renamed(s, s.sid.rsplit("/", 1)[0] + f"/bad{d.serial:05d}" if "/" in s.sid
                            else f"bad{d.serial:05d}")

    def renamed(self, s: Sample, new_id: str) -> Sample:
        raise NotImplementedError

    def expected(self, s: Sample, spec) -> dict[str, np.ndarray]:
        raise NotImplementedError

    def columns_expected(self, s: Sample, spec) -> dict[str, object]:
        return dict(s.columns)

    # ---- files
    def write(self, root: Path, s: Sample) -> None:
        for f, rel in s.files.items():
            write_file(root / rel, s.data[f])
        if self.annotation:
            records = read_records(root / self.annotation)
            records.append(self.record(s))
            write_records(root / self.annotation, records)

    def remove(self, root: Path, s: Sample) -> None:
        for rel in s.files.values():
            (root / rel).unlink()
        if self.annotation:
            records = [r for r in read_records(root / self.annotation) if not self._is(r, s)]
            write_records(root / self.annotation, records)

    def record(self, s: Sample) -> dict:
        key = s.sid if self.id_key == "id" else Path(next(iter(s.files.values()))).name
        return {self.id_key: key, **{k: v for k, v in s.columns.items()}}

    def _is(self, rec: dict, s: Sample) -> bool:
        return str(rec.get(self.id_key)) == str(self.record(s)[self.id_key])

    def edit(self, root: Path, s: Sample, columns: dict) -> None:
        records = read_records(root / self.annotation)
        for r in records:
            if self._is(r, s):
                r.update(columns)
        write_records(root / self.annotation, records)
        s.columns.update(columns)


def read_records(path: Path) -> list[dict]:
    if not path.exists():
        return []
    if path.suffix == ".csv":
        with path.open(newline="", encoding="utf-8") as fh:
            return [dict(r) for r in csv.DictReader(fh)]
    if path.suffix == ".jsonl":
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return json.loads(path.read_text())


def write_records(path: Path, records: list[dict]) -> None:
    if not records:
        path.unlink(missing_ok=True)
        return
    if path.suffix == ".csv":
        buf = io.StringIO(newline="")
        w = csv.DictWriter(buf, fieldnames=list(dict.fromkeys(k for r in records for k in r)))
        w.writeheader()
        w.writerows(records)
        data = buf.getvalue().encode()
    elif path.suffix == ".jsonl":
        data = "".join(json.dumps(r) + "\n" for r in records).encode()
    else:
        data = json.dumps(records, indent=1).encode()
    write_file(path, data)


def mask_pad(field) -> int:
    """Where a mask is padded (docs/spec.md): its pad_value, else its ignore_value, else 255 (no class)."""
    return next((v for v in (field.pad_value, field.ignore_value) if v is not None), 255)


class Segment(Layout):
    """``images/`` + ``masks/`` + an annotation file (JSON, JSON Lines or CSV; keyed by id or file)."""

    def __init__(self, fmt: str, id_key: str):
        self.fmt, self.id_key = fmt, id_key
        self.annotation = f"annotations.{fmt}"
        self.name = f"segment-{fmt}-{id_key}"

    def sample(self, d: Draw) -> Sample:
        pic = _pictures()[d.picture % len(_pictures())]
        y, x = d.y % (pic.shape[0] - d.h), d.x % (pic.shape[1] - d.w)
        img = _stamp(pic[y:y + d.h, x:x + d.w, :3], d.serial)
        grey = _grey()[y % (512 - d.h):y % (512 - d.h) + d.h, x % (512 - d.w):x % (512 - d.w) + d.w]
        mask = np.where(grey > 110, 255, 0).astype(np.uint8)
        sid = f"s{d.serial:05d}"
        return Sample(sid, {"images": f"images/{sid}.png", "masks": f"masks/{sid}.png"},
                      {"images": _png(img), "masks": _png(mask)},
                      {"label": LABELS[d.label % 2], "count": d.count})

    def defects(self) -> tuple[str, ...]:
        return (*super().defects(), "mask-size")

    def defective(self, d: Draw, how: str) -> Sample:
        if how != "mask-size":
            return super().defective(d, how)
        s = self.bad(d)
        s.data["masks"] = _png(np.zeros((d.h + 3, d.w, 1), np.uint8)[..., 0])
        return s

    def renamed(self, s: Sample, new_id: str) -> Sample:
        return Sample(new_id, {"images": f"images/{new_id}.png", "masks": f"masks/{new_id}.png"}, dict(s.data),
                      dict(s.columns))

    def expected(self, s: Sample, spec) -> dict[str, np.ndarray]:
        th, tw = spec.fields["images"].size
        fill = spec.fields["images"].fill
        mask = decode_grey(s.data["masks"])
        return {"images": fit(decode_rgb(s.data["images"]), th, tw, fill),
                "masks": fit((mask > 0).astype(np.uint8), th, tw, mask_pad(spec.fields["masks"]))}


class Classes(Layout):
    """``<class>/*.png`` (or ``<split>/<class>/*.png``): ids are paths, the label is the folder."""

    def __init__(self, splits: bool):
        self.splits = splits
        self.name = "classes-split" if splits else "classes"

    def sample(self, d: Draw) -> Sample:
        images, _ = _digits()
        k = 1 + d.h % 4  # 8x8 digits enlarged 1..4 times: all within the 32x32 target, padded
        arr = np.kron(images[d.serial % len(images)] * 15, np.ones((k, k))).astype(np.uint8)
        cls = CLASSES[d.label % len(CLASSES)]
        split = ("train", "val", "test")[d.split % 3] if self.splits else None
        folder = f"{split}/{cls}" if split else cls
        sid = f"{folder}/d{d.serial:05d}"
        return Sample(sid, {"images": f"{sid}.png"}, {"images": _png(_stamp(arr, d.serial))}, {"label": cls}, split)

    def renamed(self, s: Sample, new_id: str) -> Sample:
        return Sample(new_id, {"images": f"{new_id}.png"}, dict(s.data), dict(s.columns), s.split)

    def expected(self, s: Sample, spec) -> dict[str, np.ndarray]:
        th, tw = spec.fields["images"].size
        classes = list(spec.fields["label"].classes)
        return {"images": fit(decode_grey(s.data["images"]), th, tw, spec.fields["images"].fill),
                "label": np.int64(classes.index(s.columns["label"]))}

    def columns_expected(self, s: Sample, spec) -> dict[str, object]:
        return {"label": s.columns["label"], **({"split": s.split} if self.splits else {})}


class Pairs(Layout):
    """Super-resolution pairs ``lr/`` + ``hr/`` (HR twice the LR's size)."""

    name = "sr-pairs"

    def sample(self, d: Draw) -> Sample:
        pic = _pictures()[d.picture % len(_pictures())]
        h, w = 24 + d.h % 17, 24 + d.w % 17  # around the 32x32 LR target: some padded, some cropped
        y, x = d.y % (pic.shape[0] - 2 * h), d.x % (pic.shape[1] - 2 * w)
        hr = _stamp(pic[y:y + 2 * h, x:x + 2 * w, :3], d.serial)
        lr = np.asarray(Image.fromarray(hr).resize((w, h), Image.Resampling.BICUBIC))
        sid = f"p{d.serial:05d}"
        return Sample(sid, {"low_res": f"lr/{sid}.png", "high_res": f"hr/{sid}.png"},
                      {"low_res": _png(lr), "high_res": _png(hr)})

    def defects(self) -> tuple[str, ...]:
        return (*super().defects(), "wrong-scale")

    def defective(self, d: Draw, how: str) -> Sample:
        if how != "wrong-scale":
            return super().defective(d, how)
        s = self.bad(d)
        lr = decode_rgb(s.data["low_res"])
        s.data["high_res"] = _png(np.asarray(Image.fromarray(lr).resize((3 * lr.shape[1], 3 * lr.shape[0]))))
        return s

    def renamed(self, s: Sample, new_id: str) -> Sample:
        return Sample(new_id, {"low_res": f"lr/{new_id}.png", "high_res": f"hr/{new_id}.png"}, dict(s.data))

    def expected(self, s: Sample, spec) -> dict[str, np.ndarray]:
        th, tw = spec.fields["low_res"].size
        k = spec.fields["high_res"].scale
        fill = spec.fields["low_res"].fill
        lr = decode_rgb(s.data["low_res"])
        return {"low_res": fit(lr, th, tw, fill),
                "high_res": fit(decode_rgb(s.data["high_res"]), th, tw, fill, like=lr.shape[:2], k=k)}


LAYOUTS = {layout.name: layout for layout in (
    Segment("json", "id"), Segment("jsonl", "id"), Segment("csv", "file"), Segment("csv", "id"),
    Segment("json", "file"), Classes(False), Classes(True), Pairs())}
