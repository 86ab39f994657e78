"""Choices measured on the user's own data: the codec table of `h5forge codecs`."""
