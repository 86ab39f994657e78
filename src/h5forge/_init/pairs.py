"""The super-resolution layout: ``lr/`` + ``hr/``, ``low_res/`` + ``high_res/``, ``<name>_LR_x4/`` +
``<name>_HR/`` (also ``<name>_LR_bicubic/X4/``). The scale is measured on sampled pairs rather than
taken from a folder name, and only an integer scale shared by both sides becomes ``kind: paired``;
otherwise the HR side is a plain image and a note says why."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

from h5forge.kinds import Layout
from h5forge._init.annotations import annotation_lines, find_annotations
from h5forge._init.folders import sample, subdirs
from h5forge._init.pictures import image_field, picture_globs, pictures_in, target_size, upright_size
from h5forge._init.text import SpecText, files_value

PAIR_SAMPLE = 50
_LR, _HR = {"lr", "lowres", "lq"}, {"hr", "highres", "hq", "gt"}
_DEGRADATIONS = {"bicubic", "unknown", "mild", "difficult", "wild", "realistic", "res", "resolution"}


def _sr_key(name: str) -> tuple[tuple[str, ...], str | None, int | None]:
    """A folder name as (its other words, role lr/hr/None, the scale of an ``x4`` word)."""
    words = [w for w in re.split(r"[_\-\s./]+", name.lower()) if w]
    role, scale, rest = None, None, []
    for i, w in enumerate(words):
        nxt = words[i + 1] if i + 1 < len(words) else ""
        if re.fullmatch(r"x\d+", w):
            scale = int(w[1:])
        elif w in _LR or (w == "low" and nxt in ("res", "resolution")):
            role = role or "lr"
        elif w in _HR or (w == "high" and nxt in ("res", "resolution")):
            role = role or "hr"
        elif w not in _DEGRADATIONS:
            rest.append(w)
    return tuple(rest), role, scale


def _sr_folders(raw: Path) -> list[tuple[str, Path]]:
    """Folders with pictures (and ``<dir>/X4``-style sub-folders), by their path below ``raw``."""
    found = []
    for d in subdirs(raw):
        if pictures_in(d):
            found.append((d.name, d))
        for sub in subdirs(d):
            if re.fullmatch(r"x\d+", sub.name.lower()) and pictures_in(sub):
                found.append((f"{d.name}/{sub.name}", sub))
    return found


def sr_pairs(raw: Path) -> list[tuple[tuple[str, Path], tuple[str, Path], int | None]]:
    folders = [(rel, d, *_sr_key(rel)) for rel, d in _sr_folders(raw)]
    pairs = []
    for rel, d, rest, role, scale in folders:
        if not (role == "lr" or (role is None and scale)):
            continue
        for rel2, d2, rest2, role2, scale2 in folders:
            if d2 == d or scale2 is not None or rest2 != rest:
                continue
            if (role == "lr" and role2 == "hr") or (role is None and role2 is None):
                pairs.append(((rel, d), (rel2, d2), scale))
    return sorted(pairs, key=lambda p: ("train" not in p[0][0].lower(), p[0][0]))


def _scale(lr: dict[str, Path], hr: dict[str, Path], notes: list[str]) -> tuple[int | None, int]:
    ratios: Counter = Counter()
    odd: list[str] = []
    common = sorted(set(lr) & set(hr))
    for stem in sample(common, PAIR_SAMPLE):
        a, b = upright_size(lr[stem]), upright_size(hr[stem])
        if a is None or b is None:
            continue
        (lw, lh), (hw, hh) = a[0], b[0]
        k = hh // lh if hh % lh == 0 and hw % lw == 0 and hh // lh == hw // lw else None
        ratios[k] += 1
        if k is None:
            odd.append(f"{lr[stem].name} {lh}x{lw} vs {hr[stem].name} {hh}x{hw}")
    measured = sum(ratios.values())
    if not measured:
        return None, 0
    k, n = max(ratios.items(), key=lambda kv: (kv[1], kv[0] is not None))
    if k is None or k < 2 or k > 16 or n < 0.75 * measured:
        seen = ", ".join(f"x{r}: {c}" if r else f"not an integer scale: {c}" for r, c in ratios.most_common())
        notes.append(
            f"the HR/LR size ratio could not be inferred from {measured} sampled pairs ({seen}"
            f"{'; e.g. ' + odd[0] if odd else ''}): it must be an integer from 2 to 16, the same in both "
            "sides; high_res is declared as a plain image, change it to kind: paired with the scale"
        )
        return None, measured
    wrong = measured - n
    if wrong:
        other = [f"x{r}" if r else "not an integer scale" for r in ratios if r != k]
        notes.append(
            f"{wrong} of {measured} sampled pairs are not x{k} ({', '.join(other)}"
            f"{'; e.g. ' + odd[0] if odd else ''}): they will be rejected"
        )
    return k, measured


def _strip_scale(stem: str) -> str:
    return re.sub(r"[xX]\d+$", "", stem).rstrip("_-")


def sr_body(raw: Path, pairs, notes: list[str]):
    (lr_rel, lr_dir), (hr_rel, hr_dir), named_scale = pairs[0]
    for (other_lr, _), (other_hr, _), _ in pairs[1:]:
        notes.append(
            f"also found {other_lr}/ + {other_hr}/; this spec reads {lr_rel}/ + {hr_rel}/ only "
            "(add their globs to files to include them)"
        )
    lr_files, hr_files = pictures_in(lr_dir), pictures_in(hr_dir)
    lr = {p.stem: p for p in lr_files}
    hr = {p.stem: p for p in hr_files}
    id_suffix = None
    if not set(lr) & set(hr):
        stripped = {_strip_scale(s): p for s, p in lr.items()}
        suffixes = Counter(s[len(_strip_scale(s)) :] for s in lr)
        if set(stripped) & set(hr) and len(suffixes) == 1 and "" not in suffixes:
            # every LR stem ends in the same scale word (DIV2K's 0001x4.png): the id leaves it out
            [id_suffix] = suffixes
            lr = stripped
        elif set(stripped) & set(hr):
            stem = next(s for s in sorted(stripped) if s in hr)
            notes.append(
                f"the LR files carry the scale in their name ({stripped[stem].name} vs {hr[stem].name}), "
                f"not all the same ({', '.join(sorted(suffixes))}): pairs are matched by file name, so "
                "rename the LR files without it"
            )
            lr = stripped
        else:
            notes.append(f"{lr_rel}/ and {hr_rel}/ share no file name: pairs are matched by name, so nothing pairs")
    elif set(lr) ^ set(hr):
        notes.append(
            f"{len(set(lr) ^ set(hr))} pictures of {lr_rel}/ and {hr_rel}/ have no partner: they are "
            "quarantined as incomplete samples"
        )
    scale, measured = _scale(lr, hr, notes)
    if scale and named_scale and scale != named_scale:
        notes.append(f"{lr_rel}/ is named x{named_scale} but the sampled pairs are x{scale}")
    size = target_size(lr_files, str(raw / lr_rel))
    hr_size = None if scale else target_size(hr_files, str(raw / hr_rel))
    ann = find_annotations(raw, set(lr) if id_suffix else {p.stem for p in lr_files}, "stem", set(), notes)

    def body(t: SpecText) -> None:
        t(0, "fields:")
        why = "bigger LR pictures are centre-cropped, their HR partner with them"
        image_field(t, "low_res", picture_globs(f"{lr_rel}/", lr_files), size, "crop", why)
        if id_suffix:
            example = lr[sorted(lr)[0]].name
            why = f"the LR names end in {id_suffix} ({example}): the sample id leaves it out, to pair with the HR name"
            t(2, f"id_suffix: {id_suffix}", why)
        t(1, "high_res:")
        if scale:
            t(2, "kind: paired", "the HR partner: exactly scale x its LR picture, checked per pair")
            t(2, f"files: {files_value(picture_globs(f'{hr_rel}/', hr_files))}")
            t(2, "like: low_res", "cropped and padded with the LR plan times scale: pairs stay aligned")
            t(2, f"scale: {scale}", f"HR/LR size ratio of {measured} sampled pairs")
        else:
            why = "the scale is unknown (see the notes); once known: kind: paired, like: low_res, scale: k"
            t(2, "kind: image", why)
            t(2, f"files: {files_value(picture_globs(f'{hr_rel}/', hr_files))}")
            assert hr_size is not None  # measured when the scale is unknown
            t(2, f"size: [{hr_size.height}, {hr_size.width}]")
        annotation_lines(t, ann)

    return body


def detect(kind, raw: Path, notes: list[str], todo: list[str]) -> Layout | None:
    """The ``sr`` layout: an image field and its ``kind`` partner, when ``raw`` holds LR/HR folders."""
    pairs = sr_pairs(raw)
    return Layout("sr", sr_body(raw, pairs, notes)) if pairs else None
