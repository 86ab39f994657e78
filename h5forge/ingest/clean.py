"""Clean: decode raw files and bring them to the stored form, or reject them with a reason.

Rules (README "Cleaning rules"):
- colour: RGB kept; grey replicated to 3 channels; palette expanded; alpha composited over the
  field's fill value; 16-bit scaled linearly to 8 bits (v * 255 / 65535, rounded), never clipped
  or wrapped; CMYK/YCbCr converted by Pillow; float images rejected.
- geometry: smaller sides padded evenly with the fill value, the odd pixel going to the bottom /
  right; larger sides centre-cropped, or the picture shrunk keeping its aspect ratio then padded,
  or rejected, as the field's ``larger`` policy says. Never stretched.
- masks: single channel (3 equal channels accepted), values a subset of {0,1} or {0,255}, stored
  as {0,1}; same raw size as their image; cropped/shrunk/padded exactly like it (nearest, fill 0).
Every defect becomes a Rejection naming the file; no exception escapes ``clean_batch``.
"""

from __future__ import annotations

import hashlib
import io
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, UnidentifiedImageError

from h5forge.ingest.discover import Rejection, SampleRef
from h5forge.spec import DatasetSpec, ImageField, MaskField

Image.MAX_IMAGE_PIXELS = None  # our own per-field limit applies, checked before decoding


class Reject(Exception):
    """Raised inside cleaning; turned into a Rejection for the sample."""

    def __init__(self, path: str, reason: str):
        super().__init__(reason)
        self.path = path
        self.reason = reason


@dataclass
class CleanedBatch:
    """Cleaned samples of one batch, in input order, plus the rejections of that batch."""

    ids: list[str]
    splits: list[str]
    columns: list[dict]
    files: list[list[str]]  # per sample, raw file paths in field order
    arrays: dict[str, np.ndarray]  # field -> (n, C, H, W) uint8
    source_sha256: list[list[str]]  # per sample, hex digest per field
    checksums: list[str]  # sha256 of the stored bytes of every field of the sample
    histograms: dict[str, dict[str, np.ndarray]]  # image field -> split -> (C, 256) pixel counts
    rejections: list[Rejection]

    def __len__(self) -> int:
        return len(self.ids)

    def take(self, keep: list[int], extra_rejections: list[Rejection]) -> "CleanedBatch":
        """The samples at ``keep`` only (the rest are accounted for by ``extra_rejections``)."""
        arrays = {name: a[keep] for name, a in self.arrays.items()}
        splits = [self.splits[i] for i in keep]
        return CleanedBatch(
            ids=[self.ids[i] for i in keep], splits=splits, columns=[self.columns[i] for i in keep],
            files=[self.files[i] for i in keep], arrays=arrays,
            source_sha256=[self.source_sha256[i] for i in keep], checksums=[self.checksums[i] for i in keep],
            histograms={name: pixel_histograms(arrays[name], splits) for name in self.histograms},
            rejections=self.rejections + extra_rejections,
        )


# ---- decoding --------------------------------------------------------------------------------

def _open(data: bytes, path: str, max_pixels: int) -> Image.Image:
    if not data:
        raise Reject(path, "empty file (0 bytes)")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            img = Image.open(io.BytesIO(data))
            w, h = img.size
            if w * h > max_pixels:
                raise Reject(path, f"decompression bomb: header declares {w}x{h} = {w * h:,} pixels, "
                                   f"limit is {max_pixels:,} (max_pixels)")
            img.load()
    except Reject:
        raise
    except UnidentifiedImageError:
        raise Reject(path, "not an image Pillow can read (unknown or corrupt format)") from None
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError, EOFError) as err:
        raise Reject(path, f"corrupt or truncated image: {err}") from None
    return img


def _sixteen_to_eight(arr: np.ndarray, path: str) -> np.ndarray:
    if arr.min() < 0 or arr.max() > 65535:
        raise Reject(path, f"pixel values {arr.min()}..{arr.max()} exceed the 16-bit range")
    return ((arr.astype(np.uint32) * 255 + 32767) // 65535).astype(np.uint8)


def _composite(rgba: np.ndarray, fill: int) -> np.ndarray:
    alpha = rgba[..., 3:4].astype(np.uint32)
    rgb = rgba[..., :3].astype(np.uint32)
    return ((rgb * alpha + fill * (255 - alpha) + 127) // 255).astype(np.uint8)


def to_pixels(img: Image.Image, path: str, channels: int, fill: int) -> np.ndarray:
    """HWC uint8 with 3 channels (or HW1 for a grey field) by the rules in the module doc."""
    mode = img.mode
    if mode in ("I;16", "I;16B", "I;16L", "I;16N", "I"):
        grey = _sixteen_to_eight(np.asarray(img), path)
        rgb = np.repeat(grey[..., None], 3, axis=2)
    elif mode == "F":
        raise Reject(path, "floating-point image: convert it to 8 or 16 bits")
    elif mode in ("RGBA", "LA", "PA", "La", "RGBa") or (mode == "P" and "transparency" in img.info):
        rgb = _composite(np.asarray(img.convert("RGBA")), fill)
    elif mode == "RGB":
        rgb = np.asarray(img)
    elif mode == "L":
        rgb = np.repeat(np.asarray(img)[..., None], 3, axis=2)
    else:  # P, 1, CMYK, YCbCr, LAB, HSV
        rgb = np.asarray(img.convert("RGB"))
    if channels == 1:
        grey = np.asarray(Image.fromarray(rgb).convert("L"))  # ITU-R 601-2 luma
        return grey[..., None]
    return rgb


def mask_values(img: Image.Image, path: str) -> np.ndarray:
    """HW uint8 with values {0,1}."""
    mode = img.mode
    if mode == "1":
        return np.asarray(img, dtype=np.uint8)
    arr = np.asarray(img)
    if arr.ndim == 3:
        if mode in ("RGBA", "LA") and (arr[..., -1] != 255).any():
            raise Reject(path, "mask has transparency; masks must be a single opaque channel")
        colour = arr[..., :3] if arr.shape[2] >= 3 else arr[..., :1]
        if not (colour == colour[..., :1]).all():
            raise Reject(path, f"mask has {colour.shape[2]} different channels ({mode}); masks must be single-channel")
        arr = colour[..., 0]
    values = np.unique(arr) if arr.dtype != np.uint8 else np.flatnonzero(np.bincount(arr.ravel(), minlength=256))
    present = set(int(v) for v in values)
    if present <= {0, 1}:
        return arr.astype(np.uint8, copy=False)
    if present <= {0, 255}:
        return (arr == 255).astype(np.uint8)
    shown = sorted(present)[:8]
    raise Reject(path, f"mask values {shown}{'...' if len(present) > 8 else ''} not allowed: "
                       "a mask must hold {0,1} or {0,255}")


# ---- geometry --------------------------------------------------------------------------------

@dataclass(frozen=True)
class Geometry:
    """How a (h, w) picture becomes (th, tw): optional shrink, centre crop, even pad."""

    scaled: tuple[int, int] | None
    crop: tuple[int, int, int, int]  # top, left, height, width taken after scaling
    pad: tuple[int, int, int, int]  # top, bottom, left, right


def plan_geometry(h: int, w: int, th: int, tw: int, larger: str, path: str) -> Geometry:
    scaled = None
    if h > th or w > tw:
        if larger == "reject":
            raise Reject(path, f"image is {h}x{w} (HxW), larger than the target {th}x{tw} and the policy is 'reject'")
        if larger == "shrink":
            scale = min(th / h, tw / w)
            h, w = max(1, min(th, round(h * scale))), max(1, min(tw, round(w * scale)))
            scaled = (h, w)
    ch, cw = min(h, th), min(w, tw)
    top, left = (h - ch) // 2, (w - cw) // 2
    ph, pw = th - ch, tw - cw
    return Geometry(scaled, (top, left, ch, cw), (ph // 2, ph - ph // 2, pw // 2, pw - pw // 2))


def apply_geometry(arr: np.ndarray, g: Geometry, fill: int, nearest: bool) -> np.ndarray:
    """``arr`` is HWC; returns the target-size HWC array."""
    if g.scaled is not None:
        resample = Image.Resampling.NEAREST if nearest else Image.Resampling.LANCZOS
        squeezed = arr[..., 0] if arr.shape[2] == 1 else arr
        small = np.asarray(Image.fromarray(squeezed).resize((g.scaled[1], g.scaled[0]), resample))
        arr = small.reshape(g.scaled[0], g.scaled[1], arr.shape[2])
    top, left, ch, cw = g.crop
    arr = arr[top : top + ch, left : left + cw]
    pt, pb, pl, pr = g.pad
    if pt or pb or pl or pr:
        arr = np.pad(arr, ((pt, pb), (pl, pr), (0, 0)), constant_values=fill)
    return arr


# ---- one sample, one batch -------------------------------------------------------------------

def clean_sample(spec: DatasetSpec, root: Path, ref: SampleRef) -> tuple[dict[str, np.ndarray], list[str]]:
    """Stored arrays (CHW uint8) per field and the raw sha256 per field; raises Reject."""
    raw_size: dict[str, tuple[int, int]] = {}
    geometry: dict[str, Geometry] = {}
    out: dict[str, np.ndarray] = {}
    hashes: list[str] = []
    # image fields first: masks follow the geometry of their image
    order = sorted(spec.fields, key=lambda n: isinstance(spec.fields[n], MaskField))
    digests: dict[str, str] = {}
    for name in order:
        f = spec.fields[name]
        rel = ref.files[name]
        try:
            data = (root / rel).read_bytes()
        except OSError as err:
            raise Reject(rel, f"cannot read file: {err.strerror or err}") from None
        digests[name] = hashlib.sha256(data).hexdigest()
        img = _open(data, rel, f.max_pixels)
        if isinstance(f, ImageField):
            pixels = to_pixels(img, rel, f.channels, f.fill)
            h, w = pixels.shape[:2]
            raw_size[name] = (h, w)
            geometry[name] = plan_geometry(h, w, f.size[0], f.size[1], f.larger, rel)
            arr = apply_geometry(pixels, geometry[name], f.fill, nearest=False)
        else:
            assert isinstance(f, MaskField)
            values = mask_values(img, rel)
            if values.shape != raw_size[f.like]:
                ih, iw = raw_size[f.like]
                raise Reject(rel, f"mask is {values.shape[0]}x{values.shape[1]} (HxW) but its image "
                                  f"{ref.files[f.like]} is {ih}x{iw}")
            arr = apply_geometry(values[..., None], geometry[f.like], 0, nearest=True)
        out[name] = np.ascontiguousarray(arr.transpose(2, 0, 1))
    hashes = [digests[name] for name in spec.fields]
    return {name: out[name] for name in spec.fields}, hashes


def sample_checksum(arrays: dict[str, np.ndarray]) -> str:
    """sha256 over the stored bytes of every field, in field order."""
    h = hashlib.sha256()
    for arr in arrays.values():
        h.update(np.ascontiguousarray(arr).data)
    return h.hexdigest()


def pixel_histograms(images: np.ndarray, splits: list[str]) -> dict[str, np.ndarray]:
    """Per split, per channel counts of each 8-bit value: exact, and merged by adding.

    Mean and std per channel follow from them without a float pass over every pixel.
    """
    out: dict[str, np.ndarray] = {}
    labels = np.asarray(splits)
    for split in sorted(set(splits)):
        rows = images[labels == split]
        out[split] = np.stack([np.bincount(rows[:, c].ravel(), minlength=256) for c in range(images.shape[1])])
    return out


def clean_batch(spec: DatasetSpec, root: str | Path, refs: list[SampleRef]) -> CleanedBatch:
    """Clean ``refs`` in order; never raises for bad input."""
    root = Path(root)
    kept: list[tuple[SampleRef, dict[str, np.ndarray], list[str]]] = []
    rejections: list[Rejection] = []
    for ref in refs:
        try:
            arrays, hashes = clean_sample(spec, root, ref)
        except Reject as rej:
            rejections.append(Rejection(ref.id, rej.path, rej.reason, stage="clean"))
            continue
        except Exception as err:  # a defect no rule foresaw still must not kill the run
            rejections.append(Rejection(ref.id, ", ".join(ref.files.values()),
                                        f"unexpected {type(err).__name__}: {err}", stage="clean"))
            continue
        kept.append((ref, arrays, hashes))
    n = len(kept)
    arrays = {
        name: (np.stack([k[1][name] for k in kept]) if n else np.zeros((0, *spec.field_shape(name)), np.uint8))
        for name in spec.fields
    }
    splits = [k[0].split for k in kept]
    histograms = {
        name: pixel_histograms(arrays[name], splits)
        for name, f in spec.fields.items() if isinstance(f, ImageField)
    }
    return CleanedBatch(
        ids=[k[0].id for k in kept],
        splits=splits,
        columns=[k[0].columns for k in kept],
        files=[[k[0].files[name] for name in spec.fields] for k in kept],
        arrays=arrays,
        source_sha256=[k[2] for k in kept],
        checksums=[sample_checksum({name: arrays[name][i] for name in spec.fields}) for i in range(n)],
        histograms=histograms,
        rejections=rejections,
    )
