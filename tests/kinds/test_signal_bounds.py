"""Recordings are read in bounded memory: a CSV recording is parsed as a stream (peak at most
3x its file size plus a constant), a CSV header with more columns than ``max_columns`` is
rejected, and EDF/BDF and .npy headers that promise more samples than ``max_decoded_bytes``
allows, or more than the file holds, are rejected before any sample is decoded. Each case is
cleaned in a fresh process whose peak RSS is measured."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pyedflib
import pytest

from tests.kinds.test_memory_bounds import MIB, clean_in_a_fresh_process
from tests.kinds.test_signal import write_edf

WRITE_CSV = textwrap.dedent("""
    import sys
    import numpy as np
    path, target = sys.argv[1], int(sys.argv[2])
    rows = target // 18  # each line: "%.3f,%.5f" is 18 bytes or so
    with open(path, "w") as fh:
        fh.write("time,volt\\n")
        for start in range(0, rows, 200_000):
            t = np.arange(start, min(rows, start + 200_000)) / 1000
            np.savetxt(fh, np.column_stack([t, np.sin(t)]), fmt=("%.3f", "%.5f"), delimiter=",")
""")  # in its own process, so the test process never holds the table


def signal_spec(root, files, channel=None, rate=1000, **signal) -> dict:
    field = {"kind": "signal", "files": files, "rate": rate, **({"channel": channel} if channel else {}), **signal}
    return {"name": "bounds", "source": {"root": str(root)}, "fields": {"sig": field},
            "output": {"dir": str(root.parent / "out")}}


def csv_recording_in_bounded_memory(tmp_path, size: int) -> None:
    root = tmp_path / "raw"
    (root / "csv").mkdir(parents=True)
    path = root / "csv" / "long.csv"
    subprocess.run([sys.executable, "-c", WRITE_CSV, str(path), str(size)], check=True, timeout=900)
    (root / "csv" / "short.csv").write_text("time,volt\n0,1\n0.001,2\n0.002,3\n")
    got = clean_in_a_fresh_process(signal_spec(root, "csv/*.csv", "volt"))
    assert got["rejected"] == [] and sorted(got["taken"]) == ["long", "short"]
    file_size = path.stat().st_size
    rows = sum(1 for _ in open(path)) - 1
    assert got["shape"]["sig"] == [rows + 3]  # the ragged values of both recordings
    used = got["peak_rss"] - got["base_rss"]
    print(f"CSV recording of {file_size / MIB:.1f} MiB ({rows:,} rows): peak {used / MIB:.0f} MiB over the base")
    assert used < 3 * file_size + 32 * MIB, got


def test_a_csv_recording_is_parsed_in_bounded_memory(tmp_path):
    csv_recording_in_bounded_memory(tmp_path, 12 * MIB)


@pytest.mark.slow
@pytest.mark.soak
def test_a_65_mb_csv_recording_is_parsed_in_bounded_memory(tmp_path):
    csv_recording_in_bounded_memory(tmp_path, 65 * 1000 * 1000)


def write_wide_csv(folder, name: str, columns: int = 1_000_000) -> None:
    """``folder/name``: a CSV recording of three lines of ``columns`` channels, beside a good
    ``good.csv`` of channel c7."""
    folder.mkdir(parents=True)
    with open(folder / name, "w") as fh:
        fh.write("time," + ",".join(f"c{i}" for i in range(columns)) + "\n")
        for t in range(3):
            fh.write(f"{t / 1000}," + ",".join(["1"] * columns) + "\n")
    (folder / "good.csv").write_text("time,c7\n0,1\n0.001,2\n0.002,3\n")


def test_a_csv_with_a_million_columns_is_rejected_by_its_header(tmp_path):
    root = tmp_path / "raw"
    write_wide_csv(root / "csv", "wide.csv")
    got = clean_in_a_fresh_process(signal_spec(root, "csv/*.csv", "c7"))
    assert got["taken"] == ["good"]
    assert got["rejected"] == [["wide", "CSV recording has 1,000,001 columns in its header, more than the field's "
                                        "limit of 10,000 (max_columns)"]]
    assert got["peak_rss"] - got["base_rss"] < 48 * MIB, got


def test_a_csv_line_with_more_values_than_the_limit_is_rejected(tmp_path, build_spec):
    root = tmp_path / "raw"
    (root / "csv").mkdir(parents=True)
    (root / "csv" / "a.csv").write_text("time,volt\n0,1\n0.001,2\n0.002," + ",".join(["3"] * 50) + "\n")
    (root / "csv" / "b.csv").write_text('time,volt\n0,1\n0.001,"2\n0.002,' + "9" * 200 + '"\n')
    (root / "csv" / "c.csv").write_text("time,volt\n0,1\n0.001,2\n0.002,3\n")
    spec = signal_spec(root, "csv/*.csv", "volt", max_columns=20)
    spec["splits"] = {"ratios": {"train": 1.0}}
    _, summary = build_spec(spec)
    reasons = {r.sample_id: r.reason for r in summary.rejections}
    assert reasons["a"] == "CSV recording line 4 has 51 values, more than the field's limit of 20 (max_columns)"
    long_value = "2\n0.002," + "9" * 200
    assert reasons["b"] == f"CSV recording line 4, column 'volt': {long_value[:40] + '…'!r} is not a number"
    assert summary.samples == 1


def _edf_claiming(path, records: int) -> None:
    """A real EDF+ file of 2 s (pyedflib's writer) whose header then claims ``records`` data records."""
    write_edf(path, 2, seed=1)
    data = bytearray(path.read_bytes())
    data[236:244] = f"{records:<8d}".encode()
    path.write_bytes(bytes(data))


def test_an_edf_header_claiming_99999999_records_is_rejected_before_decoding(tmp_path):
    root = tmp_path / "raw"
    (root / "rec").mkdir(parents=True)
    write_edf(root / "rec" / "good.edf", 2, seed=0)
    _edf_claiming(root / "rec" / "liar.edf", 99_999_999)
    got = clean_in_a_fresh_process(signal_spec(root, "rec/*.edf", "ACC"))
    assert got["taken"] == ["good"] and got["shape"]["sig"] == [2000]
    assert got["rejected"] == [["liar", "the header declares 99,999,999,000 samples of channel 'ACC', "
                                        "799,999,992,000 bytes decoded, more than the field's limit of "
                                        f"{1 << 30:,} (max_decoded_bytes)"]]
    assert got["peak_rss"] - got["base_rss"] < 48 * MIB, got
    # within the limit, but the file holds 2 of the 10 records its header declares
    _edf_claiming(root / "rec" / "liar.edf", 10)
    got = clean_in_a_fresh_process(signal_spec(root, "rec/*.edf", "ACC"))
    [(sid, reason)] = got["rejected"]
    data = (root / "rec" / "liar.edf").read_bytes()
    header = 256 * (1 + int(data[252:256]))
    declared = header + 10 * (len(data) - header) // 2
    assert sid == "liar" and reason == (f"not a readable EDF/BDF file: the header declares 10 data records ({declared:,} bytes with the "
                                        f"header), the file holds {len(data):,}"), reason


def _npy_claiming(path, shape, descr="<f8", size=200) -> None:
    with open(path, "wb") as fh:
        np.lib.format.write_array_header_1_0(fh, {"descr": descr, "fortran_order": False, "shape": shape})
        fh.write(b"\0" * (size - fh.tell()))


def test_a_200_byte_npy_claiming_ten_billion_values_is_rejected_before_decoding(tmp_path):
    root = tmp_path / "raw"
    (root / "npy").mkdir(parents=True)
    np.save(root / "npy" / "good.npy", np.arange(50, dtype=np.float32))
    _npy_claiming(root / "npy" / "liar.npy", (10**10,))
    assert (root / "npy" / "liar.npy").stat().st_size == 200
    got = clean_in_a_fresh_process(signal_spec(root, "npy/*.npy"))
    assert got["taken"] == ["good"] and got["shape"]["sig"] == [50]
    assert got["rejected"] == [["liar", "the header declares 10,000,000,000 samples, 80,000,000,000 bytes decoded, "
                                        f"more than the field's limit of {1 << 30:,} (max_decoded_bytes)"]]
    assert got["peak_rss"] - got["base_rss"] < 48 * MIB, got
    _npy_claiming(root / "npy" / "liar.npy", (1000,))  # within the limit; the file holds 72 bytes of values
    _npy_claiming(root / "npy" / "wide.npy", (10, 10), descr="<f4", size=528)
    _npy_claiming(root / "npy" / "objects.npy", (3,), descr="|O")
    got = clean_in_a_fresh_process(signal_spec(root, "npy/*.npy"))
    assert dict(got["rejected"]) == {
        "liar": "the header declares 8,000 bytes of values, the file holds 72",
        "wide": "a channel must be one row of numbers; found shape (10, 10), dtype float32",
        "objects": "a channel must be one row of numbers; found shape (3,), dtype object",
    }


def test_the_limits_are_the_fields(tmp_path, build_spec):
    root = tmp_path / "raw"
    (root / "rec").mkdir(parents=True)
    write_edf(root / "rec" / "long.edf", 3, seed=0)
    write_edf(root / "rec" / "short.edf", 1, seed=1)
    spec = signal_spec(root, "rec/*.edf", "ACC", max_decoded_bytes=16_000)
    spec["splits"] = {"ratios": {"train": 1.0}}
    _, summary = build_spec(spec)
    assert [(r.sample_id, r.reason) for r in summary.rejections] == [(
        "long", "the header declares 3,000 samples of channel 'ACC', 24,000 bytes decoded, more than the field's "
        "limit of 16,000 (max_decoded_bytes)")]
    assert summary.samples == 1
    spec["fields"]["sig"]["max_decoded_bytes"] = 24_000
    _, summary = build_spec(spec)
    assert summary.rejections == () and summary.samples == 2
    assert pyedflib.EdfReader(str(root / "rec" / "long.edf")).getNSamples()[0] == 3000
