# SPDX-License-Identifier: Apache-2.0
"""Hostile and careless inputs to OwnedRasterArray.from_numpy: nothing the caller gave is
silently dropped."""

from __future__ import annotations

import numpy as np
import pytest

from vibespatial_raster.buffers import OwnedRasterArray


@pytest.mark.parametrize("nodata", [np.complex64(1 + 2j), np.complex128(-1), 1 + 0j])
def test_from_numpy_complex_nodata_refused(nodata):
    # Python's complex was refused; NumPy's was taken with its imaginary part dropped
    # (a ComplexWarning only).
    with pytest.raises(TypeError, match="nodata"):
        OwnedRasterArray.from_numpy(np.zeros((2, 2), np.float32), nodata=nodata)


def test_with_georeferencing_complex_nodata_refused():
    r = OwnedRasterArray.from_numpy(np.zeros((2, 2), np.float32))
    with pytest.raises(TypeError, match="nodata"):
        r.with_georeferencing(nodata=np.complex64(3))


def test_from_numpy_masked_array_with_masked_pixels_refused():
    # The mask was dropped: masked pixels came back as valid data, nodata None.
    data = np.ma.masked_array(np.arange(6, dtype=np.float32).reshape(2, 3),
                              mask=[[True, False, False], [False, False, True]])
    with pytest.raises(ValueError, match="masked"):
        OwnedRasterArray.from_numpy(data)
    with pytest.raises(ValueError, match="masked"):
        OwnedRasterArray.from_numpy(data, nodata=-1.0)


def test_from_numpy_masked_array_without_masked_pixels_accepted():
    data = np.ma.masked_array(np.arange(6, dtype=np.int16).reshape(2, 3))
    r = OwnedRasterArray.from_numpy(data, nodata=-1)
    assert np.array_equal(r.to_numpy(), data.data)
    filled = np.ma.masked_equal(np.arange(6, dtype=np.int16).reshape(2, 3), 4)
    r = OwnedRasterArray.from_numpy(filled.filled(-1), nodata=-1)
    assert r.nodata_mask.tolist() == filled.mask.tolist()
