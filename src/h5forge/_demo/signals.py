"""The ``signals`` demo: EDF+ recordings written with pyedflib, channels at different rates and of
plausible shape (gait, an ECG-like pulse, a slowly rising temperature), with broken recordings."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

SIGNAL_CHANNELS = {  # label: (rate Hz, unit, physical min, physical max)
    "ACC": (1000, "g", -8.0, 8.0),
    "VOLT": (100, "mV", -5.0, 5.0),
    "TEMP": (1, "degC", 20.0, 45.0),
}


def _channel(rng: np.random.Generator, label: str, seconds: int, rate: int) -> np.ndarray:
    t = np.arange(seconds * rate) / rate
    if label == "ACC":  # gait: ~1.8 Hz steps plus sensor noise
        return 1.0 + 0.6 * np.sin(2 * np.pi * rng.uniform(1.5, 2.1) * t) + rng.normal(0, 0.05, t.size)
    if label == "VOLT":  # an ECG-like pulse train at ~70 bpm
        beat = (t * rng.uniform(1.0, 1.3)) % 1.0
        return (
            1.2 * np.exp(-(((beat - 0.3) / 0.02) ** 2))
            - 0.2 * np.exp(-(((beat - 0.55) / 0.06) ** 2))
            + rng.normal(0, 0.02, t.size)
        )
    return rng.uniform(36.2, 37.0) + 0.05 * t / max(seconds, 1) + rng.normal(0, 0.01, t.size)


def _write_edf(path: Path, rng: np.random.Generator, seconds: int, channels: dict[str, int], start: int) -> None:
    import datetime

    import pyedflib

    w = pyedflib.EdfWriter(str(path), len(channels), file_type=pyedflib.FILETYPE_EDFPLUS)
    try:
        headers: list[dict[str, Any]] = []
        for label, rate in channels.items():
            _, unit, lo, hi = SIGNAL_CHANNELS[label]
            headers.append(
                {
                    "label": label,
                    "dimension": unit,
                    "sample_frequency": rate,
                    "physical_min": lo,
                    "physical_max": hi,
                    "digital_min": -32768,
                    "digital_max": 32767,
                }
            )
        w.setSignalHeaders(headers)
        w.setStartdatetime(datetime.datetime(2024, 3, 1, 8, 0, 0) + datetime.timedelta(hours=start))
        w.writeSamples(
            [
                np.clip(_channel(rng, label, seconds, rate), SIGNAL_CHANNELS[label][2], SIGNAL_CHANNELS[label][3])
                for label, rate in channels.items()
            ]
        )
    finally:
        w.close()


def generate_signals(
    root: str | Path,
    n: int = 8,
    seed: int = 0,
    bad: bool = True,
    prefix: str = "rec_",
    seconds_range: tuple[int, int] = (2, 10),
) -> dict[str, str]:
    """``n`` good EDF+ recordings ROOT/<prefix>NNN.edf (ACC 1000 Hz, VOLT 100 Hz, TEMP 1 Hz, 2-10 s),
    plus (``bad``) one with ACC at 500 Hz, one without TEMP and one truncated file."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    rates = {label: spec[0] for label, spec in SIGNAL_CHANNELS.items()}
    for i in range(n):
        rng = np.random.default_rng([seed, i])
        _write_edf(
            root / f"{prefix}{i:03d}.edf", rng, int(rng.integers(seconds_range[0], seconds_range[1] + 1)), rates, i
        )
    defects: dict[str, str] = {}
    if bad:
        rng = np.random.default_rng([seed, 1_000_003])
        _write_edf(root / f"{prefix}bad_rate.edf", rng, 4, {**rates, "ACC": 500}, n)
        defects[f"{prefix}bad_rate.edf"] = "ACC recorded at 500 Hz, not 1000 Hz"
        _write_edf(root / f"{prefix}no_temp.edf", rng, 3, {k: v for k, v in rates.items() if k != "TEMP"}, n + 1)
        defects[f"{prefix}no_temp.edf"] = "the TEMP channel is missing"
        path = root / f"{prefix}truncated.edf"
        _write_edf(path, rng, 5, rates, n + 2)
        data = path.read_bytes()
        path.write_bytes(data[: len(data) * 2 // 3])
        defects[f"{prefix}truncated.edf"] = "truncated: the last third of the file is cut off"
    return defects
