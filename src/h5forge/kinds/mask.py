"""``kind: mask``: a label mask that follows an image field.

Binary (the default): values {0,1} or {0,255}, stored {0,1}; anything else (128 would become a
silent NaN loss) rejects the sample, unless the field's ``threshold`` reads a lossy binary mask (a
JPEG's values near 0 and 255: ``_mask_threshold``). Multi-class (``classes: K``): values 0..K-1 and the
``ignore_value``, read by palette index, through ``palette`` (RGB, or a palette picture's colours) or
by value; a value or colour outside them rejects the sample. Values are judged exactly as stored: a
float mask's 0.5 or 1.5 is no class, never cut to one. A mask has its image's raw size and follows
its geometry (nearest), padded with ``pad_value``, never a class and never counted (the loss's
``ignore_index``). Statistics: pixels per class per split and the rows holding each class.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, Protocol, TypeVar

import numpy as np
from pydantic import Field, model_validator

from h5forge.kinds.base import (
    Decoded,
    FieldKind,
    FieldModel,
    Follows,
    Globs,
    Stored,
    field_of,
    lossy_format,
    read_source,
)
from h5forge.kinds._mask_threshold import FAR, THRESHOLD_DOC, clear_enough, grey_and_unclear, stray_pixels
from h5forge.kinds.image import ImageField, apply_geometry, decode_picture, mode_of
from h5forge.kinds.index import RowIndex
from h5forge.kinds.plugins import Demo, Plugins
from h5forge.kinds.preview import Preview
from h5forge.kinds.reading import ReadOption, ReadOptions
from h5forge.kinds.statistics import ClassCounts
from h5forge._samples import Reject, SampleRef

# preview colours of classes 1, 2, ...: green first, as stained tissue is mostly pink and purple
OVERLAY = np.array(
    [
        [40, 230, 90],
        [40, 160, 230],
        [240, 200, 40],
        [230, 40, 40],
        [200, 80, 220],
        [250, 140, 40],
        [40, 220, 200],
        [150, 150, 150],
    ],
    dtype=np.uint8,
)


PAD = 255  # where a mask is padded, unless the spec says otherwise: no class (classes are 0..254)
PAD_DOC = (
    "written where the mask is padded to its image's size: never a class, never counted in "
    "<mask>_class_pixels (default: the ignore_value if declared, else 255; pass it as the loss's ignore_index)"
)


def pad_of(pad_value: int | None, ignore_value: int | None) -> int:
    return pad_value if pad_value is not None else ignore_value if ignore_value is not None else PAD


def check_pad(pad: int, classes: int | None) -> None:
    k = classes or 2
    if pad < k:
        raise ValueError(f"pad_value {pad} is one of the classes 0..{k - 1}: padding must never count as a class")


class MaskField(FieldModel):
    """A label mask: binary ({0,1} or {0,255}, stored {0,1}) or with ``classes`` values 0..K-1."""

    kind: Literal["mask"] = "mask"
    files: Globs
    id_suffix: str | None = Field(
        None, min_length=1, description="an end of the file stems not part of the id (_segmentation: ISIC's masks)"
    )
    like: str = Field(description="the image field whose size and geometry this mask follows")
    classes: int | None = Field(None, ge=2, le=255, description="multi-class: values 0..classes-1")
    ignore_value: int | None = Field(None, ge=0, le=255, description="a value that marks pixels to ignore")
    palette: dict[int, tuple[int, int, int]] | None = Field(
        None, description="colour and palette masks: class -> [r, g, b]"
    )
    pad_value: int | None = Field(None, ge=0, le=255, description=PAD_DOC)
    threshold: int | None = Field(None, ge=1, le=255, description=THRESHOLD_DOC)
    max_pixels: int = Field(64_000_000, gt=0)

    @property
    def pad(self) -> int:
        return pad_of(self.pad_value, self.ignore_value)

    @model_validator(mode="after")
    def _consistent(self) -> "MaskField":
        if (self.ignore_value is not None or self.palette) and self.classes is None:
            raise ValueError("ignore_value and palette need classes")
        if self.threshold is not None and self.classes is not None:
            raise ValueError(
                "threshold reads binary masks only: a class mask in a lossy format has its edges moved onto "
                "other classes, which no threshold undoes (save it as PNG)"
            )
        if self.classes is not None and self.ignore_value is not None and self.ignore_value < self.classes:
            raise ValueError(f"ignore_value {self.ignore_value} is one of the classes 0..{self.classes - 1}")
        check_pad(self.pad, self.classes)
        for cls in self.palette or {}:
            if not 0 <= cls < (self.classes or 0) and cls != self.ignore_value:
                raise ValueError(f"palette: {cls} is not a class (0..{(self.classes or 0) - 1}) or the ignore_value")
        if self.palette and len(set(self.palette.values())) != len(self.palette):
            raise ValueError("palette: two classes share a colour")
        return self


def _number(v) -> int | float:
    """A value as it is: an int when whole, else the float (0.5 stays 0.5, never truncated to 0)."""
    return int(v) if float(v).is_integer() else float(v)


def _present(arr: np.ndarray) -> set[int | float]:
    """The values ``arr`` holds, exactly: a float mask's 0.5 or NaN is no class."""
    if arr.dtype == np.uint8:
        return set(np.flatnonzero(np.bincount(arr.ravel(), minlength=256)).tolist())
    return {_number(v) for v in np.unique(arr)}


def _listed(values, limit: int = 8) -> str:
    values = sorted(_number(v) if np.ndim(v) == 0 else tuple(int(x) for x in v) for v in values)
    return f"{values[:limit]}{'...' if len(values) > limit else ''}"


def _opaque(mode: str, arr: np.ndarray, path: str) -> np.ndarray:
    """A picture's HW values, or its HWC colour channels without an alpha that must be opaque."""
    if arr.ndim == 2:
        return arr
    if mode in ("RGBA", "LA") and (arr[..., -1] != 255).any():
        raise Reject(path, "mask has transparency; masks must be a single opaque channel")
    return arr[..., :3] if arr.shape[2] >= 3 else arr[..., :1]


def _single_channel(mode: str, arr: np.ndarray, path: str) -> np.ndarray:
    """The one channel of a picture's HW or HWC values, which must agree in every colour channel."""
    colour = _opaque(mode, arr, path)
    if colour.ndim == 2:
        return colour
    if not (colour == colour[..., :1]).all():
        raise Reject(
            path,
            f"mask has {colour.shape[2]} different channels ({mode}); masks must be single-channel "
            "(or declare a palette)",
        )
    return colour[..., 0]


def class_picture(data: bytes, path: str, max_pixels: int):
    """A class mask's picture as ``decode_picture`` gives it. A lossy format rejects the sample: its
    compression moves values near every edge, mostly onto other classes, which no value check finds."""
    if fmt := lossy_format(data):
        raise Reject(
            path,
            f"class mask is a {fmt}, a lossy format whose values near edges are not the classes drawn: save it as PNG",
        )
    return decode_picture(data, path, max_pixels)


def picture_values(img, path: str, binary: bool = False) -> np.ndarray:
    """A mask picture's one channel as ``decode_picture`` gives it, values as stored: a palette
    picture's indices, a 16-bit or float picture's own values (the mask rules then judge them).
    A ``binary`` mask's palette picture of black and one colour is read by its colours: an editor
    numbers the colours as it meets them, so index 0 may be the mask's white."""
    mode = mode_of(img)
    if mode == "1":
        return np.asarray(img, dtype=np.uint8)
    if binary and mode == "P" and (shades := _black_and_white(img)) is not None:
        return shades
    return _single_channel(mode, np.asarray(img), path)


def _black_and_white(img) -> np.ndarray | None:
    """A palette picture's pixels as black (0) and the one other colour it draws (255: white, or a
    mask drawn in red); None when it uses two colours besides black (VOC's palettes: the index is
    the class, the colour only shows it). Where the palette numbers black 0, as VOC's does, the
    colours give the indices' values."""
    index = np.asarray(img)
    palette = np.asarray(img.getpalette() or [], np.uint8).reshape(-1, 3)
    used = np.flatnonzero(np.bincount(index.ravel(), minlength=256))
    if not used.size or used[-1] >= len(palette):
        return None
    drawn = np.asarray(palette.any(axis=1))  # any colour but black
    if len(np.unique(palette[used][drawn[used]], axis=0)) > 1:
        return None
    return np.where(drawn, np.uint8(255), np.uint8(0))[index]


def binary_values(img, path: str) -> np.ndarray:
    """HW uint8 with values {0,1}, from a picture as ``decode_picture`` gives it."""
    return binary_array(picture_values(img, path, binary=True), path)


def thresholded(img, path: str, threshold: int) -> np.ndarray:
    """HW uint8 {0,1} of a binary mask in a lossy format, as ``decode_picture`` gives it: 1 where
    its grey value (the luma of a colour picture) is ``threshold`` or more. A mask whose values are
    {0,1} or {0,255} already is read as without a threshold, and so is a 1-bit, palette, 16-bit or
    float picture (exact values only); a grey picture, whose values are not near 0 and 255, is
    rejected rather than cut in two."""
    mode = mode_of(img)
    if mode not in ("L", "RGB", "RGBA", "LA"):
        return binary_values(img, path)
    pixels = _opaque(mode, np.asarray(img), path)
    grey, unclear = grey_and_unclear(pixels[..., 0] if pixels.ndim == 3 and pixels.shape[2] == 1 else pixels)
    if not clear_enough(unclear, grey.size):
        raise Reject(
            path,
            f"mask has {unclear / grey.size:.0%} of its pixels far from 0 and 255 (or coloured): not a "
            f"binary mask, which threshold {threshold} would cut in two",
        )
    top = int(grey.max()) if grey.size else 0
    if top <= 1:
        return grey
    if top < 256 - FAR:
        raise Reject(
            path,
            f"mask values 0..{top} hold nothing near 255: a {{0,1}} mask in a lossy format, which threshold "
            f"{threshold} would empty (save it as PNG)",
        )
    if stray := stray_pixels(grey):
        raise Reject(
            path,
            f"mask has {stray} pixels {FAR}..{255 - FAR} away from any edge: a region drawn in grey, which "
            f"threshold {threshold} would drop or keep whole by its shade",
        )
    return (grey >= threshold).view(np.uint8)


def binary_array(arr: np.ndarray, path: str) -> np.ndarray:
    """{0,1} or {0,255} values as {0,1}; anything else rejects the sample."""
    if arr.dtype == np.uint8 and arr.size:  # the common cases in two passes, without a histogram
        if arr.max() <= 1:
            return arr
        high = arr == 255
        if np.count_nonzero(high) + np.count_nonzero(arr == 0) == arr.size:
            return high.view(np.uint8)
    present = _present(arr)
    if present <= {0, 1}:
        return arr.astype(np.uint8, copy=False)
    if present <= {0, 255}:
        return (arr == 255).astype(np.uint8)
    raise Reject(path, f"mask values {_listed(present)} not allowed: a mask must hold {{0,1}} or {{0,255}}")


def class_values(img, spec: MaskField, path: str) -> np.ndarray:
    """HW uint8 class indices (and the ignore value): by the declared palette's colours for a colour
    or palette picture, else by palette index or value."""
    mode = mode_of(img)
    if spec.palette and mode in ("RGB", "RGBA", "P"):
        # a palette picture's index order is the file's own (an editor numbers colours as it meets
        # them): its colours are what the declared palette names
        rgb = np.asarray(img.convert("RGB") if mode == "P" else img)[..., :3]
        arr = np.full(rgb.shape[:2], 256, np.uint16)
        for cls, colour in spec.palette.items():
            arr[(rgb == np.asarray(colour, np.uint8)).all(axis=2)] = cls
        unknown = arr == 256
        if unknown.any():
            colours = np.unique(rgb[unknown].reshape(-1, 3), axis=0)
            raise Reject(path, f"mask colours {_listed(colours)} are not in the palette")
        return arr.astype(np.uint8)
    arr = picture_values(img, path)  # a palette picture (P) without a declared palette: its index is its class
    assert spec.classes is not None  # a multi-class mask's values; binary masks never come here
    return class_array(arr, spec.classes, spec.ignore_value, path)


def class_array(arr: np.ndarray, classes: int, ignore_value: int | None, path: str) -> np.ndarray:
    """Class indices 0..classes-1 (and the ignore value) as uint8; anything else rejects the sample."""
    allowed = set(range(classes)) | ({ignore_value} if ignore_value is not None else set())
    present = _present(arr)
    if not present <= allowed:
        raise Reject(
            path,
            f"mask values {_listed(present - allowed)} are not classes 0..{classes - 1}"
            + (f" or the ignore value {ignore_value}" if ignore_value is not None else ""),
        )
    return arr.astype(np.uint8, copy=False)


class MaskRules(Protocol):
    """What the mask kinds read of their spec models (a 2-D mask's, a label volume's)."""

    @property
    def like(self) -> str: ...
    @property
    def classes(self) -> int | None: ...
    @property
    def ignore_value(self) -> int | None: ...
    @property
    def pad(self) -> int: ...


R = TypeVar("R", bound=MaskRules)


def class_pixels(block: np.ndarray, n_classes: int) -> np.ndarray:
    """(n, K) pixels of each class per row of ``block``, for the pixel counts and the class index."""
    if len(block) == 0:
        return np.zeros((0, n_classes), np.int64)
    flat = block.reshape(len(block), -1)
    if n_classes <= 16:
        return np.stack([np.count_nonzero(flat == c, axis=1) for c in range(n_classes)], axis=1)
    return np.array([np.bincount(row, minlength=256)[:n_classes] for row in flat], dtype=np.int64).reshape(
        len(flat), n_classes
    )


class ClassMasks(Follows, ClassCounts, RowIndex, Preview, FieldKind[R]):
    """Class labels that follow another field pixel for pixel (a mask its image, a label volume its
    volume): class counts and index, integers for readers, colours over that field's preview."""

    read_options = (
        ReadOption(
            "mask_dtype",
            "int64",
            "the integer dtype masks come as (torch: uint8 as stored)",
            {"jax": "int32", "torch": "uint8"},
        ),
    )
    counted = "class_pixels"  # padding is not counted

    @property
    def n_classes(self) -> int:
        return self.spec.classes or 2

    def dataset_attrs(self) -> dict[str, Any]:
        attrs: dict[str, Any] = {"classes": self.n_classes, "pad_value": self.spec.pad}
        if self.spec.ignore_value is not None:
            attrs["ignore_value"] = self.spec.ignore_value
        return attrs

    # ---- reading
    def output_dtype(self, opts: ReadOptions) -> np.dtype:
        given = self.option(opts, "mask_dtype")
        dtype = np.dtype(given)
        if dtype.kind not in "iu":
            raise ValueError(f"mask_dtype must be an integer type, got {given!r}")
        return dtype

    # ---- preview: class colours over the image (background and ignore_value stay transparent)
    @property
    def overlay_on(self) -> str:
        return self.spec.like

    def paint(self, classes: np.ndarray) -> np.ndarray:
        """(..., 3) colours of a label array: class k > 0 in OVERLAY[k - 1], anything else black."""
        colours = np.zeros((256, 3), np.uint8)
        colours[1 : self.n_classes] = OVERLAY[np.arange(self.n_classes - 1) % len(OVERLAY)]
        return colours[classes]

    def legend(self) -> list[tuple[str, tuple[int, int, int]]]:
        """Each class's colour, for a multi-class mask (a binary one paints one colour only)."""
        if self.n_classes <= 2:
            return []
        colours = self.paint(np.arange(1, self.n_classes, dtype=np.uint8))
        return [(f"{self.name} class {k}", (int(r), int(g), int(b))) for k, (r, g, b) in enumerate(colours, 1)]


class MaskKind(Plugins, ClassMasks[MaskField]):
    kind = "mask"
    Spec = MaskField
    follows = "image"
    demos = (
        Demo(
            "segment-multiclass",
            "h5forge._demo.segment_multiclass:generate_segment_multiclass",
            120,
            "3-class masks + annotations.csv",
            noun="segment-multiclass samples",
        ),
    )
    layout_doc = (
        "(N, 1, H, W) uint8: {0,1}, or class indices 0..K-1 (and ignore_value), and pad_value (dataset "
        "attr; 255 by default) where padded, chunked and compressed like its image; split attr "
        "<field>_class_pixels (K,), padding not counted; /index/<split>/<field>: rows by class present"
    )

    def stored(self) -> Stored:
        return Stored((1, *field_of(self.dataset, self.spec.like, ImageField).size), np.uint8, bulk=True)

    def decode(self, root: Path, ref: SampleRef, done: dict[str, Decoded]) -> Decoded:
        rel = ref.files[self.name]
        data, digest = read_source(root, rel)
        if self.spec.classes is None:
            values = self._binary(data, rel)
        else:
            values = class_values(class_picture(data, rel, self.spec.max_pixels), self.spec, rel)
        geometry = done[self.spec.like].context
        if values.shape != geometry.raw:
            ih, iw = geometry.raw
            raise Reject(
                rel,
                f"mask is {values.shape[0]}x{values.shape[1]} (HxW) but its image "
                f"{ref.files[self.spec.like]} is {ih}x{iw}",
            )
        return Decoded(apply_geometry(values[..., None], geometry, self.spec.pad, nearest=True), digest)

    def _binary(self, data: bytes, rel: str) -> np.ndarray:
        """A binary mask's {0,1}: by its values, or cut at the field's threshold."""
        img = decode_picture(data, rel, self.spec.max_pixels)
        if self.spec.threshold is not None:
            return thresholded(img, rel, self.spec.threshold)
        try:
            return binary_values(img, rel)
        except Reject as err:
            if fmt := lossy_format(data):  # its compression moved values off 0 and 255: say what reads it
                raise Reject(rel, f"{err.reason} ({fmt}: the field's threshold reads a lossy binary mask)") from None
            raise

    def row_counts(self, block: np.ndarray) -> np.ndarray:
        return class_pixels(block, self.n_classes)

    def preview(self, value: Any) -> np.ndarray:
        return self.paint(np.asarray(value)[0])
