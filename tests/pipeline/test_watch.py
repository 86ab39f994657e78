"""The watch loop on a CSV-annotated inbox: a real watcher (watchfiles) in a thread, running the
plain pipeline's append. Its own writes (the pruned CSV, processed/, quarantine/) never start
another append, and what it moved into processed/ or quarantine/ is never read as new samples."""

from __future__ import annotations

import csv
import json
import os
import shutil
import threading

import h5forge
from h5forge._pipeline.watch import watch_inbox
from h5forge.spec import DatasetSpec
from h5forge._store.versions import latest
from tests.helpers.data import age_files
from tests.helpers.files import all_ids

QUIET_LOOKS = 3  # the watcher looked at the inbox this many times after an append and found nothing to do


def _write_csv(path, rows):
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=["id", "label", "num_cells"])
        w.writeheader()
        w.writerows(rows)
    os.replace(tmp, path)


class Watcher:
    """``watch_inbox`` in a thread; every append it starts is recorded, and how many times it has
    looked at the inbox since the last one and found nothing to append (``quiet``)."""

    def __init__(self, spec: DatasetSpec, own_files):
        self.spec, self.calls, self.stop = spec, [], threading.Event()
        self.quiet, self.changed = 0, threading.Condition()
        a = spec.append
        self.thread = threading.Thread(target=watch_inbox, args=(spec.source.inbox, self.append), kwargs=dict(
            own_files=own_files, settle_seconds=a.settle_seconds, window_seconds=a.batch_window_seconds,
            poll_seconds=a.poll_seconds, stop=self.stop, looked=self.looked))

    def append(self) -> int | None:
        result = h5forge.append(self.spec, skip_if_busy=True)
        with self.changed:
            self.calls.append(result)
            self.quiet = 0
            self.changed.notify_all()
        return None if result.skipped else result.waiting  # as `h5forge watch` runs it

    def looked(self) -> None:
        with self.changed:
            self.quiet += 1
            self.changed.notify_all()

    def settle_on(self, version: int, appends: int) -> None:
        """Until ``version`` is latest and the watcher has since looked at the inbox QUIET_LOOKS
        times without appending (its own writes, then polls), or it started more than ``appends``
        appends in all: a watcher that retriggers itself appends again before it goes quiet, and
        the caller sees the extra call."""
        with self.changed:
            self.changed.wait_for(
                lambda: not self.thread.is_alive() or len(self.calls) > appends or (
                    latest(self.spec.output.dir) == version and self.quiet >= QUIET_LOOKS),
                timeout=900)  # bounds a watcher that never appends
        assert self.thread.is_alive() and latest(self.spec.output.dir) == version, [c.version for c in self.calls]


def test_watch_appends_once_per_drop_and_never_reads_its_own_folders(raw_demo, tmp_path):
    records = {r["id"]: r for r in json.loads((raw_demo / "annotations.json").read_text())}
    good = sorted(i for i in records if i.startswith("cell_"))
    root, inbox, out = tmp_path / "raw", tmp_path / "inbox", tmp_path / "out"

    def row(sid):
        return {"id": sid, "label": records[sid]["label"], "num_cells": records[sid]["num_cells"]}

    def place(folder, ids):
        (folder / "images").mkdir(parents=True, exist_ok=True)
        for sid in ids:
            shutil.copy(raw_demo / "images" / f"{sid}.png", folder / "images" / f"{sid}.png")

    place(root, good[:20])
    _write_csv(root / "labels.csv", [row(i) for i in good[:20]])
    # a glob that reaches into every folder under the inbox, processed/ and quarantine/ included
    spec = DatasetSpec.model_validate({
        "name": "csv", "source": {"root": str(root), "inbox": str(inbox)}, "output": {"dir": str(out)},
        "fields": {"images": {"kind": "image", "files": "**/*.png", "size": [64, 64]}},
        "annotations": {"file": "labels.csv", "columns": {"label": "str", "num_cells": "int"}},
        "append": {"settle_seconds": 0.5, "batch_window_seconds": 0.5, "poll_seconds": 1}, "max_rejected": 0.5})
    assert h5forge.build(spec).version == 1

    place(inbox, good[20:26])
    (inbox / "images" / "broken.png").write_bytes(b"not a picture")
    # "ghost" is a record whose picture never comes: it waits, and must not keep the watcher busy
    _write_csv(inbox / "labels.csv", [row(i) for i in good[20:26]] + [
        {"id": "broken", "label": "x", "num_cells": 1}, {"id": "ghost", "label": "x", "num_cells": 1}])
    age_files(inbox)

    watcher = Watcher(spec, own_files=["labels.csv"])
    watcher.thread.start()
    try:
        watcher.settle_on(2, appends=1)
        assert [c.version for c in watcher.calls] == [2]  # one append for one drop
        assert watcher.calls[0].waiting == 1  # the ghost record
        with open(inbox / "labels.csv", newline="") as fh:
            assert [r["id"] for r in csv.DictReader(fh)] == ["ghost"]

        place(inbox, good[26:29])  # a second drop: three pictures and their rows
        _write_csv(inbox / "labels.csv", [{"id": "ghost", "label": "x", "num_cells": 1},
                                          *(row(i) for i in good[26:29])])
        watcher.settle_on(3, appends=2)
        assert [c.version for c in watcher.calls] == [2, 3]
        second = watcher.calls[1]
        # nothing re-read from processed/ or quarantine/: only the ghost still waits
        assert second.added == 3 and second.rejections == () and second.waiting == 1
    finally:
        watcher.stop.set()
        watcher.thread.join(60)
    assert not watcher.thread.is_alive()

    assert sorted(sum(all_ids(out / "dataset_latest.h5").values(), [])) == good[:29]
    assert sorted(p.relative_to(inbox).as_posix() for p in (inbox / "quarantine").rglob("*") if p.is_file()) == [
        "quarantine/images/broken.png", "quarantine/images/broken.png.labels.csv",  # with its record
        "quarantine/images/broken.png.labels.csv.reason", "quarantine/images/broken.png.reason"]
    assert sorted(p.name for p in (inbox / "processed" / "v0002" / "images").iterdir()) == [
        f"{i}.png" for i in good[20:26]]
    assert sorted(p.name for p in (inbox / "processed" / "v0003" / "images").iterdir()) == [
        f"{i}.png" for i in good[26:29]]


def test_watch_does_not_take_its_own_rewrite_of_a_coco_file_for_news(tmp_path):
    """The COCO file keeps the entry of a picture not yet there: the append rewrites it, and the
    watcher runs no append for that; the picture's arrival is one append."""
    from h5forge._ingest.append import rewritten_by_append
    from tests.ingest.test_append_inbox_records import _save_photo, coco_spec, write_coco

    write_coco(tmp_path / "raw", ["astronaut", "coffee"], "annotations/instances_train.json")
    spec = coco_spec(tmp_path, append={"settle_seconds": 0.5, "batch_window_seconds": 0.5, "poll_seconds": 1})
    assert h5forge.build(spec).version == 1
    inbox = tmp_path / "inbox"
    write_coco(inbox, ["flower", "hubble_crop", "chelsea"], "annotations/batch.json")
    (inbox / "images" / "chelsea.jpg").unlink()  # its entry is there, the picture comes later
    age_files(inbox)
    watcher = Watcher(spec, own_files=lambda: rewritten_by_append(spec, inbox))
    watcher.thread.start()
    try:
        watcher.settle_on(2, appends=1)
        assert [c.version for c in watcher.calls] == [2]
        left = json.loads((inbox / "annotations" / "batch.json").read_text())
        assert [im["file_name"] for im in left["images"]] == ["chelsea.jpg"]
        _save_photo(inbox, "chelsea")
        watcher.settle_on(3, appends=2)
        assert [c.version for c in watcher.calls] == [2, 3] and watcher.calls[1].added == 1
    finally:
        watcher.stop.set()
        watcher.thread.join(60)
    assert not (inbox / "annotations" / "batch.json").exists()


def test_watch_takes_what_waited_while_another_run_held_the_folder(raw_demo, raw_new, tmp_path):
    """Samples the watcher found while a build held the output folder (its append skipped) are
    appended once the folder is free, with nothing else dropped into the inbox."""
    import subprocess
    import sys

    from tests.helpers.data import REPO, demo_spec, drop_samples

    out, inbox = tmp_path / "out", tmp_path / "inbox"
    spec = demo_spec(raw_demo, out)
    spec = spec.model_copy(update={
        "source": spec.source.model_copy(update={"inbox": inbox}),
        "append": spec.append.model_copy(update={"settle_seconds": 0.5, "batch_window_seconds": 0.5,
                                                 "poll_seconds": 1})})
    assert h5forge.build(spec).version == 1
    new = drop_samples(raw_new, inbox, ["cell_000000", "cell_000001"], rename="k_")
    age_files(inbox)

    holder = subprocess.Popen(  # another run writing to the folder: a real process holding its lock
        [sys.executable, "-c", "import sys\nfrom h5forge._store.versions import output_lock\n"
         "with output_lock(sys.argv[1], 'build-dataset'):\n    print('held', flush=True)\n    sys.stdin.read()",
         str(out)], cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    watcher = Watcher(spec, own_files=[])
    watcher.thread.start()
    try:
        with watcher.changed:
            watcher.changed.wait_for(lambda: watcher.calls or not watcher.thread.is_alive(), timeout=900)
        assert [c.skipped is not None for c in watcher.calls] == [True]  # the folder was busy
        holder.stdin.close()  # the other run ends
        assert holder.wait(timeout=300) == 0
        with watcher.changed:
            watcher.quiet = 0
            watcher.changed.wait_for(lambda: latest(out) == 2 or watcher.quiet >= QUIET_LOOKS
                                     or not watcher.thread.is_alive(), timeout=900)
        assert latest(out) == 2, [c.skipped or c.version for c in watcher.calls]
    finally:
        watcher.stop.set()
        watcher.thread.join(60)
        if holder.poll() is None:
            holder.kill()
    assert set(new) <= set(sum(all_ids(out / "dataset_latest.h5").values(), []))
    assert not list((inbox / "images").iterdir())


def test_watch_takes_a_background_picture_once_it_has_been_in_the_inbox_settle_seconds(tmp_path):
    """A YOLO picture without its label file (``missing: empty``) moved into the inbox keeps its old
    mtime: the append the watcher starts lets it wait for its label file, and the watcher appends
    again once it has been there ``settle_seconds`` by its ctime, with no other file event."""
    import yaml
    from PIL import Image

    from tests.kinds.boxes.test_boxes import _picture, _spec

    raw = tmp_path / "raw"
    (raw / "images").mkdir(parents=True)
    (raw / "labels").mkdir()
    Image.fromarray(_picture("astronaut")).save(raw / "images" / "astronaut.png")
    (raw / "labels" / "astronaut.txt").write_text("0 0.5 0.5 0.2 0.4\n")
    inbox = tmp_path / "inbox"
    spec = _spec(raw, tmp_path / "out", {"files": "labels/*.txt", "missing": "empty"})
    spec["source"]["inbox"] = str(inbox)
    spec["append"] = {"settle_seconds": 2, "batch_window_seconds": 0.2, "poll_seconds": 0.5}
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec))
    loaded = DatasetSpec.model_validate(spec)
    assert h5forge.build(loaded).version == 1
    (inbox / "images").mkdir(parents=True)
    Image.fromarray(_picture("camera")).save(inbox / "images" / "camera.png")
    age_files(inbox)  # as `mv` leaves it: an old mtime, a ctime of now
    watcher = Watcher(loaded, own_files=())
    watcher.thread.start()
    try:
        with watcher.changed:
            watcher.changed.wait_for(lambda: latest(loaded.output.dir) == 2, timeout=60)
        waits = [c.waiting for c in watcher.calls]
        assert latest(loaded.output.dir) == 2 and waits[0] == 1 and waits[-1] == 0, waits
    finally:
        watcher.stop.set()
        watcher.thread.join(60)
    assert (inbox / "processed" / "v0002" / "images" / "camera.png").is_file()
    assert sorted(sum(all_ids(tmp_path / "out" / "dataset_latest.h5").values(), [])) == ["astronaut", "camera"]
