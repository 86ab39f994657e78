"""Audio signals: WAV and FLAC recordings synthesised here (a chirp plus noise) and written with
soundfile and with the standard library's ``wave`` module, read as one field per channel index,
stored ragged, and read back equal to ``soundfile.read(..., dtype="float32")``; recordings at
other rates rejected or resampled; broken files rejected with their reasons."""

from __future__ import annotations

import struct
import wave
from pathlib import Path

import h5py
import numpy as np
import pytest
import soundfile

from h5forge._format import arrays
from h5forge._format.layout import decode_str
from h5forge.read.torch import H5Dataset


def chirp(rate: int, seconds: float, channels: int, seed: int) -> np.ndarray:
    """(frames, channels) in [-1, 1]: a 100 Hz to rate/4 chirp per channel, phase-shifted, plus noise."""
    t = np.arange(int(rate * seconds)) / rate
    sweep = 100 + (rate / 4 - 100) * t / (2 * seconds)
    rng = np.random.default_rng(seed)
    cols = [0.6 * np.sin(2 * np.pi * sweep * t + k) + rng.normal(0, 0.05, t.size) for k in range(channels)]
    return np.clip(np.stack(cols, axis=1), -1, 1)


def write_wave(path: Path, x: np.ndarray, rate: int) -> None:
    """16-bit PCM with the standard library's writer."""
    pcm = np.round(x * 32767).astype("<i2")
    with wave.open(str(path), "wb") as w:
        w.setnchannels(x.shape[1])
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(pcm.tobytes())


def audio_spec(root: Path, out: Path, fields: dict) -> dict:
    return {"name": "audio", "source": {"root": str(root)}, "output": {"dir": str(out)},
            "splits": {"ratios": {"train": 1.0}}, "fields": fields}


def stereo_fields(rate: int, **extra) -> dict:
    files = ["rec/*.wav", "rec/*.flac", "rec/*.ogg"]
    return {side: {"kind": "signal", "files": files, "channel": i, "rate": rate, **extra}
            for i, side in enumerate(("left", "right"))}


def stored_rows(path: Path, name: str) -> dict[str, np.ndarray]:
    with h5py.File(path, "r") as f:
        g = f["train"]
        reader = arrays.RowReader(g, name, arrays.Stored((), np.float32, True, True))
        return {sid: reader.row(i) for i, sid in enumerate(decode_str(g["ids"][()]))}


def test_wav_flac_and_ogg_channels_round_trip_with_their_rate(tmp_path, build_spec):
    root = tmp_path / "raw"
    (root / "rec").mkdir(parents=True)
    soundfile.write(root / "rec" / "pcm16.wav", chirp(16000, 1.5, 2, 0), 16000, subtype="PCM_16")
    soundfile.write(root / "rec" / "pcm24.flac", chirp(16000, 2.0, 2, 1), 16000, subtype="PCM_24")
    soundfile.write(root / "rec" / "vorbis.ogg", chirp(16000, 0.5, 2, 2), 16000, subtype="VORBIS")
    write_wave(root / "rec" / "stdlib.wav", chirp(16000, 1.0, 2, 3), 16000)
    soundfile.write(root / "rec" / "mono.wav", chirp(16000, 1.0, 1, 4), 16000, subtype="PCM_16")
    soundfile.write(root / "rec" / "slow.flac", chirp(8000, 1.0, 2, 5), 8000)
    path, summary = build_spec(audio_spec(root, tmp_path / "out", stereo_fields(16000)))
    reasons = {r.sample_id: r.reason for r in summary.rejections}
    assert reasons == {
        "mono": "channel 1 not in the recording: it has 1 channel(s), 0 to 0",
        "slow": "recorded at 8000 Hz, the spec declares 16000 Hz (resample: true converts it)",
    }
    expected = {p.stem: soundfile.read(p, dtype="float32", always_2d=True)[0]
                for p in sorted((root / "rec").iterdir()) if p.stem not in reasons}
    assert set(expected) == {"pcm16", "pcm24", "vorbis", "stdlib"}
    for i, side in enumerate(("left", "right")):
        rows = stored_rows(path, side)
        assert rows.keys() == expected.keys()
        for sid, stored in rows.items():
            assert stored.dtype == np.float32 and np.array_equal(stored, expected[sid][:, i]), (sid, side)
    with h5py.File(path, "r") as f:
        g = f["train"]
        assert g["left"].attrs["rate"] == 16000 and g["left"].attrs["channel"] == 0
        assert g["right"].attrs["channel"] == 1
        ids = decode_str(g["ids"][()])
        assert dict(zip(ids, g["left" + arrays.LENGTHS][()].tolist())) == {
            "pcm16": 24000, "pcm24": 32000, "vorbis": 8000, "stdlib": 16000}
    # 16-bit PCM is scaled by 1/32768: the stdlib writer's integers come back exactly
    pcm = np.frombuffer(wave.open(str(root / "rec" / "stdlib.wav")).readframes(-1), "<i2").reshape(-1, 2)
    ds = H5Dataset(path, fields=("left", "right"))
    left, right = ds[ds.ids().index("stdlib")]
    assert np.array_equal(left.numpy() * 32768, pcm[:, 0]) and np.array_equal(right.numpy() * 32768, pcm[:, 1])
    (batch, lengths), _ = next(iter(ds.loader(batch_size=4, shuffle=False)))
    assert batch.shape == (4, 32000) and sorted(lengths.tolist()) == [8000, 16000, 24000, 32000]


def test_a_mono_file_needs_no_channel_and_mixed_rates_are_resampled_when_asked(tmp_path, build_spec):
    root = tmp_path / "raw"
    (root / "rec").mkdir(parents=True)
    signals = {}
    for name, rate, seconds in (("native", 16000, 1.0), ("narrow", 8000, 1.5), ("cd", 44100, 0.5)):
        signals[name] = chirp(rate, seconds, 1, seed=rate)
        soundfile.write(root / "rec" / f"{name}.flac", signals[name], rate, subtype="PCM_16")
    soundfile.write(root / "rec" / "stereo.flac", chirp(16000, 1.0, 2, 9), 16000)
    field = {"kind": "signal", "files": "rec/*.flac", "rate": 16000, "resample": True}
    path, summary = build_spec(audio_spec(root, tmp_path / "out", {"voice": field}))
    assert {r.sample_id: r.reason for r in summary.rejections} == {
        "stereo": "the recording has 2 channels; pick one with channel: 0 to 1"}
    rows = stored_rows(path, "voice")
    read = {name: soundfile.read(root / "rec" / f"{name}.flac", dtype="float32")[0] for name in signals}
    assert np.array_equal(rows["native"], read["native"])
    # onto the 16 kHz grid over each recording's duration (last sample at or before its last one)
    assert len(rows["narrow"]) == 23999 and len(rows["cd"]) == (22050 - 1) * 16000 // 44100 + 1 == 8000
    assert np.allclose(rows["narrow"][::2], read["narrow"], atol=1e-6)  # every other point is an original
    assert np.allclose(rows["narrow"][1::2], (read["narrow"][:-1] + read["narrow"][1:]) / 2, atol=1e-6)
    t = np.arange(8000) / 16000
    assert np.allclose(rows["cd"], np.interp(t, np.arange(22050) / 44100, read["cd"]), atol=1e-6)
    with h5py.File(path, "r") as f:
        assert f["train"]["voice"].attrs["rate"] == 16000 and "channel" not in f["train"]["voice"].attrs


def test_broken_audio_files_are_rejected_with_reasons(tmp_path, build_spec):
    root = tmp_path / "raw"
    (root / "rec").mkdir(parents=True)
    good = chirp(16000, 1.0, 2, 0)
    soundfile.write(root / "rec" / "good.wav", good, 16000, subtype="PCM_16")
    data = (root / "rec" / "good.wav").read_bytes()
    (root / "rec" / "cut.wav").write_bytes(data[: len(data) // 2])
    promise = bytearray(data)  # a data chunk of 4 GB in a 64 kB file
    at = promise.index(b"data")
    promise[at + 4 : at + 8] = struct.pack("<I", 0xFFFFFFF0)
    (root / "rec" / "promise.wav").write_bytes(bytes(promise))
    (root / "rec" / "notes.wav").write_text("take 3: the left microphone was off\n" * 20)
    soundfile.write(root / "rec" / "whole.flac", good, 16000)
    flac = (root / "rec" / "whole.flac").read_bytes()
    (root / "rec" / "lost.flac").write_bytes(flac[: len(flac) // 2])
    stream = bytearray(flac)  # STREAMINFO's 36-bit sample count (bytes 21-25 of the file) set to 0: unknown
    stream[21] &= 0xF0
    stream[22:26] = bytes(4)
    (root / "rec" / "stream.flac").write_bytes(bytes(stream))
    soundfile.write(root / "rec" / "whole.ogg", good, 16000, subtype="VORBIS")
    ogg = (root / "rec" / "whole.ogg").read_bytes()
    (root / "rec" / "half.ogg").write_bytes(ogg[: len(ogg) // 2])
    (root / "rec" / "whole.ogg").unlink()
    (root / "rec" / "whole.flac").unlink()
    soundfile.write(root / "rec" / "long.flac", chirp(16000, 3.0, 2, 1), 16000)
    soundfile.write(root / "rec" / "big.wav", chirp(16000, 1.7, 2, 2), 16000, subtype="FLOAT")
    # long.flac: 3 s x 2 channels x 4 bytes = 384,000 decoded from ~150 kB; big.wav: 217,600 bytes of samples
    fields = stereo_fields(16000, max_decoded_bytes=300_000, max_bytes=200_000)
    path, summary = build_spec(audio_spec(root, tmp_path / "out", fields))
    reasons = {(r.sample_id, r.path): r.reason for r in summary.rejections}
    assert reasons == {
        ("cut", "rec/cut.wav"): "its header declares 64,000 bytes of samples, the file holds 31,978 (truncated?)",
        ("promise", "rec/promise.wav"):
            "its header declares 4,294,967,280 bytes of samples, the file holds 64,000 (truncated?)",
        ("notes", "rec/notes.wav"): "not a readable audio file (WAV, FLAC or Ogg): Format not recognised",
        ("lost", "rec/lost.flac"): "the audio cannot be decoded (flac decoder lost sync): truncated or damaged?",
        ("long", "rec/long.flac"): "48,000 frames of 2 channel(s) would take 384,000 bytes decoded, more than "
                                   "max_decoded_bytes 300,000; rejected before decoding",
        ("stream", "rec/stream.flac"):
            "its header does not give its length, so its decoded size cannot be checked before decoding",
        ("half", "rec/half.ogg"): "the file holds no audio samples (empty or cut short)",
        ("big", "rec/big.wav"): "file is 217,688 bytes, larger than the field's limit of 200,000 (max_bytes)",
    }
    assert list(stored_rows(path, "left")) == ["good"]


def test_audio_fields_take_an_index_and_a_float_dtype(tmp_path):
    from h5forge.spec import DatasetSpec

    named = audio_spec(tmp_path, tmp_path / "out", {"l": {"kind": "signal", "files": "*.wav", "channel": "left",
                                                          "rate": 8000}})
    with pytest.raises(ValueError, match="fields.l.channel: 'left' is a name, but audio channels have none"):
        DatasetSpec.model_validate(named)
    ints = audio_spec(tmp_path, tmp_path / "out", {"l": {"kind": "signal", "files": "*.flac", "rate": 8000,
                                                         "dtype": "int16"}})
    with pytest.raises(ValueError, match=r"fields.l.dtype: audio is read as float in \[-1, 1\]; int16 would round"):
        DatasetSpec.model_validate(ints)
