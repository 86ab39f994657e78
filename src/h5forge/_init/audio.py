"""The audio layout: ``*.wav``/``*.flac``/``*.ogg`` recordings, one ``signal`` field per channel
index (audio channels have no names), at the rate the files' headers give. Only headers are read
(soundfile.info). A mono folder gives one field, ``audio``; a stereo one ``left`` and ``right``;
more channels ``ch_0``, ``ch_1``, ... Only the channels (nearly) every recording holds get a field
(``Survey.keep_shared``): a folder of mono and stereo recordings gives ``audio``, channel 0."""

from __future__ import annotations

from pathlib import Path

from h5forge.kinds import Layout
from h5forge._init.signals import Survey, first_folder_with

STEREO = ("left", "right")


def _audio_header(path: Path) -> tuple[int, float] | str:
    """(channels, rate) of an audio file's header, or why soundfile cannot read it."""
    import soundfile

    try:
        info = soundfile.info(str(path))
    except (soundfile.LibsndfileError, RuntimeError) as err:
        why = getattr(err, "error_string", None) or "format not recognised"
        return why.removeprefix("Error : ").rstrip(".")
    return info.channels, float(info.samplerate)


def _field_names(channels: int) -> list[str]:
    if channels == 1:
        return ["audio"]
    if channels == len(STEREO):
        return list(STEREO)
    return [f"ch_{i}" for i in range(channels)]


def detect(kind, raw: Path, notes: list[str], todo: list[str]) -> Layout | None:
    """The ``signals`` layout of the audio recordings of ``raw`` or its first sub-folder holding
    some (the others noted), or None if there are none; ``kind`` gives the rate tolerance and the
    audio suffixes."""
    found = first_folder_with(raw, kind.audio_suffixes, notes)
    if found is None:
        return None
    survey = Survey(raw, *found, kind.rate_tolerance)
    for p in survey.sampled:
        got = _audio_header(p)
        if isinstance(got, str):
            survey.reject(p.name, got)
            continue
        channels, rate = got
        for i in range(channels):
            survey.add(str(i), rate, p.name)
    survey.require(
        notes,
        f"no audio recording in {survey.base} can be read by soundfile",
        "no channels",
        "recordings cannot be read by soundfile",
    )
    survey.keep_shared("channel", notes)  # before naming: a mono and stereo folder keeps channel 0, named audio
    names = _field_names(len(survey.channels))
    indexed = {label: (names[k], int(label)) for k, label in enumerate(sorted(survey.channels, key=int))}
    layout = survey.layout(
        "channel",
        notes,
        f"one field per channel of the {len(survey.files)} recordings in {survey.prefix or './'} "
        "(read as float in [-1, 1]); they pair by file name",
        "from the headers",
        indexed,
    )
    if any(ch.off_rate() for ch in survey.channels.values()):
        notes.append("resample: true in a field converts a recording at another rate instead of rejecting it")
    return layout
