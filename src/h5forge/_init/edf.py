"""The EDF/BDF layout: ``*.edf``/``*.bdf`` recordings, one ``signal`` field per channel label at the
rate its header gives. Only headers are read; a file whose size does not match its header is
caught before pyedflib opens it, since pyedflib's C library prints the mismatch on stdout."""

from __future__ import annotations

from pathlib import Path

from h5forge.kinds import Layout
from h5forge._init.signals import Survey, first_folder_with

EDF_SUFFIXES = (".edf", ".bdf")
# the EDF+/BDF+ annotation channel: time-stamped text in the signal's bytes, not samples. pyedflib
# hides it in a file whose header says EDF+ or BDF+, and lists it as a signal where it does not
ANNOTATION_LABELS = ("edf annotations", "bdf annotations")


def _edf_size_problem(path: Path) -> str | None:
    """Why an EDF/BDF file's size does not match what its header declares (a truncated or padded
    file), checked before pyedflib opens it (its C library prints the mismatch on stdout)."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(256)
            ns = int(head[252:256])
            fh.seek(256 + ns * 216)
            per_record = sum(int(fh.read(8)) for _ in range(ns))
        header, records = int(head[184:192]), int(head[236:244])
        size = path.stat().st_size
    except (OSError, ValueError):
        return None  # pyedflib says what is wrong
    expected = header + records * per_record * (3 if head[:8] == b"\xffBIOSEMI" else 2)
    if records >= 0 and size != expected:
        return f"{size:,} bytes where its header declares {expected:,} (truncated?)"
    return None


def _edf_channels(path: Path) -> list[tuple[str, float]] | str:
    """(label, rate) per channel of an EDF/BDF header, or why pyedflib cannot read it."""
    import pyedflib

    problem = _edf_size_problem(path)
    if problem:
        return problem
    try:
        reader = pyedflib.EdfReader(str(path), annotations_mode=pyedflib.DO_NOT_READ_ANNOTATIONS)
    except OSError as err:
        return str(err).replace(str(path) + ": ", "")
    try:
        return [
            (label.strip(), float(reader.getSampleFrequency(i))) for i, label in enumerate(reader.getSignalLabels())
        ]
    finally:
        reader.close()


def detect(kind, raw: Path, notes: list[str], todo: list[str]) -> Layout | None:
    """The ``signals`` layout of the EDF/BDF recordings of ``raw`` or its first sub-folder holding
    some (the others noted), or None if there are none; ``kind`` gives the rate tolerance."""
    edf = first_folder_with(raw, EDF_SUFFIXES, notes)
    if edf is None:
        return None
    survey = Survey(raw, *edf, kind.rate_tolerance)
    twice, annotated = [], []
    for p in survey.sampled:
        got = _edf_channels(p)
        if isinstance(got, str):
            survey.reject(p.name, got)
            continue
        if any(label.lower() in ANNOTATION_LABELS for label, _ in got):
            annotated.append(p.name)
            got = [(label, rate) for label, rate in got if label.lower() not in ANNOTATION_LABELS]
        labels = [label for label, _ in got]
        for i, (label, rate) in enumerate(got):
            if label in labels[:i]:
                twice.append(f"{p.name}: {label}")
                continue
            survey.add(label, rate, p.name)
    survey.require(
        notes,
        f"no EDF/BDF recording in {survey.base} can be read by pyedflib",
        "no channels",
        "recordings cannot be read by pyedflib",
    )
    if annotated:
        notes.append(
            f"{len(annotated)} of {len(survey.sampled)} sampled recordings ({', '.join(annotated[:3])}) hold an "
            "'EDF Annotations' channel: EDF+ annotations (time-stamped text), not samples, so no field reads it"
        )
    if twice:
        notes.append(f"a label appears twice in a recording ({', '.join(twice[:3])}): its field reads the first")
    return survey.layout(
        "channel",
        notes,
        f"one field per channel of the {len(survey.files)} recordings in "
        f"{survey.prefix or './'}; they pair by file name, each at its own rate",
        "from the headers",
    )
