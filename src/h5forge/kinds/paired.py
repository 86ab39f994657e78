"""``kind: paired``: the high-resolution partner of an image field (super-resolution pairs).

    fields:
      low_res:  {kind: image, files: lr/*.png, size: [64, 64]}
      high_res: {kind: paired, files: hr/*.png, like: low_res, scale: 4}

Each HR picture must be exactly ``scale`` times its LR partner (else the pair is rejected with
both sizes), and goes through the LR plan times ``scale``, so the pair stays aligned pixel for
pixel. Stored, read and summarised like an image, with the LR field's channels and fill.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import Field

from h5forge.kinds.base import Decoded, FieldKind, FieldModel, Follows, Globs, Stored, field_of, read_source
from h5forge.kinds.image import ImageField, apply_geometry, decode_picture, to_pixels
from h5forge.kinds._pictures import Pictures
from h5forge.kinds.plugins import Demo, Detector, Plugins
from h5forge._samples import Reject, SampleRef


class PairedField(FieldModel):
    """A picture ``scale`` times larger than its partner image field."""

    kind: Literal["paired"] = "paired"
    files: Globs
    like: str = Field(description="the image field this one is the high-resolution partner of")
    scale: int = Field(ge=2, le=16, description="HR size = scale x LR size, checked per sample")
    max_pixels: int = Field(64_000_000, gt=0)


class PairedKind(Plugins, Follows, Pictures, FieldKind[PairedField]):
    kind = "paired"
    Spec = PairedField
    follows = "image"
    detectors = (Detector("h5forge._init.pairs:detect", 10, "lr/ + hr/ super-resolution pairs"),)
    demos = (Demo("sr", "h5forge._demo.sr:generate_sr", 100, "lr/ + hr/ pairs", noun="sr samples"),)
    layout_doc = "(N, C, scale*H, scale*W) uint8, aligned with its `like` image field; statistics as an image"

    @property
    def partner(self) -> ImageField:
        return field_of(self.dataset, self.spec.like, ImageField)

    @property
    def channels(self) -> int:
        return self.partner.channels

    def stored(self) -> Stored:
        k = self.spec.scale
        return Stored((self.channels, k * self.partner.size[0], k * self.partner.size[1]), np.uint8, bulk=True)

    def decode(self, root: Path, ref: SampleRef, done: dict[str, Decoded]) -> Decoded:
        rel, k = ref.files[self.name], self.spec.scale
        data, digest = read_source(root, rel)
        pixels = to_pixels(decode_picture(data, rel, self.spec.max_pixels), rel, self.channels, self.partner.fill)
        low = done[self.spec.like].context
        if pixels.shape[:2] != (k * low.raw[0], k * low.raw[1]):
            raise Reject(
                rel,
                f"HR is {pixels.shape[0]}x{pixels.shape[1]} (HxW) but its LR partner "
                f"{ref.files[self.spec.like]} is {low.raw[0]}x{low.raw[1]}: scale {k} needs "
                f"{k * low.raw[0]}x{k * low.raw[1]}",
            )
        return Decoded(apply_geometry(pixels, low.times(k), self.partner.fill, nearest=False), digest)
