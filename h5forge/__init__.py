"""h5forge: labelled raw data in, versioned and verified HDF5 training sets out."""

from importlib import import_module

__version__ = "0.1.0"

# Importing hdf5plugin registers its compression filters (LZ4, Zstd, Bitshuffle, Blosc2, ...) with the
# HDF5 library h5py loaded, so after `import h5forge` plain h5py code reads every codec a version may
# use (the default lz4 included) without importing anything else.
import_module("hdf5plugin")
