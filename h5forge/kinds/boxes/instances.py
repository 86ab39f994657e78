"""Instance masks (``masks: true``): each box's object as a binary mask, from the COCO
``segmentation`` (polygons, or RLE compressed or not) or a YOLO segmentation polygon, decoded by
pycocotools (the format's reference code) at the raw picture's size, then cropped, shrunk
(nearest) and padded with the picture's plan. A box without a segmentation is its own mask.
"""

from __future__ import annotations

import numpy as np

from h5forge.samples import Reject


def instance_mask(segmentation, corners: np.ndarray, raw: tuple[int, int], where: str) -> np.ndarray:
    """(h, w) uint8 {0, 1}: the object of one box in its raw picture."""
    from pycocotools import mask as rle

    h, w = raw
    if segmentation is None or segmentation == []:
        out = np.zeros((h, w), np.uint8)
        x0, y0, x1, y1 = np.clip(np.round(corners), 0, [w, h, w, h]).astype(int)
        out[y0:y1, x0:x1] = 1
        return out
    try:
        if isinstance(segmentation, list):  # polygons [[x1, y1, x2, y2, ...], ...]
            parts = rle.frPyObjects([[float(v) for v in poly] for poly in segmentation], h, w)
            encoded = rle.merge(parts)
        elif isinstance(segmentation, dict) and isinstance(segmentation.get("counts"), list):
            encoded = rle.frPyObjects(segmentation, h, w)  # uncompressed RLE
        elif isinstance(segmentation, dict):
            counts = segmentation["counts"]
            encoded = {
                "size": list(segmentation["size"]),
                "counts": counts.encode() if isinstance(counts, str) else counts,
            }
        else:
            raise TypeError(type(segmentation).__name__)
        if list(encoded["size"]) != [h, w]:
            raise Reject(
                where, f"segmentation is {encoded['size'][1]}x{encoded['size'][0]} (WxH); the picture is {w}x{h}"
            )
        return np.ascontiguousarray(rle.decode(encoded), np.uint8)
    except Reject:
        raise
    except (TypeError, ValueError, KeyError, IndexError) as err:
        raise Reject(where, f"segmentation is neither polygons nor RLE that pycocotools decodes: {err}") from None


def placed_masks(masks: list[np.ndarray], geometry, size: tuple[int, int]) -> np.ndarray:
    """(n, H, W) uint8: each raw mask through the picture's plan (nearest, padded with 0)."""
    from h5forge.kinds.image import apply_geometry

    if not masks:
        return np.zeros((0, *size), np.uint8)
    return np.stack([apply_geometry(m[..., None], geometry, 0, nearest=True)[0] for m in masks])
