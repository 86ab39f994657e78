"""A dataset's life as random sequences of what users do, checked against a model after every step.

The model is the set of good samples the user has given (and where: the raw folder, the inbox,
appended) with their expected values, decoded here with Pillow and the spec's pad/crop rule
(tests/helpers/lifecycle.py), never through h5forge's cleaning code. The steps: good and defective
files dropped into the raw folder or the inbox in every layout ``init`` knows, annotation edits,
deletions, renames, spec edits (the pad value, which changes what every padded sample holds; the
codec, rows per chunk and ``storage.assemble``, which change how rows are stored and nothing they
hold), build, append, the watcher, a rebuild of unchanged inputs, rollback, retention, export; the
builds copy the rows into each version or map the files the workers wrote (``storage.assemble``). After each step: every good sample given so
far is in latest exactly once (after a rollback, as of that version) with the values the spec its
version was made under gives it; an append under a pad value other than latest's is refused;
every defective input has a reason on record; no published file changed; ``verify`` is HEALTHY for
latest and every kept version; ``diff`` between the versions before and after a step is the
model's change.

``make test`` runs a fixed number of derandomized sequences per layout; ``make test-soak`` a long
run (``soak`` marker).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import shutil
import tempfile
import threading
import time
import zlib
from collections import Counter
from dataclasses import replace
from pathlib import Path

import h5py
import hypothesis
import numpy as np
import pytest
import yaml
from hypothesis import HealthCheck, Phase, settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule, run_state_machine_as_test

import h5forge
from h5forge.errors import SamplesRemoved, VersionError
from h5forge._format.layout import decode_str
from h5forge._format.names import DELTA_RE, LATEST, ROWS_FOLDER_RE, VERSION_RE, version_name
from h5forge._init import infer_spec
from h5forge._pipeline import verify
from h5forge._pipeline.watch import watch_inbox
from h5forge.read._reader import SplitReader
from h5forge.spec import load_spec
from h5forge._store.thin import export
from h5forge._store.verify import verify_file
from h5forge._store.versions import latest, output_lock, published, retain, set_latest
from h5forge._views.diff import diff_versions
from tests.helpers.lifecycle import HOSTILE, LAYOUTS, Draw, Layout, Sample

SPLITS = ("train", "val", "test")
KEEP = (2, 5)  # output.keep of the spec and of the retention step (retire_after_seconds: 0)
RUNS = {"sequences": 0, "steps": 0, "rules": Counter()}  # what the machine ran here (``run`` prints it)


DATA = object()  # an action's argument that is the step's own ``st.data()``, to draw from as it goes
ACTIONS: dict[str, tuple] = {}  # what a user does: name -> (when it applies, its arguments' strategies)


def action(applies, **arguments):
    """A user action the machine's one rule picks among those that apply, each as likely as the
    others (Hypothesis' own rule choice switches whole rules off for a sequence). It is counted,
    and with H5FORGE_LIFECYCLE_TRACE set each step is printed as it runs."""
    def register(fn):
        @functools.wraps(fn)
        def step(self, **kwargs):
            RUNS["rules"][fn.__name__] += 1
            self.steps += 1
            if os.environ.get("H5FORGE_LIFECYCLE_TRACE"):
                print(f"  {self.layout.name} step {self.steps}: {fn.__name__}", flush=True)
            return fn(self, **kwargs)
        ACTIONS[fn.__name__] = (applies or (lambda self: True), arguments)
        return step
    return register


draws = st.builds(Draw, serial=st.just(0), picture=st.integers(0, 3), y=st.integers(0, 400),
                  x=st.integers(0, 400), h=st.integers(40, 90), w=st.integers(40, 90), label=st.integers(0, 2),
                  count=st.integers(0, 99), split=st.integers(0, 2))


def nfc(text: str) -> str:
    import unicodedata

    return unicodedata.normalize("NFC", text)


def internal(reason: str) -> bool:
    """A reason that is an error caught by the cleaner's last resort, not one a user can act on."""
    return reason.startswith("unexpected ") or "Traceback" in reason


class Lifecycle(RuleBasedStateMachine):
    """One dataset's life in one layout (``layout``, set by ``machine_for``)."""

    layout: Layout

    def __init__(self):
        super().__init__()
        self.tmp = Path(tempfile.mkdtemp(prefix=f"lifecycle-{self.layout.name}-"))
        self.raw, self.inbox, self.out = self.tmp / "raw", self.tmp / "inbox", self.tmp / "out"
        self.serial = 0
        self.raw_good: dict[str, Sample] = {}  # good samples in the raw folder, as the user left them
        self.pending: dict[str, Sample] = {}  # good samples waiting in the inbox
        self.appended: dict[str, Sample] = {}  # good samples an append took (now in inbox/processed/)
        self.expect: dict[str, dict] = {}  # what latest must hold: id -> snapshot of the sample
        self.history: dict[int, dict[str, dict] | None] = {}  # version -> its snapshot (None: not known)
        self.bad_raw: list[Sample] = []  # defective inputs in the raw folder (rejected by every build)
        self.bad_inbox: list[Sample] = []  # defective inputs dropped into the inbox, not yet appended
        self.copies: list[Sample] = []  # copies of samples latest held, under new names, in the inbox
        self.hashes: dict[str, str] = {}  # published file -> its sha256 when first seen
        self.split_of: dict[str, str] = {}
        self.spec_of: dict[int, object] = {}  # version -> the spec it was made under
        self.built_clean = False  # nothing changed since the last build, which latest still is
        self.steps = 0

    def teardown(self):
        RUNS["sequences"] += 1
        RUNS["steps"] += self.steps
        shutil.rmtree(self.tmp, ignore_errors=True)

    # ---- the model's helpers
    def draw(self, d: Draw) -> Draw:
        self.serial += 1
        return replace(d, serial=self.serial)

    def snap(self, s: Sample) -> dict:
        """A sample as a version holds it: its files' contents and the spec its values are made by."""
        return {"sample": Sample(s.sid, dict(s.files), dict(s.data), dict(s.columns), s.split), "spec": self.spec}

    def given(self) -> dict[str, dict]:
        """What a full rebuild must hold: the raw folder's good samples and every appended one, the
        first (in id order) of any raw content given under several names (``duplicates: keep_first``)."""
        held, contents = {}, set()
        for sid, s in sorted({**self.raw_good, **self.appended}.items(), key=lambda kv: nfc(kv[0])):
            content = tuple(s.data[f] for f in sorted(s.data))
            if content not in contents:
                contents.add(content)
                held[sid] = self.snap(s)
        return held

    def changed(self) -> None:
        self.built_clean = False

    # ---- set-up: a raw folder, the spec init writes for it
    @initialize(first=st.lists(draws, min_size=4, max_size=4), keep=st.sampled_from(KEEP),
                allow_removals=st.booleans())
    def start(self, first, keep, allow_removals):
        # how builds assemble their versions, from a value already drawn: a draw of its own would
        # change every sequence the suite runs
        assemble = ("copy", "mapped")[first[0].count % 2]
        for i, d in enumerate(first):
            # the first samples share one size, from which init infers the targets
            d = replace(self.draw(d), h=48, w=48, label=i, split=i % 3 if i < 3 else 0)
            s = self.layout.sample(d)
            self.layout.write(self.raw, s)
            self.raw_good[s.sid] = s
        self.inbox.mkdir()
        spec_path = self.tmp / "spec.yaml"
        data = yaml.safe_load(infer_spec(self.raw, spec_path).text)
        data["source"]["inbox"] = str(self.inbox)
        data["output"] = {"dir": str(self.out), "keep": keep, "retire_after_seconds": 0,
                          "allow_removals": allow_removals}
        data["max_rejected"] = 0.9  # the machine decides how many defects there are, not the limit
        data["append"] = {"settle_seconds": 0, "batch_window_seconds": 0.2, "poll_seconds": 1}
        data["verify"] = {"latency_reads": 5}
        data["compute"] = {"workers": 1}
        data.setdefault("storage", {})["assemble"] = assemble  # mapped: builds that clean every row map them
        RUNS["rules"][f"assemble={assemble}"] += 1
        spec_path.write_text(yaml.safe_dump(data))
        self.spec_path = spec_path
        self.spec = load_spec(spec_path)
        self.build()  # what a user does first after init

    @rule(data=st.data())
    def act(self, data):
        names = [name for name, (applies, _) in ACTIONS.items() if applies(self)]
        name = data.draw(st.sampled_from(names), label="action")
        kwargs = {k: data if v is DATA else data.draw(v, label=k)
                  for k, v in ACTIONS[name][1].items()}
        getattr(self, name)(**kwargs)

    # ---- what users do to their files
    @action(None, batch=st.lists(draws, min_size=1, max_size=3), to_inbox=st.booleans())
    def add_good(self, batch, to_inbox):
        for d in batch:
            s = self.layout.sample(self.draw(d))
            self.layout.write(self.inbox if to_inbox else self.raw, s)
            (self.pending if to_inbox else self.raw_good)[s.sid] = s
        if not to_inbox:
            self.changed()

    @action(None, d=draws, to_inbox=st.booleans(), data=DATA)
    def add_defective(self, d, to_inbox, data):
        if len(self.bad_raw) >= 3 and not to_inbox:
            return  # a few are enough, and max_rejected stays out of the way
        how = data.draw(st.sampled_from(self.layout.defects()))
        s = self.layout.defective(self.draw(d), how)
        self.layout.write(self.inbox if to_inbox else self.raw, s)
        (self.bad_inbox if to_inbox else self.bad_raw).append(s)
        if not to_inbox:
            self.changed()

    @action(lambda self: self.expect, data=DATA)
    def add_duplicate(self, data):
        """A copy of a sample latest holds, under a new name, into the inbox (exactly once says no)
        or the raw folder (a build keeps the first of the two in id order)."""
        sid = data.draw(st.sampled_from(sorted(self.expect)))
        s = self.layout.renamed(self.expect[sid]["sample"], self._new_id(self.expect[sid]["sample"]))
        if data.draw(st.booleans(), label="to_raw"):
            self.layout.write(self.raw, s)
            self.raw_good[s.sid] = s
            self.changed()
            return
        self.layout.write(self.inbox, s)
        self.copies.append(s)

    def _new_id(self, s: Sample) -> str:
        self.serial += 1
        head, _, tail = s.sid.rpartition("/")
        return f"{head}/n{self.serial:05d}" if head else f"n{self.serial:05d}"

    @action(lambda self: self.layout.annotation and self.raw_good, data=DATA,
            label=st.integers(0, 1), count=st.integers(100, 199))
    def edit_annotation(self, data, label, count):
        sid = data.draw(st.sampled_from(sorted(self.raw_good)))
        s = self.raw_good[sid]
        self.layout.edit(self.raw, s, {"label": ("round", "long")[label], "count": count})
        self.changed()

    @action(lambda self: len(self.raw_good) > 1, data=DATA)
    def delete_sample(self, data):
        sid = data.draw(st.sampled_from(sorted(self.raw_good)))
        self.layout.remove(self.raw, self.raw_good.pop(sid))
        self.changed()

    @action(lambda self: self.raw_good, data=DATA)
    def rename_sample(self, data):
        sid = data.draw(st.sampled_from(sorted(self.raw_good)))
        old = self.raw_good.pop(sid)
        self.layout.remove(self.raw, old)
        new = self.layout.renamed(old, self._new_id(old))
        self.layout.write(self.raw, new)
        self.raw_good[new.sid] = new
        self.changed()

    @action(None, fill=st.sampled_from([0, 255]))
    def edit_fill(self, fill):
        """The pad value of the first picture field: every padded sample's values change, so an
        append is refused until a build remakes them all."""
        self.edit_spec(lambda data: data["fields"][self.picture].update(fill=fill))

    @action(None, codec=st.sampled_from(["lz4", "none", "gzip-1"]), rows=st.sampled_from([1, 3]),
            assemble=st.sampled_from(["copy", "mapped"]))
    def edit_storage(self, codec, rows, assemble):
        """How rows are stored: nothing a sample holds changes, and appends go on."""
        self.edit_spec(lambda data: data["storage"].update(codec=codec, chunk_rows=rows, assemble=assemble))

    def edit_spec(self, edit) -> None:
        data = yaml.safe_load(self.spec_path.read_text())
        edit(data)
        self.spec_path.write_text(yaml.safe_dump(data))
        self.spec = load_spec(self.spec_path)
        self.changed()

    @property
    def picture(self) -> str:
        return next(name for name, f in self.spec.fields.items() if hasattr(f, "fill"))

    def rules_as_latest(self) -> bool:
        """Whether the spec makes samples' values as latest's spec did (what this model edits of them)."""
        made = self.spec_of.get(latest(self.out)) if self.out.exists() else None
        return made is None or made.fields[self.picture].fill == self.spec.fields[self.picture].fill

    # ---- what users run
    @action(None)
    def build(self):
        before = self.latest_path()
        want = self.given()
        leaving = sorted(set(self.expect) - set(want))
        if leaving and not self.spec.output.allow_removals:
            with pytest.raises(SamplesRemoved, match=f"{len(leaving)} sample.s. of .* would leave latest"):
                h5forge.build(self.spec)
            assert self.latest_path() == before, "a refused build moved latest"
            return
        result = h5forge.build(self.spec)
        assert sorted(result.left_latest) == leaving
        if result.unchanged:
            assert self.same(want, self.expect), "the build found nothing new, but the model holds changes"
            assert self.rules_as_latest(), "the build found nothing new under another pad value"
        else:
            assert result.version is not None, result
            self.published_version(result.version, want, before)
            self.check_raw_defects(result.version)
        self.built_clean = True

    @action(lambda self: self.built_clean)
    def rebuild_unchanged(self):
        current = latest(self.out)
        result = h5forge.build(self.spec)
        assert result.unchanged and result.version == current, result

    @action(lambda self: self.history)
    def append(self):
        before = self.latest_path()
        if not self.rules_as_latest():  # refused, or nothing to append
            left = self.inbox_files_left()
            try:
                result = h5forge.append(self.spec)
            except VersionError as err:
                assert re.search(r"rules for what a sample holds differ .*\(fields\.\w+\.fill\)", str(err)), err
                RUNS["rules"]["append refused"] += 1
            else:
                assert result.version is None and not self.pending, f"appended under another pad value: {result}"
            assert self.latest_path() == before and self.inbox_files_left() == left, "a refused append changed something"
            return
        result = h5forge.append(self.spec)
        self.appended_version(result.version, before)

    @action(lambda self: self.expect and self.rules_as_latest(), batch=st.lists(draws, min_size=0, max_size=2))
    def watch(self, batch):
        """The watch loop in a thread (the plain append), with files dropped while it runs."""
        before, first = self.latest_path(), max(published(self.out), default=0)
        stop, failure, runs = threading.Event(), [], []
        own = [self.spec.annotations.file] if self.spec.annotations.file else []  # as `h5forge watch` passes

        busy = threading.Lock()
        quiet = threading.Condition()  # notified whenever the watcher looked at the inbox and did nothing
        looks = [0]

        def append_once() -> int:
            with busy:
                result = h5forge.append(self.spec)
                runs.append(result)
            return result.waiting

        def looked() -> None:
            with quiet:
                looks[0] += 1
                quiet.notify_all()

        def loop():
            try:
                watch_inbox(self.inbox, append_once, own_files=own, settle_seconds=0.1, window_seconds=0.2,
                            poll_seconds=0.5, stop=stop, looked=looked)
            except BaseException as err:  # the main thread reports it
                failure.append(err)

        worker = threading.Thread(target=loop, name="lifecycle-watch")
        worker.start()
        try:
            for d in batch:
                s = self.layout.sample(self.draw(d))
                self.layout.write(self.inbox, s)
                self.pending[s.sid] = s
            deadline = time.monotonic() + 600  # bounds a watcher that never takes the files
            while time.monotonic() < deadline and (self.inbox_files_left() or not runs) and worker.is_alive():
                time.sleep(0.2)
            with busy, quiet:  # the append that took the last files has returned
                settled, seen = len(runs), looks[0]
            with quiet:  # three looks at the inbox (its own writes, then polls) must not start appends
                quiet.wait_for(lambda: looks[0] >= seen + 3 or len(runs) > settled or not worker.is_alive(),
                               timeout=600)  # bounds a watcher that neither looks nor appends
            idle = runs[settled:]
        finally:
            stop.set()
            worker.join(600)
        assert not failure, failure
        assert not worker.is_alive(), "the watcher did not stop"
        assert not self.inbox_files_left(), f"the watcher left {self.inbox_files_left()} in the inbox"
        assert not idle, f"{len(idle)} append(s) ran with nothing dropped into the inbox: {idle}"
        made = [v for v in published(self.out) if v > first]
        for v in made[:-1]:
            self.history[v] = None  # which of the dropped samples each took depends on timing
        self.appended_version(made[-1] if made else None, before)

    def inbox_files_left(self) -> list[str]:
        return sorted(rel for s in [*self.pending.values(), *self.bad_inbox, *self.copies] for rel in s.files.values()
                      if (self.inbox / rel).exists())

    @action(lambda self: [v for v, h in self.history.items() if h is not None and v != latest(self.out)],
            data=DATA)
    def rollback(self, data):
        kept = published(self.out)
        targets = sorted(v for v, h in self.history.items() if h is not None and v in kept and v != latest(self.out))
        if not targets:
            return
        v = data.draw(st.sampled_from(targets))
        with output_lock(self.out, what="rollback"):
            assert verify_file(kept[v], checksums=False, resample=0, latency_reads=0).ok
            set_latest(self.out, v)
        self.expect = self.history[v]
        self.changed()

    @action(lambda self: self.history, keep=st.sampled_from(KEEP))
    def retention(self, keep):
        retain(self.out, keep, 0)

    @action(lambda self: self.expect, codec=st.sampled_from([None, "gzip-1"]))
    def export_latest(self, codec):
        dest = self.tmp / "exports" / f"export_{self.serial}_{codec}.h5"
        dest.parent.mkdir(exist_ok=True)
        self.serial += 1
        export(self.out / LATEST, dest, codec)
        assert verify_file(dest, resample=0, latency_reads=0).ok
        self.check_holds(dest, self.expect)

    # ---- what the model expects of a run
    def published_version(self, number: int, want: dict[str, dict], before: Path | None) -> None:
        assert latest(self.out) == number
        self.spec_of[number] = self.spec
        self.check_diff(before, self.expect, want)
        self.expect = want
        self.history[number] = want

    def appended_version(self, number: int | None, before: Path | None) -> None:
        # a duplicate of what latest holds now, or of a copy before it in id order (keep_first); after
        # a rollback or a removal, the first copy of a sample latest no longer holds is new
        for s in sorted(self.copies, key=lambda s: nfc(s.sid)):
            if any(e["sample"].data == s.data for e in [*self.expect.values(), *map(self.snap, self.pending.values())]):
                self.bad_inbox.append(s)
            else:
                self.pending[s.sid] = s
        self.copies = []
        for s in self.bad_inbox:
            self.check_inbox_reason(s)
        self.bad_inbox = []
        if not self.pending:
            assert number is None, f"v{number} published with nothing new in the inbox"
            return
        assert number is not None, f"{len(self.pending)} good sample(s) in the inbox, nothing appended"
        want = {**self.expect, **{sid: self.snap(s) for sid, s in self.pending.items()}}
        self.appended.update(self.pending)
        self.pending = {}
        self.published_version(number, want, before)
        self.changed()

    def check_raw_defects(self, number: int) -> None:
        report = self.out / "quarantine" / f"{version_name(number)[:-3]}.rejections.json"
        rows = json.loads(report.read_text()) if report.exists() else []
        for s in self.bad_raw:
            mine = [r for r in rows if r["sample_id"] == s.sid or any(rel in r["path"] for rel in s.files.values())]
            assert mine and all(r["reason"] for r in mine), f"{s.sid}: no reason in {report.name}: {rows}"
            assert not any(internal(r["reason"]) for r in mine), f"{s.sid}: an internal error as its reason: {mine}"

    def check_inbox_reason(self, s: Sample) -> None:
        """A rejected inbox input is moved to inbox/quarantine/ with a ``.reason`` beside it."""
        reasons = [self.inbox / "quarantine" / f"{rel}.reason" for rel in s.files.values()]
        found = [p for p in reasons if p.exists() and p.read_text().strip()]
        assert found, f"{s.sid}: no reason on record in {self.inbox / 'quarantine'}"
        assert not any(internal(p.read_text()) for p in found), f"{s.sid}: an internal error as its reason"
        if self.layout.annotation:  # its record went with it, under its own name
            name = Path(self.layout.annotation).name
            records = [self.inbox / "quarantine" / f"{rel}.{name}" for rel in s.files.values()]
            assert any(p.exists() for p in records), f"{s.sid}: its annotation record is not in quarantine/"
            assert not (self.inbox / "quarantine" / name).exists(), "the whole annotation file was quarantined"

    def check_diff(self, before: Path | None, old: dict[str, dict], new: dict[str, dict]) -> None:
        after = self.latest_path()
        if before is None or not before.exists():
            return
        d = diff_versions(before, after)
        assert d.added == sorted(set(new) - set(old)), d.added
        assert d.removed == sorted(set(old) - set(new)), d.removed
        changed = sorted(sid for sid in set(old) & set(new) if not self.same({sid: old[sid]}, {sid: new[sid]}, True))
        assert d.content_changed == changed, (d.content_changed, changed)
        cols = sorted(sid for sid in set(old) & set(new)
                      if old[sid]["sample"].columns != new[sid]["sample"].columns)
        assert sorted(d.columns_changed) == cols, (d.columns_changed, cols)
        assert not d.moved_split, d.moved_split

    def same(self, a: dict[str, dict], b: dict[str, dict], values: bool = False) -> bool:
        """The same samples from the same files and columns; with ``values``, also holding the same
        values under the specs each was made by (a pad value changes those of a padded sample)."""
        return a.keys() == b.keys() and all(
            a[k]["sample"].data == b[k]["sample"].data and a[k]["sample"].columns == b[k]["sample"].columns
            and (not values or self.same_values(a[k], b[k])) for k in a)

    def same_values(self, a: dict, b: dict) -> bool:
        if a["spec"] is b["spec"]:
            return True
        was, now = self.layout.expected(a["sample"], a["spec"]), self.layout.expected(b["sample"], b["spec"])
        return all(np.array_equal(was[name], now[name]) for name in was)

    def latest_path(self) -> Path | None:
        number = latest(self.out) if self.out.exists() else None
        return None if number is None else self.out / version_name(number)

    # ---- invariants, after every step
    @invariant()
    def latest_holds_every_good_sample_once(self):
        path = self.latest_path()
        if path is None:
            assert not self.expect
            return
        self.check_holds(path, self.expect)

    def check_holds(self, path: Path, expect: dict[str, dict]) -> None:
        fields = list(self.spec.fields)
        seen: list[str] = []
        with h5py.File(os.path.realpath(path), "r") as f:
            for split in SPLITS:
                g = f[split]
                ids = decode_str(g["ids"][()])
                seen += ids
                for row, sid in enumerate(ids):
                    if sid not in expect:
                        continue
                    s, spec = expect[sid]["sample"], expect[sid]["spec"]
                    want = self.layout.expected(s, spec)
                    for name in fields:
                        got = g[name][row]
                        assert np.array_equal(got, want[name]), f"{sid}: {name} differs from its decode"
                    for col, value in self.layout.columns_expected(s, spec).items():
                        got = g["meta"][col][row]
                        got = got.decode() if isinstance(got, bytes) else got.item()
                        assert got == value, f"{sid}: column {col} is {got!r}, given {value!r}"
                    if s.split is not None:
                        assert split == s.split, f"{sid}: in {split}, its folder says {s.split}"
                    assert self.split_of.setdefault(sid, split) == split, f"{sid} moved split"
                if ids:
                    self.check_reader(path, split, ids, {name: g[name][()] for name in fields})
        dupes = sorted({i for i in seen if seen.count(i) > 1})
        assert not dupes, f"{path.name}: ids stored more than once: {dupes}"
        assert sorted(seen) == sorted(expect), (f"{path.name}: missing {sorted(set(expect) - set(seen))}, "
                                                f"unexpected {sorted(set(seen) - set(expect))}")

    @staticmethod
    def check_reader(path: Path, split: str, ids: list[str], stored: dict[str, np.ndarray]) -> None:
        """h5forge's reader (its own chunk reads, its mapping of a thin version's files) gives what
        HDF5 gives, rows asked in a shuffled order and one at a time."""
        order = np.random.default_rng(len(ids)).permutation(len(ids))
        with SplitReader(path, split) as reader:
            assert reader.ids() == ids
            batch = reader.read(order)
            for name, values in stored.items():
                assert np.array_equal(batch[name], values[order]), f"{path.name} {split}/{name}: the reader's batch"
                assert np.array_equal(reader.read_one(int(order[0]))[name], values[order[0]]), f"{split}/{name}"

    @invariant()
    def published_files_never_change(self):
        if not self.out.exists():
            return
        for p in self.out.iterdir():
            files = sorted(p.iterdir()) if ROWS_FOLDER_RE.match(p.name) else [p]  # the files a version maps
            for f in files:
                if VERSION_RE.match(p.name) or DELTA_RE.match(p.name) or f is not p:
                    name = str(f.relative_to(self.out))
                    digest = hashlib.sha256(f.read_bytes()).hexdigest()
                    assert self.hashes.setdefault(name, digest) == digest, f"{name} changed after it was published"

    @invariant()
    def every_kept_version_is_healthy(self):
        if self.latest_path() is None:
            return
        report = verify(self.out)
        assert report.ok, report.errors
        for number, path in published(self.out).items():
            if number != latest(self.out):
                # what retention may break is a file a kept version reads: structure and sources
                r = verify_file(path, checksums=False, resample=0, latency_reads=0)
                assert r.ok, (path.name, r.errors)


def machine_for(layout: str) -> type[Lifecycle]:
    return type(f"Lifecycle_{layout.replace('-', '_')}", (Lifecycle,), {"layout": LAYOUTS[layout]})


def run(layout: str, examples: int, steps: int, seed: int = 18, shrink: bool = False) -> None:
    """``examples`` sequences of up to ``steps`` steps, from a fixed seed (the same sequences each run;
    each layout its own, so the layouts do not all run the same sequence of rules)."""
    before = {k: v for k, v in RUNS.items() if k != "rules"}
    seed += zlib.crc32(layout.encode())
    run_state_machine_as_test(hypothesis.seed(seed)(machine_for(layout)), settings=settings(
        max_examples=examples, stateful_step_count=steps, deadline=None, database=None,
        suppress_health_check=list(HealthCheck), print_blob=True,
        phases=[Phase.explicit, Phase.generate, *([Phase.shrink] if shrink else [])]))
    print(f"lifecycle {layout}: {RUNS['sequences'] - before['sequences']} sequences, "
          f"{RUNS['steps'] - before['steps']} steps; rules so far: {dict(RUNS['rules'])}")


@pytest.mark.slow
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_lifecycle(layout):
    run(layout, examples=3, steps=12)


@pytest.mark.soak
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_lifecycle_soak(layout):
    run(layout, examples=int(os.environ.get("H5FORGE_LIFECYCLE_EXAMPLES", 5)), steps=25, seed=1000, shrink=True)


class Given:
    """The one value a step draws (``add_defective``'s kind of defect), for a sequence written out."""

    def __init__(self, value):
        self.value = value

    def draw(self, strategy, label=None):
        return self.value


@pytest.mark.faults
@pytest.mark.parametrize("layout", ["segment-json-id", "classes", "sr-pairs"])
def test_hostile_inputs_dropped_into_the_raw_folder_and_the_inbox(layout):
    """Every hostile input (HOSTILE: a FIFO, a symlink to /dev/zero and a folder at a picture's path,
    a PNG bomb, a truncated PNG) in the raw folder and then in the inbox: each is rejected with a
    reason a user can act on, and every good sample stays (the machine's invariants, after each step)."""
    m = machine_for(layout)()
    try:
        m.start(first=[Draw(0, i, 40 * i, 60 * i, 50, 50, i, i, i) for i in range(4)], keep=2, allow_removals=False)
        for i, how in enumerate(HOSTILE):
            s = m.layout.defective(m.draw(Draw(0, i, 7 * i, 9 * i, 44, 44, i, i, i)), how)
            m.layout.write(m.raw, s)
            m.bad_raw.append(s)
        m.changed()
        m.build()
        m.add_good(batch=[Draw(0, 1, 3, 5, 52, 52, 1, 2, 0)], to_inbox=True)
        for i, how in enumerate(HOSTILE):
            m.add_defective(d=Draw(0, i, 11 * i, 13 * i, 46, 46, i, i, i), to_inbox=True, data=Given(how))
        m.append()
        for check in (m.latest_holds_every_good_sample_once, m.published_files_never_change,
                      m.every_kept_version_is_healthy):
            check()
        assert len(m.expect) == 5 and latest(m.out) == 3  # the first build, the build, the append
    finally:
        m.teardown()
