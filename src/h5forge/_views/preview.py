"""A contact sheet of a version's samples: one cell per sample, drawn by its field kinds.

Each field kind that is a ``Preview`` draws its own stored value (``preview_of``, given the whole
sample), fitted into a box one tile high and ``preview_tiles`` tiles wide; a kind with
``overlay_on`` (a mask) is painted half-transparent over that field's picture. The kinds' captions
go under the cell after the sample id, the colours they name (``legend``) under the samples.
Nothing here names a kind. Samples are picked at random with a seed, or by id.
"""

from __future__ import annotations

import base64
import io
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

import h5py
import numpy as np
from PIL import Image, ImageDraw

from h5forge.errors import ReadError, SourceMissing, UsageError
from h5forge._format import arrays
from h5forge._format.codecs import ensure_filters
from h5forge._format.layout import decode_str
from h5forge._format.mapped import read_all, rows_of
from h5forge._format.names import FORMAT, IDS, REPORTS_DIR, SPEC, SPLITS, Attr, version_tag
from h5forge._format.row_files import virtual_sources
from h5forge.kinds import FieldKind, stored_kinds
from h5forge.kinds.preview import Preview
from h5forge.spec import spec_from_json
from h5forge._store.whole_files import replace_file
from h5forge._views import drawing

MARGIN = 10  # around the sheet
GAP = 10  # between cells
PICTURE_GAP = 4  # between the pictures of one cell
CAPTION_LINES = 3  # at most, under each cell (the id line included)
ARTIFACT_SIDE = 960  # longest side of the copy embedded in a Prefect artifact
ARTIFACT_QUALITY = 85  # JPEG quality of that copy


@dataclass(frozen=True)
class Drawn:
    """One sample as the sheet draws it: its pictures (field path -> (H, W, 3)), the overlays to
    paint on each (scaled apart, so no label colour is smeared), its captions."""

    split: str
    row: int
    id: str
    pictures: dict[str, np.ndarray]
    overlays: dict[str, list[np.ndarray]]
    captions: list[str]
    parts: dict[str, dict[str, tuple[int, int, int, int]]] = field(default_factory=dict)  # named regions
    tiles: dict[str, int] = field(default_factory=dict)  # tiles wide each picture's box is (default 1)
    legend: list[tuple[str, tuple[int, int, int]]] = field(default_factory=list)  # (text, colour)


@dataclass
class Sheet:
    """The composed picture and where each sample's pictures landed: ``boxes[id][field]`` is
    (left, top, width, height) in sheet pixels, ``boxes[id]["field/part"]`` a named region of it (a
    volume's planes); ``legend[text]`` is the box of that legend entry's colour swatch."""

    image: Image.Image
    samples: list[Drawn]
    boxes: dict[str, dict[str, tuple[int, int, int, int]]] = field(default_factory=dict)
    legend: dict[str, tuple[int, int, int, int]] = field(default_factory=dict)

    @property
    def ids(self) -> list[str]:
        return [s.id for s in self.samples]


def preview_path(out: Path, number: int) -> Path:
    """``<out>/reports/dataset_vNNNN.preview.png``: where a build writes its version's sheet."""
    return Path(out) / REPORTS_DIR / f"{version_tag(number)}.preview.png"


# ---- choosing and drawing samples -----------------------------------------------------------


def _open(path: Path) -> h5py.File:
    ensure_filters()
    if not os.path.exists(path):
        raise SourceMissing(f"{path}: no such dataset file")
    try:
        f = h5py.File(os.path.realpath(path), "r")
    except OSError as err:
        raise ReadError(f"{path}: not a readable HDF5 file ({err})") from None
    if f.attrs.get(Attr.FORMAT) != FORMAT or SPEC not in f:
        f.close()
        raise ReadError(f"{path}: not an h5forge dataset file")
    missing = sorted(s for s in virtual_sources(f) if not os.path.exists(s))
    if missing:
        f.close()
        raise ReadError(f"{path}: reads from files that are missing: {', '.join(missing)}")
    return f


def _count(f: h5py.File, split: str) -> int:
    return int(f[split].attrs.get(Attr.COUNT, 0)) if split in f else 0


def choose(f: h5py.File, split: str | None, n: int, seed: int, ids: Sequence[str] | None) -> list[tuple[str, int, str]]:
    """(split, row, id) of the samples to draw: ``ids`` in the order given (in ``split``, or in any),
    else ``n`` rows of ``split`` (default: train, or the first split with samples) drawn with ``seed``,
    in row order."""
    splits = [split] if split else [s for s in SPLITS if _count(f, s)]
    for s in splits:
        if s not in SPLITS:
            raise UsageError(f"--split must be one of {', '.join(SPLITS)}, not {s!r}")
    if ids:
        where: dict[str, tuple[str, int]] = {}
        for s in splits:
            if _count(f, s):
                for row, sid in enumerate(decode_str(read_all(f[s][IDS]))):
                    where.setdefault(sid, (s, row))
        missing = [i for i in ids if i not in where]
        if missing:
            scope = f"split {split!r}" if split else "any split"
            raise UsageError(f"{len(missing)} id(s) not in {scope} of {f.filename}: {', '.join(missing[:10])}")
        return [(*where[i], i) for i in ids]
    chosen = split or ("train" if _count(f, "train") else next(iter(splits), "train"))
    count = _count(f, chosen)
    if count == 0:
        raise UsageError(f"split {chosen!r} of {f.filename} holds no samples")
    rows = np.sort(np.random.default_rng(seed).choice(count, size=min(n, count), replace=False))
    names = rows_of(f[chosen][IDS])
    return [(chosen, int(r), decode_str(names[int(r) : int(r) + 1])[0]) for r in rows]


def draw_sample(
    kinds: dict[str, FieldKind], values: Mapping[str, object], split: str, row: int, sample_id: str
) -> Drawn:
    """The pictures of one sample, the overlays of each (one that does not fit its target is left
    out), and its captions."""
    pictures: dict[str, np.ndarray] = {}
    overlays: list[tuple[str, np.ndarray]] = []
    captions: list[str] = []
    parts: dict[str, dict[str, tuple[int, int, int, int]]] = {}
    tiles: dict[str, int] = {}
    legend: list[tuple[str, tuple[int, int, int]]] = []
    for path, kind in kinds.items():
        if not isinstance(kind, Preview):
            continue
        picture = kind.preview_of(values)
        if picture is not None:
            target = kind.overlay_on
            if target is None:
                pictures[path] = np.ascontiguousarray(picture, np.uint8)
                parts[path] = kind.preview_parts(values)
                tiles[path] = kind.preview_tiles
            else:
                overlays.append((target, picture))
            legend += kind.legend()
        text = kind.caption_of(values)
        if text:
            captions.append(text)
    painted: dict[str, list[np.ndarray]] = {}
    for target, picture in overlays:
        if target in pictures and pictures[target].shape == picture.shape:
            painted.setdefault(target, []).append(np.ascontiguousarray(picture, np.uint8))
    return Drawn(split, row, sample_id, pictures, painted, captions, parts, tiles, legend)


def load_samples(
    path: str | Path, split: str | None = None, n: int = 16, seed: int = 0, ids: Sequence[str] | None = None
) -> list[Drawn]:
    """The chosen samples of the version file at ``path``, drawn."""
    with _open(Path(path)) as f:
        kinds = stored_kinds(spec_from_json(f[SPEC][()].decode()))
        picked = choose(f, split, n, seed, ids)
        readers: dict[str, dict[str, arrays.RowReader]] = {}
        drawn = []
        for s, row, sid in picked:
            if s not in readers:
                readers[s] = {p: arrays.RowReader(f[s], p, k.stored()) for p, k in kinds.items()}
            values = {p: r.row(row) for p, r in readers[s].items()}
            drawn.append(draw_sample(kinds, values, s, row, sid))
    return drawn


# ---- composing ------------------------------------------------------------------------------


def _columns(n: int) -> int:
    return max(1, int(np.ceil(np.sqrt(n))))


def compose(samples: list[Drawn], tile: int = 192, columns: int | None = None) -> Sheet:
    """The contact sheet: cells in ``columns`` columns (about square by default), each as wide as
    the widest picture box; in a cell the pictures one under the other with their overlays, then
    the id (and split) and the kinds' captions. Under the cells, the legend."""
    if not samples:
        raise UsageError("no samples to draw")
    cols = columns or _columns(len(samples))
    cell = tile * max([1, *(n for s in samples for n in s.tiles.values())])
    scratch = ImageDraw.Draw(Image.new("RGB", (1, 1)))
    layouts = []
    for s in samples:
        sizes = {
            p: drawing.fitted_size(pic.shape[0], pic.shape[1], tile, tile * s.tiles.get(p, 1))
            for p, pic in s.pictures.items()
        }
        lines = [drawing.fit_text(scratch, f"{s.id} ({s.split})", cell)]
        lines += drawing.wrap_text(scratch, s.captions, cell, CAPTION_LINES - 1)
        height = sum(h for h, _ in sizes.values()) + PICTURE_GAP * max(0, len(sizes) - 1)
        layouts.append((sizes, lines, height + PICTURE_GAP + drawing.LINE_HEIGHT * len(lines)))
    grid = [layouts[i : i + cols] for i in range(0, len(layouts), cols)]
    row_heights = [max(c[2] for c in r) for r in grid]
    width = 2 * MARGIN + cols * cell + (cols - 1) * GAP
    legend = list(dict.fromkeys(entry for s in samples for entry in s.legend))
    legend_rows = _legend_rows(scratch, legend, width - 2 * MARGIN)
    height = 2 * MARGIN + sum(row_heights) + GAP * (len(grid) - 1)
    height += (GAP + drawing.LINE_HEIGHT * len(legend_rows)) if legend_rows else 0
    image = Image.new("RGB", (width, height), drawing.BACKGROUND)
    draw = ImageDraw.Draw(image)
    sheet = Sheet(image, samples)
    top = MARGIN
    for r, cells in enumerate(grid):
        for c, (sizes, lines, _) in enumerate(cells):
            s = samples[r * cols + c]
            left, y = MARGIN + c * (cell + GAP), top
            boxes = sheet.boxes.setdefault(s.id, {})
            for p, (h, w) in sizes.items():
                picture = drawing.resized(s.pictures[p], (h, w))
                for overlay in s.overlays.get(p, ()):
                    picture = drawing.blend(picture, drawing.resized(overlay, (h, w), labels=True))
                x = left + (cell - w) // 2
                boxes[p] = (x, y, w, h)
                sy, sx = h / s.pictures[p].shape[0], w / s.pictures[p].shape[1]
                parts = {
                    name: (round(pl * sx), round(pt * sy), round(pw * sx), round(ph * sy))
                    for name, (pl, pt, pw, ph) in s.parts.get(p, {}).items()
                }
                if parts:  # only the named regions are drawn: the space between them is the sheet's
                    shown = np.zeros(picture.shape[:2], bool)
                    for pl, pt, pw, ph in parts.values():
                        shown[pt : pt + ph, pl : pl + pw] = True
                    picture = picture.copy()
                    picture[~shown] = drawing.BACKGROUND
                image.paste(Image.fromarray(picture), (x, y))
                for name, (pl, pt, pw, ph) in parts.items():
                    boxes[f"{p}/{name}"] = (x + pl, y + pt, pw, ph)
                y += h + PICTURE_GAP
            for k, line in enumerate(lines):
                colour = drawing.TEXT if k == 0 else drawing.DIM_TEXT  # the id line, then the captions
                draw.text((left, y + k * drawing.LINE_HEIGHT), line, font=drawing.font(), fill=colour)
        top += row_heights[r] + GAP
    for k, row in enumerate(legend_rows):
        y = top + k * drawing.LINE_HEIGHT
        for x, (text, colour) in row:
            swatch = (x, y + 2, SWATCH, SWATCH)
            draw.rectangle((x, y + 2, x + SWATCH - 1, y + 2 + SWATCH - 1), fill=colour)
            draw.text((x + SWATCH + 4, y), text, font=drawing.font(), fill=drawing.DIM_TEXT)
            sheet.legend[text] = swatch
    return sheet


SWATCH = 10  # pixels: a legend entry's colour square
LEGEND_GAP = 14  # pixels between legend entries


def _legend_rows(
    draw: ImageDraw.ImageDraw, legend: list[tuple[str, tuple[int, int, int]]], width: int
) -> list[list[tuple[int, tuple[str, tuple[int, int, int]]]]]:
    """The legend entries packed into lines of ``width`` pixels: (left, entry) per line."""
    rows: list[list[tuple[int, tuple[str, tuple[int, int, int]]]]] = []
    x = width  # start a line at the first entry
    for text, colour in legend:
        w = SWATCH + 4 + round(draw.textlength(text, font=drawing.font()))
        if rows and x + w <= width:
            rows[-1].append((MARGIN + x, (text, colour)))
        else:
            rows.append([(MARGIN, (text, colour))])
            x = 0
        x += w + LEGEND_GAP
    return rows


def write_preview(
    path: str | Path,
    out: str | Path,
    split: str | None = None,
    n: int = 16,
    seed: int = 0,
    ids: Sequence[str] | None = None,
    tile: int = 192,
    compress_level: int = 6,
) -> Sheet:
    """Draw the chosen samples of ``path`` and save the sheet as a PNG at ``out``. ``compress_level``
    is zlib's: a higher one buys few bytes of a sheet of photographs for much more time."""
    sheet = compose(load_samples(path, split, n, seed, ids), tile)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    png = io.BytesIO()
    sheet.image.save(png, format="PNG", compress_level=compress_level)
    replace_file(out, png.getvalue())  # whole or not at all: a full disk leaves no cut-off picture
    return sheet


def artifact_data_uri(image: Image.Image, max_side: int = ARTIFACT_SIDE, quality: int = ARTIFACT_QUALITY) -> str:
    """A ``data:image/jpeg;base64,...`` URI of a drawn sheet at most ``max_side`` pixels (a Markdown
    artifact carries its picture: the Prefect UI shows no local file). JPEG, as the artifact is
    only looked at (the PNG on disk keeps every pixel), and several times smaller."""
    image = image.convert("RGB")
    scale = max_side / max(image.size)
    if scale < 1:
        image = image.resize(
            (max(1, round(image.width * scale)), max(1, round(image.height * scale))), Image.Resampling.LANCZOS
        )
    buf = io.BytesIO()
    image.save(buf, format="JPEG", quality=quality)
    return "data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode("ascii")
