"""h5forge: labelled raw data in, versioned and verified HDF5 training sets out."""

__version__ = "0.1.0"
