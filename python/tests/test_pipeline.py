# SPDX-License-Identifier: Apache-2.0
"""Band math (ops.calc) and pipelines (ops.Pipeline) from Python: values against numpy and
against the same operations run one after another, whole and tiled; typed errors."""

import numpy as np
import pytest

from vibespatial_raster import ops
from vibespatial_raster.buffers import OwnedRasterArray, RasterPlan, TilingStrategy

AFFINE = (10.0, 0.0, 500.0, 0.0, -10.0, 900.0)


def raster(bands, h, w, seed, dtype=np.float32, nodata=-9999.0):
    rng = np.random.default_rng(seed)
    a = rng.uniform(0, 100, size=(bands, h, w)).astype(dtype)
    a.flat[::37] = nodata
    if np.issubdtype(dtype, np.floating):
        a.flat[5::41] = np.nan
    return OwnedRasterArray.from_numpy(a, nodata=nodata, affine=AFFINE)


def tiled(th, tw):
    return RasterPlan(TilingStrategy.TILED, (th, tw), 0, 0, 0, 1, True)


def same(a, b):
    x, y = a.to_numpy(), b.to_numpy()
    return x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes()


def test_calc_equals_numpy_in_float64():
    a = raster(4, 20, 30, 1, dtype=np.float64)
    out = ops.calc("(A[4] - A[3]) / (A[4] + A[3])", A=a, dtype="float64")
    x = a.to_numpy()
    nir, red = x[3], x[2]
    valid = (nir != -9999) & (red != -9999) & ~np.isnan(nir) & ~np.isnan(red)
    with np.errstate(all="ignore"):
        want = (nir - red) / (nir + red)
    got = out.to_numpy()
    assert got.shape == (20, 30) or got.shape == (1, 20, 30)
    got = got.reshape(20, 30)
    assert np.array_equal(got[valid], want[valid], equal_nan=True)
    assert np.isnan(got[~valid]).all() or out.nodata is not None
    assert out.affine == AFFINE


def test_calc_several_inputs_and_expressions():
    a = raster(1, 8, 9, 2)
    b = raster(1, 8, 9, 3)
    out = ops.calc(["A + B", "A * 2"], A=a, B=b)
    assert out.band_count == 2
    assert out.dtype == np.float32


@pytest.mark.parametrize("compute", ["float64", "float32"])
def test_calc_constants_give_what_pixels_of_the_same_value_give(compute):
    # numpy's ** fast path x ** 0.5 is sqrt(x), on constants as on pixels: (-0.0) ** 0.5 is -0.0
    # and (-inf) ** 0.5 NaN (C's pow gives +0.0 and +inf).
    values = np.array([[[-0.0, -np.inf, 4.0, -1.0]]], dtype=compute)
    a = OwnedRasterArray.from_numpy(values)
    exprs = [f"A ** {e}" for e in ("0.5", "2", "-1")] + ["pow(A, 0.5)"]
    by_pixel = ops.calc(exprs, A=a, dtype="float64", compute=compute,
                        propagate_nodata=False).to_numpy().reshape(len(exprs), 4)
    literal = ["(-0.0)", "(-inf)", "4.0", "(-1.0)"]
    folded = ops.calc([e.replace("A", v) for e in exprs for v in literal], A=a, dtype="float64",
                      compute=compute, propagate_nodata=False).to_numpy()
    folded = folded.reshape(len(exprs), 4, 4)[:, :, 0]  # every pixel of a constant is the same
    assert np.array_equal(folded, by_pixel, equal_nan=True)
    numbers = ~np.isnan(by_pixel)
    assert np.array_equal(np.signbit(folded[numbers]), np.signbit(by_pixel[numbers]))
    assert np.signbit(folded[0, 0]) and folded[0, 0] == 0 and np.isnan(folded[0, 1])
    assert folded[3, 1] == np.inf and not np.signbit(folded[3, 0])  # pow() stays C's pow


def test_a_pipeline_equals_its_steps_whole_and_tiled():
    a = raster(3, 37, 41, 4)
    chain = (ops.Pipeline(A=3).focal_mean("reflect").clip(5, 95).focal_mean("nearest")
             .rescale(0, 100, 1, 255, "uint8"))
    assert chain.halo == 2
    assert chain.steps == ["focal-mean", "clip", "focal-mean", "rescale"]
    want = ops.focal_mean_3x3(a, "reflect")
    want = ops.clip(want, 5, 95)
    want = ops.focal_mean_3x3(want, "nearest")
    want = ops.rescale(want, 0, 100, 1, 255, "uint8")
    assert same(chain.run(A=a), want)
    for th, tw in [(8, 8), (5, 17), (64, 64)]:
        assert same(chain.run(tiled(th, tw), A=a), want), (th, tw)


def test_a_pipeline_with_calc_over_two_inputs():
    a = raster(4, 16, 18, 5)
    b = raster(1, 16, 18, 6)
    chain = ops.Pipeline(A=4, B=1).calc(["A[4] - B", "A[1]"]).focal_mean().calc("X[1] + X[2]")
    assert chain.band_count == 1
    want = ops.calc(["A[4] - B", "A[1]"], A=a, B=b)
    want = ops.focal_mean_3x3(want)
    # A calc step sees the chain's inputs, then X: its nodata rule takes A's first.
    want = ops.calc("X[1] + X[2]", A=a, B=b, X=want)
    assert same(chain.run(tiled(5, 7), A=a, B=b), want)


def test_bad_input_gives_typed_errors():
    a = raster(2, 6, 7, 7)
    with pytest.raises(ValueError, match="unknown name 'C' at column 8"):
        ops.calc("A[1] + C", A=a)
    with pytest.raises(ValueError, match="at least one input"):
        ops.calc("1 + 2")
    with pytest.raises(TypeError, match="expr must be a str"):
        ops.calc(3, A=a)
    with pytest.raises(TypeError, match="must be an OwnedRasterArray"):
        ops.calc("A", A=np.zeros((2, 2)))
    with pytest.raises(ValueError, match="compute must be"):
        ops.calc("A[1]", A=a, compute="float16")
    with pytest.raises(ValueError, match="at least one input"):
        ops.Pipeline()
    with pytest.raises(ValueError, match="may not be named X"):
        ops.Pipeline(X=1)
    with pytest.raises(TypeError, match="must be an integer"):
        ops.Pipeline(A=1.5)
    p = ops.Pipeline(A=2).focal_mean()
    with pytest.raises(ValueError, match=r"step 2 \(calc\)"):
        p.calc("A[3]")
    with pytest.raises(ValueError, match="edge must be"):
        p.focal_mean("wrap")
    assert p.steps == ["focal-mean"]
    with pytest.raises(ValueError, match="missing A"):
        p.run(B=a)
    with pytest.raises(ValueError, match="built for 2"):
        p.run(A=raster(3, 6, 7, 8))
    with pytest.raises(TypeError, match="plan must be"):
        p.run("tiled", A=a)


def test_calc_output_nodata_rule():
    # The library's one output-nodata rule: a valid result equal to the nodata is refused (it
    # would read as nodata), a given nodata never rewrites valid results, and an input the
    # expression does not read plays no part in the output's nodata.
    u8 = OwnedRasterArray.from_numpy(np.full((1, 2, 2), 200, np.uint8), affine=AFFINE)
    with pytest.raises(ValueError, match="equal the output nodata"):
        ops.calc("A + 55", A=u8, dtype="uint8")
    out = ops.calc("A + 55", A=u8, dtype="uint8", nodata=0)
    assert out.nodata == 0 and (out.to_numpy() == 255).all()
    i16 = OwnedRasterArray.from_numpy(np.full((1, 2, 2), 5, np.int16), nodata=-32768,
                                      affine=AFFINE)
    assert np.isnan(ops.calc("B + 1", A=i16, B=u8).nodata)
    assert ops.calc("A + B", A=i16, B=u8).nodata == -32768
    with pytest.raises(ValueError, match="equal the output nodata"):
        ops.Pipeline(A=1).convert("int16", 205).run(A=ops.calc("A + 5", A=u8))
