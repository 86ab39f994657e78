"""How a field shows on the preview sheet: a picture of its stored value, a caption, or both.

A kind shown on the sheet is a ``Preview`` (the sheet asks ``isinstance(kind, Preview)``); it
overrides what it shows, and each default shows nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

import numpy as np


class Preview:
    """A picture of one stored value and a caption, for the preview sheet."""

    if TYPE_CHECKING:  # the kind's (FieldKind.path)

        @property
        def path(self) -> str: ...

    def preview(self, value: Any) -> np.ndarray | None:
        """An (H, W, 3) uint8 picture of one stored value, or None when the kind draws nothing."""
        return None

    @property
    def overlay_on(self) -> str | None:
        """The field whose preview this one is painted over (a mask over its image), or None for a
        picture of its own. An overlay's preview has its target's shape; its black pixels are
        transparent."""
        return None

    def caption(self, value: Any) -> str | None:
        """A short text shown under a preview tile."""
        return None

    def preview_of(self, values: Mapping[str, Any]) -> np.ndarray | None:
        """``preview`` of this field in one sample, given every stored value of that sample by
        dataset path (companion columns included): a kind whose picture needs them (a volume drawn
        at its voxel spacing) reads them here."""
        return self.preview(values[self.path])

    def caption_of(self, values: Mapping[str, Any]) -> str | None:
        """``caption`` of this field in one sample, given every stored value of that sample."""
        return self.caption(values[self.path])

    def preview_parts(self, values: Mapping[str, Any]) -> dict[str, tuple[int, int, int, int]]:
        """Named regions of ``preview_of``'s picture, (left, top, width, height) in its pixels (a
        volume's three planes); the sheet reports where each landed."""
        return {}

    @property
    def preview_tiles(self) -> int:
        """How many tiles wide the box its picture is fitted into on the sheet (one picture of
        three planes side by side needs three to show each plane at a readable size)."""
        return 1

    def legend(self) -> list[tuple[str, tuple[int, int, int]]]:
        """(text, colour) of each colour its preview paints, when the colours need naming (the
        classes of a multi-class mask); the sheet draws them under the samples."""
        return []
