"""A build SIGKILLed mid-way (a real child process) is taken over in place by the next one: its file,
cut back to the rows its last checkpoint made durable, becomes the new version, and the result
equals an uninterrupted build."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

from h5forge._format.names import RESUMABLE, RESUME_SUFFIX, SPEC
from tests.helpers.files import make_raw, strays
from tests.ingest.incremental.test_rebuild import assert_same, build, nightly_spec

PARTIAL = ".dataset_v0001.h5.partial"


@pytest.fixture
def raw(tmp_path) -> Path:
    return make_raw(tmp_path / "raw", n=120, seed=3)


def killed_build(raw: Path, out: Path, chunk_rows: int = 1) -> Path:
    """``build(nightly_spec(raw, out, chunk_rows=chunk_rows))`` in a child SIGKILLed after 80 % of
    its inputs (a checkpoint after every batch of 2); returns the partial file it left."""
    child = subprocess.run(
        [sys.executable, "-c", "import sys; from pathlib import Path; "
         "from tests.ingest.incremental.test_rebuild import build, nightly_spec; "
         "build(nightly_spec(Path(sys.argv[1]), Path(sys.argv[2]), chunk_rows=int(sys.argv[3])))",
         str(raw), str(out), str(chunk_rows)],
        cwd=Path(__file__).resolve().parents[3], capture_output=True, text=True, timeout=900,
        env={**os.environ, "H5FORGE_KILL_AT": "build:at-80%", "H5FORGE_CHECKPOINT_SECONDS": "0"})
    assert child.returncode == -signal.SIGKILL, child.stdout + child.stderr
    return out / PARTIAL


def spoil(raw: Path, k: int) -> str:
    """The picture of the ``k``-th record replaced by bytes no decoder reads: cleaning rejects it."""
    sid = json.loads((raw / "annotations.json").read_text())[k]["id"]
    (raw / "images" / f"{sid}.png").write_bytes(b"not a picture")
    return sid


def test_a_killed_build_is_taken_over_in_place(raw, tmp_path):
    bad = spoil(raw, 3)
    out = tmp_path / "out"
    partial = killed_build(raw, out)
    inode = partial.stat().st_ino

    path, result = build(nightly_spec(raw, out))
    t = result.timings
    # 96 of 120 inputs were settled at the kill: 95 rows and the rejected sample, whose rejection
    # is carried over (not cleaned again); only the 24 others are cleaned
    assert (t["resumed_in_place"], t["cleaned"], t["resumed_damaged_rows"]) == (95, 24, 0)
    assert "resumed_rows" not in t and t["reused"] == 0  # nothing copied
    assert path.stat().st_ino == inode  # the killed build's file, published
    # the 24 cleaned rows were checked in full while written, the kept ones as the take-over began;
    # verify samples them
    assert "sampled" in result.health["checksums"]
    assert [r.sample_id for r in result.rejections] == [bad]
    assert strays(out) == []

    fresh, fresh_result = build(nightly_spec(raw, tmp_path / "fresh"))
    assert_same(path, fresh)  # every value, checksum, statistic and index
    assert [(r.sample_id, r.reason) for r in result.rejections] == [
        (r.sample_id, r.reason) for r in fresh_result.rejections]
    with h5py.File(path) as f, h5py.File(fresh) as g:
        assert f.attrs["version"] == g.attrs["version"] == 1
        ours, theirs = json.loads(f[SPEC][()]), json.loads(g[SPEC][()])
    # the stored spec is this build's: the same but for the output folder
    assert (ours["output"].pop("dir"), theirs["output"].pop("dir")) == (str(out), str(tmp_path / "fresh"))
    assert ours == theirs


def test_a_killed_build_of_several_samples_per_chunk_is_taken_over_in_place(raw, tmp_path):
    """Four samples per chunk, a checkpoint after every batch of 2: the durable rows end inside a
    chunk, which the take-over cuts and the next rows complete. The version equals an uninterrupted
    build's, verifies in full, and its readers give h5py's values."""
    from h5forge.read._reader import SplitReader
    from h5forge._store.verify import verify_file

    out = tmp_path / "out"
    partial = killed_build(raw, out, chunk_rows=4)
    counts = json.loads(partial.with_name(partial.name + RESUME_SUFFIX).read_text())["counts"]
    assert any(n % 4 for n in counts.values())  # a checkpoint inside a chunk
    path, result = build(nightly_spec(raw, out, chunk_rows=4))
    assert result.timings["resumed_in_place"] == sum(counts.values()) and result.timings["resumed_damaged_rows"] == 0
    fresh, _ = build(nightly_spec(raw, tmp_path / "fresh", chunk_rows=4))
    assert_same(path, fresh)
    report = verify_file(path, resample=0, latency_reads=0)
    assert report.ok, report.errors
    with h5py.File(path) as f:
        for split in ("train", "val", "test"):
            reader = SplitReader(path, split=split, fields=("images", "masks"))
            for name in ("images", "masks"):
                assert f[split][name].chunks[0] == 4
                want = f[split][name][()]
                got = reader.read(list(range(len(want))))[name]
                assert np.array_equal(got, want), (split, name)


def _damage(path: Path, row: int, how: str) -> None:
    """Train's row ``row`` in the file at ``path``, damaged ``how``: one bit flipped in the middle of
    its picture's stored chunk, 64 of that chunk's bytes zeroed (pages a restart of the machine
    lost), or its id or checksum rewritten through HDF5."""
    if how in ("another id", "another checksum"):
        with h5py.File(path, "r+") as f:
            name, value = ("ids", "cell_999999") if how == "another id" else ("checksum", b"0" * 64)
            f["train"][name][row] = value
        return
    with h5py.File(path, "r") as f:
        ds = f["train"]["images"]
        info = ds.id.get_chunk_info_by_coord((row - row % ds.chunks[0],) + (0,) * (ds.ndim - 1))
        at, size = int(info.byte_offset), int(info.size)
    with open(path, "r+b") as fh:
        if how == "one flipped bit":
            fh.seek(at + size // 2)
            byte = fh.read(1)[0]
            fh.seek(at + size // 2)
            fh.write(bytes([byte ^ 0x10]))
        else:
            fh.seek(at + min(100, size - 64))
            fh.write(b"\0" * 64)


@pytest.mark.parametrize(
    "how, checked_by",
    [("one flipped bit", 1), ("64 zero bytes", 1), ("another id", 1), ("another checksum", 1),
     ("one flipped bit", 2), ("another checksum", 2)],
)
def test_a_kept_row_damaged_after_the_kill_is_cleaned_again(raw, tmp_path, monkeypatch, how, checked_by):
    """Anything may write into a killed build's file before the next build takes it over: every
    kept row is checked against its checksum first, in the build's process or shared among the
    workers of the cluster it started ahead, and the rows from the first damaged one on are cleaned
    again. The version equals an uninterrupted build's and verifies in full."""
    from h5forge._ingest import parallel
    from h5forge._ingest.incremental import take_over
    from h5forge._store.verify import verify_file

    out = tmp_path / "out"
    partial = killed_build(raw, out)
    counts = json.loads(partial.with_name(partial.name + RESUME_SUFFIX).read_text())["counts"]
    assert counts["train"] > 5
    _damage(partial, 5, how)

    spec = nightly_spec(raw, out)
    if checked_by == 2:  # a cluster started ahead (24 inputs left, more than 10), which checks every row
        monkeypatch.setattr(parallel, "INLINE_BYTES", 0)
        monkeypatch.setattr(take_over, "WORKER_ROWS", 1)
        spec = spec.model_copy(update={"compute": spec.compute.model_copy(update={"inline_below": 10})})
    path, result = build(spec)
    assert result.timings["take_over_processes"] == checked_by
    report = verify_file(path, resample=0, latency_reads=0)  # every row's checksum
    assert report.ok and report.checks["checksums"] == "ok (120 samples)", report.errors
    fresh, _ = build(nightly_spec(raw, tmp_path / "fresh"))
    assert_same(path, fresh)  # train[5] holds its source's picture again, as every other row does
    t = result.timings
    assert t["resumed_damaged_rows"] == counts["train"] - 5  # train[5] and the durable rows after it
    assert t["resumed_in_place"] == sum(counts.values()) - t["resumed_damaged_rows"]
    assert t["cleaned"] == 120 - t["resumed_in_place"]


def test_a_killed_builds_file_whose_first_rows_are_all_damaged_is_not_taken(raw, tmp_path):
    """Row 0 of every split no longer matches its checksum: nothing of the file is kept, nor copied
    (the rows after a damaged one are not trusted either); the build cleans everything."""
    from h5forge._format.names import RESUMABLE
    from h5forge._store.verify import verify_file

    out = tmp_path / "out"
    partial = killed_build(raw, out)
    with h5py.File(partial, "r+") as f:
        for split in ("train", "val", "test"):
            f[split]["checksum"][0] = b"0" * 64

    path, result = build(nightly_spec(raw, out))
    assert verify_file(path, resample=0, latency_reads=0).ok
    t = result.timings
    assert "resumed_in_place" not in t and not t.get("resumed_rows") and t["cleaned"] == 120
    assert not (out / RESUMABLE).exists() and strays(out) == []
    fresh, _ = build(nightly_spec(raw, tmp_path / "fresh"))
    assert_same(path, fresh)


def test_durable_rows_after_a_sample_that_left_are_copied_instead(raw, tmp_path):
    """The first sample of the inputs is gone: the durable rows are no longer the first rows this
    build writes, so they are copied into a new file (and still not cleaned again)."""
    out = tmp_path / "out"
    killed_build(raw, out)
    records = json.loads((raw / "annotations.json").read_text())
    gone = records[0]["id"]
    for folder in ("images", "masks"):
        (raw / folder / f"{gone}.png").unlink()
    (raw / "annotations.json").write_text(json.dumps(records[1:]))

    path, result = build(nightly_spec(raw, out))
    t = result.timings
    assert "resumed_in_place" not in t and t["resumed_rows"] == 95 and t["cleaned"] == 24
    assert not (out / RESUMABLE).exists() and strays(out) == []
    fresh, _ = build(nightly_spec(raw, tmp_path / "fresh"))
    assert_same(path, fresh)


def signal_spec(root: Path, out: Path):
    from h5forge.spec import DatasetSpec
    from tests.kinds.test_signal import spec_data

    return DatasetSpec.model_validate({**spec_data(root, out), "compute": {"batch_size": 1}})


def test_ragged_recordings_are_cut_back_to_their_durable_rows(tmp_path):
    """Recordings of different lengths share chunks. The last durable recording changed after the
    kill: the killed build's file is cut back to the 7 rows before it (of each ragged field, exactly
    their elements; their statistics recounted), and the changed one and the rest follow."""
    import numpy as np

    from tests.ingest.incremental.test_rebuild import contents
    from tests.kinds.test_signal import write_edf

    root = tmp_path / "raw"
    (root / "rec").mkdir(parents=True)
    for i in range(10):
        write_edf(root / "rec" / f"r{i}.edf", seconds=2 + i % 3, seed=i)
    child = subprocess.run(
        [sys.executable, "-c", "import sys, h5forge; from pathlib import Path; "
         "from tests.ingest.incremental.test_take_over import signal_spec; "
         "h5forge.build(signal_spec(Path(sys.argv[1]), Path(sys.argv[2])))", str(root), str(tmp_path / "out")],
        cwd=Path(__file__).resolve().parents[3], capture_output=True, text=True, timeout=900,
        env={**os.environ, "H5FORGE_KILL_AT": "build:at-80%", "H5FORGE_CHECKPOINT_SECONDS": "0"})
    assert child.returncode == -signal.SIGKILL, child.stdout + child.stderr

    with h5py.File(tmp_path / "out" / PARTIAL, "r") as f:
        assert [v.decode() for v in f["train"]["ids"][()]][-1] == "r7"  # 8 durable rows, r0..r7
    write_edf(root / "rec" / "r7.edf", seconds=5, seed=99)  # longer than before

    resumed, result = build(signal_spec(root, tmp_path / "out"))
    assert (result.timings["resumed_in_place"], result.timings["cleaned"]) == (7, 3)
    fresh, _ = build(signal_spec(root, tmp_path / "fresh"))
    left, right = contents(resumed), contents(fresh)
    assert sorted(left) == sorted(right)
    for k in left:
        if k.endswith("/sample") and left[k].dtype.kind == "f":
            continue
        if "@" in k and np.asarray(left[k]).dtype.kind == "f":  # float sums: the kept rows' are
            assert np.allclose(left[k], right[k], rtol=1e-12), k  # recounted at once, not batch by batch
        else:
            assert np.array_equal(left[k], right[k]), k


def ragged_raw(kind: str, root: Path, n: int) -> None:
    """``n`` inputs of ragged fields, one of them rejected: NIfTI cases of 1 to 6 slices with their
    label volumes (``volume``), or pictures with YOLO boxes, some as polygons (``boxes``)."""
    rng = np.random.default_rng(5)
    if kind == "volume":
        import nibabel

        for folder in ("cases", "masks"):
            (root / folder).mkdir(parents=True)
        for i in range(n):
            depth = int(rng.integers(1, 7))
            ct = rng.integers(-1000, 1000, (16, 12, depth)).astype(np.int16)
            labels = rng.integers(0, 2, (16, 12, depth)).astype(np.uint8)
            nibabel.save(nibabel.Nifti1Image(ct, np.eye(4)), root / "cases" / f"c{i:03d}.nii.gz")
            nibabel.save(nibabel.Nifti1Image(labels, np.eye(4)), root / "masks" / f"c{i:03d}.nii.gz")
        (root / "cases" / "c005.nii.gz").write_bytes(b"not a volume")
        return
    from PIL import Image

    for folder in ("images", "labels"):
        (root / folder).mkdir(parents=True)
    for i in range(n):
        h, w = (int(v) for v in rng.integers(16, 48, 2))
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(root / "images" / f"p{i:03d}.png")
        lines = []
        for _ in range(int(rng.integers(0, 4))):
            c, (cx, cy), (bw, bh) = int(rng.integers(0, 3)), rng.uniform(0.2, 0.8, 2), rng.uniform(0.1, 0.4, 2)
            polygon = [cx - bw / 2, cy - bh / 2, cx + bw / 2, cy - bh / 2, cx, cy + bh / 2]
            lines.append(" ".join(f"{v:.5f}" for v in ([cx, cy, bw, bh] if rng.random() < 0.5 else polygon)))
            lines[-1] = f"{c} {lines[-1]}"
        (root / "labels" / f"p{i:03d}.txt").write_text("\n".join(lines) + "\n")
    (root / "labels" / "p005.txt").write_text("7 0.5 0.5 0.1 0.1\n")


def ragged_spec(kind: str, root: Path, out: Path):
    from h5forge.spec import DatasetSpec

    if kind == "volume":
        fields = {"ct": {"kind": "volume", "files": "cases/*.nii.gz", "size": [16, 16]},
                  "ct_mask": {"kind": "volume_mask", "files": "masks/*.nii.gz", "like": "ct"}}
    else:
        fields = {"images": {"kind": "image", "files": "images/*.png", "size": [32, 32], "larger": "shrink"},
                  "boxes": {"kind": "boxes", "like": "images", "classes": ["a", "b", "c"], "files": "labels/*.txt",
                            "masks": True}}
    return DatasetSpec.model_validate({
        "name": kind, "source": {"root": str(root)}, "output": {"dir": str(out)}, "fields": fields,
        "compute": {"batch_size": 3}, "verify": {"resample": 4, "latency_reads": 0}})


@pytest.mark.parametrize("kind", ["volume", "boxes"])
def test_a_killed_build_of_ragged_fields_is_taken_over_and_equals_a_fresh_build(tmp_path, kind):
    """CT cases with their label volumes, and pictures with their boxes and instance masks: ragged
    fields whose elements share chunks. A build SIGKILLed with rows written past its last
    checkpoint (one every 5 % of the inputs, batches of 3) is cut back to the durable rows, taken
    over, and publishes what an uninterrupted build publishes: ids, checksums, every element, the
    rejected input's reason; the CT slices read for 2.5-D training are h5py's."""
    from h5forge.read.torch import H5Dataset

    root = tmp_path / "raw"
    ragged_raw(kind, root, 100)
    child = subprocess.run(
        [sys.executable, "-c", "import sys, h5forge; from pathlib import Path; "
         "from tests.ingest.incremental.test_take_over import ragged_spec; "
         "h5forge.build(ragged_spec(sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])))",
         kind, str(root), str(tmp_path / "out")],
        cwd=Path(__file__).resolve().parents[3], capture_output=True, text=True, timeout=900,
        env={**os.environ, "H5FORGE_KILL_AT": "build:at-80%", "H5FORGE_CHECKPOINT_SECONDS": "1000"})
    assert child.returncode == -signal.SIGKILL, child.stdout + child.stderr
    partial = tmp_path / "out" / PARTIAL
    state = json.loads(partial.with_name(partial.name + RESUME_SUFFIX).read_text())
    durable = sum(state["counts"].values())
    # the kill came once 80 of the 100 inputs were settled: the last batches were written past the checkpoint
    assert durable + len(state["rejected"]) < 80

    resumed, result = build(ragged_spec(kind, root, tmp_path / "out"))
    assert result.timings["resumed_in_place"] == durable and result.timings["cleaned"] == 100 - durable - 1
    fresh, fresh_result = build(ragged_spec(kind, root, tmp_path / "fresh"))
    assert_same(resumed, fresh)
    assert [(r.sample_id, r.reason) for r in result.rejections] == [
        (r.sample_id, r.reason) for r in fresh_result.rejections] and len(result.rejections) == 1
    if kind == "volume":
        with h5py.File(resumed) as f:
            flat, depths = f["train"]["ct"][()], f["train"]["ct_lengths"][()]
        ends = np.cumsum(depths)
        near = [[min(max(j + o, e - d), e - 1) for o in (-1, 0, 1)]  # within the case ending at e
                for d, e in zip(depths, ends) for j in range(e - d, e)]
        ds = H5Dataset(resumed, "train", fields=("ct",), unit="slice", context=1)
        assert np.array_equal(ds.__getitems__(list(range(len(ds)))).stacked.numpy(), flat[np.array(near)])
