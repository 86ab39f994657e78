"""The storage ``init`` writes from measurement: several small samples per chunk (and every reader
and the append path on such a file), one big sample per chunk; volume slices uncompressed unless
LZ4 saves enough on sampled ones."""

from __future__ import annotations

import re
from pathlib import Path

import h5py
import nibabel
import numpy as np
import pytest
import yaml
from nibabel.testing import data_path as nibabel_data
from PIL import Image

import h5forge
from h5forge._format.mapped import MappedDataset
from h5forge._demo import generate_ct
from h5forge._init import infer_spec
from h5forge._init.sections import CHUNK_BYTES
from h5forge._init.volumes import LZ4_WORTH
from h5forge.read._direct import DirectRows
from h5forge.read.torch import ChunkShuffleSampler, H5Dataset
from h5forge.spec import load_spec
from h5forge._store.verify import verify_file
from tests.helpers.data import age_files

SPLITS = ("train", "val", "test")


def pairs(folder: Path, n: int, size: int, seed: int = 0, prefix: str = "s") -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """``n`` picture + mask PNG pairs of ``size``² in ``folder``/images and /masks: {id: (CHW image, mask 0/1)}."""
    rng = np.random.default_rng(seed)
    (folder / "images").mkdir(parents=True, exist_ok=True)
    (folder / "masks").mkdir(parents=True, exist_ok=True)
    out = {}
    for i in range(n):
        image = rng.integers(0, 256, (size, size, 3), dtype=np.uint8)
        mask = (rng.random((size, size)) < 0.3).astype(np.uint8)
        Image.fromarray(image).save(folder / "images" / f"{prefix}{i:04d}.png")
        Image.fromarray(mask * 255).save(folder / "masks" / f"{prefix}{i:04d}.png")
        out[f"{prefix}{i:04d}"] = (image.transpose(2, 0, 1), mask)
    return out


def inferred(raw: Path, tmp: Path) -> tuple[dict, Path]:
    spec_path = tmp / "spec.yaml"
    spec_path.write_text(infer_spec(raw, spec_path).text)
    return yaml.safe_load(spec_path.read_text()), spec_path


def epoch(path: Path, split: str) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """One shuffled epoch of the default loader (its chunk-aware sampler; a thin version's rows are
    mapped onto several files, whose chunks it does not align with: a plain shuffle), by id; every
    id once."""
    ds = H5Dataset(path, split, ("images", "masks"), image_dtype="uint8", mask_dtype="uint8", return_index=True)
    ids, got = ds.ids(), {}
    loader = ds.loader(batch_size=16, num_workers=2, seed=1)
    assert isinstance(loader.sampler, ChunkShuffleSampler) and loader.sampler.order.chunk_rows == ds.chunk_rows
    for x, m, rows in loader:
        for image, mask, row in zip(x.numpy(), m.numpy(), rows.tolist()):
            assert ids[row] not in got
            got[ids[row]] = (image, mask)
    assert sorted(got) == sorted(ids)
    return got


def test_small_pictures_are_stored_several_per_chunk_and_read_back_exactly(tmp_path):
    """32x32 picture + mask pairs (4 KB a sample): ``init`` writes a power of two of them per chunk;
    a build, a shuffled epoch of the default loader (each sample once, the source's values), an
    append (a thin version mapped onto the first and the new rows) and verify all take it."""
    source = pairs(tmp_path / "raw", 120, 32)
    text, spec_path = inferred(tmp_path / "raw", tmp_path)
    rows = text["storage"]["chunk_rows"]
    assert rows == CHUNK_BYTES // (4 * 32 * 32) == 16
    spec = load_spec(spec_path, output=tmp_path / "out")
    first = h5forge.build(spec)
    with h5py.File(first.path, "r") as f:
        assert f["train/images"].chunks == (rows, 3, 32, 32) and f["train/masks"].chunks == (rows, 1, 32, 32)
    # a row is read alone from the writer's joined chunks: the loader's sampler shuffles rows, not chunks
    assert H5Dataset(first.path).chunk_rows == 1
    seen = {}
    for split in SPLITS:
        seen |= epoch(Path(first.path), split)
    assert sorted(seen) == sorted(source)
    for sid, (image, mask) in seen.items():
        assert np.array_equal(image, source[sid][0]) and np.array_equal(mask[0], source[sid][1]), sid

    new = pairs(tmp_path / "inbox", 40, 32, seed=1, prefix="new")
    age_files(tmp_path / "inbox")
    second = h5forge.append(spec, inbox=tmp_path / "inbox")
    assert second.added == 40
    ds = H5Dataset(second.path, "train", ("images", "masks"))
    ds.reader.read(range(len(ds)))
    mapped = ds.reader._direct["images"]  # the thin version's rows, read from its files' chunks
    assert isinstance(mapped, MappedDataset) and [c.rows for c in mapped._chunks.values()] == [rows, rows]
    seen = {}
    for split in SPLITS:
        seen |= epoch(Path(second.path), split)
    assert sorted(seen) == sorted(source | new)
    for sid, (image, mask) in seen.items():
        want = (source | new)[sid]
        assert np.array_equal(image, want[0]) and np.array_equal(mask[0], want[1]), sid
    assert verify_file(second.path).ok and verify_file(first.path).ok


@pytest.mark.parametrize("size, rows", [(64, 4), (96, 1), (256, 1)])
def test_larger_pictures_get_fewer_per_chunk_down_to_one(tmp_path, size, rows):
    """64²: 16 KB a sample, 4 per chunk; from 96² (36 KB) one sample per chunk, as read fastest."""
    pairs(tmp_path / "raw", 4, size)
    text, _ = inferred(tmp_path / "raw", tmp_path)
    assert text["storage"]["chunk_rows"] == rows


def test_the_reader_decodes_a_row_alone_from_the_chunks_the_writer_joined(tmp_path):
    pairs(tmp_path / "raw", 40, 32)
    _, spec_path = inferred(tmp_path / "raw", tmp_path)
    result = h5forge.build(load_spec(spec_path, output=tmp_path / "out"))
    ds = H5Dataset(result.path, "train", ("images", "masks"))
    ds.reader.read_one(0)
    direct = ds.reader._direct["images"]
    assert isinstance(direct, DirectRows) and direct.chunk_rows == 16
    ds.reader.read(range(16))  # the first chunk is whole: its rows read alone, no chunk decoded and kept
    assert direct.chunks is not None and len(direct.chunks) == 0


# ---- CT and MR slices: lz4 only where it saves enough -------------------------------------------

def nifti_cases(folder: Path, volumes: list[np.ndarray]) -> Path:
    folder.mkdir(parents=True)
    for i, v in enumerate(volumes):
        nibabel.save(nibabel.Nifti1Image(v, np.eye(4)), folder / f"case{i}.nii")
    return folder


def nibabel_cases(folder: Path, name: str, n: int = 3) -> Path:
    """``n`` cases of one of nibabel's own test volumes (real scans), each a little different."""
    img = nibabel.load(Path(nibabel_data) / name)
    data = np.asanyarray(img.dataobj)
    return nifti_cases(folder, [np.roll(data, i, axis=0) for i in range(n)])


@pytest.mark.parametrize("source", ["dicom CT_small", "nifti anatomical.nii"])
def test_slices_lz4_saves_little_on_are_stored_as_they_are(tmp_path, source):
    """pydicom's CT_small.dcm as DICOM case folders (h5forge's CT demo) and nibabel's anatomical.nii:
    LZ4 saves a few % on their slices, so the field is written with ``codec: none``."""
    raw = tmp_path / "raw"
    if source.startswith("dicom"):
        generate_ct(raw, n=3, seed=0, bad=False, depth_range=(4, 6))
    else:
        nibabel_cases(raw, "anatomical.nii")
    text, spec_path = inferred(raw, tmp_path)
    field = text["fields"]["ct" if source.startswith("dicom") else "volume"]
    assert field["codec"] == "none" and text["storage"]["codec"] == "lz4"
    assert re.search(rf"LZ4 saves -?\d+% on \d+ sampled slices, under {LZ4_WORTH:.0%}", spec_path.read_text())


@pytest.mark.parametrize("source", ["nifti example4d.nii.gz", "synthetic"])
def test_slices_lz4_shrinks_keep_lz4(tmp_path, source):
    """nibabel's example4d.nii.gz (a real MR run, its background dark) and a synthetic CT whose
    slices lie mostly outside the field of view: LZ4 saves more than the rule's share, lz4 stays."""
    raw = tmp_path / "raw"
    if source == "synthetic":
        rng = np.random.default_rng(0)
        yy, xx = np.mgrid[:64, :64] - 31.5
        inside = np.hypot(yy, xx) < 12
        nifti_cases(raw, [np.where(inside[..., None], rng.normal(40, 60, (64, 64, 6)), -3024).astype(np.int16)
                          for _ in range(3)])
    else:
        nibabel_cases(raw, "example4d.nii.gz")
    text, spec_path = inferred(raw, tmp_path)
    assert "codec" not in text["fields"]["volume"] and text["storage"]["codec"] == "lz4"
    saved = re.search(rf"# codec: none  <- LZ4 saves (\d+)% on \d+ sampled slices, {LZ4_WORTH:.0%} or more",
                      spec_path.read_text())
    assert saved and int(saved[1]) >= 100 * LZ4_WORTH
