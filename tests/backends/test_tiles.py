"""Loop kernels that walk a transposed operand a multiple of 1 KiB at a step run their last two
loops in tiles (the numba backend writes them; the C backend renders the same loops): the
source has the tile loops exactly where the rule says, and the results are the same bits as
numpy's, with ragged edges, a batch dimension, rows split across threads, and NaN, infinities
and -0.0 passing through."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import xfuse
from xfuse.backends.numba import kernels
from xfuse.runtime.parallel import num_threads, set_num_threads


def _values(shape, seed=0):
    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    flat = x.reshape(-1)
    flat[:5] = [np.nan, np.inf, -np.inf, -0.0, 1e-45]
    return x


CASES = {  # name: (function, input shape, tiled?)
    "square_1024": (lambda x: x.T + 1, (1024, 1024), True),
    "ragged_1000_by_2048": (lambda x: x.T * 2, (1000, 2048), True),  # 2048 floats a step: 8 KiB
    "batch_swap": (lambda x: jnp.swapaxes(x, 1, 2) - 0.5, (3, 40, 512), True),
    "transcendental": (lambda x: jnp.tanh(x).T, (520, 256), True),
    "stride_4000_bytes": (lambda x: x.T + 1, (1000, 1000), False),
    "contiguous": (lambda x: x + 1, (1024, 1024), False),
}


@pytest.mark.parametrize("backend", ["numba", "c"])
@pytest.mark.parametrize("name", CASES)
def test_tiles_where_the_rule_says_and_agree_bit_for_bit(name, backend):
    fn, shape, tiled = CASES[name]
    x = _values(shape)
    compiled = xfuse.jit(fn, backend=backend).lower(x).compile()
    source = compiled.kernel_source()
    tiles = ("_t in range(", f", {kernels.TILE}):") if backend == "numba" else ("_t += ", f"_t += {kernels.TILE})")
    assert all(t in source for t in tiles) == tiled, source
    want = np.asarray(jax.jit(fn)(x)) if name == "transcendental" else np.asarray(fn(x))
    got = np.asarray(compiled(x))
    if name == "transcendental":  # xfuse's tanh, not XLA's: within its documented ulps
        np.testing.assert_allclose(got, want, rtol=4e-7, atol=0, equal_nan=True)
        np.testing.assert_array_equal(got, np.asarray(xfuse.jit(jnp.tanh, backend=backend)(x)).T)
    else:
        assert got.tobytes() == want.astype(np.float32).tobytes()


@pytest.mark.parametrize("backend", ["numba", "c"])
def test_rows_split_across_threads_meet_the_tiles(backend):
    """Rows split at 1/3 and 2/3 of 2048 (not multiples of the tile) still cover every element
    once."""
    x = _values((2000, 2048), seed=1)
    before = num_threads()
    try:
        set_num_threads(3)
        compiled = xfuse.jit(lambda x: x.T * 3, backend=backend).lower(x).compile()
        assert "i0_t = row_start" in compiled.kernel_source() or "i0_t in range(row_start" in compiled.kernel_source()
        assert compiled(x).tobytes() == (x.T * np.float32(3)).tobytes()
    finally:
        set_num_threads(before)
