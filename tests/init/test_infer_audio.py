"""``h5forge init`` on a folder of audio recordings written by soundfile (WAV and FLAC, stereo
and mono, at two rates) and a text file named .wav: the inferred spec has one field per channel
index at the headers' rate, notes the recordings that will be rejected, builds through the library
and reads back what soundfile reads."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import soundfile
import yaml

import h5forge
from h5forge._format.layout import decode_str
from h5forge._init import infer_spec
from h5forge.read.torch import H5Dataset
from h5forge.spec import override, parse_spec
from tests.kinds.test_signal_audio import chirp

SPLITS = ("train", "val", "test")


def stored_ids(path: Path) -> dict[str, tuple[str, int]]:
    with h5py.File(path, "r") as f:
        return {sid: (s, row) for s in SPLITS for row, sid in enumerate(decode_str(f[s]["ids"][()]))}


def test_audio_folder_gives_left_and_right_fields_at_the_headers_rate(tmp_path):
    raw = tmp_path / "clips"
    raw.mkdir()
    for i in range(6):
        soundfile.write(raw / f"take{i}.{'flac' if i % 2 else 'wav'}", chirp(16000, 0.5 + i / 10, 2, i), 16000)
    soundfile.write(raw / "phone.flac", chirp(8000, 1.0, 2, 7), 8000)
    soundfile.write(raw / "mono.wav", chirp(16000, 1.0, 1, 8), 16000, subtype="PCM_16")
    (raw / "readme.wav").write_text("recorded in the lab, March\n")
    inferred = infer_spec(raw, tmp_path / "clips.yaml")
    spec = parse_spec(yaml.safe_load(inferred.text), tmp_path)
    assert inferred.layout == "signals" and list(spec.fields) == ["left", "right"]
    assert {n: (f.files, f.channel, f.rate) for n, f in spec.fields.items()} == {
        "left": (("*.wav", "*.flac"), 0, 16000), "right": (("*.wav", "*.flac"), 1, 16000)}
    assert "channel: 0             # the channel's index in the file" in inferred.text
    notes = " | ".join(inferred.notes)
    assert "1 of 9 sampled recordings cannot be read by soundfile (readme.wav: Format not recognised)" in notes
    assert "channel '0' is at 8000 Hz in 1 of 8 sampled files (phone.flac), not 16000 Hz" in notes
    assert "channel '1' is missing in 1 of 8 sampled files (mono.wav)" in notes
    assert "resample: true in a field converts a recording at another rate" in notes

    result = h5forge.build(override(spec, output=tmp_path / "out").model_copy(update={"max_rejected": 1.0}))
    reasons = {r.sample_id: r.reason for r in result.rejections}
    assert reasons == {
        "phone": "recorded at 8000 Hz, the spec declares 16000 Hz (resample: true converts it)",
        "mono": "channel 1 not in the recording: it has 1 channel(s), 0 to 0",
        "readme": "not a readable audio file (WAV, FLAC or Ogg): Format not recognised",
    }
    ids = stored_ids(Path(result.path))
    assert set(ids) == {f"take{i}" for i in range(6)}
    split, row = ids["take3"]
    left, right = H5Dataset(result.path, split=split, fields=("left", "right"))[row]
    read = soundfile.read(raw / "take3.flac", dtype="float32")[0]
    assert left.shape == (12800,) and np.array_equal(left.numpy(), read[:, 0])
    assert np.array_equal(right.numpy(), read[:, 1])
