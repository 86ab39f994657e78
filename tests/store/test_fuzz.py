"""The standing fault suite's fuzzing of verify, on small real version files.

- Bit flips in stored data: each flipped byte of a data region (chunks, contiguous datasets, the
  heaps holding strings) is either detected by ``verify`` or leaves every value ``h5forge.read``
  returns unchanged. None is missed.
- Bit flips in metadata: the root attributes, /inputs, /diagnostics, /meta/spec, the attributes of
  the splits' groups and datasets, and the row checksums. Each is detected or leaves everything a
  user sees unchanged (``file_view``: what readers return, every attribute, every catalog value).
- Truncations and flips anywhere in a file (headers, B-trees, heaps, data): ``verify`` never
  raises; a file it calls HEALTHY reads exactly as before.

Each test prints its figures (run with ``-s`` to see them). The default run tries a few hundred
cases (about two minutes on a busy 2-core machine); the ``slow`` variants a few thousand.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from h5forge._store.verify import verify_file
from tests.helpers.tamper import (
    copy_writable,
    data_regions,
    file_view,
    flip,
    metadata_regions,
    raw_pair,
    reader_view,
    small_version,
    thin_version,
)

pytestmark = pytest.mark.faults

QUICK = {"resample": 0, "latency_reads": 0}


@pytest.fixture(scope="module")
def versions(tmp_path_factory) -> dict[str, Path]:
    """A self-contained version per codec (``none``: a flip changes values directly; ``zstd``:
    a flip usually breaks decompression) and a thin version over a parent and a delta."""
    raws = raw_pair(tmp_path_factory.mktemp("fuzz"))
    out = {}
    for codec in ("none", "zstd"):
        out[codec] = tmp_path_factory.mktemp(codec) / "dataset_v0001.h5"
        small_version(out[codec], raws[0], codec=codec)
    out["thin"] = thin_version(tmp_path_factory.mktemp("thin"), *raws)
    return out


def spread(regions: list[tuple[int, int]], n: int, rng: np.random.Generator) -> list[int]:
    """``n`` offsets over every region in turn; half of them in a region's first 512 bytes, where
    a mostly empty chunk (a column's rows, before its unused tail) keeps its values."""
    picks = []
    for i in range(n):
        start, size = regions[i % len(regions)]
        span = min(size, 512) if i % 2 == 0 else size
        picks.append(start + int(rng.integers(0, span)))
    return picks


def flip_trials(path: Path, offsets: list[int], masks: list[int], work: Path, view=reader_view) -> dict:
    """Flip each offset in a fresh copy; verify; compare what a reader returns (``view``)."""
    before = view(path)
    outcome: Counter = Counter()
    missed = []
    for offset, mask in zip(offsets, masks):
        copy_writable(path, work)
        flip(work, offset, mask)
        if not verify_file(work, isolate=True, **QUICK).ok:
            outcome["detected"] += 1
        elif view(work) == before:
            outcome["harmless"] += 1
        else:
            missed.append(offset)
    return {"flips": len(offsets), "detected": outcome["detected"], "harmless": outcome["harmless"],
            "missed": len(missed), "missed_offsets": missed[:20]}


def run_bit_flips(versions, tmp_path, per_file: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    figures = {}
    for name in ("none", "zstd"):
        path = versions[name]
        offsets = spread(data_regions(path), per_file, rng)
        masks = [1 << int(b) for b in rng.integers(0, 8, size=len(offsets))]
        figures[name] = flip_trials(path, offsets, masks, tmp_path / f"{name}.h5")
    print("\nbit flips in data regions:", json.dumps(figures))
    return figures


def test_bit_flips_in_stored_data_are_detected_or_harmless(versions, tmp_path):
    figures = run_bit_flips(versions, tmp_path, per_file=100, seed=0)
    assert sorted(figures) == ["none", "zstd"]  # the loop below checks both files
    for name, fig in figures.items():
        assert fig["missed"] == 0, (name, fig)
        assert fig["detected"] + fig["harmless"] == fig["flips"] == 100
        assert fig["detected"] > 0


@pytest.mark.slow
@pytest.mark.soak
def test_bit_flips_in_stored_data_thousands(versions, tmp_path):
    figures = run_bit_flips(versions, tmp_path, per_file=1500, seed=1)
    assert sorted(figures) == ["none", "zstd"] and all(fig["flips"] == 1500 for fig in figures.values()), figures
    assert all(fig["missed"] == 0 for fig in figures.values()), figures


def run_metadata_flips(versions, tmp_path, per_part: int, seed: int, files=("zstd",)) -> dict:
    rng = np.random.default_rng(seed)
    figures = {}
    for name in files:
        path = versions[name]
        for part, regions in metadata_regions(path).items():
            offsets = spread(regions, per_part, rng)
            masks = [1 << int(b) for b in rng.integers(0, 8, size=len(offsets))]
            figures[f"{name}: {part}"] = flip_trials(path, offsets, masks, tmp_path / f"{name}.h5", view=file_view)
    print("\nbit flips in metadata:", json.dumps(figures))
    return figures


def test_bit_flips_in_metadata_are_detected_or_harmless(versions, tmp_path):
    figures = run_metadata_flips(versions, tmp_path, per_part=6, seed=0)
    assert len(figures) == 6
    for part, fig in figures.items():
        assert fig["missed"] == 0, (part, fig)
        assert fig["detected"] + fig["harmless"] == fig["flips"] == 6
    assert sum(fig["detected"] for fig in figures.values()) > 0


@pytest.mark.slow
@pytest.mark.soak
def test_bit_flips_in_metadata_hundreds(versions, tmp_path):
    figures = run_metadata_flips(versions, tmp_path, per_part=60, seed=1, files=("none", "zstd"))
    assert len(figures) == 12 and all(fig["flips"] == 60 for fig in figures.values()), figures
    assert all(fig["missed"] == 0 for fig in figures.values()), figures


def verify_trials(path: Path, cases: list[tuple[str, int, int]], work: Path, dependency: Path | None = None) -> dict:
    """Each case damages a fresh copy of ``path`` (or of the ``dependency`` a thin version reads):
    ("cut", n, 0) keeps the first n bytes, ("flip", offset, mask) XORs one byte."""
    target = dependency or path
    pristine = target.read_bytes()
    before = reader_view(path)
    outcome: Counter = Counter()
    raised, changed = [], []
    damaged = target if dependency else work
    for what, at, mask in cases:
        data = bytearray(pristine)
        if what == "cut":
            data = data[:at]
        else:
            data[at] ^= mask
        damaged.unlink(missing_ok=True)  # a new file each time: HDF5 never meets a stale open handle of it
        damaged.write_bytes(bytes(data))
        checked = path if dependency else work
        try:
            report = verify_file(checked, isolate=True, **QUICK)  # some damage crashes HDF5 itself
        except Exception as err:  # noqa: BLE001 - counted: the figure that must be 0
            raised.append(f"{what}@{at}: {type(err).__name__}: {err}")
            continue
        if not report.ok:
            assert report.errors, "a BROKEN report says why"
            outcome["broken"] += 1
        elif reader_view(checked) == before:
            outcome["healthy_and_harmless"] += 1
        else:
            changed.append(f"{what}@{at}^{mask}")
    if dependency:
        dependency.unlink()
        dependency.write_bytes(pristine)
    return {"cases": len(cases), "broken": outcome["broken"], "healthy_and_harmless": outcome["healthy_and_harmless"],
            "healthy_but_changed": len(changed), "exceptions": len(raised), "examples": (raised + changed)[:10]}


def damage_cases(size: int, cuts: int, flips: int, rng: np.random.Generator) -> list[tuple[str, int, int]]:
    cases = [("cut", int(at), 0) for at in np.unique(np.linspace(0, size - 1, cuts).astype(int))]
    cases += [("flip", int(at), int(m)) for at, m in zip(rng.integers(0, size, flips), rng.integers(1, 256, flips))]
    return cases


def run_verify_fuzz(versions, tmp_path, cuts: int, flips: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    figures = {}
    for name in ("none", "zstd", "thin"):
        path = versions[name]
        work = path.parent / "damaged.h5"  # beside it: a thin version finds its row files by relative name
        figures[name] = verify_trials(path, damage_cases(path.stat().st_size, cuts, flips, rng), work)
    delta = versions["thin"].parent / "dataset_v0002.delta.h5"
    figures["thin's delta"] = verify_trials(versions["thin"], damage_cases(delta.stat().st_size, cuts, flips, rng),
                                            tmp_path / "unused.h5", dependency=delta)
    print("\nverify on damaged files:", json.dumps(figures))
    return figures


def test_verify_never_raises_on_truncated_or_flipped_files(versions, tmp_path):
    figures = run_verify_fuzz(versions, tmp_path, cuts=8, flips=25, seed=0)
    assert sorted(figures) == ["none", "thin", "thin's delta", "zstd"]  # the loop below checks all four
    for name, fig in figures.items():
        outcomes = fig["broken"] + fig["healthy_and_harmless"] + fig["healthy_but_changed"] + fig["exceptions"]
        assert outcomes == fig["cases"] >= 25 + 1, (name, fig)  # every flip and at least one cut ran
        assert fig["exceptions"] == 0, (name, fig)
        assert fig["healthy_but_changed"] == 0, (name, fig)
        assert fig["broken"] >= 8  # every truncation at least


@pytest.mark.slow
@pytest.mark.soak
def test_verify_never_raises_thousands(versions, tmp_path):
    figures = run_verify_fuzz(versions, tmp_path, cuts=50, flips=400, seed=1)
    assert sorted(figures) == ["none", "thin", "thin's delta", "zstd"]
    assert all(fig["cases"] >= 400 for fig in figures.values()), figures
    assert all(fig["exceptions"] == 0 and fig["healthy_but_changed"] == 0 for fig in figures.values()), figures
