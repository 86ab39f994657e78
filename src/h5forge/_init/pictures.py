"""Picture files: the formats found (one glob per suffix, spelled as found, since a glob is
case-sensitive), the size an ``image`` field stores them at, and that field's lines."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from PIL import Image

from h5forge.errors import UsageError
from h5forge._init.folders import files_in, sample
from h5forge._init.text import SpecText, files_value

PICTURES = (".png", ".jpg", ".jpeg", ".tif", ".tiff", ".bmp", ".webp")
IMAGE_DIRS = ("images", "imgs", "image", "img", "jpegimages")
MAX_SIDE = 1024  # a larger inferred size is scaled down to this (and pictures shrunk to fit)
SIZE_SAMPLE = 200
HEADER_LIMIT = 64_000_000  # like image max_pixels: a bigger header is a bomb and says nothing


def pictures_in(d: Path) -> list[Path]:
    """The picture files directly in ``d`` (any case of a known suffix), sorted."""
    return files_in(d, PICTURES)


def _suffixes(files: Iterable[Path]) -> list[str]:
    """The picture suffixes found, exactly as spelled (glob is case-sensitive), most common first."""
    counts = Counter(p.suffix for p in files if p.suffix.lower() in PICTURES)
    return sorted(counts, key=lambda s: (-counts[s], PICTURES.index(s.lower()), s))


def picture_globs(prefix: str, files: Iterable[Path]) -> list[str]:
    return [f"{prefix}*{s}" for s in _suffixes(files)]


def upright_size(path: Path) -> tuple[tuple[int, int], str] | None:
    """(width, height) as shown (EXIF orientation applied, like the cleaning does) and the mode,
    from the header only; None for what cannot be read."""
    try:
        with Image.open(path) as im:
            w, h = im.size
            if w * h > HEADER_LIMIT:
                return None
            orientation = im.getexif().get(0x0112, 1)
            return ((h, w) if orientation in (5, 6, 7, 8) else (w, h)), im.mode
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError):
        return None


def _round_up(v: int, to: int = 32) -> int:
    return -(-v // to) * to


@dataclass
class Size:
    height: int
    width: int
    sampled: int
    modes: Counter
    capped: bool = False
    largest: tuple[int, int] = (0, 0)

    @property
    def grey(self) -> bool:
        return all(m in ("L", "I;16", "I", "1") for m in self.modes)


def target_size(paths: list[Path], what: str) -> Size:
    sizes: list[tuple[int, int]] = []
    modes: Counter[str] = Counter()
    for p in sample(paths, SIZE_SAMPLE):
        got = upright_size(p)
        if got is not None:
            sizes.append(got[0])
            modes[got[1]] += 1
    if not sizes:
        raise UsageError(f"no readable picture in {what}")
    # the 95th percentile, so a few outsized pictures are cropped rather than padding everything
    hs, ws = sorted(h for _, h in sizes), sorted(w for w, _ in sizes)
    k = int(0.95 * (len(sizes) - 1))
    height, width = _round_up(hs[k]), _round_up(ws[k])
    size = Size(height, width, len(sizes), modes, largest=(hs[-1], ws[-1]))
    if max(height, width) > MAX_SIDE:
        factor = MAX_SIDE / max(height, width)
        size.height, size.width = max(32, _round_up(int(height * factor))), max(32, _round_up(int(width * factor)))
        size.height, size.width = min(size.height, MAX_SIDE), min(size.width, MAX_SIDE)
        size.capped = True
    return size


def larger_choice(size: Size, default: str) -> tuple[str, str]:
    """The ``larger:`` value and its comment: ``shrink`` when the size was capped (cropping would
    keep a small middle of a large picture), else the layout's ``default``."""
    if size.capped:
        return "shrink", "bigger pictures are shrunk (aspect kept), then padded | crop | reject"
    if default == "shrink":
        return "shrink", "bigger pictures are shrunk (aspect kept, the whole object stays) | crop | reject"
    return "crop", "for bigger pictures: crop (centre) | shrink (keep aspect, pad) | reject"


def image_field(t: SpecText, name: str, globs: list[str], size: Size, larger: str, why: str) -> None:
    t(1, f"{name}:")
    t(2, "kind: image")
    t(2, f"files: {files_value(globs)}", "one glob per picture format found" if len(globs) > 1 else None)
    line = f"size: [{size.height}, {size.width}]"
    if size.capped:
        t(
            2,
            line,
            f"(height, width): pictures reach {size.largest[0]}x{size.largest[1]}; the 95th percentile of "
            f"{size.sampled} sampled is scaled down to at most {MAX_SIDE} a side",
        )
    else:
        t(2, line, f"(height, width): 95th percentile of {size.sampled} sampled, rounded up to 32;")
        t.more("smaller pictures are padded evenly, never stretched")
    t(2, f"channels: {1 if size.grey else 3}", f"sampled modes: {dict(size.modes)}")
    t(2, f"larger: {larger}", why)
    t(2, "fill: 0", "padding value")
