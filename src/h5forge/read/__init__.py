"""The read side: framework-free reader and sampler, and the torch / TF / JAX adapters.
Importing it loads neither Pillow, dask nor Prefect (a training process needs none of them).

The readers are the modules ``h5forge.read.torch``, ``.jax``, ``.tf`` and ``.lightning``; the names
here are imported on first use, and the modules with a leading underscore are internal."""

from importlib import import_module

_PUBLIC = {
    "SplitReader": "h5forge.read._reader",
    "VarlenCollate": "h5forge.read._collate",
    "Padded": "h5forge.read._collate",
    "pad_batch": "h5forge.read._collate",
    "index_rows": "h5forge._format.layout",
}
__all__ = ["SplitReader", "VarlenCollate", "Padded", "pad_batch", "index_rows"]


def __getattr__(name: str):
    if name in _PUBLIC:
        return getattr(import_module(_PUBLIC[name]), name)
    raise AttributeError(f"module 'h5forge.read' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
