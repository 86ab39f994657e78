"""h5forge: labelled raw data in, versioned and verified HDF5 training sets out."""

from importlib import import_module

__version__ = "0.1.0"

# Importing hdf5plugin registers its compression filters (LZ4, Zstd, Bitshuffle, Blosc2, ...) with the
# HDF5 library h5py loaded, so after `import h5forge` plain h5py code reads every codec a version may
# use (the default lz4 included) without importing anything else.
import_module("hdf5plugin")

_PIPELINE = ("build", "append")


def __getattr__(name: str):
    """``h5forge.build`` and ``h5forge.append`` (``h5forge.pipeline``), imported on first use: a
    training process that only reads never loads the build side (dask, Pillow, decoders)."""
    if name in _PIPELINE:
        return getattr(import_module("h5forge.pipeline"), name)
    raise AttributeError(f"module 'h5forge' has no attribute {name!r}")
