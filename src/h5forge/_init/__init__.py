"""``h5forge init``: a commented spec inferred from a raw folder.

The layouts it recognises, first match wins, and how each is read are in docs/layouts.md. They are
the field kinds' registered detectors (``Plugins.detectors``), which ``detect`` asks in priority
order; a kind whose detector lives in its own package adds it without an edit here. The built-in
kinds' layouts have their modules here (``pairs``, ``segment``, ``classes``, ``dicom``, ``nifti``,
``edf``, ``csv_recordings``, ``npy_channels``), those of one family sharing ``volumes`` or
``signals``; ``text`` writes the commented YAML.

What cannot be inferred safely is not guessed: it becomes a note, written in the spec as
``# note: ...`` and returned for the CLI to print. A value that must be known and cannot be
inferred (the rate of .npy channels without a sidecar) is written as a ``# rate: TODO`` line and
returned in ``todo``: such a spec is incomplete on purpose, and ``init`` exits 2 after writing it.
"""

from __future__ import annotations

from h5forge._init.detect import Inferred, infer_spec

__all__ = ["Inferred", "infer_spec"]
