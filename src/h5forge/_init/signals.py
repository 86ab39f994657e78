"""What the signal layouts (EDF/BDF, CSV with a time column, per-channel ``.npy`` folders, audio) share:
the folders holding recordings, a field name per channel label, each channel's rate as the sampled
recordings give it (the most common one; recordings at another rate are noted, as they will be
rejected) and the ``signal`` field's lines. A recording's id is its file stem."""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from h5forge.errors import UsageError
from h5forge.kinds import Layout
from h5forge._format.arrays import LENGTHS
from h5forge._format.names import RESERVED
from h5forge._init.folders import files_in, sample, subdirs
from h5forge._init.sections import MAX_REJECTED
from h5forge._init.text import SpecText, files_value, scalar

SIGNAL_SAMPLE = 50


def folders_with(raw: Path, suffixes: tuple[str, ...]) -> list[tuple[Path, list[Path]]]:
    """``raw`` and its sub-folders that hold files with one of ``suffixes``, with those files."""
    found = [(b, files_in(b, suffixes)) for b in [raw, *subdirs(raw)]]
    return [(b, files) for b, files in found if files]


def first_folder_with(raw: Path, suffixes: tuple[str, ...], notes: list[str]) -> tuple[Path, list[Path]] | None:
    """The first of ``folders_with(raw, suffixes)``, the others noted as left out of the spec, or
    None when no folder holds such recordings."""
    found = folders_with(raw, suffixes)
    if not found:
        return None
    for other, _ in found[1:]:
        notes.append(
            f"{other.relative_to(raw).as_posix()}/ also holds recordings; this spec reads "
            f"{found[0][0].relative_to(raw).as_posix() or '.'}/ only (add its glob to files to include it)"
        )
    return found[0]


def signal_name(label: str, taken: set[str]) -> str:
    """A field name from a channel label: lower case, runs of other characters as ``_``, unique."""
    name = re.sub(r"[^a-z0-9]+", "_", label.lower()).strip("_") or "signal"
    if name[0].isdigit():
        name = f"ch_{name}"
    base, k = name, 2
    while name in taken or name in RESERVED or name.endswith(LENGTHS):
        name, k = f"{base}_{k}", k + 1
    taken.add(name)
    return name


def _rate_value(rate: float) -> int | float:
    return int(round(rate)) if abs(rate - round(rate)) <= 1e-6 * max(rate, 1.0) else float(f"{rate:.6g}")


@dataclass
class Channel:
    """One channel as the sampled recordings show it."""

    label: str
    tolerance: float  # the kind's: a rate this far (relative) from the declared one is rejected
    rates: dict[float, list[str]] = field(default_factory=dict)  # rate -> files

    def add(self, rate: float, name: str) -> None:
        self.rates.setdefault(_rate_value(rate), []).append(name)

    @property
    def files(self) -> int:
        return sum(len(v) for v in self.rates.values())

    def holders(self) -> set[str]:
        """The sampled files that hold the channel."""
        return {name for names in self.rates.values() for name in names}

    def rate(self) -> int | float:
        return max(self.rates, key=lambda r: (len(self.rates[r]), r))

    def off_rate(self) -> list[tuple[float, list[str]]]:
        """The rates other than the chosen one, beyond the kind's tolerance, with their files."""
        chosen = self.rate()
        return [(r, names) for r, names in self.rates.items() if abs(r - chosen) > self.tolerance * chosen]


LABEL_WHY = "the label in the recording, exactly"
INDEX_WHY = "the channel's index in the file (audio channels have no names; 0 is the first, left in stereo)"


def signal_field(
    t: SpecText,
    name: str,
    globs: list[str],
    channel: str | int | None,
    rate: int | float | None,
    why: str,
    wide: str | None = None,
) -> None:
    """``wide``: why the field is stored in float64 (what float32 would lose), or None."""
    t(1, f"{name}:")
    t(2, "kind: signal")
    t(2, f"files: {files_value(globs)}")
    if channel is not None:
        t(2, f"channel: {scalar(channel)}", INDEX_WHY if isinstance(channel, int) else LABEL_WHY)
    if rate is None:
        t.todo(2, "rate", "1", f"samples per second: {why}")
    else:
        t(2, f"rate: {rate}", why)
    if wide is not None:
        t(2, "dtype: float64", wide)


def _suffix_globs(prefix: str, files: Iterable[Path]) -> list[str]:
    counts = Counter(p.suffix for p in files)
    return [f"{prefix}*{s}" for s, _ in counts.most_common()]


@dataclass
class Survey:
    """The channels the sampled recordings of one folder hold, and the recordings that cannot be
    used (``<file>: why``). EDF/BDF and CSV recordings both hold several labelled channels, each
    at its own rate, so both become one field per channel the same way."""

    raw: Path
    base: Path
    files: list[Path]
    tolerance: float  # the signal kind's rate tolerance
    prefix: str = field(init=False)  # "" or "<folder>/", as the globs start
    sampled: list[Path] = field(init=False)
    channels: dict[str, Channel] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.prefix = "" if self.base == self.raw else f"{self.base.name}/"
        self.sampled = sample(self.files, SIGNAL_SAMPLE)

    def add(self, label: str, rate: float, name: str) -> None:
        self.channels.setdefault(label, Channel(label, self.tolerance)).add(rate, name)

    def reject(self, name: str, why: str) -> None:
        self.problems.append(f"{name}: {why}")

    def require(self, notes: list[str], nothing: str, empty: str, unusable: str) -> None:
        """Raises when no sampled recording gave a channel (``nothing``, with the first problem or
        ``empty``); else notes the recordings that will be rejected (``unusable`` says why)."""
        if not self.channels:
            raise UsageError(f"{nothing} ({self.problems[0] if self.problems else empty})")
        if self.problems:
            notes.append(
                f"{len(self.problems)} of {len(self.sampled)} sampled {unusable} "
                f"({'; '.join(self.problems[:3])}): they will be rejected"
            )

    def readable(self) -> list[str]:
        """The sampled files that gave their channels."""
        return [p.name for p in self.sampled if not any(u.startswith(f"{p.name}: ") for u in self.problems)]

    def keep_shared(self, unit: str, notes: list[str]) -> None:
        """Keeps the channels a build can read from (nearly) every recording: a field whose channel
        a recording lacks rejects that recording, so a channel goes when the sampled recordings
        lacking it, with those lacking another channel kept, are more than the written spec's
        ``max_rejected`` allows (a stray defective recording keeps its channel and is rejected; a
        folder of mono and stereo recordings, or of two kinds of recorder, keeps what they share).
        Raises when no channel is left: no spec builds every recording then."""
        readable = self.readable()
        allowed = max(int(MAX_REJECTED * len(readable) + 1e-9), 1)
        lacking = {label: set(readable) - ch.holders() for label, ch in self.channels.items()}
        kept: list[str] = []
        refused: set[str] = set()
        for label in sorted(self.channels, key=lambda label: len(lacking[label])):  # the most widely held first
            if len(refused | lacking[label]) <= allowed:
                kept.append(label)
                refused |= lacking[label]
        if not kept:
            raise UsageError(self._nothing_shared(unit, readable))
        for label in [label for label in self.channels if label not in kept]:
            names = sorted(lacking[label])
            notes.append(
                f"{unit} {label!r} is missing in {len(names)} of {len(readable)} sampled files "
                f"({', '.join(names[:3])}): no field reads it, so that those recordings build (a field "
                "for it would reject them)"
            )
        self.channels = {label: ch for label, ch in self.channels.items() if label in kept}

    def _nothing_shared(self, unit: str, readable: list[str]) -> str:
        held = "; ".join(
            f"{name}: {', '.join(label for label, ch in self.channels.items() if name in ch.holders())}"
            for name in readable[:3]
        )
        return (
            f"the recordings in {self.prefix or './'} share no {unit} ({held}{'; ...' if len(readable) > 3 else ''}): "
            "a field per channel would reject most of them; put the recordings that hold the same channels "
            "in a folder of their own and run init on each"
        )

    def layout(
        self, unit: str, notes: list[str], comment: str, source: str, indexed: dict[str, tuple[str, int]] | None = None
    ) -> Layout:
        """The ``signals`` layout: one field per channel (those ``keep_shared`` keeps), at its most
        common rate (``source`` says where the rate was read); notes for a channel missing, or at
        another rate, in some of the recordings (``unit``: what a channel is called, e.g.
        ``column``). Channels without names (audio) give ``indexed``: label -> (field name, the
        channel's index)."""
        self.keep_shared(unit, notes)
        _channel_notes(self.channels, self.readable(), unit, notes)
        globs = _suffix_globs(self.prefix, self.files)
        taken: set[str] = set()
        names = {label: signal_name(label, taken) for label in self.channels}
        channels: dict[str, str | int] = {label: label for label in self.channels}
        for label, (name, index) in (indexed or {}).items():
            names[label], channels[label] = name, index

        def body(t: SpecText) -> None:
            t(0, "fields:")
            t.comment(1, comment)
            for label, ch in self.channels.items():
                why = f"Hz, {source} of {ch.files} sampled files"
                signal_field(t, names[label], globs, channels[label], ch.rate(), why)

        return Layout("signals", body)


def _channel_notes(channels: dict[str, Channel], readable: list[str], unit: str, notes: list[str]) -> None:
    for ch in channels.values():
        for rate, names in ch.off_rate():
            notes.append(
                f"{unit} {ch.label!r} is at {rate:g} Hz in {len(names)} of {ch.files} sampled files "
                f"({', '.join(names[:3])}), not {ch.rate():g} Hz: those recordings will be rejected"
            )
        missing = [n for n in readable if n not in ch.holders()]
        if missing:
            notes.append(
                f"{unit} {ch.label!r} is missing in {len(missing)} of {len(readable)} sampled files "
                f"({', '.join(missing[:3])}): those recordings will be rejected (every field must be in "
                "a sample; drop the field to keep them)"
            )
