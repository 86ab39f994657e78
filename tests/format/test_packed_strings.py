"""Digests hash fixed-width bytes arrays (catalogs, sample keys, hashes) a run at a time: the same
bytes as hashing each value alone, whatever NULs the values end with."""

import numpy as np
import pytest

from h5forge._format.checksums import PACK_STRINGS_FROM, _string, canonical


def _one_by_one(arr: np.ndarray) -> bytes:
    head = b"a" + bytes([arr.ndim]) + b"".join(int(n).to_bytes(8, "little") for n in arr.shape)
    return head + b"".join(_string(v) for v in arr.ravel().tolist())


@pytest.mark.parametrize("width", [1, 16, 32, 64])
def test_packed_strings_hash_as_each_value_alone(width):
    rng = np.random.default_rng(width)
    arr = np.frombuffer(rng.bytes(width * 3000), dtype=f"S{width}").copy().reshape(1000, 3)
    arr[0, 0] = b""  # every NUL: numpy reads it as b""
    arr[5, 1] = b"x"  # trailing NULs dropped
    arr[-1, -1] = b"\0" + b"y" * (width - 1) if width > 1 else b"y"  # a leading NUL stays
    assert (np.char.str_len(arr) < width).any()
    assert canonical(arr) == _one_by_one(arr)
    few = arr.reshape(-1)[: PACK_STRINGS_FROM - 1]
    assert canonical(few) == _one_by_one(few)
