"""What float32, a signal field's default dtype, keeps of a recording's values (``kind: signal``,
and ``init``'s choice of dtype for ``.npy`` channels)."""

from __future__ import annotations

import numpy as np

FLOAT32_INTEGERS = 1 << 24  # float32 holds every integer up to this, and not all beyond it
FLOAT32_STEP_SHARE = 0.5  # of a float channel's median step between samples: float32 may round by less
STEPS_MEASURED = 1 << 16  # steps between samples a channel's median step is measured on
LOSS_BLOCK = 1 << 20  # samples compared with their float32 values at a time (a bounded copy)
# a step within this many float64 spacings of its value is arithmetic noise, no step of the signal
# (a flat channel through a filter: 5.0 give or take 1e-14); 0.1 s at 1.7e9 s is 400,000 spacings
NOISE_SPACINGS = 1 << 10


def float32_loss(values: np.ndarray, stored: np.ndarray) -> str | None:
    """What float32 (``stored``) loses of a channel's ``values``, or None: an integer channel must be
    kept exactly (counts above 2**24 would become their neighbours), a float channel rounded by less
    than half its median step from one sample to the next (timestamps near 1.7e9 s at 0.1 s steps
    would be rounded by up to 64 s and merge; a 16-bit EDF channel's levels stay apart). Steps of
    float64 arithmetic noise (``NOISE_SPACINGS``) are no steps: a channel of only those is flat."""
    if values.dtype.kind in "iu":
        if values.size and max(-int(values.min()), int(values.max())) > FLOAT32_INTEGERS:
            if not np.array_equal(stored.astype(np.float64), values.astype(np.float64)):
                return (
                    f"integer values {int(values.min()):,}..{int(values.max()):,}: float32 holds integers only up "
                    f"to {FLOAT32_INTEGERS:,} exactly; set dtype: float64"
                )
        return None
    if values.dtype.itemsize <= 4:
        return None
    kept = np.isfinite(values)
    finite, rounded = (values, stored) if kept.all() else (values[kept], stored[kept])
    if finite.size < 2:
        return None
    at = np.unique(np.linspace(0, finite.size - 2, min(finite.size - 1, STEPS_MEASURED)).astype(np.int64))
    steps = np.abs(finite[at + 1] - finite[at])  # a spread sample of the steps: no copy of a long channel
    steps = steps[steps > NOISE_SPACINGS * np.spacing(np.abs(finite[at]))]
    if not steps.size:
        return None
    step = float(np.median(steps))
    loss = 0.0
    with np.errstate(over="ignore", invalid="ignore"):
        for start in range(0, finite.size, LOSS_BLOCK):
            block = slice(start, start + LOSS_BLOCK)
            loss = max(loss, float(np.abs(rounded[block].astype(np.float64) - finite[block]).max()))
    if loss >= FLOAT32_STEP_SHARE * step:
        return (
            f"float32 would round values by up to {loss:.3g}, where the median step between samples is {step:.3g} "
            f"(values {finite.min():.12g}..{finite.max():.12g}); set dtype: float64"
        )
    return None
