"""``kind: boxes``: object detection boxes per picture (``kind``), from COCO or YOLO files
(``sources``), through the picture's crop/pad/scale plan (``geometry``); its ``init`` layout
(``detect``) and demo folder (``demo``) are loaded by name only when ``init`` / ``demo-data`` run."""

from h5forge.kinds.boxes.kind import BoxesField, BoxesKind

__all__ = ["BoxesField", "BoxesKind"]
