"""The faster decoders (libspng for 8-bit grey, RGB and RGBA PNG; libjpeg-turbo through simplejpeg for
grey and RGB JPEG) give exactly the values Pillow gives, on scikit-image's photographs in every mode they
take, interlaced, EXIF-rotated; every other picture stays on Pillow; and a damaged or hostile file gets
the verdict Pillow gives it (docs/spec.md, "Decoders")."""

from __future__ import annotations

import io
import struct
import zlib
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
from PIL import Image, ImageOps
from skimage import data, filters

from h5forge._demo.pictures import bomb_png
from h5forge._ingest.clean import clean_batch
from h5forge._ingest.discover import discover
from h5forge.kinds import image
from h5forge._samples import Reject
from h5forge.spec import parse_spec
from tests.kinds.test_paired import spec_data as sr_spec
from tests.kinds.test_paired import write_pairs

SHIPPED = Path(data.__file__).parent  # the photographs scikit-image ships, as it ships them


def pillow_only():
    """Every picture decoded by Pillow, as before the faster decoders."""
    return mock.patch.object(image, "_fast_pixels", return_value=None)


def encoded(pixels, fmt: str = "PNG", **options) -> bytes:
    out = io.BytesIO()
    (pixels if isinstance(pixels, Image.Image) else Image.fromarray(pixels)).save(out, fmt, **options)
    return out.getvalue()


def chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def chunks(png: bytes) -> list[tuple[bytes, bytes]]:
    out, at = [], 8
    while at < len(png):
        (length,) = struct.unpack_from(">I", png, at)
        out.append((png[at + 4 : at + 8], png[at + 8 : at + 8 + length]))
        at += 12 + length
    return out


def png_of(parts: list[tuple[bytes, bytes]]) -> bytes:
    return b"\x89PNG\r\n\x1a\n" + b"".join(chunk(k, b) for k, b in parts)


def with_chunk(png: bytes, kind: bytes, body: bytes, after_pixels: bool = False) -> bytes:
    """``png`` with one more chunk, just after IHDR or just before IEND."""
    parts = chunks(png)
    parts.insert(len(parts) - 1 if after_pixels else 1, (kind, body))
    return png_of(parts)


# Adam7's passes: (first row, first column, row step, column step)
ADAM7 = ((0, 0, 8, 8), (0, 4, 8, 8), (4, 0, 8, 4), (0, 2, 4, 4), (2, 0, 4, 2), (0, 1, 2, 2), (1, 0, 2, 1))


def interlaced(pixels: np.ndarray) -> bytes:
    """An Adam7-interlaced 8-bit PNG (Pillow writes none): each pass's rows, filter type 0."""
    h, w = pixels.shape[:2]
    colour = {2: 0, 3: 2, 4: 6}[pixels.ndim if pixels.ndim == 2 else pixels.shape[2]]
    rows = (b"\0" + row.tobytes() for y, x, dy, dx in ADAM7 for row in pixels[y::dy, x::dx] if row.size)
    return png_of(
        [
            (b"IHDR", struct.pack(">IIBBBBB", w, h, 8, colour, 0, 0, 1)),
            (b"IDAT", zlib.compress(b"".join(rows))),
            (b"IEND", b""),
        ]
    )


def outcome(blob: bytes, **options):
    """What decode_picture makes of a file: its pixels, or the rejection's reason."""
    try:
        return np.asarray(image.decode_picture(blob, "x.png", 64_000_000, **options))
    except Reject as r:
        return r.reason


def assert_pillows(blob: bytes, **options) -> np.ndarray | str:
    """The same outcome as Pillow's: equal values (and dtype), or the same reason."""
    got = outcome(blob, **options)
    with pillow_only():
        want = outcome(blob, **options)
    if isinstance(want, str):
        assert got == want
    else:
        assert isinstance(got, np.ndarray) and got.dtype == want.dtype and np.array_equal(got, want)
    return got


def routed(blob: bytes) -> bool:
    return image._fast_pixels(blob, image._open_unchecked(blob), image.DEFAULT_MAX_DECODED) is not None


def _rgba() -> np.ndarray:
    return np.dstack([data.astronaut(), data.camera()])


def _xmp(orientation: int) -> bytes:
    xmp = f'<x:xmpmeta><rdf:Description tiff:Orientation="{orientation}"/></x:xmpmeta>'.encode()
    return b"XML:com.adobe.xmp\0\0\0\0\0" + xmp


def _exif(orientation: int) -> Image.Exif:
    exif = Image.Exif()
    exif[0x0112] = orientation
    return exif


def pictures() -> dict[str, tuple[bytes, bool]]:
    """name -> (file, whether a faster decoder takes it)."""
    ast, cam = data.astronaut(), data.camera()
    out = {f"shipped {p.name}": (p.read_bytes(), None) for p in sorted(SHIPPED.glob("*.png"))}
    out |= {
        "grey": (encoded(cam), True),
        "rgb": (encoded(ast), True),
        "rgba": (encoded(_rgba()), True),
        "rgb coffee": (encoded(data.coffee()), True),
        "grey coins, best compression": (encoded(data.coins(), compress_level=9), True),
        "interlaced rgb": (interlaced(ast[:37, :53]), True),
        "interlaced grey": (interlaced(cam[:5, :3]), True),
        "interlaced rgba": (interlaced(_rgba()[:100, :77]), True),
        "interlaced 1x1": (interlaced(cam[:1, :1]), True),
        "rgb + tRNS": (with_chunk(encoded(ast), b"tRNS", bytes(6)), True),
        "grey + tRNS": (with_chunk(encoded(cam), b"tRNS", bytes(2)), True),
        "rgb + gAMA": (with_chunk(encoded(ast), b"gAMA", struct.pack(">I", 100_000)), True),
        "rgb + text before the pixels": (with_chunk(encoded(ast), b"tEXt", b"Comment\0x"), True),
        "jpeg 4:2:0": (encoded(ast, "JPEG", quality=90), True),
        "jpeg 4:4:4": (encoded(ast, "JPEG", subsampling=0), True),
        "jpeg 4:2:2": (encoded(ast, "JPEG", subsampling=1), True),
        "jpeg progressive": (encoded(ast, "JPEG", progressive=True), True),
        "jpeg stored as RGB": (encoded(ast, "JPEG", keep_rgb=True), True),
        "jpeg odd size": (encoded(ast[:101, :7], "JPEG", progressive=True), True),
        "jpeg grey": (encoded(cam, "JPEG"), True),
        **{f"shipped {n}": ((SHIPPED / n).read_bytes(), True) for n in ("retina.jpg", "rocket.jpg")},
        # Pillow's: other modes, chunks after the pixels, formats the faster decoders lack
        "palette": (encoded(Image.fromarray(ast).quantize(16)), False),
        "palette + transparency": (encoded(Image.fromarray(_rgba()).quantize(16), transparency=3), False),
        "grey 16-bit": (encoded(cam.astype(np.uint16) * 257), False),
        "grey+alpha": (encoded(np.dstack([cam, cam[::-1]])), False),
        "1-bit": (encoded(Image.fromarray(cam > 128)), False),
        "text after the pixels": (with_chunk(encoded(ast), b"tEXt", b"Comment\0x", after_pixels=True), False),
        "jpeg cmyk": (encoded(Image.fromarray(ast).convert("CMYK"), "JPEG"), False),
        "webp": (encoded(ast, "WEBP"), False),
    }
    return out


PICTURES = pictures()


@pytest.mark.parametrize("name", PICTURES)
def test_each_picture_decodes_to_pillows_values(name):
    blob, fast = PICTURES[name]
    if fast is not None:
        assert routed(blob) is fast
    assert_pillows(blob)


def test_the_shipped_pngs_mostly_take_the_faster_decoder():
    """Those that do not: 16-bit RGB, and text after the pixels."""
    left = {n for n, (blob, fast) in PICTURES.items() if fast is None and not routed(blob)}
    assert left == {"shipped chessboard_RGB.png", "shipped clock_motion.png", "shipped moon.png"}


@pytest.mark.parametrize("orientation", range(1, 9))
@pytest.mark.parametrize(
    "where", ["jpeg", "png eXIf", "png eXIf after the pixels", "png XMP", "png XMP after the pixels", "png raw profile"]
)
def test_an_exif_orientation_is_applied_as_pillow_applies_it(where, orientation):
    pixels = data.astronaut()[:60, :90]
    if where == "jpeg":
        blob = encoded(pixels, "JPEG", exif=_exif(orientation))
    elif where.startswith("png eXIf"):
        body = _exif(orientation).tobytes()[6:]  # the chunk holds the TIFF header on, without "Exif\0\0"
        blob = with_chunk(encoded(pixels), b"eXIf", body, after_pixels="after" in where)
    elif where == "png raw profile":  # ImageMagick's text chunk, which Pillow's getexif reads
        hexed = _exif(orientation).tobytes().hex()
        blob = with_chunk(encoded(pixels), b"tEXt", f"Raw profile type exif\0\nexif\n{len(hexed) // 2:8d}\n{hexed}\n".encode())
    else:
        blob = with_chunk(encoded(pixels), b"iTXt", _xmp(orientation), after_pixels="after" in where)
    assert routed(blob) is ("after" not in where)
    assert image.plain_png(blob) is None or "after" in where  # after: the faster decoder refuses it
    got = assert_pillows(blob)
    assert got.shape[:2] == ((90, 60) if orientation >= 5 else (60, 90))
    assert np.array_equal(got, np.asarray(ImageOps.exif_transpose(Image.open(io.BytesIO(blob)))))


def test_a_plain_pngs_header_is_read_without_pillow_and_any_other_is_left_to_it():
    """The chunks before the pixels are all ones that change no value, with right CRCs: header from IHDR."""
    cam, ast = data.camera()[:20, :30], data.astronaut()[:20, :30]
    assert image.plain_png(encoded(ast)) == image.PngHeader(30, 20, "RGB")
    assert image.plain_png(encoded(cam)) == image.PngHeader(30, 20, "L")
    assert image.plain_png(encoded(_rgba()[:20, :30])) == image.PngHeader(30, 20, "RGBA")
    gamma = with_chunk(encoded(ast), b"gAMA", struct.pack(">I", 100_000))
    assert image.plain_png(gamma) == image.PngHeader(30, 20, "RGB")
    left = {
        "tRNS": with_chunk(encoded(ast), b"tRNS", bytes(6)),
        "text": with_chunk(encoded(ast), b"tEXt", b"Comment\0x"),
        "unknown chunk": with_chunk(encoded(ast), b"prVt", b"12"),
        "iCCP": with_chunk(encoded(ast), b"iCCP", b"p\0\1" + bytes(8)),  # Pillow rejects its compression method
        "short pHYs": with_chunk(encoded(ast), b"pHYs", bytes(8)),  # Pillow: truncated
        "IHDR CRC": _flipped(encoded(ast), _crc_at(encoded(ast), 0)),
        "gAMA CRC": _flipped(gamma, _crc_at(gamma, 1)),
        "palette": encoded(Image.fromarray(ast).quantize(16)),
        "16-bit": encoded(cam.astype(np.uint16) * 257),
        "cut in its header": encoded(ast)[:30],
        "jpeg": encoded(ast, "JPEG"),
    }
    assert {name: image.plain_png(blob) for name, blob in left.items()} == dict.fromkeys(left)
    for blob in left.values():
        assert_pillows(blob)


def test_a_shrunk_jpeg_is_decoded_at_a_reduced_scale_by_pillow():
    blob = encoded(data.astronaut(), "JPEG")
    with mock.patch.object(image, "_fast_pixels", wraps=image._fast_pixels) as fast:
        got = assert_pillows(blob, draft_to=(64, 64))
    assert got.shape == (64, 64, 3) and not fast.called


def test_a_picture_too_large_to_hold_twice_stays_on_pillow():
    blob = encoded(data.astronaut())
    assert not image._fast_pixels(blob, image._open_unchecked(blob), 2 * 512 * 512 * 4 - 1)
    assert image._fast_pixels(blob, image._open_unchecked(blob), 2 * 512 * 512 * 4) is not None


def _otsu(grey: np.ndarray) -> np.ndarray:
    return (grey > filters.threshold_otsu(grey)).astype(np.uint8) * 255


def write_photos(root: Path) -> None:
    """Pictures of every routed kind with binary masks and palette-coloured class masks."""
    for folder in ("images", "masks", "colours"):
        (root / folder).mkdir(parents=True)
    rotated = encoded(data.coffee(), "JPEG", exif=_exif(6))
    files = {
        "camera.png": encoded(data.camera()),
        "astronaut.png": encoded(data.astronaut()),
        "horse.png": (SHIPPED / "horse.png").read_bytes(),
        "rgba.png": encoded(_rgba()),
        "small.png": interlaced(data.astronaut()[:37, :53]),
        "coffee.jpg": encoded(data.coffee(), "JPEG"),
        "rotated.jpg": rotated,
        "grey.jpg": encoded(data.coins(), "JPEG"),
        "palette.png": encoded(Image.fromarray(data.chelsea()).quantize(8)),
    }
    colours = np.array([[0, 0, 0], [200, 30, 30], [30, 200, 30]], np.uint8)
    for name, blob in files.items():
        (root / "images" / name).write_bytes(blob)
        grey = np.asarray(ImageOps.exif_transpose(Image.open(io.BytesIO(blob))).convert("L"))
        stem = name.split(".")[0]
        Image.fromarray(_otsu(grey)).save(root / "masks" / f"{stem}.png")
        classes = np.digitize(grey, filters.threshold_multiotsu(grey, classes=3))
        rgb = colours[classes]
        Image.fromarray(np.dstack([rgb, np.full(grey.shape, 255, np.uint8)]) if stem == "rgba" else rgb).save(
            root / "colours" / f"{stem}.png"
        )


def segmentation_spec(root: Path, **images) -> dict:
    return {
        "name": "routes",
        "source": {"root": str(root)},
        "output": {"dir": str(root.parent / "out")},
        "fields": {
            "images": {"kind": "image", "files": ["images/*.png", "images/*.jpg"], "size": [96, 128], **images},
            "masks": {"kind": "mask", "files": "masks/*.png", "like": "images"},
            "colours": {
                "kind": "mask",
                "files": "colours/*.png",
                "like": "images",
                "classes": 3,
                "palette": {0: [0, 0, 0], 1: [200, 30, 30], 2: [30, 200, 30]},
            },
        },
    }


def cleaned(spec_data: dict, root: Path):
    spec = parse_spec(spec_data, root)
    inventory = discover(spec)
    return clean_batch(spec, inventory.root, inventory.samples, encode=False)


@pytest.mark.parametrize(
    "images",
    [{}, {"larger": "shrink", "fill": 7}, {"channels": 1}, {"size": [600, 700]}],
    ids=["crop", "shrink", "grey field", "padded"],
)
def test_every_kind_stores_the_same_rows_either_way(tmp_path, images):
    root = tmp_path / "raw"
    write_photos(root)
    spec = segmentation_spec(root, **images)
    assert sum(routed(p.read_bytes()) for p in root.rglob("*.*")) == 26  # all but the palette picture
    got = cleaned(spec, root)
    with pillow_only():
        want = cleaned(spec, root)
    assert got.ids == want.ids and len(got.ids) == 9 and not got.rejections
    for field in ("images", "masks", "colours"):
        assert np.array_equal(got.arrays[field], want.arrays[field]), field


def test_super_resolution_pairs_store_the_same_rows_either_way(tmp_path):
    root = tmp_path / "raw"
    write_pairs(root)
    spec = sr_spec(root, tmp_path / "out")
    got = cleaned(spec, root)
    with pillow_only():
        want = cleaned(spec, root)
    assert got.ids == want.ids and [r.reason for r in got.rejections] == [r.reason for r in want.rejections]
    for field in ("low_res", "high_res"):
        assert np.array_equal(got.arrays[field], want.arrays[field]), field


# ---- damaged and hostile files: Pillow's verdict, whichever decoder was asked first

PNG = encoded(data.astronaut()[:200, :300])
JPEG = encoded(data.astronaut()[:200, :300], "JPEG")


def _flipped(blob: bytes, at: int, bit: int = 0) -> bytes:
    out = bytearray(blob)
    out[at] ^= 1 << bit
    return bytes(out)


def _crc_at(png: bytes, index: int) -> int:
    """Where the CRC of the png's ``index``-th chunk is."""
    at = 8
    for _ in range(index if index >= 0 else len(chunks(png)) + index):
        at += 12 + struct.unpack_from(">I", png, at)[0]
    return at + 8 + struct.unpack_from(">I", png, at)[0]


def _idat_flips(png: bytes, n: int) -> list[bytes]:
    """``n`` seeded bit flips in the compressed pixels, each chunk's CRC made right again: damage only
    the deflate stream and its Adler-32 can tell."""
    parts, rng, out = chunks(png), np.random.default_rng(0), []
    idat = [i for i, (k, _) in enumerate(parts) if k == b"IDAT"]
    for _ in range(n):
        i = idat[int(rng.integers(len(idat)))]
        body = bytearray(parts[i][1])
        body[int(rng.integers(len(body)))] ^= 1 << int(rng.integers(8))
        out.append(png_of(parts[:i] + [(b"IDAT", bytes(body))] + parts[i + 1 :]))
    return out


HOSTILE = {
    **{
        f"png cut at {n}": PNG[:n]
        for n in (8, 20, 33, 45, 100, len(PNG) // 3, len(PNG) // 2, len(PNG) - 20, len(PNG) - 12, len(PNG) - 1)
    },
    **{f"png CRC of chunk {i} flipped": _flipped(PNG, _crc_at(PNG, i)) for i in (0, 1, -2, -1)},
    **{f"png pixels flipped #{k}": blob for k, blob in enumerate(_idat_flips(PNG, 25))},
    "png declaring 4000x4000 with 200x300 of pixels": png_of(
        [(b"IHDR", struct.pack(">IIBBBBB", 4000, 4000, 8, 2, 0, 0, 0))] + chunks(PNG)[1:]
    ),
    "png signature then text": PNG[:8] + b"just some text",
    "empty": b"",
    "text named .png": b"just some text\n",
    "a jpeg named .png": JPEG,
    **{f"jpeg cut at {n}": JPEG[:n] for n in (2, 100, 700, len(JPEG) // 2, len(JPEG) - 2)},
    **{f"jpeg flipped at {k}": _flipped(JPEG, 700 + 97 * k, k % 8) for k in range(40)},
}


@pytest.mark.parametrize("name", HOSTILE)
def test_a_damaged_file_gets_pillows_verdict(name):
    """Pillow's verdict, or before any decoder a PNG whose pixel data does not match its IDAT CRC."""
    got = assert_pillows(HOSTILE[name])
    if isinstance(got, str):
        assert got.split(":")[0] in (
            "empty file (0 bytes)",
            "not an image Pillow can read (unknown or corrupt format)",
            "corrupt or truncated image",
            "corrupt PNG",
        ), got
        assert got.split(":")[0] != "corrupt PNG" or "CRC" in name, (name, got)


def test_truncated_pixels_are_rejected_as_truncated():
    for blob in (PNG[: len(PNG) // 2], JPEG[: len(JPEG) // 2]):
        assert "truncated" in outcome(blob)


def test_a_bomb_is_rejected_from_its_header_before_any_decoder(tmp_path):
    bomb_png(tmp_path / "bomb.png", 30_000, 30_000)
    with mock.patch.object(image, "_fast_pixels") as fast, mock.patch("PIL.ImageFile.ImageFile.load") as load:
        reason = outcome((tmp_path / "bomb.png").read_bytes())
    assert reason.startswith("decompression bomb: header declares 30000x30000 = 900,000,000 pixels")
    assert not fast.called and not load.called


def test_the_faster_decoders_refuse_damaged_files_rather_than_return_partial_rows():
    """What the fallback to Pillow rests on: libspng checks chunk CRCs and the deflate stream's Adler-32
    and wants every row; simplejpeg, strict, refuses a JPEG that ends early."""
    from imagecodecs import spng_decode
    from simplejpeg import decode_jpeg

    for blob in [PNG[:n] for n in (100, len(PNG) // 2, len(PNG) - 20)] + [_flipped(PNG, _crc_at(PNG, 1))]:
        with pytest.raises(RuntimeError):
            spng_decode(blob)
    parts = chunks(PNG)  # the last IDAT's last byte: the deflate stream's Adler-32
    adler = png_of(parts[:-2] + [(b"IDAT", _flipped(parts[-2][1], len(parts[-2][1]) - 1))] + parts[-1:])
    with pytest.raises(RuntimeError):
        spng_decode(adler)
    for n in (700, len(JPEG) // 2, len(JPEG) - 2):
        with pytest.raises(ValueError):
            decode_jpeg(JPEG[:n], "RGB")
