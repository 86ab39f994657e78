"""Commands that look at datasets without changing them: ``--version``, info, diff."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import typer
from rich.table import Table

from h5forge._cli.app import _fail, _reported, app, out, say, settings
from h5forge._figures import size as size_text


def _print_version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        say(f"h5forge {version('h5forge')}")
        raise typer.Exit(0)


@app.callback()
def _main(
    show_version: bool = typer.Option(
        False, "--version", is_eager=True, callback=_print_version, help="print the installed h5forge version and exit"
    ),
    debug: bool = typer.Option(
        False, "--debug", help="show the tracebacks of expected failures too (they are always in the Prefect run's log)"
    ),
) -> None:
    """Labelled raw data in, versioned and verified HDF5 training sets out."""
    settings.debug = debug


def _counts_text(counts: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v}" for k, v in counts.items())


def _number(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.3f}"
    if isinstance(v, list):
        return "[" + ", ".join(_number(x) for x in v) + "]"
    return str(v)


def _print_info(info: dict[str, Any]) -> None:
    lin, sz, spec = info["lineage"], info["sizes"], info["spec"]
    t = Table(title=f"{info['name']} v{lin['version']:04d} ({info['file']})", show_header=False)
    t.add_row("samples", f"{info['samples']} ({_counts_text(info['counts'])})")
    ratio = sz["array_bytes_stored"] / sz["array_bytes_raw"] if sz["array_bytes_raw"] else 1.0
    t.add_row(
        "arrays",
        f"{size_text(sz['array_bytes_stored'])} stored of {size_text(sz['array_bytes_raw'])} raw ({ratio:.3f})",
    )
    t.add_row(
        "file", f"{size_text(sz['file_bytes'])}; on disk with the files it reads: {size_text(sz['on_disk_bytes'])}"
    )
    t.add_row("codec", f"{info['codec']} (needs {info['codec_needs']})")
    t.add_row(
        "created",
        f"{lin['created_at']} by {lin['creator']}, h5forge {lin['written_with']['h5forge']}, "
        f"HDF5 {lin['written_with']['hdf5']}",
    )
    if lin["kind"] == "thin":
        files = ", ".join(f"{s['file']}{'' if s['present'] else ' (MISSING)'}" for s in lin["row_files"])
        how = "mapped onto its workers' row files" if lin["assembled"] else "thin"
        t.add_row("kind", f"{how}: reads {len(lin['row_files'])} files: {files}")
    else:
        exported = f", exported from {lin['exported_from']}" if lin["exported_from"] else ""
        t.add_row("kind", f"full (self-contained){exported}")
    chain = " <- ".join(
        [f"v{lin['version']:04d}"]
        + [
            f"v{a['version']:04d}" + ("" if a["present"] else " (deleted)") + (f" {a['kind']}" if a.get("kind") else "")
            for a in lin["ancestors"]
        ]
    )
    t.add_row("lineage", chain if lin["parent"] else "no parent (first version of the folder)")
    fields = "; ".join(
        f"{n}: {f['kind']} {f['shape']} {f['dtype']}" + (f" {f['codec']}" if f["codec"] else "")
        for n, f in spec["fields"].items()
    )
    t.add_row("spec", f"{spec['name']}: {spec['description']}")
    t.add_row("fields", fields)
    t.add_row("columns", ", ".join(f"{c} ({ty})" for c, ty in spec["columns"].items()) or "none")
    t.add_row("splits", _counts_text(spec["splits"]) + f"; chunk_rows {spec['chunk_rows']}")
    t.add_row("source", spec["source_root"])
    out.print(t)
    stats = Table(
        "split",
        "samples",
        "statistics",
        "samples per value",
        title="per split",
        caption="samples per value: of the indexed columns, and for a mask the samples holding each class",
    )
    for split, s in info["splits"].items():
        st = "\n".join(
            f"{k}: {', '.join(f'{c} {n}' for c, n in v.items()) if isinstance(v, dict) else _number(v)}"
            for k, v in s["stats"].items()
        )
        by = "\n".join(f"{k}: {_counts_text(v)}" for k, v in s["samples_by_value"].items())
        stats.add_row(split, str(s["samples"]), st, by)
    out.print(stats)
    rej = info["rejected"]
    run = "the append that wrote it" if lin["kind"] == "thin" and not lin["assembled"] else "the build"
    say(f"rejected inputs ({run}): {rej['total']}")
    for r in rej["by_reason"]:
        ids = ", ".join(i["path"] for i in r["inputs"][:5]) + (" ..." if r["count"] > 5 else "")
        say(f"  {r['count']} x [{r['stage']}] {r['reason']}: {ids}")


@app.command()
def info(
    path: Path = typer.Argument(..., help="a version file, dataset_latest.h5, or an output folder"),
    as_json: bool = typer.Option(False, "--json", help="print everything as JSON"),
) -> None:
    """What a version holds: samples per split, sizes, codec, the spec, lineage (thin or full),
    label and class counts, the rejected inputs by reason. A folder: every version, the latest in full."""
    from h5forge._views.info import folder_info, version_info
    from h5forge._store.isolated import in_child

    with _reported():
        data = in_child(folder_info if path.is_dir() else version_info, path, what=f"read {path}")
    if as_json:
        print(json.dumps(data, indent=2))
        return
    if path.is_dir():
        t = Table("", "version", "samples", "size", "kind", "created", "parent", title=str(path))
        for v in data["versions"]:
            t.add_row(
                "latest →" if v["latest"] else "",
                f"v{v['version']:04d}",
                f"{v['samples']} ({_counts_text(v['counts'])})",
                size_text(v["file_bytes"]),
                v["kind"],
                v["created_at"],
                f"v{v['parent']:04d}" if v["parent"] else "",
            )
        out.print(t)
        data = data["detail"]
    _print_info(data)


@app.command()
def diff(
    old: str = typer.Argument(..., help="the earlier version: a file, or with --dir a version name"),
    new: str = typer.Argument(..., help="the later version: a file, or with --dir a version name"),
    folder: Optional[Path] = typer.Option(
        None, "--dir", help="output folder: OLD and NEW are then versions of it: 3, v0003, latest or previous"
    ),
    as_json: bool = typer.Option(False, "--json", help="print the diff as JSON (every id listed)"),
) -> None:
    """Sample-level changes between two versions: ids added and removed, content (checksum) and
    label/column changes, samples that moved split (none, by the stable-split rule), counts per
    split and per label.

    Examples: h5forge diff out/dataset_v0001.h5 out/dataset_v0002.h5;
    h5forge diff --dir out previous latest; h5forge diff --dir out 1 3 --json
    """
    from h5forge._views.diff import diff_versions, resolve_version
    from h5forge._store.isolated import in_child

    with _reported():
        if folder is not None:
            a, b = resolve_version(folder, old), resolve_version(folder, new)
        else:
            a, b = Path(old), Path(new)
        result = in_child(diff_versions, a, b, what=f"compare {a} and {b}")
    if as_json:
        print(json.dumps(result.to_dict(), indent=2))
        return
    for line in result.lines():
        say(line)


def _values_text(values: Any) -> tuple[str, str, str]:
    """(shape, dtype, values) of one field of a batch: an array, or a list of rows (ragged fields)."""
    import numpy as np

    if isinstance(values, list):  # one array per row: lengths differ
        lengths = [len(v) for v in values]
        dtype = str(values[0].dtype) if values else ""
        return f"{len(values)} rows of {min(lengths)}..{max(lengths)}", dtype, _range_text(values)
    values = np.asarray(values)
    if values.dtype.kind in "OSU":  # text columns
        shown = [v.decode() if isinstance(v, bytes) else str(v) for v in values[:3]]
        return str(values.shape), "str", ", ".join(shown) + (" ..." if len(values) > 3 else "")
    return str(values.shape), str(values.dtype), _range_text([values])


def _range_text(arrays: list) -> str:
    sized = [a for a in arrays if a.size]
    if not sized:
        return "empty"
    low, high = min(a.min() for a in sized), max(a.max() for a in sized)
    return f"{_number(low.item())}..{_number(high.item())}"


@app.command("read")
def read_batch(
    path: Path = typer.Argument(..., help="a version file or dataset_latest.h5"),
    split: str = typer.Option("train", help="the split to read: train, val or test"),
    fields: Optional[str] = typer.Option(None, help="fields to read, comma-separated (default: every field)"),
    batch_size: int = typer.Option(8, "--batch-size", min=1, help="rows to read"),
) -> None:
    """Read the first rows of a split back as stored, with the framework-free reader
    (h5forge.read._reader.SplitReader, what the torch, TF and JAX readers build on): each field's
    batch shape, dtype and values, and the rows' ids."""
    from h5forge.read._reader import SplitReader

    names = [n.strip() for n in fields.split(",") if n.strip()] if fields else None
    with _reported():
        try:
            reader = SplitReader(path, split=split, fields=names)
        except FileNotFoundError as e:
            _fail(str(e))
        with reader:
            rows = range(min(batch_size, len(reader)))
            batch = reader.read(rows)
            ids = reader.ids()[: len(rows)]
    t = Table("field", "batch", "dtype", "values", title=f"{path} {split}: rows 0..{len(rows) - 1} of {len(reader)}")
    for name, values in batch.items():
        t.add_row(name, *_values_text(values))
    out.print(t)
    say("ids: " + ", ".join(ids))
