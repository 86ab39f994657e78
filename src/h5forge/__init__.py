"""h5forge: labelled raw data in, versioned and verified HDF5 training sets out."""

from importlib import import_module

__version__ = "0.1.0"

# Importing hdf5plugin registers its compression filters (LZ4, Zstd, Bitshuffle, Blosc2, ...) with the
# HDF5 library h5py loaded, so after `import h5forge` plain h5py code reads every codec a version may
# use (the default lz4 included) without importing anything else.
import_module("hdf5plugin")

# The public API, imported on first use (a training process that only reads never loads the build
# side: dask, Pillow, decoders), with the readers' modules (h5forge.read.torch, .jax, .tf, .lightning)
# and the errors (h5forge.errors). Every other module is internal, and its name or its package's starts
# with an underscore (h5forge._pipeline, h5forge.read._reader): docs/architecture.md, "The public API".
_PUBLIC = {
    "build": "h5forge._pipeline",
    "append": "h5forge._pipeline",
    "verify": "h5forge._pipeline",
    "BuildResult": "h5forge._pipeline",
    "AppendResult": "h5forge._pipeline",
    "DatasetSpec": "h5forge.spec",
    "load_spec": "h5forge.spec",
    "H5Dataset": "h5forge.read.torch",
    "ChunkShuffleSampler": "h5forge.read.torch",
    "H5forgeError": "h5forge.errors",
}
__all__ = [*_PUBLIC, "__version__"]


def __getattr__(name: str):
    if name in _PUBLIC:
        return getattr(import_module(_PUBLIC[name]), name)
    raise AttributeError(f"module 'h5forge' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
