"""Realistic demo raw folders, one per layout h5forge reads, each with the defects real ones have.

Each demo has its module, which says what it writes: ``cells`` (the default, ``generate``:
micrographs, binary masks, annotations.json), ``classify`` (class folders in mixed formats),
``segment_multiclass`` (class masks), ``sr`` (HR/LR pairs), ``ct`` (DICOM series) and ``signals``
(multi-rate EDF+); the kind that declares a demo names it (``Plugins.demos``). With ``bad=True``
each folder also holds defects the build must quarantine with a reason while every good sample
lands. Every generator is seeded (same arguments, same bytes) and returns {path: what is wrong}
for the defects it wrote.
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
    """``KINDS``: the demo folders ``h5forge demo-data --kind`` writes, as the kinds declare them:
    name -> (generator, default sample count)."""
    if name == "KINDS":
        from h5forge.kinds import demos

        return {d.name: (d.load(), d.default_n) for d in demos().values()}
    raise AttributeError(f"module 'h5forge._demo' has no attribute {name!r}")
