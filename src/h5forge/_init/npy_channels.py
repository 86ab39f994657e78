"""The per-channel ``.npy`` layout: ``<channel>/<recording>.npy``, one field per folder, channels
pairing by file name. An array carries no rate, so it is read from ``<stem>.json`` sidecars; without
one the rate is not guessed: it becomes a ``# rate: TODO`` line and ``init`` exits 2."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from h5forge.kinds import Layout
from h5forge.kinds._signal_values import float32_loss
from h5forge._init.folders import sample
from h5forge._init.signals import SIGNAL_SAMPLE, Channel, folders_with, signal_field, signal_name
from h5forge._init.text import SpecText


def detect(kind, raw: Path, notes: list[str], todo: list[str]) -> Layout | None:
    """The ``signals`` layout of the folders of ``.npy`` channels in ``raw``, or None if there are
    none; ``kind`` gives the rate tolerance."""
    folders = folders_with(raw, (".npy",))
    if not folders:
        return None
    taken: set[str] = set()
    # (name, globs, rate or None, why, why float64 or None)
    fields: list[tuple[str, list[str], float | None, str, str | None]] = []
    stems = {}
    for d, files in folders:
        prefix = "" if d == raw else f"{d.name}/"
        name = signal_name(d.name if d != raw else "signal", taken)
        ch, odd, wide = Channel(name, kind.rate_tolerance), [], []
        sampled = sample(files, SIGNAL_SAMPLE)
        for p in sampled:
            try:
                array = np.load(p, mmap_mode="r", allow_pickle=False)
                shape = array.shape
                if len(shape) == 1 and array.dtype.kind in "iuf":
                    with np.errstate(over="ignore"):
                        if float32_loss(np.asarray(array), np.asarray(array).astype(np.float32)):
                            wide.append(p.name)
            except (ValueError, OSError):
                odd.append(f"{p.name} (unreadable)")
                continue
            if len(shape) != 1:
                odd.append(f"{p.name} {shape}")
            sidecar = p.with_suffix(".json")
            try:
                rate = json.loads(sidecar.read_text()).get("rate") if sidecar.is_file() else None
            except (ValueError, UnicodeDecodeError, AttributeError):
                rate = None
            if isinstance(rate, (int, float)) and not isinstance(rate, bool) and rate > 0:
                ch.add(float(rate), p.name)
        if odd:
            notes.append(
                f"{prefix}: {len(odd)} of {len(sampled)} sampled arrays are not one channel of numbers "
                f"({', '.join(odd[:3])}): a .npy must hold one 1-D channel; they will be rejected"
            )
        stems[prefix or "./"] = {p.stem for p in files}
        if ch.rates:
            for rate, names in ch.off_rate():
                notes.append(
                    f"{prefix}: {len(names)} sidecars give {rate:g} Hz ({', '.join(names[:3])}), not "
                    f"{ch.rate():g} Hz: those recordings will be rejected"
                )
            fields.append(
                (
                    name,
                    [f"{prefix}*.npy"],
                    ch.rate(),
                    f"Hz, from the <stem>.json sidecars of {ch.files} sampled files",
                    _float64_why(wide, sampled),
                )
            )
        else:
            message = (
                f"fields.{name}.rate: no {prefix}<stem>.json sidecar gives the rate of {prefix}*.npy; "
                "fill in rate: (samples per second) in the spec"
            )
            notes.append(message)
            todo.append(f"fields.{name}.rate")
            fields.append(
                (
                    name,
                    [f"{prefix}*.npy"],
                    None,
                    f"no {prefix}<stem>.json sidecar gives it; fill it in",
                    _float64_why(wide, sampled),
                )
            )
    every = set.intersection(*stems.values())
    for where, have in stems.items():
        if have - every:
            notes.append(
                f"{len(have - every)} recordings in {where} are missing in another channel folder "
                f"(e.g. {sorted(have - every)[0]}): they are quarantined as incomplete samples"
            )

    def body(t: SpecText) -> None:
        t(0, "fields:")
        t.comment(1, "one field per channel folder; a recording's channels pair by file name")
        for name, globs, rate, why, wide in fields:
            signal_field(t, name, globs, None, rate, why, wide)

    return Layout("signals", body)


def _float64_why(wide: list[str], sampled: list[Path]) -> str | None:
    if not wide:
        return None
    return (
        f"float32 would lose values of {len(wide)} of {len(sampled)} sampled arrays ({', '.join(wide[:3])}): "
        "integers above 2**24, or values large beside their steps"
    )
