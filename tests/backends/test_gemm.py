"""The numba backend's own float32 product (`backends.numba.gemm`): its register-tiled
micro-kernel and 16x16 transposes agree with float64 products on every layout and remainder of
rows, columns and contracting length; special values follow IEEE as BLAS's do; it declines what
it does not take without writing; it runs from several threads at once; and the runtime sends
it exactly the products `products.kernel_gemm_takes` names, attention's among them."""

from __future__ import annotations

import itertools
from concurrent.futures import ThreadPoolExecutor

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import xfuse
from xfuse.backends.numba import backend as numba_backend
from xfuse.backends.numba import gemm
from xfuse.runtime import products

RNG = np.random.default_rng(5)


def _right(g: int, k: int, n: int, layout: str) -> np.ndarray:
    """A (g, k, n) float32 right side: rows contiguous (N), a transposed (g, n, k) array (T, as
    attention's k^T), or every other column of a wider one (S)."""
    if layout == "N":
        return RNG.standard_normal((g, k, n)).astype(np.float32)
    if layout == "T":
        return RNG.standard_normal((g, n, k)).astype(np.float32).transpose(0, 2, 1)
    return RNG.standard_normal((g, k, 2 * n)).astype(np.float32)[:, :, ::2]


def _assert_product(got: np.ndarray, a: np.ndarray, b: np.ndarray) -> None:
    """Within the bound of k fused multiply-adds in float32 (each rounding once, relative to
    the sum of |terms|) of the float64 product."""
    want = a.astype(np.float64) @ b.astype(np.float64)
    size = np.abs(a).astype(np.float64) @ np.abs(b).astype(np.float64)
    k = a.shape[-1]
    bound = (k + 1) * 2.0**-24 * size + 2.0**-126
    error = np.abs(got.astype(np.float64) - want)
    assert got.dtype == np.float32 and got.shape == want.shape
    assert (error <= bound).all(), f"max error {error.max()} at {np.unravel_index(error.argmax(), error.shape)}"


@pytest.mark.parametrize("layout", ["N", "T", "S"])
@pytest.mark.parametrize("g", [1, 3])
def test_products_agree_with_float64_over_remainders_and_layouts(layout, g):
    # rows around the tile's 6, columns around its 64 (and the transposes' 16), k around 16 and
    # past the blocks of KC (the later blocks add to the sums, partial tiles through a copy)
    for m, k, n in itertools.product([1, 5, 6, 7, 13, 64], [1, 15, 16, 17, 40, gemm.KC + 1, 2 * gemm.KC + 45],
                                     [1, 16, 17, 63, 64, 65, 130]):
        a = RNG.standard_normal((g, m, k)).astype(np.float32)
        b = _right(g, k, n, layout)
        out = np.full((g, m, n), np.nan, np.float32)
        assert gemm.gemm_f32(a, b, out)
        _assert_product(out, a, b)


def test_attention_shapes_and_a_strided_result():
    a = RNG.standard_normal((8, 256, 64)).astype(np.float32)
    b = _right(8, 64, 256, "T")  # q k^T per head
    out = np.empty((8, 256, 256), np.float32)
    assert gemm.gemm_f32(a, b, out)
    _assert_product(out, a, b)
    p = RNG.random((8, 256, 256)).astype(np.float32)
    v = _right(8, 256, 64, "N")  # softmax(...) @ v: b read in place, one panel wide
    wide = np.full((8, 256, 128), np.nan, np.float32)
    out = wide[:, :, 32:96]  # rows 128 floats apart: written where they are, nothing beside
    assert gemm.gemm_f32(p, v, out)
    _assert_product(out, p, v)
    assert np.isnan(wide[:, :, :32]).all() and np.isnan(wide[:, :, 96:]).all()


def test_special_values_follow_ieee_as_blas():
    m, k, n = 13, 20, 70
    a = RNG.standard_normal((1, m, k)).astype(np.float32)
    b = RNG.standard_normal((1, k, n)).astype(np.float32)
    a[0, 0, 3] = np.nan  # row 0: NaN throughout
    a[0, 1, 4] = np.inf  # row 1: +-inf by the sign of b[4], NaN where b[4] is 0
    b[0, 4, :5] = 0.0
    a[0, 2, 5], a[0, 2, 6] = np.inf, np.inf  # row 2: inf - inf where b[5] and b[6] differ in sign
    b[0, 5, 10:20], b[0, 6, 10:20] = 1.0, -1.0
    b[0, 7, 30] = np.inf  # column 30: inf times each row's a[7]
    a[0, 3, 7] = 0.0  # ... which is 0 in row 3: NaN there
    a[0, 4] = -0.0  # row 4 all -0.0: the sums start from +0.0, as BLAS's and XLA's
    a[0, 5] = 3e38  # row 5: overflow to inf
    b[0, :, 40] = 3e38
    out = np.empty((1, m, n), np.float32)
    assert gemm.gemm_f32(a, b, out)
    with np.errstate(all="ignore"):
        want = np.matmul(a, b)
    # Row 5's other columns sum terms near the largest float: whether a partial sum overflows
    # (and then whether infinities of both signs meet, NaN) depends on the order of the
    # additions, which differs between BLAS's kernels of one CPU and another's: those elements
    # are left out of the comparison of special values.
    order_free = np.ones(out.shape, bool)
    order_free[0, 5] = False
    order_free[0, 5, 40] = True
    for special in (np.isnan, np.isposinf, np.isneginf):
        np.testing.assert_array_equal(special(out)[order_free], special(want)[order_free])
    assert np.isnan(out[0, 0]).all() and np.isnan(out[0, 1, :5]).all() and np.isnan(out[0, 2, 10:20]).all()
    assert np.isnan(out[0, 3, 30]) and np.isposinf(out[0, 5, 40])
    zeros = np.delete(out[0, 4], 30)  # (-0.0 times column 30's inf is NaN)
    assert (zeros == 0).all() and not np.signbit(zeros).any()
    finite = np.isfinite(want) & np.isfinite(out)
    np.testing.assert_allclose(out[finite], want[finite], rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("a, b, out", [
    (np.ones((1, 8, 4)), np.ones((1, 4, 16)), np.zeros((1, 8, 16))),  # float64
    (np.ones((8, 4), np.float32), np.ones((4, 16), np.float32), np.zeros((8, 16), np.float32)),  # 2-D
    (np.ones((1, 8, 8), np.float32)[:, :, ::2], np.ones((1, 4, 16), np.float32), np.zeros((1, 8, 16), np.float32)),
    (np.ones((1, 8, 4), np.float32), np.ones((1, 4, 16), np.float32), np.zeros((1, 8, 32), np.float32)[:, :, ::2]),
    (np.ones((1, 8, 0), np.float32), np.ones((1, 0, 16), np.float32), np.zeros((1, 8, 16), np.float32)),  # k = 0
    (np.ones((1, 8, 4), np.float32), np.ones((1, 5, 16), np.float32), np.zeros((1, 8, 16), np.float32)),  # k differs
    (np.ones((1, 8, 4), np.float32), np.ones((2, 4, 16), np.float32), np.zeros((1, 8, 16), np.float32)),  # batch
    (np.frombuffer(bytes(8 * 4 * 4 + 1), np.float32, 32, 1).reshape(1, 8, 4),  # misaligned
     np.ones((1, 4, 16), np.float32), np.zeros((1, 8, 16), np.float32)),
    (np.ones((1, 8, 4), np.float32), np.ones((1, 4, 16), np.float32),
     np.frombuffer(bytes(8 * 16 * 4), np.float32).reshape(1, 8, 16)),  # a read-only result
])
def test_operands_it_does_not_take_are_declined_unwritten(a, b, out):
    before = out.copy()
    assert not gemm.takes(a, b, out)
    assert gemm.gemm_f32(a, b, out) is False
    np.testing.assert_array_equal(out, before)


def test_one_compiled_driver_serves_every_layout_and_read_only_operands():
    # numba would compile the driver (most of a second) again for each combination of layouts
    a = RNG.standard_normal((2, 40, 70)).astype(np.float32)
    for layout in "NTS":
        b = _right(2, 70, 90, layout)
        for ro in (False, True):
            x, y = a.copy(), b.copy() if layout == "N" else b
            if ro:
                x.flags.writeable = False
                if layout == "N":
                    y.flags.writeable = False
            wide = np.empty((2, 40, 200), np.float32)
            for out in (np.empty((2, 40, 90), np.float32), wide[:, :, 7:97]):
                assert gemm.gemm_f32(x, y, out)
                _assert_product(out, x, y)
    assert len(gemm._driver().overloads) == 1


def test_threads_at_once_keep_their_own_buffers():
    shapes = [(2, 50, 33, 70), (1, 256, 64, 256), (3, 7, 17, 130), (2, 64, 256, 64)]
    jobs = [(RNG.standard_normal((g, m, k)).astype(np.float32), _right(g, k, n, "NT"[i % 2]))
            for i, (g, m, k, n) in enumerate(shapes * 4)]

    def run(job):
        a, b = job
        out = np.empty((a.shape[0], a.shape[1], b.shape[2]), np.float32)
        for _ in range(5):
            assert gemm.gemm_f32(a, b, out)
        return out

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(run, jobs))
    for (a, b), out in zip(jobs, results):
        _assert_product(out, a, b)


def test_the_runtime_sends_it_exactly_the_products_its_rule_names():
    f32 = np.dtype(np.float32)
    taken = []

    def spy(a3, b3, out3):
        taken.append((a3.shape, b3.shape))
        return gemm.gemm_f32(a3, b3, out3)

    cases = [  # (a shape, b shape, taken?)
        ((8, 256, 64), (8, 64, 256), True),  # attention's heads
        ((256, 256), (256, 64), True),  # 2-D: a batch of one
        ((16, 256), (256, 64), False),  # fewer rows than KERNEL_GEMM_ROWS
        ((256, 256), (256, 256), False),  # b of 64K floats, past KERNEL_GEMM_B_MAX
        ((1024, 64), (64, 512), False),  # wider than KERNEL_GEMM_COLUMNS (split by rows)
        ((256, 8), (8, 8), False),  # narrower than one vector
    ]
    for ashape, bshape, expected in cases:
        a = RNG.standard_normal(ashape).astype(np.float32)
        b = RNG.standard_normal(bshape).astype(np.float32)
        out = np.empty((*ashape[:-1], bshape[-1]), np.float32)
        taken.clear()
        products.matmul(a, b, out, f32, own=True, backend=products.BackendProducts(thread=spy))
        assert bool(taken) is expected, (ashape, bshape, taken)
        assert products.kernel_gemm_takes(a, b) is expected
        _assert_product(out.reshape(-1, *out.shape[-2:]), a.reshape(-1, *ashape[-2:]), b.reshape(-1, *bshape[-2:]))
    a64 = RNG.standard_normal((256, 64))
    assert not products.kernel_gemm_takes(a64, a64.T.copy())  # float64 stays with BLAS


def test_attention_through_xfuse_jit_runs_its_products_here_where_kernels_use_512_bit_vectors(monkeypatch):
    calls = []
    real = numba_backend.gemm_f32

    def counted(a3, b3, out3):
        calls.append(b3.shape)
        return real(a3, b3, out3)

    monkeypatch.setattr(numba_backend, "gemm_f32", counted)

    def attention(q, k, v):
        s = jnp.einsum("bhqd,bhkd->bhqk", q, k) / 8.0
        return jnp.einsum("bhqk,bhkd->bhqd", jax.nn.softmax(s, axis=-1), v)

    q, k, v = (RNG.standard_normal((2, 4, 256, 64)).astype(np.float32) for _ in range(3))
    got = np.asarray(xfuse.jit(attention)(q, k, v))
    want = np.asarray(jax.jit(attention)(q, k, v))
    if gemm.ENABLED:  # kernels of 512-bit vectors
        assert {shape[1:] for shape in calls} == {(64, 256), (256, 64)}, calls  # q k^T and p @ v
    else:  # the tile would spill: products stay with BLAS
        assert calls == []
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)
