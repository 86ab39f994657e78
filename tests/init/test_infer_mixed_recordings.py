"""``h5forge init`` on folders whose recordings differ in their channels, written with soundfile and
pyedflib, and on class folders whose names hold a line break: the spec it writes builds every
recording (the written spec as it is, ``max_rejected`` included), or init exits non-zero saying why
in one line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pyedflib
import pytest
import soundfile
import yaml
from PIL import Image

import h5forge
from h5forge.errors import UsageError
from h5forge._format.layout import decode_str
from h5forge._init import infer_spec
from h5forge.read._reader import SplitReader
from h5forge.spec import override, parse_spec
from tests.kinds.test_signal_audio import chirp

SPLITS = ("train", "val", "test")
H5FORGE = str(Path(sys.executable).parent / "h5forge")


def inferred_spec(raw: Path, tmp: Path):
    """What init writes for ``raw``, parsed as a build reads it, and its notes."""
    inferred = infer_spec(raw, tmp / f"{raw.name}.yaml")
    assert inferred.unbuildable is None and not inferred.todo, inferred.notes
    return parse_spec(yaml.safe_load(inferred.text), tmp), " | ".join(inferred.notes)


def published(spec, out: Path) -> tuple[h5forge._pipeline.BuildResult, dict[str, tuple[str, int]]]:
    """The written spec built as it is: every recording must be published."""
    result = h5forge.build(override(spec, output=out))
    assert result.rejected == 0, result.rejections
    with h5py.File(result.path, "r") as f:
        where = {sid: (s, row) for s in SPLITS for row, sid in enumerate(decode_str(f[s]["ids"][()]))}
    return result, where


def stored(result, where, sid: str, field: str) -> np.ndarray:
    split, row = where[sid]
    with SplitReader(result.path, split=split, fields=(field,)) as reader:
        return reader.read_one(row)[field]


# ---- audio: mono and stereo in one folder -------------------------------------------------------

def test_mono_and_stereo_recordings_give_one_field_every_recording_holds(tmp_path):
    raw = tmp_path / "clips"
    raw.mkdir()
    for i in range(8):  # half of them stereo
        soundfile.write(raw / f"take{i}.wav", chirp(8000, 0.5 + i / 10, 2 if i % 2 else 1, i), 8000, subtype="PCM_16")
    spec, notes = inferred_spec(raw, tmp_path)
    assert {n: (f.channel, f.rate) for n, f in spec.fields.items()} == {"audio": (0, 8000)}
    assert "channel '1' is missing in 4 of 8 sampled files (take0.wav, take2.wav, take4.wav)" in notes
    assert "no field reads it, so that those recordings build" in notes

    result, where = published(spec, tmp_path / "out")
    assert sorted(where) == [f"take{i}" for i in range(8)]
    for sid in ("take2", "take3"):  # a mono one, and a stereo one's first channel
        want = soundfile.read(raw / f"{sid}.wav", dtype="float32", always_2d=True)[0][:, 0]
        assert np.array_equal(stored(result, where, sid, "audio"), want)


def test_a_stray_mono_recording_among_stereo_ones_keeps_both_channels(tmp_path):
    # one defective recording of 12 is within the written max_rejected: it is rejected, the channel kept
    raw = tmp_path / "clips"
    raw.mkdir()
    for i in range(12):
        soundfile.write(raw / f"take{i:02d}.wav", chirp(8000, 0.5, 1 if i == 5 else 2, i), 8000)
    spec, notes = inferred_spec(raw, tmp_path)
    assert {n: f.channel for n, f in spec.fields.items()} == {"left": 0, "right": 1}
    assert "channel '1' is missing in 1 of 12 sampled files (take05.wav): those recordings will be rejected" in notes


# ---- EDF / BDF ---------------------------------------------------------------------------------

def write_recording(path: Path, channels: dict[str, int], seconds: int, seed: int, plus: bool = True) -> dict:
    """A recording of ``channels`` (label -> Hz) written by pyedflib (EDF+ or BDF+ by suffix, plain
    EDF/BDF without ``plus``); the values pyedflib reads back, by label."""
    bdf = path.suffix == ".bdf"
    kind = {(False, True): pyedflib.FILETYPE_EDFPLUS, (False, False): pyedflib.FILETYPE_EDF,
            (True, True): pyedflib.FILETYPE_BDFPLUS, (True, False): pyedflib.FILETYPE_BDF}[bdf, plus]
    digital = 2 ** 23 - 1 if bdf else 32767
    rng = np.random.default_rng(seed)
    w = pyedflib.EdfWriter(str(path), len(channels), file_type=kind)
    try:
        w.setSignalHeaders([{"label": label, "dimension": "uV", "sample_frequency": rate, "physical_min": -500,
                             "physical_max": 500, "digital_min": -digital - 1, "digital_max": digital}
                            for label, rate in channels.items()])
        w.writeSamples([rng.uniform(-400, 400, rate * seconds) for rate in channels.values()])
    finally:
        w.close()
    reader = pyedflib.EdfReader(str(path))
    try:
        return {label: reader.readSignal(i).astype(np.float32) for i, label in enumerate(reader.getSignalLabels())}
    finally:
        reader.close()


def without_plus(path: Path) -> None:
    """The file's header says plain EDF, not EDF+ (as some converters write it): its annotation
    channel is then listed as a signal labelled 'EDF Annotations'."""
    data = bytearray(path.read_bytes())
    assert data[192:197] == b"EDF+C"
    data[192:236] = b" " * 44
    path.write_bytes(bytes(data))


def test_an_edf_annotations_channel_becomes_no_field(tmp_path):
    raw = tmp_path / "sleep"
    raw.mkdir()
    values = {}
    for i in range(6):
        path = raw / f"night{i}.edf"
        values[path.stem] = write_recording(path, {"EEG": 100, "EOG": 50}, 3 + i, i)
        without_plus(path)
    reader = pyedflib.EdfReader(str(raw / "night0.edf"))
    assert reader.getSignalLabels() == ["EEG", "EOG", "EDF Annotations"]  # what init is shown
    reader.close()
    spec, notes = inferred_spec(raw, tmp_path)
    assert {n: (f.channel, f.rate) for n, f in spec.fields.items()} == {"eeg": ("EEG", 100), "eog": ("EOG", 50)}
    assert "6 of 6 sampled recordings (night0.edf, night1.edf, night2.edf) hold an 'EDF Annotations' channel" in notes

    result, where = published(spec, tmp_path / "out")
    assert sorted(where) == sorted(values)
    assert np.array_equal(stored(result, where, "night4", "eog"), values["night4"]["EOG"])


def test_edf_and_bdf_recordings_give_the_channels_they_share(tmp_path):
    raw = tmp_path / "mixed"
    raw.mkdir()
    values = {}
    for i in range(4):
        values[f"lab{i}"] = write_recording(raw / f"lab{i}.edf", {"EEG": 100, "ECG": 100}, 2, i)
        values[f"field{i}"] = write_recording(raw / f"field{i}.bdf", {"EEG": 100, "EMG": 200, "RESP": 10}, 2, 10 + i)
    spec, notes = inferred_spec(raw, tmp_path)
    assert {n: (sorted(f.files), f.channel, f.rate) for n, f in spec.fields.items()} == {
        "eeg": (["*.bdf", "*.edf"], "EEG", 100)}
    for label in ("ECG", "EMG", "RESP"):
        assert f"channel {label!r} is missing in 4 of 8 sampled files" in notes

    result, where = published(spec, tmp_path / "out")
    assert sorted(where) == sorted(values)
    for sid in ("lab1", "field2"):
        assert np.array_equal(stored(result, where, sid, "eeg"), values[sid]["EEG"])


def test_recordings_that_share_no_channel_end_init_with_the_reason(tmp_path):
    raw = tmp_path / "apart"
    raw.mkdir()
    for i in range(3):
        write_recording(raw / f"a{i}.edf", {"ECG": 100}, 2, i)
        write_recording(raw / f"b{i}.bdf", {"EMG": 100}, 2, 10 + i)
    with pytest.raises(UsageError) as err:
        infer_spec(raw, tmp_path / "apart.yaml")
    assert str(err.value).startswith("the recordings in ./ share no channel (")
    assert "put the recordings that hold the same channels in a folder of their own and run init on each" in str(
        err.value)
    done = subprocess.run([H5FORGE, "init", str(raw), "--out", str(tmp_path / "apart.yaml")], capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 2 and done.stderr.startswith("error: the recordings in ./ share no channel")
    assert len(done.stderr.strip().splitlines()) == 1 and not (tmp_path / "apart.yaml").exists()


# ---- class folders -------------------------------------------------------------------------------

def test_a_class_folder_named_with_a_line_break_is_one_error_line_and_a_spec_that_loads(tmp_path):
    raw = tmp_path / "animals"
    rng = np.random.default_rng(0)
    for name in ("cats", "do\ngs", "birds"):
        (raw / name).mkdir(parents=True)
        for i in range(4):
            Image.fromarray((rng.random((24, 24, 3)) * 255).astype(np.uint8)).save(raw / name / f"{i}.png")
    spec_path = tmp_path / "animals.yaml"
    done = subprocess.run([H5FORGE, "init", str(raw), "--out", str(spec_path)], capture_output=True, text=True,
                          timeout=600)
    assert "Traceback" not in done.stdout + done.stderr
    assert done.returncode == 1 and done.stderr.startswith("error: wrote ")
    assert "holds a control character (U+000A); rename its files" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert all(line.startswith("note: ") for line in done.stdout.splitlines())  # a note is one line too
    written = yaml.safe_load(spec_path.read_text())  # the spec init wrote loads, with the class as it is named
    assert written["fields"]["label"]["classes"] == ["birds", "cats", "do\ngs"]
    assert "pictures: birds 4, cats 4, do\\ngs 4" in spec_path.read_text()
