"""Realistic demo raw folders, one per layout h5forge reads, each with the defects real ones have.

``cells`` (the default, ``generate``): stained-cell micrographs, binary masks, annotations
    ROOT/images/<id>.png  ROOT/masks/<id>.png  ROOT/annotations.json
Images vary in size (150-260 px by default) and in PNG mode (RGB, RGBA, palette, grey, 16-bit grey).
``classify`` (``generate_classify``): a class-folder tree ROOT/<class>/<nnnn>.<ext> (optionally
    ROOT/<split>/<class>/...) of four visually distinct classes, in mixed formats (PNG, JPEG as
    .jpg/.jpeg/.JPG, WebP, BMP), some JPEGs stored rotated with an EXIF orientation tag.
``segment-multiclass`` (``generate_segment_multiclass``): ROOT/images/ + ROOT/masks/ with class
    masks (0 background, 1 cytoplasm, 2 nucleus, 255 an uncertain rim in some), one palette PNG
    mask, and ROOT/annotations.csv.
``sr`` (``generate_sr``): ROOT/hr/<id>.png and ROOT/lr/<id>.png made from it by ``Image.resize``
    at scale 4.
``ct`` (``generate_ct``): real DICOM series written with pydicom from its bundled ``CT_small.dcm``,
    one folder per case ROOT/<case>/ (files shuffled, InstanceNumber shuffled, one case's files
    without a suffix, as scanners write them), a sphere of +400 HU in each, and per-slice PNG masks
    of the sphere in ROOT/masks/<case>/slice_NNN.png.
``signals`` (``generate_signals``): EDF+ recordings written with pyedflib's EdfWriter, ROOT/<id>.edf,
    channels at different rates (ACC 1000 Hz, VOLT 100 Hz, TEMP 1 Hz) and lengths (2-10 s).
With ``bad=True`` each folder also holds defects, each of which the build must quarantine with a
reason while every good sample lands. Every generator is seeded (same arguments, same bytes) and
returns {path: what is wrong} for the defects it wrote.

Each demo has its module (``cells``, ``classify``, ``segment_multiclass``, ``sr``, ``ct``,
``signals``), named by the kind that declares it (``Plugins.demos``); ``pictures`` writes
pictures the way real collections hold them, for several of them.
"""

from __future__ import annotations

from h5forge._demo.cells import LABELS, STAINS, generate
from h5forge._demo.classify import CLASSIFY_CLASSES, generate_classify
from h5forge._demo.ct import CT_SPACING, CT_SPHERE_HU, generate_ct
from h5forge._demo.segment_multiclass import SEGMENT_CLASSES, generate_segment_multiclass
from h5forge._demo.signals import SIGNAL_CHANNELS, generate_signals
from h5forge._demo.sr import generate_sr

__all__ = [
    "CLASSIFY_CLASSES",
    "CT_SPACING",
    "CT_SPHERE_HU",
    "KINDS",
    "LABELS",
    "SEGMENT_CLASSES",
    "SIGNAL_CHANNELS",
    "STAINS",
    "generate",
    "generate_classify",
    "generate_ct",
    "generate_segment_multiclass",
    "generate_signals",
    "generate_sr",
]


def __getattr__(name: str):
    """``KINDS``: the demo folders ``h5forge demo-data --kind`` writes, as the kinds declare them
    (``h5forge.kinds.demos``): name -> (generator, default sample count)."""
    if name == "KINDS":
        from h5forge.kinds import demos

        return {d.name: (d.load(), d.default_n) for d in demos().values()}
    raise AttributeError(f"module 'h5forge._demo' has no attribute {name!r}")
