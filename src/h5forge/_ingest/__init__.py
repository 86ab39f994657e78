"""The write side: discover raw samples, split, clean (on dask), write a version, append, watch."""
