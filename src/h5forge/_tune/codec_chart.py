"""The codec table as a PNG: one panel of horizontal bars per measure, the recommended codec in
its own colour (Pillow only, so no plotting library is needed)."""

from __future__ import annotations

from pathlib import Path

from PIL import Image, ImageDraw

from h5forge._tune.codec_trial import CodecTrial
from h5forge._views import drawing

MEASURES = (
    ("ratio", "stored / raw", "{:.3f}"),
    ("write_ms_per_sample", "write CPU ms / sample", "{:.2f}"),
    ("read_p50_ms", "random read p50 ms", "{:.3f}"),
    ("batch_cpu_ms", "reader CPU ms / batch", "{:.2f}"),
)
BAR = (90, 140, 210)
PICKED = (60, 200, 110)
NAME_W, BAR_W, VALUE_W, ROW_H, PAD = 110, 260, 60, 16, 12


def draw_chart(result: CodecTrial, out: str | Path) -> Path:
    """Write the chart of ``result`` to ``out`` (PNG); returns the path."""
    rows = result.results
    panel_w = NAME_W + BAR_W + VALUE_W
    panel_h = drawing.LINE_HEIGHT + 4 + ROW_H * len(rows)
    title_h = 2 * drawing.LINE_HEIGHT + PAD
    width = 2 * PAD + 2 * panel_w + PAD
    height = title_h + 2 * (panel_h + PAD) + PAD
    image = Image.new("RGB", (width, height), drawing.BACKGROUND)
    draw = ImageDraw.Draw(image)
    title = (
        (f"codecs measured on {len(result.ids)} samples of {result.spec_name}", drawing.TEXT),
        (f"recommended for {result.goal}: {result.recommended}", PICKED),
    )
    for k, (text, colour) in enumerate(title):
        draw.text((PAD, PAD // 2 + k * drawing.LINE_HEIGHT), text, font=drawing.font(), fill=colour)
    for k, (attr, label, fmt) in enumerate(MEASURES):
        left = PAD + (k % 2) * (panel_w + PAD)
        top = title_h + (k // 2) * (panel_h + PAD)
        draw.text((left, top), label, font=drawing.font(), fill=drawing.TEXT)
        values = [getattr(r, attr) for r in rows]
        scale = BAR_W / max(max(values), 1e-12)
        for i, (r, v) in enumerate(zip(rows, values)):
            y = top + drawing.LINE_HEIGHT + 4 + i * ROW_H
            draw.text((left, y), r.codec, font=drawing.font(), fill=drawing.DIM_TEXT)
            colour = PICKED if r.codec == result.recommended else BAR
            draw.rectangle((left + NAME_W, y + 2, left + NAME_W + max(1, round(v * scale)), y + ROW_H - 4), fill=colour)
            draw.text((left + NAME_W + BAR_W + 6, y), fmt.format(v), font=drawing.font(), fill=drawing.DIM_TEXT)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    image.save(out, format="PNG")
    return out
