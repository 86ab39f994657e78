"""``h5forge init``: a commented spec inferred from a raw folder.

Layouts recognised, first match wins (the built-in kinds'):

- super-resolution pairs: ``lr/`` + ``hr/``, ``low_res/`` + ``high_res/``, ``<name>_LR_x4/`` +
  ``<name>_HR/`` (also ``<name>_LR_bicubic/X4/``): an image field and its ``paired`` partner, the
  scale measured on sampled pairs (an integer, the same in both sides, or no guess and a note);
- ``images/`` (+ ``masks/``): pictures, segmentation masks (binary, or ``classes``/``ignore_value``
  read from sampled masks, palette PNGs by their index);
- class folders: ``<class>/*.jpg`` or ``<split>/<class>/*.jpg`` (``ids: path``, the label and the
  split taken from the folders);
- volumes: DICOM case folders ``<case>/*.dcm`` (or files without a suffix that pydicom reads; also
  ``cases/<case>/``), or NIfTI files ``*.nii.gz`` (also ``images/``): a ``volume`` field, the slice
  size the most common of the sampled cases, ``series: largest`` when a sampled case folder holds
  several series; masks from ``masks/<case>/`` per-slice pictures or ``masks/`` (``labels/``) NIfTI
  label volumes as a ``volume_mask`` (``classes`` read from the values). The case id is the folder
  name (the file name without ``.nii.gz``); ``compute.batch_size`` is 2, as cases are large;
- signals: EDF/BDF recordings ``*.edf`` (one ``signal`` field per channel label, at the rate its
  header gives), CSV recordings with a time column (one field per column, the rate measured from the
  time column), or per-channel folders of ``.npy`` (``acc/<recording>.npy``: one field per folder,
  the rate from ``<stem>.json`` sidecars). A recording's id is its file stem.

Every picture format found is listed in the field's ``files`` (one glob per suffix, case as found).
An annotation file beside the pictures (``*.json``, ``*.jsonl``, ``*.csv``) is joined by the column
that names the samples, with the column types inferred (from the text, for CSV). What cannot be
inferred safely is not guessed: it becomes a note, written in the spec as ``# note: ...`` and
returned for the CLI to print. A value that must be known and cannot be inferred (the rate of .npy
channels without a sidecar) is written as a ``# rate: TODO`` line and returned in ``todo``: such a
spec is incomplete on purpose, and ``init`` exits 2 after writing it.

The layouts are the field kinds' registered detectors (``Plugins.detectors``), which ``detect``
asks in priority order; a kind whose detector lives in its own package adds it without an edit
here. The built-in kinds' layouts have their modules here (``pairs``, ``segment``, ``classes``,
``dicom``, ``nifti``, ``edf``, ``csv_recordings``, ``npy_channels``), those of one family sharing
``volumes`` or ``signals``; ``text`` writes the commented YAML.
"""

from __future__ import annotations

from h5forge._init.detect import Inferred, infer_spec

__all__ = ["Inferred", "infer_spec"]
