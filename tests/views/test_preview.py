"""The contact sheet on real built versions: the PNG is opened and a known sample's tile is compared
pixel by pixel with what the file stores (cells with masks, CT volumes from real DICOM series with
per-slice masks, EDF recordings written by pyedflib)."""

from __future__ import annotations

import os

import h5py
import numpy as np
import pytest
import yaml
from PIL import Image
from typer.testing import CliRunner

from h5forge._cli import app
from h5forge.errors import UsageError
from h5forge._format.layout import decode_str
from h5forge._demo import CT_SPHERE_HU, generate_ct, generate_signals
from h5forge._init import infer_spec
from h5forge.kinds.mask import OVERLAY
from h5forge.kinds.signal import PLOT_INK, PLOT_SIZE, trace_plot
from h5forge._views.preview import artifact_data_uri, load_samples, write_preview
from tests.helpers.demo_build import build_demo

GREEN = OVERLAY[0].astype(np.uint16)  # class 1


def stored(path, split, sid, *names):
    with h5py.File(os.path.realpath(path), "r") as f:
        g = f[split]
        row = decode_str(g["ids"][()]).index(sid)
        out = []
        for name in names:
            if name + "_lengths" in g:  # a ragged field: its row is a range of elements
                off = np.concatenate([[0], np.cumsum(g[name + "_lengths"][()])])
                out.append(g[name][off[row]:off[row + 1]])
            else:
                out.append(g[name][row])
        return out


def region(png, box):
    x, y, w, h = box
    return np.asarray(Image.open(png).convert("RGB"))[y:y + h, x:x + w].astype(np.uint16)


def half(base, colour):
    return (base + colour + 1) // 2


@pytest.fixture(scope="module")
def cells(raw_demo, tmp_path_factory):
    return build_demo(raw_demo, tmp_path_factory.mktemp("cells"))


def built_from_init(raw, tmp, build_spec):
    """The spec ``init`` infers for ``raw``, built into ``tmp/out``."""
    data = yaml.safe_load(infer_spec(raw, tmp / "spec.yaml").text)
    data["source"]["root"], data["output"]["dir"] = str(raw), str(tmp / "out")
    return build_spec(data)[0]


def test_an_image_tile_is_the_stored_image_with_its_mask_painted_in_green(cells, tmp_path):
    with h5py.File(cells, "r") as f:
        sid = decode_str(f["train"]["ids"][()])[3]
        label = f["train"]["meta/label"][3].decode()
        focus = float(f["train"]["meta/focus_score"][3])
    png = tmp_path / "sheet.png"
    sheet = write_preview(cells, png, ids=[sid], tile=160)
    assert sheet.ids == [sid] and sheet.samples[0].split == "train"
    x, y, w, h = sheet.boxes[sid]["images"]
    assert (w, h) == (160, 160)  # 224 x 224 fitted into the tile
    image, mask = stored(cells, "train", sid, "images", "masks")
    expected = np.asarray(Image.fromarray(image.transpose(1, 2, 0)).resize((160, 160), Image.Resampling.LANCZOS))
    painted = np.asarray(Image.fromarray(mask[0]).resize((160, 160), Image.Resampling.NEAREST)) > 0
    got = region(png, sheet.boxes[sid]["images"])
    assert 0 < painted.sum() < painted.size
    assert np.array_equal(got[~painted], expected[~painted])
    assert np.array_equal(got[painted], half(expected[painted].astype(np.uint16), GREEN))
    assert f"label={label}" in sheet.samples[0].captions
    assert f"focus_score={focus:.4g}" in sheet.samples[0].captions  # floats cut to 4 digits


def test_random_samples_are_seeded_and_ids_are_looked_up_in_every_split(cells, tmp_path):
    first = [s.id for s in load_samples(cells, n=5, seed=3)]
    assert first == [s.id for s in load_samples(cells, n=5, seed=3)]
    assert first != [s.id for s in load_samples(cells, n=5, seed=4)]
    with h5py.File(cells, "r") as f:
        val_id = decode_str(f["val"]["ids"][()])[0]
        train_ids = decode_str(f["train"]["ids"][()])
    assert set(first) <= set(train_ids) and len(set(first)) == 5
    picked = load_samples(cells, ids=[val_id, train_ids[0]])
    assert [(s.split, s.id) for s in picked] == [("val", val_id), ("train", train_ids[0])]
    with pytest.raises(UsageError, match="1 id\\(s\\) not in split 'train'.*: " + val_id):
        load_samples(cells, split="train", ids=[val_id])


def test_a_volume_is_drawn_as_three_mid_planes_with_its_label_volume(tmp_path, build_spec):
    raw = tmp_path / "raw"
    generate_ct(raw, n=2, seed=0, bad=False)
    path = built_from_init(raw, tmp_path, build_spec)
    drawn = load_samples(path, n=2)
    sid = drawn[0].id
    volume, labels, spacing = stored(path, "train", sid, "ct", "ct_mask", "ct_spacing")
    d, h, w = volume.shape
    picture = drawn[0].pictures["ct"]
    window = np.clip(np.round((volume.astype(np.float64) + 160) / 400 * 255), 0, 255).astype(np.uint8)  # W/L 400/40
    parts = drawn[0].parts["ct"]
    assert parts["axial"] == (0, 0, w, h)  # in-plane pixels are the finest spacing: drawn 1:1
    assert np.array_equal(picture[:h, :w, 0], window[d // 2])
    for name, plane in (("coronal", window[:, h // 2, :]), ("sagittal", window[:, :, w // 2])):
        left, top, pw, ph = parts[name]
        assert ph == round(d * spacing[0] / spacing[2]) and pw == plane.shape[1]  # slices stretched by spacing
        rows = np.arange(ph) * d // ph
        assert np.array_equal(picture[top:top + ph, left:left + pw, 0], plane[rows])
    overlay = drawn[0].overlays["ct"][0]
    sphere = labels[d // 2] > 0
    assert sphere.any() and (volume[d // 2][sphere] >= CT_SPHERE_HU - 1024).all()
    assert (overlay[:h, :w][sphere] == OVERLAY[0]).all() and not overlay[:h, :w][~sphere].any()
    # on the sheet: the three planes, scaled to the tile, with the sphere painted over them
    png = tmp_path / "ct.png"
    sheet = write_preview(path, png, ids=[sid], tile=300)
    x, y, bw, bh = sheet.boxes[sid]["ct"]
    assert bw > picture.shape[1]  # three tiles wide: the planes grow, by nearest neighbour
    base = np.asarray(Image.fromarray(picture).resize((bw, bh), Image.Resampling.NEAREST)).astype(np.uint16)
    painted = np.asarray(Image.fromarray(overlay).resize((bw, bh), Image.Resampling.NEAREST)).any(axis=2)
    got = region(png, (x, y, bw, bh))
    planes = np.zeros((bh, bw), bool)
    for name in ("axial", "coronal", "sagittal"):
        px, py, pw, ph = sheet.boxes[sid][f"ct/{name}"]
        planes[py - y:py - y + ph, px - x:px - x + pw] = True
    assert 0 < planes.sum() < planes.size and not painted[~planes].any()
    assert np.array_equal(got[planes & ~painted], base[planes & ~painted])
    assert np.array_equal(got[painted], half(base[painted], GREEN))
    assert (got[~planes] == (34, 34, 38)).all()  # between and under the planes: the sheet's background


def test_each_signal_channel_is_a_line_plot_of_its_stored_values(tmp_path, build_spec):
    raw = tmp_path / "raw"
    generate_signals(raw, n=2, seed=0, bad=False)
    path = built_from_init(raw, tmp_path, build_spec)
    png = tmp_path / "sig.png"
    sheet = write_preview(path, png, n=1, tile=PLOT_SIZE[1])  # the plots at their own size
    sid = sheet.ids[0]
    assert list(sheet.boxes[sid]) == ["acc", "volt", "temp"]
    for channel in ("acc", "volt", "temp"):
        (values,) = stored(path, "train", sid, channel)
        got = region(png, sheet.boxes[sid][channel])
        assert np.array_equal(got, trace_plot(values))
        ink = (got == PLOT_INK).all(axis=2)
        assert ink[:, 1:-1].any(axis=0).all()  # a connected trace across the whole width
        top, bottom = np.flatnonzero(ink.any(axis=1))[[0, -1]]
        assert (top, bottom) == (1, PLOT_SIZE[0] - 2)  # the channel's max and min touch the frame
    assert any(c.startswith("acc: ") and c.endswith("s at 1000 Hz") for c in sheet.samples[0].captions)


def test_trace_plot_puts_each_value_at_its_height():
    plot = trace_plot(np.array([0.0, 10.0, np.nan, 0.0]), size=(12, 32))
    ink = (plot == PLOT_INK).all(axis=2)
    # 30 columns over positions 0..3: 0 at the bottom row, 10 (position 1) on the top row at column
    # 10, the NaN bridged, back to the bottom at the right edge
    assert ink[10, 1] and ink[1, 1 + 10] and not ink[1, 1 + 20] and ink[10, 30]
    assert not ink[0].any() and not ink[-1].any()  # the frame is left alone
    # 200 periods over 100 columns: each column's samples hold two whole periods, so its min/max
    # envelope spans every row inside the frame
    long = np.sin(np.linspace(0, 400 * np.pi, 50_000))
    plot = trace_plot(long, size=(20, 102))
    assert ((plot == PLOT_INK).all(axis=2)[:, 1:-1].sum(axis=0) == 18).all()


def test_preview_command_writes_the_png_and_refuses_unknown_ids(cells, tmp_path):
    runner = CliRunner()
    out = tmp_path / "p.png"
    res = runner.invoke(app, ["preview", str(cells), "--n", "4", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert f"wrote {out}" in res.output and "4 samples" in res.output
    with Image.open(out) as img:
        assert img.format == "PNG" and img.width == 2 * 192 + 10 + 2 * 10
    res = runner.invoke(app, ["preview", str(cells), "--ids", "no_such_id", "--out", str(out)])
    assert res.exit_code == 2 and "no_such_id" in res.output
    res = runner.invoke(app, ["preview", str(tmp_path / "missing.h5"), "--out", str(out)])
    assert res.exit_code == 1 and "no such dataset file" in res.output


def test_the_artifact_copy_is_a_small_jpeg_data_uri_of_the_drawn_sheet(cells, tmp_path):
    import base64
    import io

    png = tmp_path / "big.png"
    sheet = write_preview(cells, png, n=16, tile=320, compress_level=1)
    uri = artifact_data_uri(sheet.image, max_side=400)
    assert uri.startswith("data:image/jpeg;base64,")
    with Image.open(io.BytesIO(base64.b64decode(uri.split(",", 1)[1]))) as img:
        assert img.format == "JPEG" and max(img.size) == 400
        assert img.size == (400, round(sheet.image.height * 400 / sheet.image.width)) or \
            img.size == (round(sheet.image.width * 400 / sheet.image.height), 400)
        small = np.asarray(img.convert("RGB")).astype(np.int16)
    # the same picture: the sheet shrunk the same way differs by JPEG's noise only
    reference = np.asarray(sheet.image.resize(img.size, Image.Resampling.LANCZOS)).astype(np.int16)
    assert np.abs(small - reference).mean() < 4
    with Image.open(png) as full:  # the file on disk stays lossless at any compress level
        assert full.format == "PNG" and np.array_equal(np.asarray(full.convert("RGB")), np.asarray(sheet.image))
    small_side = artifact_data_uri(sheet.image.resize((200, 100)))  # never enlarged
    with Image.open(io.BytesIO(base64.b64decode(small_side.split(",", 1)[1]))) as img:
        assert img.size == (200, 100)


def test_a_version_whose_virtual_sources_are_gone_is_refused_not_drawn_as_zeros(cells, tmp_path):
    import shutil

    from h5forge.errors import ReadError

    thin = tmp_path / "thin.h5"
    shutil.copy(os.path.realpath(cells), thin)
    with h5py.File(thin, "a") as f:  # train/images read from another file, as in a thin version
        images = f["train/images"][()]
        with h5py.File(tmp_path / "part.h5", "w") as part:
            part["images"] = images
        layout = h5py.VirtualLayout(images.shape, images.dtype)
        layout[:] = h5py.VirtualSource("part.h5", "images", images.shape)
        del f["train/images"]
        f.create_virtual_dataset("train/images", layout)
    drawn = load_samples(thin, n=2)
    assert np.array_equal(drawn[0].pictures["images"], images[drawn[0].row].transpose(1, 2, 0))
    (tmp_path / "part.h5").unlink()
    with pytest.raises(ReadError, match="missing: .*part.h5"):
        load_samples(thin, n=2)


def test_a_ct_case_is_drawn_at_its_physical_aspect_with_its_spacing_and_window(tmp_path, build_spec):
    """30 slices 3 mm apart of pydicom's CT_small (128 x 128 pixels of 0.66 mm): the coronal and
    sagittal planes are 90 mm tall and 85 mm wide on the sheet as in the body, each plane at least
    160 px on its short side in a 192 px tile, and the spacing and window are written under them."""
    from tests.kinds.test_volume import write_series

    raw = tmp_path / "raw"
    hu = write_series(raw / "cases" / "case_a", depth=30, spacing=3.0)
    path = build_spec({"name": "ct", "source": {"root": str(raw)}, "output": {"dir": str(tmp_path / "out")},
                       "splits": {"ratios": {"train": 1.0}},
                       "fields": {"ct": {"kind": "volume", "files": "cases/*", "size": [128, 128]}}})[0]
    png = tmp_path / "ct.png"
    res = CliRunner().invoke(app, ["preview", str(path), "--out", str(png)])
    assert res.exit_code == 0, res.output
    sheet = write_preview(path, tmp_path / "again.png")  # what the command drew, with its boxes
    with Image.open(png) as img:
        assert np.array_equal(np.asarray(img.convert("RGB")), np.asarray(sheet.image))
    (slice_mm, row_mm, col_mm), = stored(path, "train", "case_a", "ct_spacing")
    assert (slice_mm, round(row_mm, 6), round(col_mm, 6)) == (3.0, 0.661468, 0.661468)
    boxes = sheet.boxes["case_a"]
    physical = {"axial": (128 * row_mm, 128 * col_mm), "coronal": (30 * slice_mm, 128 * col_mm),
                "sagittal": (30 * slice_mm, 128 * row_mm)}
    for name, (tall_mm, wide_mm) in physical.items():
        _, _, w, h = boxes[f"ct/{name}"]
        assert abs(h - w * tall_mm / wide_mm) <= 1, (name, w, h)
        assert min(w, h) >= 160, (name, w, h)
    x, y, w, h = boxes["ct"]
    assert (sheet.image.width, h) == (2 * 10 + 3 * 192, 192)  # a cell three tiles wide, one tile high
    assert sheet.samples[0].captions == ["spacing 3.00 x 0.66 x 0.66 mm (slice x row x column); "
                                         "W/L 400/40 (CT soft tissue)"]
    window = np.clip(np.round((hu + 160) / 400 * 255), 0, 255).astype(np.uint8)
    assert np.array_equal(sheet.samples[0].pictures["ct"][:128, :128, 0], window)  # every slice is CT_small
    caption = np.asarray(sheet.image)[y + h + 4 + 14:y + h + 4 + 28, x:x + w]  # the line under the id
    assert (np.abs(caption.astype(int) - (170, 170, 175)).sum(axis=2) < 60).sum() > 200  # text drawn there


def test_a_multiclass_mask_gets_a_legend_in_its_overlay_colours(tmp_path, build_spec):
    from h5forge._demo import generate_segment_multiclass

    raw = tmp_path / "raw"
    generate_segment_multiclass(raw, n=12, seed=0, bad=False)
    path = built_from_init(raw, tmp_path, build_spec)
    png = tmp_path / "seg.png"
    res = CliRunner().invoke(app, ["preview", str(path), "--n", "4", "--out", str(png)])
    assert res.exit_code == 0, res.output
    sheet = write_preview(path, tmp_path / "again.png", n=4)
    with Image.open(png) as img:
        got = np.asarray(img.convert("RGB"))
    assert np.array_equal(got, np.asarray(sheet.image))
    assert list(sheet.legend) == ["masks class 1", "masks class 2"]
    below = max(y + h for boxes in sheet.boxes.values() for (_, y, _, h) in boxes.values())
    seen = set()
    for k, (x, y, w, h) in enumerate(sheet.legend.values(), 1):
        assert y > below  # under the samples
        swatch = got[y:y + h, x:x + w].reshape(-1, 3)
        assert (swatch == swatch[0]).all()
        for s in sheet.samples:  # the overlay paints class k in the swatch's colour
            mask, = stored(path, s.split, s.id, "masks")
            painted = s.overlays["images"][0][mask[0] == k]
            assert (painted == swatch[0]).all()
            seen.add(k) if painted.size else None
    assert seen == {1, 2}


def test_a_binary_mask_needs_no_legend(cells, tmp_path):
    assert write_preview(cells, tmp_path / "p.png", n=2).legend == {}
