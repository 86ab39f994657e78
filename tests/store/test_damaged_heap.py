"""A version whose global heap (where HDF5 keeps the strings: ids, paths, most attributes) is damaged.

HDF5 walks a heap collection by the sizes stored in it, with no checksum: a damaged size made
``h5forge verify`` and a rebuild spin for ever inside the library, or fail with a traceback about a
buffer. Verify must say BROKEN, a rebuild that would copy rows from such a version must stop with a
clear error before reading them, and nothing may be published from it.
"""

from __future__ import annotations

import mmap
import struct
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
from PIL import Image
import yaml

import h5forge
from h5forge._format import heap
from h5forge._store.isolated import Stuck, in_child
from h5forge._store.verify import verify_file
from h5forge._views.info import version_info
from h5forge._store.versions import latest
from h5forge.errors import SamplesRemoved
from tests.helpers.data import age_files, drop_samples, write_spec_file
from tests.helpers.tamper import reader_view

QUICK = {"resample": 0, "latency_reads": 0}


def collections(path: Path) -> list[int]:
    """Where the collections HDF5 wrote start (their signature and reserved bytes)."""
    data, written = path.read_bytes(), heap.SIGNATURE + heap.RESERVED
    found, at = [], data.find(written)
    while at >= 0:
        found.append(at)
        at = data.find(written, at + 8)
    return found


def grown(path: Path, offset: int, by: int) -> bytes:
    """The bytes of ``path`` with the size (u64) at ``offset`` grown by ``by``."""
    data = bytearray(path.read_bytes())
    (size,) = struct.unpack_from("<Q", data, offset)
    struct.pack_into("<Q", data, offset, size + by)
    return bytes(data)


def damaged_copies(path: Path, work: Path) -> list[tuple[str, Path]]:
    """Per collection of ``path``: its size grown by 256 bytes (into whatever follows it in the file),
    and its first object's size grown past the collection's end."""
    copies = []
    for at in collections(path):
        for what, offset, by in (("size", at + 8, 256), ("object size", at + 16 + 8, 1 << 56)):
            copy = work / f"{at}-{what.replace(' ', '_')}.h5"
            copy.write_bytes(grown(path, offset, by))
            copies.append((f"{what} of the collection at {at}", copy))
    return copies


@pytest.fixture
def built(raw_demo, tmp_path):
    spec_file = write_spec_file(raw_demo, tmp_path / "out", tmp_path / "spec.yaml", inbox=tmp_path / "inbox")
    assert h5forge.build(spec_file).version == 1
    return spec_file, tmp_path / "out"


def test_every_collection_of_a_version_is_walked_and_each_damage_is_named(built, tmp_path, monkeypatch):
    _, out = built
    version = out / "dataset_v0001.h5"
    assert heap.damage(version) is None
    with open(version, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as m:
        assert heap.MEMMEM is not None and heap._signatures(m) == collections(version)
        monkeypatch.setattr(heap, "MEMMEM", None)  # where the C library has no memmem
        assert heap._signatures(m) == collections(version)
    copies = damaged_copies(version, tmp_path)
    assert len(copies) >= 4  # a version keeps its strings in several collections
    for what, copy in copies:
        problem = heap.damage(copy)
        assert problem is not None and "global heap collection at byte" in problem, what
        report = verify_file(copy, isolate=True, **QUICK)
        assert not report.ok and report.checks["global heap"] == "FAILED", what
        assert any("the file is damaged" in e for e in report.errors), (what, report.errors)


def looping(path: Path, work: Path) -> Path:
    """A copy of ``path`` whose collections each start with an object of index 0 and size 0: HDF5
    2.0 then walks on the spot for ever (in H5HG__cache_heap_deserialize) when it reads any string,
    as ``h5forge verify`` and ``h5forge info`` did."""
    data = bytearray(path.read_bytes())
    for at in collections(path):
        data[at + heap.HEADER : at + 2 * heap.HEADER] = bytes(heap.HEADER)
    copy = work / "looping.h5"
    copy.write_bytes(bytes(data))
    return copy


def test_verify_of_a_heap_that_sent_hdf5_round_for_ever_ends_with_broken(built, tmp_path):
    _, out = built
    version = out / "dataset_v0001.h5"
    damaged = looping(version, tmp_path)
    cli = Path(sys.executable).parent / "h5forge"
    # the command must end: a bound no loaded machine reaches, where it used to run for ever
    done = subprocess.run([str(cli), "verify", str(damaged)], capture_output=True, text=True, timeout=900)
    assert done.returncode == 1, done.stdout + done.stderr
    first = collections(version)[0]
    assert f"global heap collection at byte {first} holds an object at byte {first + 16}" in done.stdout


def test_a_look_that_hdf5_loops_on_is_stopped_and_said(built, tmp_path):
    """``info``, ``diff``, ``preview`` and ``versions`` do not walk the heap first (a pass over the
    whole file): their child is given a time limit instead, and killed past it."""
    _, out = built
    damaged = looping(out / "dataset_v0001.h5", tmp_path)
    with pytest.raises(Stuck, match=r"cannot read .*looping.h5: no answer in 20 s; the HDF5 library may be stuck"):
        in_child(version_info, damaged, what=f"read {damaged}", limit=20)
    assert in_child(version_info, out / "dataset_v0001.h5", what="read it")["file"] == "dataset_v0001.h5"


def test_a_thin_version_names_the_damaged_file_it_reads_from(built, raw_new, tmp_path):
    spec_file, out = built
    drop_samples(raw_new, tmp_path / "inbox", [f"cell_{i:06d}" for i in range(6)], rename="new_")
    age_files(tmp_path / "inbox")
    assert h5forge.append(spec_file).version == 2
    delta = out / "dataset_v0002.delta.h5"
    delta.chmod(0o644)
    delta.write_bytes(grown(delta, collections(delta)[0] + 8, 256))
    problem = heap.version_damage(out / "dataset_v0002.h5")
    assert problem is not None and problem.startswith("dataset_v0002.delta.h5, which it reads from:")
    assert not verify_file(out / "dataset_v0002.h5", isolate=True, **QUICK).ok


def damage_latest(out: Path) -> None:
    version = out / "dataset_v0001.h5"
    version.chmod(0o644)
    version.write_bytes(grown(version, collections(version)[0] + 8, 256))
    version.chmod(0o444)


def test_a_rebuild_over_a_damaged_latest_stops_clearly_or_builds_afresh(raw_copy, tmp_path):
    """One input changed: the rebuild would copy the other rows from latest, whose heap is damaged."""
    spec_file = write_spec_file(raw_copy, tmp_path / "out", tmp_path / "spec.yaml")
    out = tmp_path / "out"
    assert h5forge.build(spec_file).version == 1
    damage_latest(out)
    picture = sorted((raw_copy / "images").glob("cell_*.png"))[0]
    pixels = np.asarray(Image.open(picture)).copy()
    pixels[0, 0] ^= 1
    Image.fromarray(pixels).save(picture)
    with pytest.raises(SamplesRemoved, match="cannot tell which samples would leave latest.*global heap"):
        h5forge.build(spec_file)
    assert latest(out) == 1 and not (out / "dataset_v0002.h5").exists()
    # allowed to drop samples, the build takes nothing from the damaged version and cleans every sample
    data = yaml.safe_load(spec_file.read_text())
    data["output"]["allow_removals"] = True
    spec_file.write_text(yaml.safe_dump(data))
    result = h5forge.build(spec_file)
    assert result.version == 2 and latest(out) == 2 and result.timings["reused"] == 0
    assert verify_file(out / "dataset_latest.h5").ok
    reference = write_spec_file(raw_copy, tmp_path / "reference", tmp_path / "reference.yaml")
    assert h5forge.build(reference).version == 1
    assert reader_view(out / "dataset_v0002.h5") == reader_view(tmp_path / "reference" / "dataset_v0001.h5")


def test_heaps_written_by_other_hdf5_builds_pass():
    """The HDF5 files h5py ships for its own tests, written elsewhere (one on a big-endian machine)."""
    data_files = Path(h5py.__file__).parent / "tests" / "data_files"
    with_heaps = [p for p in sorted(data_files.glob("*.h5")) if heap.SIGNATURE in p.read_bytes()]
    assert len(with_heaps) >= 2, sorted(data_files.glob("*.h5"))
    for path in with_heaps:
        assert heap.damage(path) is None, path
        with h5py.File(path, "r") as f:  # and HDF5 reads them, strings and all
            f.visititems(lambda name, obj: obj[()] if isinstance(obj, h5py.Dataset) else None)


def in_a_child(call: str, *args: Path) -> subprocess.CompletedProcess:
    """``call`` (Python, ``sys.argv[1:]`` its arguments) in a fresh process, within a bound no loaded
    machine reaches: a read HDF5 loops on must fail the test, not hang it."""
    code = f"import sys, h5forge; {call}"
    return subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True, timeout=900)


def test_a_nightly_over_a_looping_latest_ends_with_a_clear_stop(built, tmp_path):
    """Nothing changed in the sources: the unchanged check reads latest's input key, a string."""
    spec_file, out = built
    version = out / "dataset_v0001.h5"
    looped = looping(version, tmp_path).read_bytes()
    version.chmod(0o644)
    version.write_bytes(looped)
    done = in_a_child("h5forge.build(sys.argv[1])", spec_file)
    assert done.returncode == 1 and "SamplesRemoved" in done.stderr, done.stderr[-3000:]
    assert "cannot tell which samples would leave latest" in done.stderr and "global heap" in done.stderr
    assert latest(out) == 1 and not (out / "dataset_v0002.h5").exists()


def test_a_dataset_address_moved_onto_a_looping_collection_does_not_hide_it(built, tmp_path):
    """The walk reads no layout: a contiguous dataset said to lie over a collection (one damaged
    address) does not take that collection out of the search."""
    _, out = built
    version = out / "dataset_v0001.h5"
    looped = looping(version, tmp_path)
    data = bytearray(looped.read_bytes())
    with h5py.File(version, "r") as f:
        contiguous = [d for d in _datasets(f) if d.chunks is None and d.id.get_offset() is not None]
        offset, size = contiguous[0].id.get_offset(), contiguous[0].id.get_storage_size()
    layout = b"\x03\x01" + struct.pack("<QQ", offset, size)  # layout message v3, contiguous: address, size
    assert data.count(layout) == 1
    first = collections(version)[0]
    struct.pack_into("<Q", data, data.find(layout) + 2, first)
    looped.write_bytes(bytes(data))
    assert f"collection at byte {first} holds an object at byte {first + 16}" in (heap.damage(looped) or "")
    check = "from h5forge._store.verify import verify_file; print(verify_file(sys.argv[1], isolate=True).ok)"
    done = in_a_child(check, looped)
    assert done.stdout.strip() == "False", done.stderr[-3000:]


def _datasets(f: h5py.File) -> list[h5py.Dataset]:
    found: list[h5py.Dataset] = []
    f.visititems(lambda _, obj: found.append(obj) if isinstance(obj, h5py.Dataset) else None)
    return found


def test_a_chunk_index_that_never_ends_does_not_stall_the_walk(tmp_path):
    """A v1 chunk B-tree made a graph of nodes each listing the one below 64 times: reading a chunk
    (a search) stays quick, listing the chunks visits 64**6 entries. The walk lists none."""
    path = tmp_path / "dag.h5"
    with h5py.File(path, "w", libver="earliest") as f:
        f.create_dataset("x", data=np.zeros(4 * 33000, np.uint8), chunks=(33000,))
        f.create_dataset("ids", data=[f"id-{i}" for i in range(20)], dtype=h5py.string_dtype())
    data = bytearray(path.read_bytes())
    leaf = data.find(b"TREE\x01\x00")  # the index's one leaf
    key_size, header, entries = 4 + 4 + 2 * 8, 24, 64  # a key: chunk size, filter mask, offsets (rank 1, + 1)
    key = bytes(data[leaf + header : leaf + header + key_size])
    undefined = struct.pack("<Q", 2**64 - 1)
    below = leaf
    for level in range(1, 7):
        node = b"TREE" + bytes([1, level]) + struct.pack("<H", entries) + undefined + undefined
        node += b"".join(key + struct.pack("<Q", below) for _ in range(entries)) + key
        below = len(data)
        data += node
    layout = data.find(b"\x03\x02\x02" + struct.pack("<Q", leaf))  # chunked layout v3: the index's address
    assert layout > 0
    struct.pack_into("<Q", data, layout + 3, below)
    struct.pack_into("<Q", data, 40, len(data))  # the superblock's end of file
    path.write_bytes(bytes(data))
    done = in_a_child("from h5forge._format import heap; print(heap.damage(sys.argv[1]))", path)
    assert done.stdout.strip() == "None", done.stderr[-3000:]


def _strings_file(path: Path, strings: list[str]) -> Path:
    with h5py.File(path, "w") as f:
        f.create_dataset("s", data=strings, dtype=h5py.string_dtype())
    return path


def test_a_collection_with_other_reserved_bytes_is_walked_as_hdf5_reads_it(tmp_path):
    """HDF5 checks a collection's signature and version, not the three reserved bytes after them."""
    path = _strings_file(tmp_path / "reserved.h5", [f"id-{i}" for i in range(20)])
    (first,) = collections(path)
    data = bytearray(path.read_bytes())
    data[first + 5] = 1
    data[first + heap.HEADER : first + 2 * heap.HEADER] = bytes(heap.HEADER)  # and made to loop
    path.write_bytes(bytes(data))
    assert f"collection at byte {first} holds an object" in (heap.damage(path) or "")


def test_a_string_that_spells_a_collection_signature_is_no_damage(tmp_path):
    """The bytes of a collection's signature inside one of its strings are that string's."""
    path = _strings_file(tmp_path / "spelled.h5", ["GCOL\x01", "GCOL\x01\x01\x01\x01\xff", "plain"])
    assert path.read_bytes().count(heap.SIGNATURE) == 3
    assert heap.damage(path) is None
    with h5py.File(path, "r") as f:
        assert f["s"][0] == b"GCOL\x01"


def test_a_signature_in_the_last_bytes_of_a_file_is_no_damage(tmp_path):
    """Stored values that end the file with a signature's five bytes leave no room for HDF5's header."""
    path = tmp_path / "tail.h5"
    with h5py.File(path, "w", libver="latest") as f:
        f.create_dataset("ids", data=["a", "b"], dtype=h5py.string_dtype())
        f.create_dataset("image", shape=(4096,), dtype=np.uint8)[-8:] = np.frombuffer(b"\0\0\0GCOL\x01", np.uint8)
    assert path.read_bytes().endswith(heap.SIGNATURE)
    assert heap.damage(path) is None


def _adjacent(path: Path) -> tuple[Path, list[int]]:
    """A file of 4,000 strings, written at once: HDF5 puts them in adjacent collections of 64 KiB."""
    strings = [f"string-{i:06d}-" * 4 for i in range(4000)]
    _strings_file(path, strings)
    found = collections(path)
    assert found[1] == found[0] + 65536 and found[2] == found[1] + 65536
    return path, found


def _reads(path: Path) -> list[bytes]:
    with h5py.File(path, "r") as f:
        return list(f["s"][()])


def test_one_bit_that_grows_a_collection_over_the_next_is_named(tmp_path):
    """HDF5 then reads other strings, silently, in place of 910 of them."""
    path, (first, second, *_) = _adjacent(tmp_path / "adjacent.h5")
    intact = _reads(path)
    data = bytearray(path.read_bytes())
    data[first + 10] ^= 0x02  # bit 17 of its size: 65,536 becomes 196,608 bytes
    path.write_bytes(bytes(data))
    assert _reads(path) != intact  # the damage this guards against
    assert heap.damage(path) == (
        f"its global heap collection at byte {first} runs into the collection at byte {second} (the file is damaged)"
    )


def test_a_collection_grown_by_a_few_bytes_still_leaves_the_next_one_walked(tmp_path):
    """Fewer bytes than a header past a collection's last object are its free space to HDF5, and
    they may be the next collection's start: that collection is walked all the same."""
    path, (first, second, *_) = _adjacent(tmp_path / "adjacent.h5")
    data = bytearray(path.read_bytes())
    data[first + 8] ^= 0x08  # its size grows by 8 bytes, into the next one's header
    data[second + heap.HEADER : second + 2 * heap.HEADER] = bytes(heap.HEADER)  # which loops
    path.write_bytes(bytes(data))
    assert f"collection at byte {second} holds an object at byte {second + 16}" in (heap.damage(path) or "")
