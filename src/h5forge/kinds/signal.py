"""``kind: signal``: one channel of a recording, of any length, at a declared sampling rate.

    fields:
      acc:  {kind: signal, files: "recordings/*.edf", channel: ACC, rate: 10000}
      temp: {kind: signal, files: "recordings/*.edf", channel: TEMP, rate: 1}

Channels at different rates are different fields, paired by the file's stem. Sources: EDF/BDF
(``channel`` is a label), a CSV with a time column (``channel`` is a column; the rate is measured
from evenly spaced timestamps), a ``.npy`` of the one channel (the rate is the spec's, or that of
a ``<stem>.json`` beside it), WAV/FLAC/Ogg (``channel`` is an index; _signal_audio.py); an EDF
label or CSV column that names two signals is refused, never read as the first. A
recording is at the declared ``rate`` when its own is within ``RATE_TOLERANCE`` of it (rounding
only); any other rate is resampled with ``resample: true``, else rejected. NaN/inf values reject
the sample unless ``nonfinite: keep``, and so do values the field's ``dtype`` cannot hold (a
fraction or 40000 in int16, 1e39 in float32: never wrapped, cut or made inf), and float32 must
keep an integer channel exact and round a float one by less than half its median step
(``float32_loss``, on the values as recorded, before any resampling). Stored ragged, the rate and channel as dataset attributes;
readers return a 1-D array per sample, batched as padded values plus lengths.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
from array import array
from pathlib import Path
from typing import Any, Literal

import h5py
import numpy as np
from pydantic import Field

from h5forge._format.arrays import LENGTHS, Ragged, Stored
from h5forge._format.codecs import CodecName
from h5forge.kinds.base import DEFAULT_MAX_BYTES, Decoded, FieldKind, FieldModel, Globs, read_source, stored_as
from h5forge.kinds.plugins import Demo, Detector, Plugins
from h5forge.kinds.preview import Preview
from h5forge.kinds.reading import ReadOption, ReadOptions
from h5forge.kinds._signal_audio import AUDIO_SUFFIXES, from_audio
from h5forge.kinds._signal_values import float32_loss
from h5forge.kinds.statistics import FloatSums
from h5forge._samples import Reject, SampleRef

RATE_TOLERANCE = 1e-6  # relative: a rate this close to the declared one is that rate (rounding only)
UNEVEN_STEP = 0.5  # a CSV time step this far (relative) from the mean step is a gap
TIME_COLUMNS = ("time", "t", "timestamp", "seconds", "time_s")
DEFAULT_MAX_DECODED_SIGNAL = 1 << 30  # 128 M samples: one channel of the largest EDF max_bytes lets in
DECODED_SAMPLE_BYTES = 8  # samples are decoded (and resampled) in float64
DEFAULT_MAX_COLUMNS = 10_000
SHOWN_VALUE = 40  # characters of a bad CSV value quoted in a rejection


class SignalField(FieldModel):
    """One channel of a recording."""

    kind: Literal["signal"] = "signal"
    files: Globs
    rate: float = Field(gt=0, description="samples per second the recording must have")
    channel: str | int | None = Field(None, description="EDF label, CSV column or audio channel index (0: left)")
    dtype: Literal["float32", "float64", "int16", "int32"] = "float32"
    nonfinite: Literal["reject", "keep"] = "reject"
    resample: bool = Field(False, description="resample (linear) a recording at another rate instead of rejecting it")
    max_samples: int = Field(500_000_000, gt=0, description="longer recordings are rejected before reading")
    max_bytes: int = Field(DEFAULT_MAX_BYTES, gt=0, description="a larger file is rejected unread")
    max_decoded_bytes: int = Field(
        DEFAULT_MAX_DECODED_SIGNAL, gt=0, description="a channel larger decoded (8 bytes a sample) is rejected unread"
    )
    max_columns: int = Field(
        DEFAULT_MAX_COLUMNS, gt=0, description="a CSV recording with more columns (header or any line) is rejected"
    )
    codec: CodecName = Field(
        "bitshuffle-lz4",
        description="measured on 16-bit recordings stored as float32: "
        "0.59 of raw, against 0.98 with lz4 (benchmarks/results/kinds.md)",
    )


def _too_large(rel: str, declared: str, samples: int, max_decoded: int) -> Reject:
    """``declared``: what says how many samples there are (a header, or the lines parsed so far)."""
    return Reject(
        rel,
        f"{declared}, {samples * DECODED_SAMPLE_BYTES:,} bytes decoded, more than the field's limit of "
        f"{max_decoded:,} (max_decoded_bytes)",
    )


def _from_npy(data: bytes, rel: str, max_decoded: int) -> np.ndarray:
    """The channel of a .npy file (a view of its bytes), its header checked before any value is
    read: one row of numbers, within ``max_decoded`` bytes, no more values than the file holds."""
    fh = io.BytesIO(data)
    try:
        version = np.lib.format.read_magic(fh)
        if version == (1, 0):
            shape, _, dtype = np.lib.format.read_array_header_1_0(fh)
        elif version == (2, 0):
            shape, _, dtype = np.lib.format.read_array_header_2_0(fh)
        else:
            raise ValueError(f".npy format version {version[0]}.{version[1]} is not read (1.0 and 2.0 are)")
    except ValueError as err:
        raise Reject(rel, f"not a readable .npy array: {err}") from None
    if len(shape) != 1 or dtype.kind not in "iuf":
        raise Reject(rel, f"a channel must be one row of numbers; found shape {shape}, dtype {dtype}")
    n, offset = int(shape[0]), fh.tell()
    if n * DECODED_SAMPLE_BYTES > max_decoded:
        raise _too_large(rel, f"the header declares {n:,} samples", n, max_decoded)
    if n * dtype.itemsize > len(data) - offset:
        raise Reject(
            rel, f"the header declares {n * dtype.itemsize:,} bytes of values, the file holds {len(data) - offset:,}"
        )
    return np.frombuffer(data, dtype, n, offset)


def rate_sidecar(root: Path, rel: str) -> str | None:
    """The ``<stem>.json`` beside a .npy channel (relative to ``root``) when there is one."""
    if Path(rel).suffix.lower() != ".npy":
        return None
    side = Path(rel).with_suffix(".json").as_posix()
    return side if (root / side).is_symlink() or (root / side).exists() else None


def with_sidecar(digest: str, sidecar_digest: str | None) -> str:
    """A .npy channel's digest: its own, and its rate sidecar's when it has one (the rate decides
    the stored values as much as the array: ``resample``, or a refusal)."""
    if sidecar_digest is None or not digest:
        return digest
    return hashlib.sha256(f"{digest}+rate:{sidecar_digest}".encode()).hexdigest()


def _sidecar_rate(root: Path, rel: str, max_bytes: int) -> tuple[float | None, str | None]:
    """The ``rate`` of the ``<stem>.json`` beside a .npy channel (read as the channel is) and the
    sidecar's sha256, or (None, None)."""
    side = rate_sidecar(root, rel)
    if side is None:
        return None, None
    data, digest = read_source(root, side, max_bytes)
    try:
        said = json.loads(data)["rate"]
        rate = float(said)
    except (ValueError, KeyError, TypeError, UnicodeDecodeError, RecursionError) as err:
        why = "it is nested too deeply to read" if isinstance(err, RecursionError) else f"{type(err).__name__}: {err}"
        raise Reject(side, f"sidecar must be a JSON object with a numeric rate: {why}") from None
    # NaN would pass for any rate, and 0, a negative or an infinite rate resample to nothing
    if isinstance(said, bool) or not (np.isfinite(rate) and rate > 0):
        raise Reject(
            side, f"sidecar rate must be a positive finite number of samples a second; it is {json.dumps(said)}"
        )
    return rate, digest


def _shown(value: str) -> str:
    return repr(value if len(value) <= SHOWN_VALUE else value[:SHOWN_VALUE] + "…")


def _from_csv(
    data: bytes, rel: str, channel: str | int | None, max_columns: int, max_decoded: int
) -> tuple[np.ndarray, float]:
    """The channel and the rate of a CSV recording, parsed a line at a time keeping two numbers
    per line; a line of more than ``max_columns`` values is rejected before it is split."""
    end = data.find(b"\n")
    columns = data.count(b",", 0, len(data) if end < 0 else end) + 1
    if columns > max_columns:
        raise Reject(
            rel,
            f"CSV recording has {columns:,} columns in its header, more than the field's limit of {max_columns:,} "
            "(max_columns)",
        )

    def lines():
        for number, line in enumerate(io.TextIOWrapper(io.BytesIO(data), "utf-8", "replace", newline=""), 1):
            if (values := line.count(",") + 1) > max_columns:
                raise Reject(
                    rel,
                    f"CSV recording line {number} has {values:,} values, more than the field's limit of "
                    f"{max_columns:,} (max_columns)",
                )
            yield line

    reader = csv.reader(lines())
    times, values = array("d"), array("d")
    limit = max_decoded // DECODED_SAMPLE_BYTES
    try:
        header = [h.strip() for h in next(reader, [])]
        time_col = next((i for i, h in enumerate(header) if h.lower() in TIME_COLUMNS), None)
        if time_col is None:
            raise Reject(rel, f"CSV recording has no time column (one of {', '.join(TIME_COLUMNS)}); columns: {header}")
        if str(channel) not in header:
            raise Reject(rel, f"channel {channel!r} not in the CSV; columns: {header}")
        col = _only(header, str(channel), rel, "columns of the CSV", "columns")
        for row in reader:
            if not row:
                continue
            for i, into in ((time_col, times), (col, values)):
                if i >= len(row):
                    raise Reject(rel, f"CSV recording line {reader.line_num} has no value for column {header[i]!r}")
                try:
                    into.append(float(row[i]))
                except ValueError:
                    raise Reject(
                        rel,
                        f"CSV recording line {reader.line_num}, column {header[i]!r}: {_shown(row[i])} is not a number",
                    ) from None
            if len(values) > limit:
                raise _too_large(rel, f"the CSV recording holds more than {limit:,} samples", limit, max_decoded)
    except csv.Error as err:
        raise Reject(rel, f"CSV recording line {reader.line_num} is not readable CSV: {err}") from None
    if len(values) < 2:
        raise Reject(rel, "CSV recording has fewer than two samples")
    return np.frombuffer(values, np.float64), _csv_rate(np.frombuffer(times, np.float64), rel)


def _only(names: list[str], channel: str, rel: str, what: str, unit: str) -> int:
    """The index of the one ``channel`` in ``names``; two of that name leave the channel unknown."""
    at = [i for i, name in enumerate(names) if name == channel]
    if len(at) > 1:
        listed = ", ".join(str(i + 1) for i in at[:-1]) + f" and {at[-1] + 1}"
        raise Reject(
            rel, f"channel {channel!r} names {len(at)} {what} ({unit} {listed}): which one is meant cannot be told"
        )
    return at[0]


def _csv_rate(times: np.ndarray, rel: str) -> float:
    """Samples per second over the time column's span (a timestamp's rounding then weighs little),
    once the timestamps are known to be evenly spaced."""
    steps = np.diff(times)
    if (steps <= 0).any():
        raise Reject(rel, "CSV time column does not increase")
    mean = float(times[-1] - times[0]) / len(steps)
    uneven = np.flatnonzero(np.abs(steps - mean) >= UNEVEN_STEP * mean)
    if uneven.size:
        k = int(uneven[0])
        raise Reject(
            rel,
            f"CSV time column is not evenly spaced: a step of {steps[k]:.6g} s after data line {k + 1}, where the "
            f"mean step is {mean:.6g} s (a gap or a jump: one rate cannot describe it)",
        )
    return 1.0 / mean


EDF_SIGNAL_FIELDS = 216  # bytes of a signal's header fields before its samples per record


def _check_edf_header(data: bytes, rel: str, channel: str | int | None, max_decoded: int) -> None:
    """Before pyedflib reads it, reject an EDF/BDF file whose header declares more samples of
    ``channel`` than ``max_decoded`` allows, or more data records than the file holds."""

    def number(at: int, width: int, what: str) -> int:
        raw = data[at : at + width]
        try:
            return int(raw.decode("ascii").strip())
        except ValueError:
            raise Reject(rel, f"not a readable EDF/BDF file: its header's {what} is not a number ({raw!r})") from None

    if len(data) < 256:
        raise Reject(rel, f"not a readable EDF/BDF file: {len(data):,} bytes, shorter than its 256-byte header")
    records, ns = number(236, 8, "number of data records"), number(252, 4, "number of signals")
    header = 256 * (1 + ns)
    if ns <= 0 or records < 0 or len(data) < header:
        raise Reject(rel, f"not a readable EDF/BDF file: a header of {ns} signals and {records} data records")
    labels = [data[256 + 16 * i : 272 + 16 * i].decode("latin-1").strip() for i in range(ns)]
    at = 256 + ns * EDF_SIGNAL_FIELDS
    per_record = [number(at + 8 * i, 8, f"samples per record of signal {i + 1}") for i in range(ns)]
    if str(channel) in labels:
        samples = records * per_record[labels.index(str(channel))]
        if samples * DECODED_SAMPLE_BYTES > max_decoded:
            raise _too_large(
                rel, f"the header declares {samples:,} samples of channel {channel!r}", samples, max_decoded
            )
    declared = header + records * sum(per_record) * (3 if data[:1] == b"\xff" else 2)
    if declared > len(data):
        raise Reject(
            rel,
            f"not a readable EDF/BDF file: the header declares {records:,} data records ({declared:,} bytes with the header), "
            f"the file holds {len(data):,}",
        )


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
        i = _only(labels, str(channel), rel, "signals of the recording", "signals")
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
    """(H, W, 3) line plot of a channel's finite values, framed, scaled to their min..max: a
    connected min/max envelope per pixel column when there are more samples than columns (every
    sample shows), else a polyline spread over the width."""
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


class SignalKind(Plugins, FloatSums, Preview, FieldKind[SignalField]):
    kind = "signal"
    Spec = SignalField
    detectors = (
        Detector("h5forge._init.edf:detect", 50, "recordings *.edf"),
        Detector("h5forge._init.csv_recordings:detect", 51, "*.csv with a time column"),
        Detector("h5forge._init.npy_channels:detect", 52, "<channel>/*.npy"),
        Detector("h5forge._init.audio:detect", 53, "recordings *.wav, *.flac, *.ogg"),
    )
    demos = (
        Demo(
            "signals", "h5forge._demo.signals:generate_signals", 30, "multi-rate EDF recordings", noun="signals samples"
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
        "finite values: NaN/inf kept with nonfinite: keep are the sum of the lengths minus the count), "
        "<field>_sums (3,) float64 count, sum, sum of squares, and <field>_sums_exact: the same sums "
        "exactly, as text (see Split statistics below)"
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

    def source_digest(self, root: Path, rel: str) -> str:
        side = rate_sidecar(root, rel)
        digest = super().source_digest(root, rel)
        return digest if side is None else with_sidecar(digest, read_source(root, side, self.spec.max_bytes)[1])

    def files_beside(self, root: Path, rel: str) -> tuple[str, ...]:
        side = rate_sidecar(root, rel)
        return () if side is None else (side,)

    def decode(self, root: Path, ref: SampleRef, done: dict[str, Decoded]) -> Decoded:
        f, rel = self.spec, ref.files[self.name]
        size = (root / rel).stat().st_size if (root / rel).exists() else 0
        if size > 16 * f.max_samples:
            raise Reject(rel, f"file of {size:,} bytes exceeds max_samples {f.max_samples:,}")
        data, digest = read_source(root, rel, f.max_bytes)
        suffix = Path(rel).suffix.lower()
        if suffix == ".npy":
            values = _from_npy(data, rel, f.max_decoded_bytes)
            rate, side_digest = _sidecar_rate(root, rel, f.max_bytes)
            rate = f.rate if rate is None else rate
            digest = with_sidecar(digest, side_digest)
        elif suffix == ".csv":
            values, rate = _from_csv(data, rel, f.channel, f.max_columns, f.max_decoded_bytes)
        elif suffix in (".edf", ".bdf"):
            _check_edf_header(data, rel, f.channel, f.max_decoded_bytes)
            del data  # pyedflib reads the file itself
            values, rate = _from_edf(root, rel, f.channel)
        elif suffix in AUDIO_SUFFIXES:
            values, rate = from_audio(data, rel, f.channel, f.max_samples, f.max_decoded_bytes)
        else:
            raise Reject(rel, f"unknown recording format {suffix!r} (EDF/BDF, CSV, .npy, WAV, FLAC or Ogg)")
        values = np.asarray(values)
        if values.ndim != 1 or values.dtype.kind not in "iuf":
            raise Reject(rel, f"a channel must be one row of numbers; found shape {values.shape}, dtype {values.dtype}")
        recorded = values  # what float32 must keep: the recording's values, not those interpolated between them
        if abs(rate - f.rate) > RATE_TOLERANCE * f.rate:  # the one rule: any other rate is resampled or refused
            if not f.resample:
                raise Reject(
                    rel, f"recorded at {rate:.10g} Hz, the spec declares {f.rate:g} Hz (resample: true converts it)"
                )
            if (n := int(len(values) * f.rate / rate)) * DECODED_SAMPLE_BYTES > f.max_decoded_bytes:
                raise _too_large(
                    rel, f"resampled to {f.rate:g} Hz, the recording would hold {n:,} samples", n, f.max_decoded_bytes
                )
            values = _resampled(values, rate, f.rate)
        bad = int(np.count_nonzero(~np.isfinite(values))) if values.dtype.kind == "f" else 0
        if bad and f.nonfinite == "reject":
            raise Reject(
                rel,
                f"{bad} NaN/inf value(s) in channel {self.name if f.channel is None else f.channel!r} "
                "(nonfinite: keep stores them)",
            )
        stored = stored_as(values, f.dtype, rel)
        if f.dtype == "float32":
            kept = stored if recorded is values else stored_as(recorded, f.dtype, rel)
            if lost := float32_loss(recorded, kept):
                raise Reject(rel, lost)
        return Decoded(stored, digest)

    # ---- statistics: count, sum, sum of squares of the finite values, each row's summed alone
    # and the rows added exactly (FloatSums), so every way of building the rows stores the same
    n_sums = 3

    def _finite(self, values: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The values as float64 with NaN/inf as 0 (which adds nothing), which are finite, their squares."""
        v = values.astype(np.float64)  # a copy, even of float64 values
        finite = np.isfinite(v)
        v[~finite] = 0.0
        with np.errstate(over="ignore"):  # a square beyond float64 is inf: FloatSums adds that row exactly
            return v, finite, np.square(v)

    def row_sums(self, block: Ragged) -> np.ndarray:
        v, finite, squares = self._finite(block.values)
        out = np.zeros((len(block), 3))
        rows = np.flatnonzero(block.lengths > 0)
        if rows.size:  # each non-empty row's segment ends where the next one starts
            at = block.offsets[rows]
            out[rows, 0] = np.add.reduceat(finite, at, dtype=np.int64)
            out[rows, 1] = np.add.reduceat(v, at)
            out[rows, 2] = np.add.reduceat(squares, at)
        return out

    def row_terms(self, block: Ragged, row: int) -> tuple[Any, ...]:
        v, finite, squares = self._finite(block[row])
        return int(finite.sum()), v, squares

    def write_sums(self, group: h5py.Group, sums: np.ndarray) -> None:
        n, s, s2 = sums  # numpy floats: sums beyond float64 give inf or NaN statistics, not errors
        with np.errstate(over="ignore", invalid="ignore"):
            mean = s / n if n else 0.0
            std = float(np.sqrt(max(s2 / n - mean**2, 0.0))) if n else 0.0
        group.attrs[f"{self.name}_count"] = int(n)
        group.attrs[f"{self.name}_mean"] = mean
        group.attrs[f"{self.name}_std"] = std

    def stats_attrs(self) -> tuple[str, ...]:
        return tuple(f"{self.name}_{w}" for w in ("count", "mean", "std", "sums"))

    def nonfinite(self, group: h5py.Group) -> int:
        """The NaN/inf values kept (``nonfinite: keep``): the statistics count the finite ones."""
        if np.dtype(self.spec.dtype).kind != "f":
            return 0
        return int(group[self.name + LENGTHS][()].sum()) - int(group.attrs[f"{self.name}_count"])

    def windowed(self, row: np.ndarray, opts: ReadOptions) -> np.ndarray:
        """``window`` seconds from ``window_offset``, zero-padded, whatever the channel's rate."""
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
