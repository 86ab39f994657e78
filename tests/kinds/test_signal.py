"""Signals: pyedflib's real EDF recording read as a sample, multi-rate recordings written with
pyedflib's writer, CSV and .npy channels; stored ragged, values equal to pyedflib's readSignal,
and read back padded with their lengths."""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

import h5py
import numpy as np
import pyedflib
import pyedflib.data
import pytest
import torch

from h5forge._format import arrays
from h5forge._format.layout import decode_str
from h5forge.read.torch import H5Dataset

RATES = {"ACC": 1000, "VOLT": 100, "TEMP": 1}


def write_edf(path: Path, seconds: int, seed: int, rates=RATES) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    signals = {label: rng.normal(0, 50, seconds * rate) for label, rate in rates.items()}
    w = pyedflib.EdfWriter(str(path), len(rates), file_type=pyedflib.FILETYPE_EDFPLUS)
    w.setSignalHeaders([{"label": label, "dimension": "uV", "sample_frequency": rate, "physical_max": 400,
                         "physical_min": -400, "digital_max": 32767, "digital_min": -32768}
                        for label, rate in rates.items()])
    w.writeSamples([signals[label] for label in rates])
    w.close()
    return signals


def spec_data(root, out, **extra_fields):
    fields = {label.lower(): {"kind": "signal", "files": "rec/*.edf", "channel": label, "rate": rate}
              for label, rate in RATES.items()}
    return {"name": "signals", "source": {"root": str(root)}, "output": {"dir": str(out)},
            "splits": {"ratios": {"train": 1.0}}, "fields": {**fields, **extra_fields}}



def appended_recordings(tmp_path: Path, build_spec):
    """Three EDF recordings built, then a settled fourth appended from the inbox (a thin version):
    (the fourth's signals, the spec, the append result)."""
    import h5forge
    from h5forge.spec import DatasetSpec
    from tests.helpers.data import age_files

    root, inbox = tmp_path / "raw", tmp_path / "inbox"
    (root / "rec").mkdir(parents=True)
    (inbox / "rec").mkdir(parents=True)
    for i in range(3):
        write_edf(root / "rec" / f"r{i}.edf", 2 + i, seed=i)
    new = write_edf(inbox / "rec" / "late.edf", 6, seed=7)
    age_files(inbox)
    data = spec_data(root, tmp_path / "out")
    data["source"]["inbox"] = str(inbox)
    spec = DatasetSpec.model_validate(data)
    build_spec(data)
    result = h5forge.append(spec)
    assert result.version == 2 and result.added == 1, result
    return new, spec, result


def test_multi_rate_recordings_round_trip_exactly(tmp_path, build_spec):
    root = tmp_path / "raw"
    (root / "rec").mkdir(parents=True)
    for i, seconds in enumerate((3, 5, 4)):
        write_edf(root / "rec" / f"r{i}.edf", seconds, seed=i)
    write_edf(root / "rec" / "fast.edf", 2, seed=9, rates={"ACC": 2000, "VOLT": 100, "TEMP": 1})
    write_edf(root / "rec" / "noacc.edf", 2, seed=9, rates={"VOLT": 100, "TEMP": 1})
    path, summary = build_spec(spec_data(root, tmp_path / "out"))
    reasons = {r.sample_id: r.reason for r in summary.rejections}
    assert "recorded at 2000 Hz, the spec declares 1000 Hz" in reasons["fast"]
    assert "channel 'ACC' not in the recording; channels: ['VOLT', 'TEMP']" in reasons["noacc"]
    with h5py.File(path, "r") as f:
        g = f["train"]
        assert g["acc"].attrs["rate"] == 1000 and list(g["acc" + arrays.LENGTHS][()]) == [3000, 5000, 4000]
        for row, sid in enumerate(decode_str(g["ids"][()])):
            edf = pyedflib.EdfReader(str(root / "rec" / f"{sid}.edf"))
            for i, label in enumerate(edf.getSignalLabels()):
                stored = arrays.RowReader(g, label.lower(), arrays.Stored((), np.float32, True, True)).row(row)
                assert np.array_equal(stored, edf.readSignal(i).astype(np.float32)), (sid, label)
            edf.close()
        assert g.attrs["temp_count"] == 12 and abs(g.attrs["acc_mean"]) < 5
        assert "32008" in g["acc"]._filters and "32008" not in f["train"]["ids"]._filters  # bitshuffle-lz4
        assert "Bitshuffle" in f.attrs["codec_needs"] and "LZ4" in f.attrs["codec_needs"]
    ds = H5Dataset(path, fields=("acc", "temp"), return_index=True)
    seen = 0
    for (acc, acc_len), (temp, temp_len), rows in ds.loader(batch_size=2, num_workers=2, shuffle=True):
        assert acc.dtype == torch.float32 and acc.shape == (len(rows), int(acc_len.max()))
        assert (acc_len == temp_len * 1000).all()
        for k, row in enumerate(rows.tolist()):
            assert torch.equal(acc[k, :acc_len[k]], ds[row][0]) and (acc[k, acc_len[k]:] == 0).all()
        seen += len(rows)
    assert seen == 3


def test_the_real_edf_recording_of_pyedflib(tmp_path, build_spec):
    root = tmp_path / "raw"
    (root / "rec").mkdir(parents=True)
    source = Path(pyedflib.data.__file__).parent / "test_generator.edf"
    shutil.copy(source, root / "rec" / "generator.edf")
    edf = pyedflib.EdfReader(str(source))
    labels = edf.getSignalLabels()
    fields = {f"ch{i}": {"kind": "signal", "files": "rec/*.edf", "channel": label,
                         "rate": float(edf.getSampleFrequency(i))} for i, label in enumerate(labels)}
    path, summary = build_spec(spec_data(root, tmp_path / "out") | {"fields": fields})
    assert summary.rejections == () and summary.samples == 1
    with h5py.File(path, "r") as f:
        for i in range(len(labels)):
            assert np.allclose(f["train"][f"ch{i}"][()], edf.readSignal(i), rtol=1e-6, atol=1e-3)
            assert f["train"][f"ch{i}"].shape == (edf.getNSamples()[i],)
    edf.close()


def test_csv_and_npy_channels_with_rates_checked(tmp_path, build_spec):
    root = tmp_path / "raw"
    for folder in ("csv", "npy"):
        (root / folder).mkdir(parents=True)
    t = np.arange(0, 2, 0.01)
    for name, step in (("a", 0.01), ("b", 0.02)):
        tt = np.arange(0, 2, step)
        rows = "time,volt\n" + "".join(f"{x:.4f},{np.sin(x):.6f}\n" for x in tt)
        (root / "csv" / f"{name}.csv").write_text(rows)
        np.save(root / "npy" / f"{name}.npy", np.cos(t).astype(np.float32))
    np.save(root / "npy" / "c.npy", np.array([1.0, np.nan, 2.0]))
    (root / "csv" / "c.csv").write_text("time,volt\n0,1\n0.01,2\n0.02,3\n")
    with open(root / "csv" / "d.csv", "w", newline="") as fh:  # one value left empty
        csv.writer(fh).writerows([["time", "volt"], [0, 1], [0.01, ""], [0.02, 3]])
    np.save(root / "npy" / "d.npy", np.cos(t[:3]))
    fields = {"volt": {"kind": "signal", "files": "csv/*.csv", "channel": "volt", "rate": 100},
              "cos": {"kind": "signal", "files": "npy/*.npy", "rate": 100}}
    path, summary = build_spec(spec_data(root, tmp_path / "out") | {"fields": fields})
    reasons = {r.sample_id: r.reason for r in summary.rejections}
    assert "recorded at 50 Hz" in reasons["b"] and "1 NaN/inf value(s)" in reasons["c"]
    assert reasons["d"] == "CSV recording line 3, column 'volt': '' is not a number"
    with h5py.File(path, "r") as f:
        assert np.allclose(f["train"]["volt"][()], np.sin(t), atol=1e-6)
        assert np.array_equal(f["train"]["cos"][()], np.cos(t).astype(np.float32))


def test_signal_spec_needs_a_channel_for_edf(tmp_path):
    from h5forge.spec import DatasetSpec

    data = spec_data(tmp_path, tmp_path / "out")
    del data["fields"]["acc"]["channel"]
    with pytest.raises(ValueError, match="fields.acc.channel: needed"):
        DatasetSpec.model_validate(data)


def test_append_and_export_keep_ragged_rows(tmp_path, build_spec):
    from h5forge._store.thin import export
    from h5forge._store.verify import verify_file

    new, spec, result = appended_recordings(tmp_path, build_spec)
    assert result.counts["train"] == 4
    delta = spec.output.dir / "dataset_v0002.delta.h5"
    assert oct(delta.stat().st_mode & 0o777) == "0o444"  # as read-only as the version reading it
    ds = H5Dataset(spec.output.dir / "dataset_latest.h5", fields=("acc", "temp"))
    late = ds.ids().index("late")
    acc, temp = ds[late]
    assert acc.shape == (6000,) and temp.shape == (6,)
    assert np.allclose(acc.numpy(), new["ACC"], atol=0.02)  # 16-bit EDF resolution: 800 uV / 65535
    copy = export(spec.output.dir / "dataset_latest.h5", tmp_path / "copy.h5")
    assert verify_file(copy, resample=0, latency_reads=0).ok
    with h5py.File(copy, "r") as f:
        assert not f["train"]["acc"].is_virtual and f["train"]["acc"].shape == (2000 + 3000 + 4000 + 6000,)


def test_window_aligns_channels_in_time_and_resample_converts_rates(tmp_path, build_spec):
    root = tmp_path / "raw"
    (root / "rec").mkdir(parents=True)
    signals = {name: write_edf(root / "rec" / f"{name}.edf", seconds, seed=i)
               for i, (name, seconds) in enumerate((("short", 2), ("long", 5)))}
    slow = write_edf(root / "rec" / "slow.edf", 3, seed=5, rates={"ACC": 500, "VOLT": 100, "TEMP": 1})
    data = spec_data(root, tmp_path / "out")
    data["fields"]["acc"]["resample"] = True
    path, summary = build_spec(data)
    assert summary.rejections == ()
    ds = H5Dataset(path, fields=("acc", "temp"), window=3.0, window_offset=1.0)
    ids = ds.ids()
    acc, temp = ds[ids.index("long")]
    assert acc.shape == (3000,) and temp.shape == (3,)
    assert np.allclose(acc.numpy(), signals["long"]["ACC"][1000:4000], atol=0.02)
    short_acc, short_temp = ds[ids.index("short")]
    assert (short_acc[1000:] == 0).all() and short_temp.tolist()[1:] == [0, 0]  # 1 s left after the offset
    (batch_acc, lengths), _ = next(iter(ds.loader(batch_size=3, shuffle=False)))
    assert batch_acc.shape == (3, 3000) and lengths.tolist() == [3000, 3000, 3000]
    resampled = H5Dataset(path, fields=("acc",))[ids.index("slow")]
    assert resampled.shape == (2999,)  # 3 s at 500 Hz onto the 1000 Hz grid (last sample at 2.998 s)
    assert np.allclose(resampled[::2].numpy(), slow["ACC"][:1500], atol=0.02)


def test_values_the_dtype_cannot_hold_are_rejected(tmp_path, build_spec):
    root = tmp_path / "raw"
    root.mkdir()
    np.save(root / "fine.npy", np.array([-32768.0, 0.0, 32767.0]))
    np.save(root / "wide.npy", np.array([1.0, 40000.0]))  # int16 would wrap it to -25536
    np.save(root / "fraction.npy", np.array([1.0, 1.7]))  # int16 would cut it to 1
    np.save(root / "nan.npy", np.array([1.0, np.nan]))  # int16 has no NaN, whatever nonfinite says
    np.save(root / "huge.npy", np.array([1.0, 1e39, -1e39]))  # float32 would make it inf
    fields = {"x": {"kind": "signal", "files": "*.npy", "rate": 100, "dtype": "int16", "nonfinite": "keep"}}
    path, summary = build_spec(spec_data(root, tmp_path / "int") | {"fields": fields})
    assert {r.sample_id: r.reason for r in summary.rejections} == {
        "wide": "values 1..40000 are not int16 integers; set dtype: float32",
        "fraction": "values 1..1.7 are not int16 integers; set dtype: float32",
        "nan": "1 NaN/inf value(s), which int16 cannot hold; set dtype: float32",
        "huge": "values -1e+39..1e+39 are not int16 integers; set dtype: float32"}
    with h5py.File(path, "r") as f:
        assert f["train"]["x"].dtype == np.int16 and f["train"]["x"][()].tolist() == [-32768, 0, 32767]
    for keep in ("reject", "keep"):  # the recording's own NaN/inf follow nonfinite; 1e39 is no inf
        fields = {"x": {"kind": "signal", "files": "*.npy", "rate": 100, "nonfinite": keep}}
        path, summary = build_spec(spec_data(root, tmp_path / keep) | {"fields": fields})
        reasons = {r.sample_id: r.reason for r in summary.rejections}
        assert reasons["huge"] == "2 value(s) beyond float32's range (±3.403e+38), which float32 would store as inf"
        assert ("nan" in reasons) == (keep == "reject")
        with h5py.File(path, "r") as f:
            assert np.isfinite(f["train"]["x"][()]).sum() == 3 + 2 + 2 + (keep == "keep")


def test_a_channel_name_that_two_signals_of_a_recording_share_is_refused_not_read_as_the_first(
        tmp_path, build_spec):
    """pyedflib writes two signals labelled EEG (one 'EEG ', which EDF pads to the same label) and a
    CSV has two 'volt' columns: which one the field means cannot be told, and the first used to be
    taken in silence. Each is refused naming the channel; recordings with each name once are stored
    equal to pyedflib's readSignal and the CSV's column."""
    root = tmp_path / "raw"
    (root / "rec").mkdir(parents=True)
    header = {"dimension": "uV", "physical_max": 100, "physical_min": -100, "digital_max": 32767,
              "digital_min": -32768, "sample_frequency": 200}
    for name, labels in (("edf_twice", ("EEG", "EEG ")), ("csv_twice", ("EEG", "EOG")), ("once", ("EOG", "EEG"))):
        w = pyedflib.EdfWriter(str(root / "rec" / f"{name}.edf"), 2, file_type=pyedflib.FILETYPE_EDFPLUS)
        w.setSignalHeaders([{**header, "label": label} for label in labels])
        w.writeSamples([np.sin(np.arange(800) / 7) * 50, np.full(800, 25.0)])
        w.close()
        columns = "volt,volt" if name == "csv_twice" else "amp,volt"
        (root / "rec" / f"{name}.csv").write_text(f"time,{columns}\n0,1,5\n0.005,2,6\n0.01,3,7\n")
    fields = {"eeg": {"kind": "signal", "files": "rec/*.edf", "channel": "EEG", "rate": 200, "dtype": "float64"},
              "volt": {"kind": "signal", "files": "rec/*.csv", "channel": "volt", "rate": 200}}
    path, summary = build_spec(spec_data(root, tmp_path / "out") | {"fields": fields})
    reasons = {r.path: r.reason for r in summary.rejections}
    assert reasons == {
        "rec/edf_twice.edf": "channel 'EEG' names 2 signals of the recording (signals 1 and 2): which one is "
                             "meant cannot be told",
        "rec/csv_twice.csv": "channel 'volt' names 2 columns of the CSV (columns 2 and 3): which one is meant "
                             "cannot be told",
    }
    reader = pyedflib.EdfReader(str(root / "rec" / "once.edf"))
    want = reader.readSignal(1)
    reader.close()
    with h5py.File(path, "r") as f:
        assert decode_str(f["train"]["ids"][()]) == ["once"]
        assert np.array_equal(f["train"]["eeg"][()], want)
        assert f["train"]["volt"][()].tolist() == [5, 6, 7]


def test_channels_float32_cannot_keep_are_refused_and_init_stores_them_in_float64(tmp_path, build_spec):
    """.npy channels from scikit-learn's digits: photon counts above 2**24 (int64) and float64
    timestamps near 1.7e9 s at 0.1 s steps. The default float32 used to store them rounded (counts
    by 1, timestamps by up to 6.4 s), with exit 0; now each is refused saying so. ``h5forge init``
    writes dtype: float64 for such a folder, whose build keeps every value; an ordinary float64
    channel (the digits scaled to [0, 1]) is still stored in float32, as are pyedflib's recordings
    (their 16-bit levels stay apart in float32: the other tests here)."""
    import yaml
    from sklearn.datasets import load_digits

    import h5forge
    from h5forge._init import infer_spec
    from h5forge.spec import parse_spec

    digits = load_digits().data
    big = 1 << 24  # r0's counts and r0's and r1's clocks are beyond float32; r2 fits it
    channels = {"counts": {f"r{k}": (digits[k] * 1_000_003).astype(np.int64) + (big + 1 if k == 0 else 0)
                           for k in range(3)},
                "clock": {f"r{k}": (1.7e9 if k < 2 else 0.0) + 0.1 * np.arange(64) + k for k in range(3)},
                "light": {f"r{k}": digits[k] / 16.0 for k in range(3)}}
    raw = tmp_path / "raw"
    for channel, recordings in channels.items():
        (raw / channel).mkdir(parents=True)
        for sid, values in recordings.items():
            np.save(raw / channel / f"{sid}.npy", values)
            (raw / channel / f"{sid}.json").write_text('{"rate": 10}')
    fields = {name: {"kind": "signal", "files": f"{name}/*.npy", "rate": 10} for name in channels}
    path, summary = build_spec(spec_data(raw, tmp_path / "float32") | {"fields": fields})
    reasons = {r.path: r.reason for r in summary.rejections}
    low, high = int(channels["counts"]["r0"].min()), int(channels["counts"]["r0"].max())
    assert reasons == {
        "counts/r0.npy": f"integer values {low:,}..{high:,}: float32 holds integers only up to 16,777,216 exactly; "
                         "set dtype: float64",
        "clock/r1.npy": "float32 would round values by up to 7.3, where the median step between samples is 0.1 "
                        "(values 1700000001..1700000007.3); set dtype: float64"}
    with h5py.File(path, "r") as f:
        assert decode_str(f["train"]["ids"][()]) == ["r2"]
        assert np.array_equal(f["train"]["counts"][()], channels["counts"]["r2"].astype(np.float32))

    spec_path = tmp_path / "config" / "raw.yaml"
    inferred = infer_spec(raw, spec_path)
    spec = parse_spec(yaml.safe_load(inferred.text), spec_path.parent, str(spec_path))
    assert {name: spec.fields[name].dtype for name in channels} == {
        "counts": "float64", "clock": "float64", "light": "float32"}
    result = h5forge.build(spec.model_copy(update={"output": spec.output.model_copy(update={"dir": tmp_path / "init"})}))
    path = result.path
    assert result.rejections == () and result.version == 1
    with h5py.File(path, "r") as f:
        seen = set()
        for split in ("train", "val", "test"):
            g = f[split]
            for row, sid in enumerate(decode_str(g["ids"][()])):
                seen.add(sid)
                for name, recordings in channels.items():
                    at = arrays.offsets(g, name)
                    got = g[name][at[row]:at[row + 1]]
                    want = recordings[sid].astype(np.float32 if name == "light" else np.float64)
                    assert got.dtype == want.dtype and np.array_equal(got, want), (name, sid)
        assert seen == {"r0", "r1", "r2"}


def test_a_filtered_flat_channel_is_stored_in_float32(tmp_path, build_spec):
    """A flat channel passed through scipy's zero-phase filter (a disconnected electrode in a
    filtered export) holds its level plus float64 arithmetic noise: steps of a few 1e-15 between
    samples, which are no steps of the signal. float32 keeps the level to its own precision, so the
    recording is stored in float32 like any other; a channel whose real steps float32 would merge
    (timestamps near 1.7e9 s at 0.1 s steps) is still refused."""
    from scipy import signal as scipy_signal

    sos = scipy_signal.butter(4, 0.05, output="sos")
    recordings = {"flat": scipy_signal.sosfiltfilt(sos, np.full(2000, 12.7)),
                  "filtered": scipy_signal.filtfilt(*scipy_signal.butter(4, 0.1), np.full(2000, 5.0)),
                  "clock": 1.7e9 + 0.1 * np.arange(2000)}
    assert np.ptp(recordings["flat"]) > 0  # the filter's noise is there
    raw = tmp_path / "raw"
    (raw / "rec").mkdir(parents=True)
    for sid, values in recordings.items():
        np.save(raw / "rec" / f"{sid}.npy", values)
    fields = {"level": {"kind": "signal", "files": "rec/*.npy", "rate": 10}}
    path, summary = build_spec(spec_data(raw, tmp_path / "out") | {"fields": fields})
    assert {r.path: r.reason.split(";")[-1] for r in summary.rejections} == {"rec/clock.npy": " set dtype: float64"}
    with h5py.File(path, "r") as f:
        stored = {}
        for split in ("train", "val", "test"):
            g = f[split]
            at = arrays.offsets(g, "level")
            for row, sid in enumerate(decode_str(g["ids"][()])):
                stored[sid] = g["level"][at[row]:at[row + 1]]
    assert stored.keys() == {"flat", "filtered"}
    for sid, got in stored.items():
        assert got.dtype == np.float32 and np.array_equal(got, recordings[sid].astype(np.float32)), sid


def test_a_float32_recording_resampled_is_stored_in_float32(tmp_path, build_spec):
    """A barometer's float32 .npy at 1 Hz (pressures near 101325 Pa, steps of 0.01 Pa) declared at
    4 Hz with resample: true. Its own values are float32's: the values interpolated between them
    are stored in float32 like any other, never refused for steps the interpolation made. A float64
    clock (1.7e9 s at 1 s steps) resampled the same way is refused for what float32 loses of its own
    values."""
    rng = np.random.default_rng(3)
    recordings = {"baro": (101325 + np.cumsum(rng.integers(-1, 2, 600)) * 0.01).astype(np.float32),
                  "clock": 1.7e9 + np.arange(600, dtype=np.float64)}
    raw = tmp_path / "raw"
    (raw / "rec").mkdir(parents=True)
    for sid, values in recordings.items():
        np.save(raw / "rec" / f"{sid}.npy", values)
        (raw / "rec" / f"{sid}.json").write_text('{"rate": 1}')
    fields = {"p": {"kind": "signal", "files": "rec/*.npy", "rate": 4, "resample": True}}
    path, summary = build_spec(spec_data(raw, tmp_path / "out") | {"fields": fields})
    assert [(r.path, r.reason) for r in summary.rejections] == [
        ("rec/clock.npy", "float32 would round values by up to 64, where the median step between samples is 1 "
                          "(values 1700000000..1700000599); set dtype: float64")]
    t = np.arange(600) / 1.0
    grid = np.arange(int(np.floor(t[-1] * 4)) + 1) / 4
    want = np.interp(grid, t, recordings["baro"].astype(np.float64)).astype(np.float32)
    with h5py.File(path, "r") as f:
        g = next(f[s] for s in ("train", "val", "test") if decode_str(f[s]["ids"][()]) == ["baro"])
        assert g["p"].dtype == np.float32 and np.array_equal(g["p"][()], want)
