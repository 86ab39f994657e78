"""Commands that show the data: ``preview`` (a contact sheet of samples) and ``codecs`` (the codec
table measured on the user's own raw folder)."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer
from rich.table import Table

from h5forge._cli.app import _reported, app, out, say


def _ids(values: Optional[List[str]]) -> list[str] | None:
    """``--ids a,b --ids c`` -> [a, b, c]."""
    ids = [i.strip() for v in values or [] for i in v.split(",") if i.strip()]
    return ids or None


@app.command()
def preview(
    file: Path = typer.Argument(..., help="a version file (or dataset_latest.h5)"),
    split: Optional[str] = typer.Option(
        None, help="train | val | test (default: train; with --ids, every split is searched)"
    ),
    n: int = typer.Option(16, "--n", min=1, max=400, help="samples drawn at random"),
    seed: int = typer.Option(0, help="the same seed draws the same samples"),
    ids: Optional[List[str]] = typer.Option(None, help="sample ids to draw instead, comma-separated or repeated"),
    out_path: Path = typer.Option(Path("preview.png"), "--out", help="PNG to write"),
    tile: int = typer.Option(
        192, min=32, max=1024, help="tile width in pixels: a sample's cell (a volume's is three tiles wide)"
    ),
) -> None:
    """A contact sheet PNG of random or chosen samples, each drawn by its field kinds: images with
    their masks overlaid in colour (a legend for multi-class masks), volumes as three middle planes at
    their voxel spacing with the spacing and display window, signals as line plots per channel;
    the id, the label and the annotation columns under each."""
    from h5forge._store.isolated import in_child
    from h5forge._store.output import refuse_version_names
    from h5forge._views.preview import write_preview

    with _reported():
        refuse_version_names(out_path, "the preview")
        sheet = in_child(write_preview, file, out_path, split, n, seed, _ids(ids), tile, what=f"preview {file}")
    shown = ", ".join(sheet.ids[:8]) + (f" and {len(sheet.ids) - 8} more" if len(sheet.ids) > 8 else "")
    say(f"wrote {out_path} ({sheet.image.width}x{sheet.image.height} px): {len(sheet.ids)} samples: {shown}")


@app.command()
def codecs(
    raw: Path = typer.Argument(..., help="raw folder, as for init/build"),
    spec: Optional[Path] = typer.Option(
        None, help="dataset spec YAML (default: inferred as `init` does); its source root is replaced by RAW"
    ),
    sample: int = typer.Option(500, min=1, help="raw inputs sampled (at random, seeded)"),
    only: Optional[str] = typer.Option(None, "--codecs", help="comma-separated codecs to measure (default: all)"),
    seed: int = typer.Option(0),
    chart: Path = typer.Option(Path("codecs.png"), help="bar chart PNG to write"),
    goal: str = typer.Option(
        "balanced",
        "--for",
        help="what you are short of: disk (smallest file), read (lowest reader CPU, then smallest), "
        "balanced (smallest file whose reader CPU is within 2x, or 0.05 ms per sample, of the lowest)",
    ),
) -> None:
    """Measure every codec on a sample of your own data: stored/raw, write CPU per sample, random
    single-sample read p50, reader CPU per batch; print the table, draw it, and recommend one for
    your constraint (--for), with what the other constraints would pick."""
    from h5forge._format.codecs import CODECS
    from h5forge._tune.codec_chart import draw_chart
    from h5forge._tune.codec_trial import GOALS, recommend, spec_for, trial

    names = [c.strip() for c in only.split(",") if c.strip()] if only else None
    from h5forge._store.output import refuse_version_names

    with _reported():
        refuse_version_names(chart, "the chart")
        result = trial(spec_for(raw, spec), sample, names, seed, goal=goal)
        draw_chart(result, chart)
    t = Table(
        title=f"codecs on {len(result.ids)} samples of {result.spec_name}"
        + (f" ({result.rejected} sampled input(s) rejected)" if result.rejected else "")
    )
    columns = ("codec", "stored/raw", "write CPU ms/sample", "read p50 ms", f"reader CPU ms/batch of {result.batch}")
    for col in (*columns, "reader CPU vs lowest"):
        t.add_column(col, justify="left" if col == "codec" else "right", no_wrap=col == "codec")
    lowest = min(r.batch_cpu_ms for r in result.results)
    for r in result.results:
        style = "bold green" if r.codec == result.recommended else None
        t.add_row(
            r.codec,
            f"{r.ratio:.3f}",
            f"{r.write_ms_per_sample:.2f}",
            f"{r.read_p50_ms:.3f}",
            f"{r.batch_cpu_ms:.2f}",
            f"{r.batch_cpu_ms / lowest:.2f}x",
            style=style,
        )
    out.print(t)
    say(f"recommended for {result.goal}: {result.recommended} ({result.reason})")
    others = ", ".join(f"{g}: {recommend(result.results, g, result.batch)[0]}" for g in GOALS if g != result.goal)
    say(f"other constraints (--for) would pick {others}")
    say(
        f"a reader needs: {CODECS[result.recommended].needs}; set it in the spec as "
        f"storage: {{codec: {result.recommended}}}; chart: {chart}"
    )
