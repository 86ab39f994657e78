"""``kind: signal``: one channel of a recording, of any length, at a declared sampling rate.

    fields:
      acc:  {kind: signal, files: "recordings/*.edf", channel: ACC, rate: 10000}
      temp: {kind: signal, files: "recordings/*.edf", channel: TEMP, rate: 1}

Channels at different rates are different fields (they pair up by the file's stem, so several
fields may read the same file). Sources: an EDF/BDF file (pyedflib; ``channel`` is its label, the
rate its header's), a CSV with a time column (``channel`` is the column; the rate is measured from
the time column), a ``.npy`` holding the one channel (the rate is the spec's, or the ``rate``
of a ``<stem>.json`` beside it), or a WAV/FLAC/Ogg file (soundfile; ``channel`` is an index, 0 the
first or left one, optional for a mono file; integer PCM is read as float in [-1, 1): see
signal_audio.py). A recording whose rate differs from the declared one by more than 0.1 %, or that
lacks the channel, is rejected with what was found (``resample: true`` converts the rate). NaN/inf values are
counted and reject the sample unless ``nonfinite: keep``.
Stored ragged: the samples of every recording of a split end to end (float32 by default), plus
each recording's length; the rate and channel are dataset attributes. Statistics: count, mean
and std of the values per split. Readers return a 1-D array per sample, batched as padded values
plus lengths.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any, Literal

import h5py
import numpy as np
from pydantic import Field

from h5forge.format.arrays import LENGTHS, Ragged, Stored
from h5forge.format.codecs import CodecName
from h5forge.kinds.base import (
    DEFAULT_MAX_BYTES,
    Decoded,
    Demo,
    Detector,
    FieldKind,
    Globs,
    ReadOption,
    ReadOptions,
    StrictModel,
    read_source,
)
from h5forge.kinds.signal_audio import AUDIO_SUFFIXES, from_audio
from h5forge.samples import Reject, SampleRef

RATE_TOLERANCE = 1e-3
DEFAULT_MAX_DECODED_SIGNAL = 2 << 30  # e.g. 4 channels of an hour at 48 kHz, decoded as float32
TIME_COLUMNS = ("time", "t", "timestamp", "seconds", "time_s")


class SignalField(StrictModel):
    """One channel of a recording."""

    kind: Literal["signal"] = "signal"
    files: Globs
    rate: float = Field(gt=0, description="samples per second the recording must have")
    channel: str | int | None = Field(
        None,
        description="EDF label or CSV column; for WAV/FLAC/Ogg the index (0 is the first, left in stereo), "
        "optional for mono files; a .npy file holds one channel",
    )
    dtype: Literal["float32", "float64", "int16", "int32"] = "float32"
    nonfinite: Literal["reject", "keep"] = "reject"
    resample: bool = Field(False, description="resample (linear) a recording at another rate instead of rejecting it")
    max_samples: int = Field(500_000_000, gt=0, description="longer recordings are rejected before reading")
    max_bytes: int = Field(DEFAULT_MAX_BYTES, gt=0, description="a file larger than this is rejected unread")
    max_decoded_bytes: int = Field(
        DEFAULT_MAX_DECODED_SIGNAL,
        gt=0,
        description="an audio file whose frames x channels x 4 bytes, as its header declares them, "
        "exceed this is rejected before any sample is decoded (every channel is decoded as float32)",
    )
    codec: CodecName = Field(
        "bitshuffle-lz4",
        description="measured on 16-bit recordings stored as float32: "
        "0.59 of raw, against 0.98 with lz4 (benchmarks/results/kinds.md)",
    )


def _from_npy(data: bytes, root: Path, rel: str) -> tuple[np.ndarray, float | None]:
    try:
        values = np.load(io.BytesIO(data), allow_pickle=False)
    except ValueError as err:
        raise Reject(rel, f"not a readable .npy array: {err}") from None
    sidecar = root / Path(rel).with_suffix(".json")
    if not sidecar.is_file():
        return values, None
    try:
        meta = json.loads(sidecar.read_text())
        rate = float(meta["rate"])
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as err:
        raise Reject(
            Path(rel).with_suffix(".json").as_posix(),
            f"sidecar must be a JSON object with a numeric rate: {type(err).__name__}: {err}",
        ) from None
    return values, rate


def _from_csv(data: bytes, rel: str, channel: str | int | None) -> tuple[np.ndarray, float]:
    reader = csv.reader(io.StringIO(data.decode("utf-8", errors="replace")))
    rows, lines = [], []  # each row and the line it ends on (a quoted value may span lines)
    for row in reader:
        rows.append(row)
        lines.append(reader.line_num)
    if len(rows) < 3:
        raise Reject(rel, "CSV recording has fewer than two samples")
    header = [h.strip() for h in rows[0]]
    time_col = next((i for i, h in enumerate(header) if h.lower() in TIME_COLUMNS), None)
    if time_col is None:
        raise Reject(rel, f"CSV recording has no time column (one of {', '.join(TIME_COLUMNS)}); columns: {header}")
    if str(channel) not in header:
        raise Reject(rel, f"channel {channel!r} not in the CSV; columns: {header}")
    col = header.index(str(channel))
    values = []
    for row, line in zip(rows[1:], lines[1:]):
        if not row:
            continue
        pair = []
        for i in (time_col, col):
            if i >= len(row):
                raise Reject(rel, f"CSV recording line {line} has no value for column {header[i]!r}")
            try:
                pair.append(float(row[i]))
            except ValueError:
                raise Reject(
                    rel, f"CSV recording line {line}, column {header[i]!r}: {row[i]!r} is not a number"
                ) from None
        values.append(pair)
    table = np.array(values, dtype=np.float64)
    steps = np.diff(table[:, 0])
    if (steps <= 0).any():
        raise Reject(rel, "CSV time column does not increase")
    return table[:, 1], 1.0 / float(np.median(steps))


def _from_edf(root: Path, rel: str, channel: str | int | None) -> tuple[np.ndarray, float]:
    import pyedflib

    try:
        reader = pyedflib.EdfReader(str(root / rel))
    except OSError as err:
        reason = str(err).replace(str(root / rel), "").strip(" :")
        raise Reject(rel, f"not a readable EDF/BDF file: {reason}") from None
    try:
        labels = [label.strip() for label in reader.getSignalLabels()]
        if channel is None or str(channel) not in labels:
            raise Reject(rel, f"channel {channel!r} not in the recording; channels: {labels}")
        i = labels.index(str(channel))
        return reader.readSignal(i), float(reader.getSampleFrequency(i))
    finally:
        reader.close()


def _resampled(values: np.ndarray, rate: float, target: float) -> np.ndarray:
    """Linear interpolation onto the target rate's time grid, over the recording's duration."""
    t = np.arange(len(values)) / rate
    grid = np.arange(int(np.floor(t[-1] * target)) + 1) / target if len(values) else np.zeros(0)
    return np.interp(grid, t, values.astype(np.float64))


PLOT_SIZE = (48, 240)  # (height, width) of a channel's preview plot
PLOT_INK = np.array([30, 90, 200], np.uint8)
PLOT_FRAME = np.array([190, 190, 190], np.uint8)


def trace_plot(values: np.ndarray, size: tuple[int, int] = PLOT_SIZE) -> np.ndarray:
    """(H, W, 3) line plot of a channel on white, inside a 1-pixel grey frame, scaled to its
    finite min..max (NaN/inf values are left out). A recording longer than the plot is wide is
    drawn as a min/max envelope per pixel column, each column also taking the first value of the
    next so the trace is connected: every sample shows, as in a waveform viewer. A shorter one is
    a polyline through its values, spread over the width."""
    h, w = size
    img = np.full((h, w, 3), 255, np.uint8)
    img[[0, -1], :] = PLOT_FRAME
    img[:, [0, -1]] = PLOT_FRAME
    v = np.asarray(values, np.float64)
    at = np.flatnonzero(np.isfinite(v))
    if at.size == 0:
        return img
    lo, hi = v[at].min(), v[at].max()
    cols = w - 2
    # value -> row inside the frame: hi on the top row (1), lo on the bottom one (h - 2)
    rows = 1 + (hi - v[at]) / (hi - lo or 1.0) * (h - 3)
    if at.size > cols:
        spans = []
        for c in range(cols):
            start, stop = np.searchsorted(at, [c * len(v) / cols, (c + 1) * len(v) / cols])
            seg = rows[start : min(at.size, max(stop, start + 1) + 1)]
            spans.append((seg.min(), seg.max()) if seg.size else None)
    else:
        line = np.interp(np.linspace(at[0], at[-1], cols + 1), at, rows)
        spans = [(min(a, b), max(a, b)) for a, b in zip(line[:-1], line[1:])]
    for c, span in enumerate(spans):
        if span is not None:
            img[int(round(span[0])) : int(round(span[1])) + 1, 1 + c] = PLOT_INK
    return img


class SignalKind(FieldKind):
    kind = "signal"
    Spec = SignalField
    detectors = (
        Detector("h5forge.init.edf:detect", 50, "recordings *.edf"),
        Detector("h5forge.init.csv_recordings:detect", 51, "*.csv with a time column"),
        Detector("h5forge.init.npy_channels:detect", 52, "<channel>/*.npy"),
        Detector("h5forge.init.audio:detect", 53, "recordings *.wav, *.flac, *.ogg"),
    )
    demos = (
        Demo(
            "signals", "h5forge.demo.signals:generate_signals", 30, "multi-rate EDF recordings", noun="signals samples"
        ),
    )
    read_options = (
        ReadOption("window", None, "seconds: every time series cut or zero-padded to this duration"),
        ReadOption("window_offset", 0.0, "seconds from the start where the window begins"),
    )
    rate_tolerance = RATE_TOLERANCE  # for init's detectors, which take the kind's rules from the kind
    time_columns = TIME_COLUMNS
    audio_suffixes = AUDIO_SUFFIXES
    layout_doc = (
        "ragged: (total samples,) of the split's recordings end to end, plus <field>_lengths (N,); "
        "dataset attrs rate, channel; split attrs <field>_count, <field>_mean, <field>_std (of the "
        "finite values: NaN/inf kept with nonfinite: keep are the sum of the lengths minus the count)"
    )

    def stored(self) -> Stored:
        return Stored((), np.dtype(self.spec.dtype), bulk=True, ragged=True, codec=self.spec.codec)

    @classmethod
    def check_spec(cls, name: str, spec: SignalField, dataset: Any) -> None:
        globs = (spec.files,) if isinstance(spec.files, str) else spec.files
        if spec.channel is None and any(not g.lower().endswith((".npy", *AUDIO_SUFFIXES)) for g in globs):
            raise ValueError(f"fields.{name}.channel: needed for EDF and CSV recordings")
        audio = any(g.lower().endswith(AUDIO_SUFFIXES) for g in globs)
        if audio and isinstance(spec.channel, str) and not spec.channel.isdigit():
            raise ValueError(
                f"fields.{name}.channel: {spec.channel!r} is a name, but audio channels have none; "
                "give the index (0 is the first, left in stereo)"
            )
        if audio and spec.dtype.startswith("int"):
            raise ValueError(
                f"fields.{name}.dtype: audio is read as float in [-1, 1]; {spec.dtype} would round it to 0 "
                "(float32 or float64)"
            )

    def dataset_attrs(self) -> dict[str, Any]:
        channel = self.spec.channel
        return {"rate": self.spec.rate, **({"channel": channel} if channel is not None else {})}

    def decode(self, root: Path, ref: SampleRef, done: dict[str, Decoded]) -> Decoded:
        f, rel = self.spec, ref.files[self.name]
        size = (root / rel).stat().st_size if (root / rel).exists() else 0
        if size > 16 * f.max_samples:
            raise Reject(rel, f"file of {size:,} bytes exceeds max_samples {f.max_samples:,}")
        data, digest = read_source(root, rel, f.max_bytes)
        suffix = Path(rel).suffix.lower()
        if suffix == ".npy":
            values, rate = _from_npy(data, root, rel)
            rate = f.rate if rate is None else float(rate)
        elif suffix == ".csv":
            values, rate = _from_csv(data, rel, f.channel)
        elif suffix in (".edf", ".bdf"):
            values, rate = _from_edf(root, rel, f.channel)
        elif suffix in AUDIO_SUFFIXES:
            values, rate = from_audio(data, rel, f.channel, f.max_samples, f.max_decoded_bytes)
        else:
            raise Reject(rel, f"unknown recording format {suffix!r} (EDF/BDF, CSV, .npy, WAV, FLAC or Ogg)")
        values = np.asarray(values)
        if values.ndim != 1 or values.dtype.kind not in "iuf":
            raise Reject(rel, f"a channel must be one row of numbers; found shape {values.shape}, dtype {values.dtype}")
        if abs(rate - f.rate) > RATE_TOLERANCE * f.rate:
            if not f.resample:
                raise Reject(
                    rel, f"recorded at {rate:g} Hz, the spec declares {f.rate:g} Hz (resample: true converts it)"
                )
            values = _resampled(values, rate, f.rate)
        bad = int(np.count_nonzero(~np.isfinite(values))) if values.dtype.kind == "f" else 0
        if bad and f.nonfinite == "reject":
            raise Reject(
                rel,
                f"{bad} NaN/inf value(s) in channel {self.name if f.channel is None else f.channel!r} "
                "(nonfinite: keep stores them)",
            )
        return Decoded(values.astype(f.dtype, copy=False), digest)

    # ---- statistics: count, sum, sum of squares of the finite values
    def counts(self, block: Ragged) -> np.ndarray:
        v = block.values.astype(np.float64)
        v = v[np.isfinite(v)]
        return np.array([v.size, v.sum(), np.square(v).sum()])

    def write_stats(self, group: h5py.Group, counts: np.ndarray | None) -> None:
        n, s, s2 = (0.0, 0.0, 0.0) if counts is None else counts
        mean = s / n if n else 0.0
        group.attrs[f"{self.name}_count"] = int(n)
        group.attrs[f"{self.name}_mean"] = mean
        group.attrs[f"{self.name}_std"] = float(np.sqrt(max(s2 / n - mean**2, 0.0))) if n else 0.0
        group.attrs[f"{self.name}_sums"] = np.array([n, s, s2])

    def stored_counts(self, group: h5py.Group) -> np.ndarray:
        return np.asarray(group.attrs[f"{self.name}_sums"], np.float64)

    def stats_attrs(self) -> tuple[str, ...]:
        return tuple(f"{self.name}_{w}" for w in ("count", "mean", "std", "sums"))

    def nonfinite(self, group: h5py.Group) -> int:
        """The NaN/inf values kept (``nonfinite: keep``): the statistics count the finite ones."""
        if np.dtype(self.spec.dtype).kind != "f":
            return 0
        return int(group[self.name + LENGTHS][()].sum()) - int(group.attrs[f"{self.name}_count"])

    def output_dtype(self, opts: ReadOptions) -> np.dtype:
        return np.dtype(self.spec.dtype)

    def windowed(self, row: np.ndarray, opts: ReadOptions) -> np.ndarray:
        """``window`` seconds from ``window_offset``, zero-padded: every channel covers the same span
        of time, whatever its rate."""
        window, offset = self.option(opts, "window"), self.option(opts, "window_offset")
        if window is None:
            return row
        start, n = int(round(offset * self.spec.rate)), int(round(window * self.spec.rate))
        piece = row[start : start + n]
        return piece if len(piece) == n else np.concatenate([piece, np.zeros(n - len(piece), row.dtype)])

    # ---- preview: a small line plot per channel (each channel is a field)
    def preview(self, value: Any) -> np.ndarray:
        return trace_plot(np.asarray(value))

    def caption(self, value: Any) -> str:
        n = len(value)
        return f"{self.name}: {n / self.spec.rate:.4g} s at {self.spec.rate:g} Hz"
