"""The conformance suite: every registered kind, through the plain pipeline, end to end.

Modelled on zarr-python's ``zarr.testing.store.StoreTests``: one set of behaviours that any kind
must show, run against each entry of ``h5forge.kinds.REGISTRY`` (the ``example`` fixture is
parametrized over it), so a new kind is checked by registering it. Each kind is shown by a demo
folder (``Plugins.demos``) whose spec ``init`` infers (``Plugins.detectors``), built with
``h5forge.build`` and grown with ``h5forge.append``. docs/extending.md describes it.
"""

from __future__ import annotations

import inspect

import h5py
import numpy as np
import pytest

from h5forge._format.names import SPLITS
from h5forge.kinds import REGISTRY, FieldKind, ReadOptions, decode_sample, demos, read_options, reader_options
from h5forge.kinds.parts import sample_digest
from h5forge.read._reader import SplitReader, model_batch
from tests.helpers.tamper import copy_writable
from tests.kinds.conformance.examples import GOOD, NEW

pytestmark = pytest.mark.slow  # one small build per demo folder



def _splits(path) -> list[str]:
    with h5py.File(path, "r") as f:
        return [s for s in SPLITS if s in f and int(f[s].attrs["count"]) > 0]


def _by_id(path, paths: list[str]) -> dict[str, dict[str, object]]:
    """Every sample's stored values of ``paths``, by sample id, across the splits."""
    out: dict[str, dict[str, object]] = {}
    for split in _splits(path):
        with SplitReader(path, split, fields=paths) as r:
            values = r.read(range(len(r)))
            for i, sid in enumerate(r.ids()):
                out[sid] = {p: values[p][i] for p in paths}
    return out


def _same(a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and a.dtype == b.dtype and np.array_equal(a, b, equal_nan=a.dtype.kind == "f")


# ---- the class -------------------------------------------------------------------------------

def test_the_kind_declares_its_contract(kind_name, examples):
    cls = REGISTRY[kind_name]
    assert issubclass(cls, FieldKind) and not inspect.isabstract(cls)
    assert cls.Spec.model_fields["kind"].default == kind_name  # the spec union's discriminator
    assert cls.layout_doc, "docs/format.md lists every kind's stored form"
    for detector in vars(cls).get("detectors", ()):
        assert callable(detector.load()) and detector.expects
    for demo in vars(cls).get("demos", ()):
        assert callable(demo.load()) and demo.default_n > 0 and demo.about
    for option in cls.read_options:
        assert reader_options()[option.name] == option
    assert examples.demo_for(kind_name) is not None, "some demo folder must show the kind"


def test_unknown_reader_options_are_refused():
    with pytest.raises(TypeError, match="unknown reader option"):
        read_options("torch", {"imge_dtype": "uint8"})


# ---- build, append, thin versions, export ------------------------------------------------------

def test_round_trip(example):
    """Each stored value is what the kind decodes from the sample's source, and each source's
    digest is the one the kind's ``source_digest`` gives (what incremental builds compare)."""
    from h5forge._ingest.discover import discover
    from h5forge.spec import load_spec

    spec = load_spec(example.spec_path)
    stored = _by_id(example.version, example.paths)
    refs = {ref.id: ref for ref in discover(spec).samples}
    assert len(stored) == GOOD and set(stored) <= set(refs)
    for sid, values in stored.items():
        decoded = decode_sample(example.kinds, example.raw, refs[sid])
        for path in example.paths:
            kind = example.kinds[path]
            assert _same(values[path], kind.stack([decoded[path].value])[0] if not kind.stored().ragged
                         else decoded[path].value), (sid, path)
            if kind.files:
                file_digest = kind.source_digest(example.raw, refs[sid].files[kind.name])
                assert decoded[path].sha256 == sample_digest(kind, file_digest, refs[sid])


def test_append_makes_a_thin_version(example, examples):
    from h5forge._store.verify import verify_file

    second = examples.appended(example.kind)
    before, after = _by_id(example.version, example.paths), _by_id(second, example.paths)
    assert len(after) == GOOD + NEW and set(before) < set(after)
    assert all(_same(after[sid][p], v[p]) for sid, v in before.items() for p in example.paths)
    with h5py.File(second, "r") as f:
        virtual = [f[s][p].is_virtual for s in _splits(second) for p in example.paths]
    assert any(virtual), "an append publishes a thin version over its parent"
    assert verify_file(second).ok


def test_export_is_self_contained(example, examples, tmp_path):
    from h5forge._store.thin import export
    from h5forge._store.verify import verify_file

    second = examples.appended(example.kind)
    copy = export(second, tmp_path / "exported.h5")
    with h5py.File(copy, "r") as f:
        assert not any(f[s][p].is_virtual for s in _splits(copy) for p in example.paths)
    a, b = _by_id(second, example.paths), _by_id(copy, example.paths)
    assert a.keys() == b.keys() and all(_same(a[s][p], b[s][p]) for s in a for p in example.paths)
    assert verify_file(copy).ok


def test_a_version_mapped_equals_the_copied_one(example, tmp_path):
    """``storage.assemble: mapped`` (one file per batch of 3, mapped by virtual datasets; a ragged
    field's values by their element counts): the values, checksums and split digests of the copy
    built in the same batches (floating-point statistics are summed batch by batch)."""
    import h5forge
    from h5forge.spec import load_spec
    from h5forge._store.verify import verify_file

    spec = load_spec(example.spec_path)
    built = {}
    for how in ("copy", "mapped"):
        spec = spec.model_copy(update={"storage": spec.storage.model_copy(update={"assemble": how}),
                                       "compute": spec.compute.model_copy(update={"batch_size": 3})})
        built[how] = h5forge.build(spec, output=tmp_path / how).path
    mapped, copied = built["mapped"], built["copy"]
    with h5py.File(mapped, "r") as m, h5py.File(copied, "r") as c:
        assert all(m[s][p].is_virtual for s in _splits(mapped) for p in example.paths if example.kinds[p].stored().bulk)
        for split in SPLITS:
            assert m[split].attrs["digest"] == c[split].attrs["digest"], split
            assert m[split]["checksum"][()].tolist() == c[split]["checksum"][()].tolist(), split
    a, b = _by_id(mapped, example.paths), _by_id(example.version, example.paths)
    assert a.keys() == b.keys() and all(_same(a[s][p], b[s][p]) for s in a for p in example.paths)
    assert verify_file(mapped).ok


# ---- verify ------------------------------------------------------------------------------------

def _changed(value: np.ndarray) -> np.ndarray:
    if value.dtype.kind == "f":
        return np.nextafter(value, np.inf).astype(value.dtype) if np.isfinite(value) else np.zeros_like(value)
    if value.dtype.kind == "b":
        return ~value
    return value ^ value.dtype.type(1)


def test_verify_catches_a_flipped_value(example, tmp_path):
    """One value of one stored sample of each of the kind's datasets, changed through HDF5 (the
    file stays well-formed): only the checksums can tell, and they must."""
    from h5forge._store.verify import verify_file

    assert verify_file(example.version, resample=0, latency_reads=0).ok
    for path in example.paths:
        copy = copy_writable(example.version, tmp_path / f"{path.replace('/', '_')}.h5")
        split = _splits(copy)[0]
        with h5py.File(copy, "r+") as f:
            ds = f[split][path]
            at = (0,) * ds.ndim
            assert ds.size, (split, path)
            ds[at] = _changed(np.asarray(ds[at]))
        report = verify_file(copy, resample=0, latency_reads=0)
        assert not report.ok and any("checksum" in e for e in report.errors), (path, report.errors)


# ---- preview -----------------------------------------------------------------------------------

def test_preview_draws_it(example):
    from h5forge._views.preview import compose, load_samples

    drawn = load_samples(example.version, n=GOOD)
    assert drawn
    values = _by_id(example.version, list(example.kinds))  # companions too: a volume's spacing
    for path in example.paths:
        kind = example.kinds[path]
        for d in drawn:
            picture = kind.preview_of(values[d.id])
            if picture is None:  # a kind that draws nothing says it in a caption
                assert kind.caption_of(values[d.id])
                continue
            assert picture.dtype == np.uint8 and picture.ndim == 3 and picture.shape[2] == 3
            shown = d.pictures.get(path) if kind.overlay_on is None else \
                next((p for p in d.overlays.get(kind.overlay_on, []) if _same(p, picture)), None)
            assert shown is not None and _same(shown, picture), (path, d.id)
    assert compose(drawn).image.size[0] > 0


# ---- readers -----------------------------------------------------------------------------------

def _reference(example, split: str, rows: list[int], reader: str) -> dict[str, object]:
    with SplitReader(example.version, split, fields=example.paths) as r:
        return model_batch(r, rows, ReadOptions(reader))


def _assert_values(got, want, path: str) -> None:
    if isinstance(want, list):  # strings
        assert list(got) == want, path
    elif hasattr(want, "lengths"):  # ragged: padded values + lengths
        assert np.array_equal(np.asarray(got.lengths), want.lengths), path
        assert np.array_equal(np.asarray(got.values), want.values, equal_nan=True), path
    else:
        got = np.asarray(got)
        assert got.dtype == want.dtype and np.array_equal(got, want, equal_nan=True), path


def test_torch_reader(example):
    import torch
    from torch.utils.data import DataLoader

    from h5forge.read.torch import H5Dataset, collate

    split = _splits(example.version)[0]
    ds = H5Dataset(example.version, split, fields=example.paths)
    rows = list(range(min(4, len(ds))))
    want = _reference(example, split, rows, "torch")
    single = [ds[i] if len(example.paths) > 1 else (ds[i],) for i in rows]
    for j, path in enumerate(example.paths):
        for k, i in enumerate(rows):
            one = _reference(example, split, [i], "torch")[path]
            value = single[k][j]
            if isinstance(one, list):
                assert value == one[0]
            elif hasattr(one, "lengths"):
                assert np.array_equal(np.asarray(value), one.values[0][:one.lengths[0]], equal_nan=True)
            else:
                assert np.array_equal(value.numpy(), one[0], equal_nan=True) and value.numpy().dtype == one.dtype
    for make in (lambda: DataLoader(ds, batch_size=len(rows), collate_fn=collate),
                 lambda: ds.loader(batch_size=len(rows), shuffle=False)):
        batch = next(iter(make()))
        batch = batch if len(example.paths) > 1 else (batch,)
        for j, path in enumerate(example.paths):
            got = batch[j]
            if isinstance(got, torch.Tensor):
                got = got.numpy()
            elif hasattr(got, "lengths"):
                got = type(got)(*(np.asarray(c) for c in got))
            _assert_values(got, want[path], path)


def test_jax_reader(example):
    from h5forge.read.jax import Source, batches

    split = _splits(example.version)[0]
    src = Source(example.version, split, fields=example.paths)
    rows = list(range(min(4, len(src))))
    want = _reference(example, split, rows, "jax")
    got = src.get_batch(rows)
    for path in example.paths:
        _assert_values(got[path], want[path], path)
    epoch = list(batches(src, batch_size=1, shuffle=False, drop_last=False))
    assert len(epoch) == len(src) and all(set(b) == set(example.paths) for b in epoch)
