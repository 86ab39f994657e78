"""Compression codecs a spec can name, and what a reader needs to open the result.

Byte-shuffle is never offered for uint8 data: HDF5's shuffle filter is the identity on 1-byte
types (measured, identical chunks), so it would only cost time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Callable

from pydantic import AfterValidator


@dataclass(frozen=True)
class Codec:
    name: str
    needs: str  # what a reader must have, recorded in the file's attributes
    options: Callable[[], dict[str, Any]]


def _gzip(level: int) -> Callable[[], dict[str, Any]]:
    return lambda: {"compression": "gzip", "compression_opts": level}


def _plugin(factory: str, **kwargs: Any) -> Callable[[], dict[str, Any]]:
    def options() -> dict[str, Any]:
        import hdf5plugin

        return dict(getattr(hdf5plugin, factory)(**kwargs))

    return options


CODECS: dict[str, Codec] = {
    "none": Codec("none", "any HDF5 reader", lambda: {}),
    "lzf": Codec("lzf", "h5py (LZF filter 32000 ships only with h5py)", lambda: {"compression": "lzf"}),
    **{f"gzip-{n}": Codec(f"gzip-{n}", "any HDF5 reader (deflate)", _gzip(n)) for n in (1, 4, 9)},
    "zstd-1": Codec("zstd-1", "hdf5plugin (Zstd filter 32015)", _plugin("Zstd", clevel=1)),
    "zstd": Codec("zstd", "hdf5plugin (Zstd filter 32015)", _plugin("Zstd", clevel=3)),
    "zstd-9": Codec("zstd-9", "hdf5plugin (Zstd filter 32015)", _plugin("Zstd", clevel=9)),
    "lz4": Codec("lz4", "hdf5plugin (LZ4 filter 32004)", _plugin("LZ4")),
    "bitshuffle-lz4": Codec(
        "bitshuffle-lz4", "hdf5plugin (Bitshuffle filter 32008)", _plugin("Bitshuffle", cname="lz4")
    ),
    "blosc2-zstd": Codec("blosc2-zstd", "hdf5plugin (Blosc2 filter 32026)", _plugin("Blosc2", cname="zstd", clevel=3)),
}


def known_codec(name: str) -> str:
    """A codec name a spec may use; ValueError lists the others."""
    if name not in CODECS:
        raise ValueError(f"unknown codec {name!r}; choose one of {', '.join(CODECS)}")
    return name


CodecName = Annotated[str, AfterValidator(known_codec)]


def codec_options(name: str) -> dict[str, Any]:
    """Keyword arguments for ``h5py.Group.create_dataset``."""
    return CODECS[name].options()


def ensure_filters() -> None:
    """Register the hdf5plugin filters so files written with them can be read."""
    import hdf5plugin  # noqa: F401  (importing registers the filters with HDF5)
