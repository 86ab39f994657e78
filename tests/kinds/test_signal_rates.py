"""One rate rule for every signal format: a recording within one part per million of the field's
rate is stored as it is; any other is resampled with ``resample: true`` and rejected without it.
Files are written by pyedflib (EDF), soundfile (WAV, FLAC), the csv module and numpy."""

from __future__ import annotations

import json

import h5py
import numpy as np
import pyedflib
import soundfile

from h5forge._format import arrays
from h5forge._format.layout import decode_str

EDF_RATES = {"AT": 1000, "NEAR": 999, "FAR": 975}  # samples per 1-second record


def write_edf(path, seconds=2, rates=EDF_RATES) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    signals = {label: rng.normal(0, 50, seconds * rate) for label, rate in rates.items()}
    w = pyedflib.EdfWriter(str(path), len(rates), file_type=pyedflib.FILETYPE_EDFPLUS)
    w.setSignalHeaders([{"label": label, "dimension": "uV", "sample_frequency": rate, "physical_max": 400,
                         "physical_min": -400, "digital_max": 32767, "digital_min": -32768}
                        for label, rate in rates.items()])
    w.writeSamples([signals[label] for label in rates])
    w.close()
    return signals


def resampled(values: np.ndarray, rate: float, target: float) -> np.ndarray:
    """The linear resampling the rule promises, written out here on its own."""
    t = np.arange(len(values)) / rate
    grid = np.arange(int(np.floor(t[-1] * target)) + 1) / target
    return np.interp(grid, t, values)


def spec_of(root, out, fields) -> dict:
    return {"name": "rates", "source": {"root": str(root)}, "output": {"dir": str(out)},
            "splits": {"ratios": {"train": 1.0}}, "fields": fields}


def stored(path, field) -> dict[str, np.ndarray]:
    with h5py.File(path, "r") as f:
        g = f["train"]
        at = arrays.offsets(g, field)
        return {sid: g[field][at[i]:at[i + 1]] for i, sid in enumerate(decode_str(g["ids"][()]))}


def test_an_edf_channel_0_1_percent_off_the_rate_is_resampled_like_one_2_5_percent_off(tmp_path, build_spec):
    root = tmp_path / "raw"
    (root / "rec").mkdir(parents=True)
    write_edf(root / "rec" / "r.edf")
    edf = pyedflib.EdfReader(str(root / "rec" / "r.edf"))
    read = {label: edf.readSignal(i) for i, label in enumerate(edf.getSignalLabels())}
    edf.close()
    fields = {label.lower(): {"kind": "signal", "files": "rec/*.edf", "channel": label, "rate": 1000,
                              "resample": True, "dtype": "float64"} for label in EDF_RATES}
    path, result = build_spec(spec_of(root, tmp_path / "out", fields))
    assert result.rejections == ()
    assert np.array_equal(stored(path, "at")["r"], read["AT"])  # at the rate: kept as read
    for label, rate in (("NEAR", 999), ("FAR", 975)):
        got = stored(path, label.lower())["r"]
        assert len(got) == len(resampled(read[label], rate, 1000)), label
        assert np.allclose(got, resampled(read[label], rate, 1000)), label
    near = stored(path, "near")["r"]
    assert len(near) == 1999 and len(near) != len(read["NEAR"])  # 1,998 samples at 999 Hz span 1.999 s
    # without resample, any other rate is refused with what the file says
    for spec in fields.values():
        spec["resample"] = False
    write_edf(root / "rec" / "ok.edf", rates={"NEAR": 1000})
    path, result = build_spec(spec_of(root, tmp_path / "out2", {"near": fields["near"]}))
    [rejection] = result.rejections
    assert rejection.sample_id == "r" and rejection.reason == "recorded at 999 Hz, the spec declares 1000 Hz (resample: true converts it)"


def test_audio_csv_and_npy_follow_the_same_rule(tmp_path, build_spec):
    root = tmp_path / "raw"
    for folder in ("wav", "csv", "npy"):
        (root / folder).mkdir(parents=True)
    rng = np.random.default_rng(2)
    tone = {rate: np.sin(np.arange(rate // 10) * 0.05).astype(np.float32) * 0.5 for rate in (8000, 7992)}
    soundfile.write(root / "wav" / "at.wav", tone[8000], 8000, subtype="FLOAT")
    soundfile.write(root / "wav" / "near.flac", tone[7992], 7992, subtype="PCM_24")
    flac, _ = soundfile.read(root / "wav" / "near.flac", dtype="float32")
    values = rng.normal(size=5000)  # 5 s: epoch timestamps (0.24 us apart in float64) give the rate to 0.1 ppm
    for name, rate in (("at", 1000), ("near", 999)):
        times = np.arange(len(values)) / rate + 1.7e9  # epoch seconds: each timestamp rounded to ~0.2 us
        (root / "csv" / f"{name}.csv").write_text(
            "timestamp,v\n" + "".join(f"{t:.6f},{float(v)!r}\n" for t, v in zip(times, values)))
        np.save(root / "npy" / f"{name}.npy", values)
        (root / "npy" / f"{name}.json").write_text(json.dumps({"rate": rate}))
    fields = {"audio": {"kind": "signal", "files": ["wav/*.wav", "wav/*.flac"], "rate": 8000, "resample": True},
              "v": {"kind": "signal", "files": "csv/*.csv", "channel": "v", "rate": 1000, "resample": True,
                    "dtype": "float64"},
              "n": {"kind": "signal", "files": "npy/*.npy", "rate": 1000, "resample": True, "dtype": "float64"}}
    path, result = build_spec(spec_of(root, tmp_path / "out", fields))
    assert result.rejections == ()
    audio = stored(path, "audio")
    assert np.array_equal(audio["at"], tone[8000])
    assert np.allclose(audio["near"], resampled(flac.astype(np.float64), 7992, 8000), atol=1e-6)
    written = np.loadtxt(root / "csv" / "near.csv", delimiter=",", skiprows=1)[:, 0]
    measured = (len(written) - 1) / (written[-1] - written[0])  # the timestamps' rate, 999 to within 0.1 ppm
    assert abs(measured - 999) < 1e-7 * 999
    for field, rate in (("v", measured), ("n", 999)):
        got = stored(path, field)
        assert np.allclose(got["at"], values, rtol=0, atol=1e-12), field  # epoch timestamps: still 1000 Hz
        assert np.allclose(got["near"], resampled(values, rate, 1000), atol=1e-9), field
        assert len(got["near"]) == len(resampled(values, rate, 1000)) == 5005, field


def test_a_csv_time_column_with_a_gap_is_refused_with_where_it_is(tmp_path, build_spec):
    root = tmp_path / "raw"
    (root / "csv").mkdir(parents=True)
    (root / "csv" / "gap.csv").write_text("time,v\n0.000,1\n0.001,2\n0.003,3\n0.004,4\n")
    (root / "csv" / "even.csv").write_text("time,v\n0.000,1\n0.001,2\n0.002,3\n0.003,4\n")
    fields = {"v": {"kind": "signal", "files": "csv/*.csv", "channel": "v", "rate": 1000}}
    path, result = build_spec(spec_of(root, tmp_path / "out", fields))
    assert {r.sample_id: r.reason for r in result.rejections} == {
        "gap": "CSV time column is not evenly spaced: a step of 0.002 s after data line 2, where the mean step is "
               "0.00133333 s (a gap or a jump: one rate cannot describe it)"}
    assert stored(path, "v")["even"].tolist() == [1, 2, 3, 4]


def test_a_npy_sidecar_rate_that_is_no_positive_finite_number_is_refused(tmp_path, build_spec):
    """A ``<stem>.json`` rate of 0, -100, NaN, Infinity or true is no rate: with ``resample: true`` such
    a rate used to store 0 or 1 samples of 512 (or fail on a division by zero), and NaN passed for the
    field's rate. Each is refused with what the sidecar says; a good one beside them is stored as read."""
    from sklearn.datasets import load_digits

    root = tmp_path / "raw"
    (root / "npy").mkdir(parents=True)
    digits = load_digits().data
    sidecars = {"good": "100", "half": "50", "zero": "0", "neg": "-100", "nan": "NaN", "inf": "Infinity", "yes": "true"}
    values = {}
    for k, (name, rate) in enumerate(sidecars.items()):
        values[name] = digits[8 * k:8 * k + 8].ravel()
        np.save(root / "npy" / f"{name}.npy", values[name])
        (root / "npy" / f"{name}.json").write_text('{"rate": %s}' % rate)
    fields = {"s": {"kind": "signal", "files": "npy/*.npy", "rate": 100, "resample": True, "dtype": "float64"}}
    path, result = build_spec(spec_of(root, tmp_path / "out", fields))
    reasons = {r.sample_id: (r.path, r.reason) for r in result.rejections}
    assert set(reasons) == {"zero", "neg", "nan", "inf", "yes"}
    for name in reasons:
        assert reasons[name] == (f"npy/{name}.json", f"sidecar rate must be a positive finite number of samples a "
                                                     f"second; it is {sidecars[name]}"), reasons[name]
    got = stored(path, "s")
    assert set(got) == {"good", "half"}
    assert np.array_equal(got["good"], values["good"])
    assert np.allclose(got["half"], resampled(values["half"], 50, 100))
