"""Writing pictures as real collections hold them: in the format their suffix names, some
JPEGs turned with an EXIF tag as phones store them, and a decompression bomb."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

from PIL import Image


def save_picture(img: Image.Image, path: Path, rotate_exif: bool = False) -> None:
    """Save by suffix; ``rotate_exif`` stores the pixels turned with an EXIF orientation 6 tag, as a
    phone does (a viewer, and h5forge, show it upright)."""
    fmt = {".jpg": "JPEG", ".jpeg": "JPEG", ".png": "PNG", ".webp": "WEBP", ".bmp": "BMP"}[path.suffix.lower()]
    if rotate_exif and fmt == "JPEG":
        exif = Image.Exif()
        exif[0x0112] = 6  # "rotate 90 degrees clockwise to view"
        img.transpose(Image.Transpose.ROTATE_90).save(path, fmt, quality=90, exif=exif.tobytes())
    elif fmt in ("JPEG", "WEBP"):
        img.save(path, fmt, quality=90)
    else:
        img.save(path, fmt)


def bomb_png(path: Path, width: int, height: int) -> None:
    """A tiny PNG whose header claims a huge size, as a decompression bomb does."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    raw = zlib.compress(b"\x00" * 16)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", raw) + chunk(b"IEND", b""))
