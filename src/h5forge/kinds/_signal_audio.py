"""The signal kind's audio recordings: WAV, FLAC and Ogg files read with soundfile (libsndfile).

``channel`` is an index (0 is the first, left in stereo); without one the file must be mono.
Samples are read as float32, integer PCM scaled to [-1, 1) by libsndfile. Before any sample is
decoded, a WAV declaring more bytes than it holds (libsndfile would quietly read the rest), a file
over ``max_decoded_bytes`` as its header declares it, and a FLAC without a length are rejected;
an Ogg stream cut short is read up to where it ends.
"""

from __future__ import annotations

import io
import struct

import numpy as np

from h5forge._samples import Reject

AUDIO_SUFFIXES = (".wav", ".flac", ".ogg")
DECODED_SAMPLE_BYTES = 4  # every channel of a file is decoded as float32 before one is kept
UNKNOWN_FRAMES = 2**62  # libsndfile's count for a stream whose header gives no length (SF_COUNT_MAX)


def wav_size_problem(data: bytes) -> str | None:
    """Why a RIFF/RIFX WAV's ``data`` chunk declares more bytes than the file holds (a truncated
    file, or a header promising more than is there), or None."""
    if data[:4] not in (b"RIFF", b"RIFX") or data[8:12] != b"WAVE":
        return None  # RF64, W64 or not a WAV: libsndfile checks those
    order = "<" if data[:4] == b"RIFF" else ">"
    pos = 12
    while pos + 8 <= len(data):
        chunk, size = data[pos : pos + 4], struct.unpack(order + "I", data[pos + 4 : pos + 8])[0]
        if chunk == b"data":
            held = len(data) - pos - 8
            if size > held:
                return f"its header declares {size:,} bytes of samples, the file holds {held:,} (truncated?)"
            return None
        pos += 8 + size + (size & 1)  # chunks are padded to an even size
    return None


def channel_index(channel: str | int | None, channels: int, rel: str) -> int:
    """The index of the channel a field reads from a file with ``channels`` channels."""
    if channel is None:
        if channels != 1:
            raise Reject(rel, f"the recording has {channels} channels; pick one with channel: 0 to {channels - 1}")
        return 0
    if isinstance(channel, str) and not channel.isdigit():
        raise Reject(rel, f"channel {channel!r}: audio channels have no names; give an index, 0 to {channels - 1}")
    index = int(channel)
    if not 0 <= index < channels:
        raise Reject(rel, f"channel {index} not in the recording: it has {channels} channel(s), 0 to {channels - 1}")
    return index


def from_audio(
    data: bytes, rel: str, channel: str | int | None, max_samples: int, max_decoded: int
) -> tuple[np.ndarray, float]:
    """One channel of a WAV/FLAC/Ogg recording as float32, and the file's sampling rate."""
    import soundfile

    problem = wav_size_problem(data)
    if problem:
        raise Reject(rel, problem)
    try:
        sound = soundfile.SoundFile(io.BytesIO(data))
    except (soundfile.LibsndfileError, RuntimeError) as err:
        why = getattr(err, "error_string", None) or "format not recognised"
        raise Reject(rel, f"not a readable audio file (WAV, FLAC or Ogg): {why.rstrip('.')}") from None
    with sound:
        frames, channels, rate = sound.frames, sound.channels, float(sound.samplerate)
        index = channel_index(channel, channels, rel)
        if frames >= UNKNOWN_FRAMES:
            raise Reject(
                rel, "its header does not give its length, so its decoded size cannot be checked before decoding"
            )
        if frames == 0:
            raise Reject(rel, "the file holds no audio samples (empty or cut short)")
        if frames > max_samples:
            raise Reject(
                rel, f"its header declares {frames:,} samples per channel, more than max_samples {max_samples:,}"
            )
        decoded = frames * channels * DECODED_SAMPLE_BYTES
        if decoded > max_decoded:
            raise Reject(
                rel,
                f"{frames:,} frames of {channels} channel(s) would take {decoded:,} bytes decoded, more than "
                f"max_decoded_bytes {max_decoded:,}; rejected before decoding",
            )
        try:
            values = sound.read(frames, dtype="float32", always_2d=True)
        except (soundfile.LibsndfileError, RuntimeError) as err:
            why = (getattr(err, "error_string", None) or str(err)).removeprefix("Error : ").rstrip(".")
            raise Reject(rel, f"the audio cannot be decoded ({why}): truncated or damaged?") from None
    if len(values) != frames:
        raise Reject(rel, f"its header declares {frames:,} frames, the file holds {len(values):,} (truncated?)")
    return np.ascontiguousarray(values[:, index]), rate
