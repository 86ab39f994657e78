"""A numeric numpy scalar (a row's annotation value) hashes as the 0-d array holding it: the scalar
shortcut and the array route give the same bytes for every numeric dtype and byte order."""

import numpy as np
import pytest

from h5forge._format.checksums import canonical, values_digest

DTYPES = ["?", "i1", "u1", "<i2", ">i2", "<u4", ">i4", "<i8", ">u8", "<f2", ">f4", "<f8", ">f8", "<c8", ">c16"]


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_scalar_hashes_as_its_0d_array(dtype):
    rng = np.random.default_rng(7)
    values = np.frombuffer(rng.bytes(np.dtype(dtype).itemsize * 50), dtype=dtype)
    if np.dtype(dtype).kind == "b":
        values = values.view("u1") % 2 == 1
    for v in values:
        scalar = v[()] if isinstance(v, np.ndarray) else v
        assert isinstance(scalar, np.generic)
        as_array = np.array(scalar, dtype=dtype)  # 0-d, so the array route hashes it
        assert not isinstance(as_array, np.generic)
        assert canonical(scalar) == canonical(as_array)
        assert values_digest([scalar, "x"]) == values_digest([as_array, "x"])


def test_scalars_of_different_dtypes_hash_differently():
    assert len({canonical(np.dtype(d).type(1)) for d in DTYPES}) == len({np.dtype(d).newbyteorder("<") for d in DTYPES})
