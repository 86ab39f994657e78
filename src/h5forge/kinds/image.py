"""``kind: image``: an RGB (or grey) picture, stored uint8 CHW at a fixed size.

Cleaning rules (docs/spec.md, "Cleaning rules"): colour made RGB (grey replicated, alpha composited
over ``fill``, 16-bit scaled to 8 bits, never clipped; float rejected; ``channels: 1`` is ITU-R 601
luma); smaller sides padded evenly, the odd pixel bottom / right, larger ones handled by ``larger``
(crop, shrink keeping the aspect ratio, reject), never stretched. Statistics: exact per-channel
histograms per split (``h5forge.kinds._pictures``).
"""

from __future__ import annotations

import io
import struct
import threading
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import Field, field_validator

from h5forge.kinds.base import DEFAULT_MAX_BYTES, Decoded, FieldKind, FieldModel, Globs, Stored, read_source
from h5forge.kinds._pictures import Pictures
from h5forge.kinds.plugins import Demo, Detector, Plugins
from h5forge._samples import Reject, SampleRef

DEFAULT_MAX_DECODED = 256 << 20  # bytes of a decoded picture (Pillow keeps RGB as 4 bytes a pixel)
REDUCE_ABOVE = 4  # a picture this many times larger than its target is reduced while decoding


class ImageField(FieldModel):
    """An RGB (or grey) picture, stored uint8 CHW at a fixed size."""

    kind: Literal["image"] = "image"
    files: Globs = Field(description="glob(s) relative to source.root, e.g. images/*.png")
    id_suffix: str | None = Field(
        None, min_length=1, description="an end of the file stems not part of the id (x4: 0001x4.png is 0001)"
    )
    size: tuple[int, int] = Field(description="target (height, width)")
    channels: Literal[1, 3] = 3
    larger: Literal["crop", "shrink", "reject"] = "crop"
    fill: int = Field(0, ge=0, le=255)
    max_pixels: int = Field(64_000_000, gt=0, description="larger headers are decompression bombs")
    max_decoded_bytes: int = Field(DEFAULT_MAX_DECODED, gt=0, description="a picture larger decoded is rejected")
    max_bytes: int = Field(DEFAULT_MAX_BYTES, gt=0, description="a file larger than this is rejected unread")

    @field_validator("size")
    @classmethod
    def _positive(cls, v: tuple[int, int]) -> tuple[int, int]:
        if v[0] <= 0 or v[1] <= 0:
            raise ValueError("size must be two positive integers (height, width)")
        return v


# ---- decoding (Pillow and the faster decoders are imported here only, so readers never load them) ---

_PILLOW_LIMIT = threading.Lock()


def _open_unchecked(data: bytes):
    """Image.open without Pillow's own size guard, which would answer before ``max_pixels`` does
    (put back at once)."""
    from PIL import Image

    with _PILLOW_LIMIT:
        saved, Image.MAX_IMAGE_PIXELS = Image.MAX_IMAGE_PIXELS, None
        try:
            return Image.open(io.BytesIO(data))
        finally:
            Image.MAX_IMAGE_PIXELS = saved


def decoded_bytes(img) -> int:
    """Memory Pillow takes for the decoded picture: 1, 2 or 4 bytes a pixel by mode (RGB is 4)."""
    w, h = img.size
    per_pixel = 1 if img.mode in ("1", "L", "P") else 2 if img.mode.startswith("I;16") else 4
    return w * h * per_pixel


def decode_picture(
    data: bytes,
    path: str,
    max_pixels: int,
    max_decoded: int = DEFAULT_MAX_DECODED,
    draft_to: tuple[int, int] | None = None,
):
    """The picture decoded and upright: a Pillow image, or the HW / HWC uint8 array a faster decoder
    gave with Pillow's values (``_fast_pixels``; its mode: ``mode_of``). The header is checked first:
    a bomb, an empty, truncated or unknown file rejects the sample. ``draft_to`` (width, height): a
    JPEG is decoded at the smallest 1/2, 1/4 or 1/8 scale at least that large."""
    from PIL import Image, UnidentifiedImageError

    if not data:
        raise Reject(path, "empty file (0 bytes)")
    if (damaged := _damaged_png_chunk(data)) is not None:
        raise Reject(path, f"corrupt PNG: its {damaged} chunk's checksum does not match its data (a damaged file)")
    if (plain := plain_png(data)) is not None:
        _check_size(plain, path, max_pixels, max_decoded)
        if (pixels := _fast_pixels(data, plain, max_decoded)) is not None:
            return pixels
    try:
        img = _open_unchecked(data)
        _check_size(img, path, max_pixels, max_decoded)  # from the header: nothing is decoded yet
        if draft_to is not None and img.format == "JPEG" and img.draft(img.mode, draft_to):
            img.load()  # decoded at a reduced scale, which only Pillow does here
        elif (pixels := _fast_pixels(data, img, max_decoded)) is None:
            img.load()
        elif Image.Image.getexif(img).get(0x0112, 1) in (0, 1):
            # Image's own getexif reads the header's EXIF and XMP; a PNG file's would decode the pixels
            # to look for chunks after them, and a PNG _fast_pixels takes has none
            return pixels
        else:
            header, img = img, Image.fromarray(pixels)
            img.info = header.info  # the EXIF orientation _upright applies
        img = _upright(img)
    except Reject:
        raise
    except UnidentifiedImageError:
        raise Reject(path, "not an image Pillow can read (unknown or corrupt format)") from None
    except (OSError, SyntaxError, ValueError, EOFError) as err:
        raise Reject(path, f"corrupt or truncated image: {err}") from None
    return img


def _check_size(img, path: str, max_pixels: int, max_decoded: int) -> None:
    """A picture whose header declares more pixels or decoded bytes than the limits rejects the sample."""
    w, h = img.size
    if w * h > max_pixels:
        raise Reject(
            path,
            f"decompression bomb: header declares {w}x{h} = {w * h:,} pixels, limit is {max_pixels:,} (max_pixels)",
        )
    if decoded_bytes(img) > max_decoded:
        raise Reject(
            path,
            f"too large to decode: {w}x{h} {img.mode} takes {decoded_bytes(img):,} bytes "
            f"decoded, limit is {max_decoded:,} (max_decoded_bytes)",
        )


@dataclass(frozen=True)
class PngHeader:
    """What Pillow's ``Image.open`` tells of a plain PNG (``plain_png``), read from its chunks alone."""

    width: int
    height: int
    mode: str
    format: str = "PNG"

    @property
    def size(self) -> tuple[int, int]:
        return self.width, self.height

    def getbands(self) -> tuple[str, ...]:
        return tuple(self.mode)


# Chunks before the pixels that change neither the values Pillow decodes nor their orientation, with
# the shortest body Pillow's open reads without an error; any other leaves the header to Pillow.
_PLAIN_CHUNKS = {b"pHYs": 9, b"sRGB": 1, b"gAMA": 4, b"cHRM": 32, b"bKGD": 0, b"sBIT": 0, b"tIME": 0}
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def plain_png(data: bytes) -> PngHeader | None:
    """The header of an 8-bit grey, RGB or RGBA PNG whose chunks before its pixels are all plain ones
    with right CRCs (what Pillow's open checks); None for any other file, which Pillow then opens."""
    if not data.startswith(_PNG_SIGNATURE):
        return None
    at, header = 8, None
    while at + 12 <= len(data):
        length, kind = struct.unpack_from(">I4s", data, at)
        if kind == b"IDAT":
            return header
        body = data[at + 8 : at + 8 + length]
        if len(body) != length or at + 12 + length > len(data):
            return None
        if zlib.crc32(kind + body) != struct.unpack_from(">I", data, at + 8 + length)[0]:
            return None
        if kind == b"IHDR" and header is None and at == 8 and length == 13:
            w, h, depth, colour = struct.unpack_from(">IIBB", body)
            if not (w and h and (mode := SPNG_MODES.get((depth, colour)))):
                return None
            header = PngHeader(w, h, mode)
        elif header is None or length < _PLAIN_CHUNKS.get(kind, length + 1):
            return None
        at += 12 + length
    return None


def mode_of(pic) -> str:
    """A picture's Pillow mode; a decoded array's as Image.fromarray reads its shape (HW: L, HWC: RGB, RGBA)."""
    if isinstance(pic, np.ndarray):
        return "L" if pic.ndim == 2 else "RGBA" if pic.shape[2] == 4 else "RGB"
    return pic.mode


def size_of(pic) -> tuple[int, int]:
    """A picture's (width, height), as Pillow gives it."""
    return (pic.shape[1], pic.shape[0]) if isinstance(pic, np.ndarray) else pic.size


# A PNG's IHDR (bit depth, colour type) -> the mode Pillow decodes it to, for the kinds libspng decodes to
# Pillow's own values (tests/kinds/test_fast_decode.py); palette, 1-4 and 16-bit, grey+alpha stay on Pillow.
SPNG_MODES = {(8, 0): "L", (8, 2): "RGB", (8, 6): "RGBA"}


def _fast_pixels(data: bytes, img, max_decoded: int) -> np.ndarray | None:
    """The pixels of an 8-bit grey, RGB or RGBA PNG from libspng, or of a grey or RGB JPEG from
    simplejpeg, both faster than Pillow at the same values (docs/spec.md, "Decoders"). None leaves
    the picture to Pillow, whose verdict then counts: another format or mode, chunks after the
    pixels, a picture too large to hold twice, a file the faster decoder refuses."""
    if 2 * decoded_bytes(img) > max_decoded:  # an array turned upright or made a Pillow image is held twice
        return None
    png = img.format == "PNG" and SPNG_MODES.get((data[24], data[25])) == img.mode and _pixels_last(data)
    if not png and not (img.format == "JPEG" and img.mode in ("L", "RGB")):
        return None
    try:
        if png:
            from imagecodecs import spng_decode

            pixels = spng_decode(data)
        else:
            from simplejpeg import decode_jpeg

            pixels = decode_jpeg(data, "RGB") if img.mode == "RGB" else decode_jpeg(data, "GRAY")[..., 0]
    except (RuntimeError, ValueError):
        return None
    return pixels if np.atleast_3d(pixels).shape == (img.height, img.width, len(img.getbands())) else None


def _damaged_png_chunk(data: bytes) -> str | None:
    """The name of a PNG's first pixel-data chunk (IDAT) whose CRC does not match, else None (and
    for any other file). Pillow reads no IDAT's CRC, and both it and libspng stop once they have
    every row, before the last IDAT's CRC and the stream's Adler-32: a bit flipped in the last rows
    decodes, without an error, to other values."""
    if not data.startswith(_PNG_SIGNATURE):
        return None
    at = 8
    while at + 12 <= len(data):
        length, kind = struct.unpack_from(">I4s", data, at)
        if at + 12 + length > len(data):
            return None  # cut short: the decoder says so
        if (
            kind == b"IDAT"
            and zlib.crc32(data[at + 4 : at + 8 + length]) != struct.unpack_from(">I", data, at + 8 + length)[0]
        ):
            return "IDAT"
        if kind == b"IEND":
            return None
        at += 12 + length
    return None


def _pixels_last(png: bytes) -> bool:
    """Whether only IDAT chunks and IEND follow a PNG's first IDAT, and it is no animation (Pillow
    reads chunks after the pixels, an EXIF orientation say, as it decodes them)."""
    at, pixels = 8, False
    while at + 8 <= len(png):
        length, kind = struct.unpack_from(">I4s", png, at)
        if kind == b"acTL" or (pixels and kind not in (b"IDAT", b"IEND")):
            return False
        pixels |= kind == b"IDAT"
        at += 12 + length
    return True


def _upright(img):
    """The picture as a viewer shows it: the EXIF orientation tag (phones, cameras) applied."""
    from PIL import ImageOps

    orientation = img.getexif().get(0x0112, 1) if hasattr(img, "getexif") else 1
    return ImageOps.exif_transpose(img) if orientation not in (0, 1) else img


def _sixteen_to_eight(arr: np.ndarray, path: str) -> np.ndarray:
    if arr.min() < 0 or arr.max() > 65535:
        raise Reject(path, f"pixel values {arr.min()}..{arr.max()} exceed the 16-bit range")
    return ((arr.astype(np.uint32) * 255 + 32767) // 65535).astype(np.uint8)


def _composite(rgba: np.ndarray, fill: int) -> np.ndarray:
    alpha = rgba[..., 3:4].astype(np.uint32)
    rgb = rgba[..., :3].astype(np.uint32)
    return ((rgb * alpha + fill * (255 - alpha) + 127) // 255).astype(np.uint8)


def to_pixels(img, path: str, channels: int, fill: int) -> np.ndarray:
    """HWC uint8 with 3 channels (or HW1 for a grey field) by the rules in the module doc; ``img`` as
    ``decode_picture`` gives it."""
    from PIL import Image

    mode = mode_of(img)
    if mode in ("I;16", "I;16B", "I;16L", "I;16N", "I"):
        grey = _sixteen_to_eight(np.asarray(img), path)
        rgb = np.repeat(grey[..., None], 3, axis=2)
    elif mode == "F":
        raise Reject(path, "floating-point image: convert it to 8 or 16 bits")
    elif mode in ("RGBA", "LA", "PA", "La", "RGBa") or (mode == "P" and "transparency" in img.info):
        rgb = _composite(np.asarray(img if mode == "RGBA" else img.convert("RGBA")), fill)
    elif mode == "RGB":
        rgb = np.asarray(img)
    elif mode == "L":
        rgb = np.repeat(np.asarray(img)[..., None], 3, axis=2)
    else:  # P, 1, CMYK, YCbCr, LAB, HSV
        rgb = np.asarray(img.convert("RGB"))
    if channels == 1:
        return np.asarray(Image.fromarray(rgb).convert("L"))[..., None]  # ITU-R 601-2 luma
    return rgb


@dataclass(frozen=True)
class Geometry:
    """How a (h, w) picture becomes (th, tw): optional shrink, centre crop, even pad."""

    raw: tuple[int, int]  # the picture's size as decoded
    scaled: tuple[int, int] | None
    crop: tuple[int, int, int, int]  # top, left, height, width taken after scaling
    pad: tuple[int, int, int, int]  # top, bottom, left, right

    def times(self, k: int) -> "Geometry":
        """The same plan for a picture ``k`` times larger (a super-resolution partner)."""

        def mul(t):
            return None if t is None else tuple(k * x for x in t)

        return Geometry(mul(self.raw), mul(self.scaled), mul(self.crop), mul(self.pad))


def plan_geometry(h: int, w: int, th: int, tw: int, larger: str, path: str) -> Geometry:
    raw, scaled = (h, w), None
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
    return Geometry(raw, scaled, (top, left, ch, cw), (ph // 2, ph - ph // 2, pw // 2, pw - pw // 2))


def _jpeg_size(data: bytes) -> tuple[int, int] | None:
    """(w, h) of a JPEG as a viewer shows it (EXIF rotation applied), from its header; None for
    other formats (a PNG's EXIF may follow its pixels: asking for it would decode them)."""
    try:
        img = _open_unchecked(data)
    except Exception:  # not a picture: decode_picture says why
        return None
    if img.format != "JPEG":
        return None
    w, h = img.size
    orientation = img.getexif().get(0x0112, 1) if hasattr(img, "getexif") else 1
    return (h, w) if orientation in (5, 6, 7, 8) else (w, h)


def _cut_early(img, g: Geometry):
    """Crop the decoded picture, or reduce one shrunk to a much smaller target by an integer factor
    (to at least twice the final size), *before* its pixels are converted into full-size copies;
    and the plan that finishes the job."""
    import dataclasses

    from PIL import Image

    w, h = size_of(img)
    array = isinstance(img, np.ndarray)
    if g.scaled is None:
        top, left, ch, cw = g.crop
        if (ch, cw) == (h, w):
            return img, g
        cut = img[top : top + ch, left : left + cw] if array else img.crop((left, top, left + cw, top + ch))
        return cut, dataclasses.replace(g, crop=(0, 0, ch, cw))
    sh, sw = g.scaled
    factor = min(h // (2 * sh), w // (2 * sw))
    if factor >= 2 and min(h / sh, w / sw) >= REDUCE_ABOVE:
        img = (Image.fromarray(img) if array else img).reduce(factor)
    return img, g


def apply_geometry(arr: np.ndarray, g: Geometry, fill: int, nearest: bool) -> np.ndarray:
    """The HWC ``arr`` at the target size as a contiguous CHW array, cropped, padded and
    transposed in one copy."""
    if g.scaled is not None:
        from PIL import Image

        resample = Image.Resampling.NEAREST if nearest else Image.Resampling.LANCZOS
        squeezed = arr[..., 0] if arr.shape[2] == 1 else arr
        small = np.asarray(Image.fromarray(squeezed).resize((g.scaled[1], g.scaled[0]), resample))
        arr = small.reshape(g.scaled[0], g.scaled[1], arr.shape[2])
    top, left, ch, cw = g.crop
    pt, pb, pl, pr = g.pad
    out = np.empty((arr.shape[2], pt + ch + pb, pl + cw + pr), dtype=arr.dtype)
    if pt or pb or pl or pr:
        out.fill(fill)
    out[:, pt : pt + ch, pl : pl + cw] = arr[top : top + ch, left : left + cw].transpose(2, 0, 1)
    return out


class ImageKind(Plugins, Pictures, FieldKind[ImageField]):
    kind = "image"
    Spec = ImageField
    detectors = (Detector("h5forge._init.segment:detect", 20, "images/ (+ masks/)"),)
    demos = (
        Demo(
            "cells",
            "h5forge._demo.cells:generate",
            600,
            "micrographs + binary masks + annotations.json",
            marker="annotations.json",
        ),
    )
    layout_doc = (
        "(N, C, H, W) uint8, chunks (chunk_rows, C, H, W), the spec's codec; split attrs "
        "<field>_mean, <field>_std (per channel, of value/255), <field>_histogram (C, 256) exact counts"
    )

    @property
    def channels(self) -> int:
        return self.spec.channels

    def stored(self) -> Stored:
        return Stored((self.channels, *self.spec.size), np.uint8, bulk=True)

    def decode(self, root: Path, ref: SampleRef, done: dict[str, Decoded]) -> Decoded:
        f, rel = self.spec, ref.files[self.name]
        data, digest = read_source(root, rel, f.max_bytes)
        draft = self._draft_size(data)
        img = decode_picture(data, rel, f.max_pixels, f.max_decoded_bytes, draft_to=draft)
        full = _jpeg_size(data) if draft else size_of(img)  # the plan is the full picture's, drafted or not
        assert full is not None  # a picture is drafted only when its JPEG header gave its size
        geometry = plan_geometry(full[1], full[0], f.size[0], f.size[1], f.larger, rel)
        img, local = _cut_early(img, geometry)
        pixels = to_pixels(img, rel, f.channels, f.fill)
        return Decoded(apply_geometry(pixels, local, f.fill, nearest=False), digest, geometry)

    def _draft_size(self, data: bytes) -> tuple[int, int] | None:
        """(w, h) a JPEG much larger than the target may be drafted at with ``larger: shrink``:
        twice the size it is shrunk to."""
        size = _jpeg_size(data) if self.spec.larger == "shrink" else None
        if size is None:
            return None
        w, h = size
        th, tw = self.spec.size
        scale = min(th / h, tw / w)
        if scale * REDUCE_ABOVE > 1:
            return None
        return max(1, round(2 * w * scale)), max(1, round(2 * h * scale))
