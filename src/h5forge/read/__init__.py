"""The read side: framework-free reader and sampler, and the torch / TF / JAX adapters.
Importing it loads neither Pillow, dask nor Prefect (a training process needs none of them)."""
