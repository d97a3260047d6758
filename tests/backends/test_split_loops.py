"""Loop kernels whose innermost loop runs across a concatenate's operands, or across a pad's
operand and padding, split that loop where the read switches (`kernels.Writer.split_loop`):
each piece reads one array at an unclamped index, which LLVM vectorises. The results equal the
reference interpreter's (and jax.jit's, up to XLA's fused multiply-adds), with the pieces at
the edges of the row ranges the runtime gives each thread too."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import xfuse
from xfuse.backends.numba.kernels import MAX_PIECES


def rng_array(shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def innermost_ranges(source: str) -> list[str]:
    return re.findall(r"for i\d+ in range\(([^)]*\)?)\):", source)


def check(fn, *args):
    compiled = xfuse.jit(fn).lower(*args).compile()
    got = compiled(*args)
    np.testing.assert_array_equal(got, xfuse.jit(fn, backend="reference")(*args))
    # XLA may contract a product and a sum into one FMA: one rounding fewer.
    np.testing.assert_allclose(got, jax.jit(fn)(*args), rtol=2e-7, atol=0)
    return compiled.kernel_source()


def test_a_concatenation_along_the_last_axis_reads_each_operand_in_its_own_loop():
    x, y = rng_array((64, 1000)), rng_array((64, 24), 1)
    source = check(lambda x, y: jnp.concatenate([x, y], axis=1) * 2.0 + 1.0, x, y)
    assert "range(0, 1000)" in source and "range(1000, 1024)" in source
    assert "clamp" not in source and " if " not in source  # no select, no clamped index


def test_three_operands_and_an_empty_one():
    x, y, z = rng_array((8, 5)), rng_array((8, 0), 1), rng_array((8, 3), 2)
    source = check(lambda x, y, z: jnp.concatenate([z, x, y, z], axis=1) - 0.5, x, y, z)
    assert {"0, 3", "3, 8", "8, 11"} <= set(innermost_ranges(source))


@pytest.mark.parametrize("low, high, interior", [(3, 5, 0), (0, 4, 0), (-3, 7, 0), (2, -1, 0), (1, 1, 1)])
def test_a_pad_of_the_last_axis(low, high, interior):
    x = rng_array((6, 10))
    fn = lambda x: lax.pad(x * 3.0, np.float32(-7.0), ((1, 2, 0), (low, high, interior))) + 1.0  # noqa: E731
    source = check(fn, x)
    if interior == 0 and low > 0:
        assert f"range(0, {low})" in source  # a loop of padding alone


def test_a_long_one_dimensional_concatenation_split_over_threads():
    """The innermost loop is also the rows loop the runtime splits across threads: each piece
    runs only where it meets the thread's row range."""
    x, y = rng_array(300_001), rng_array(7, 1)
    source = check(lambda x, y: jnp.tanh(jnp.concatenate([x, y]) * 0.5) * 0.0 + jnp.concatenate([x, y]), x, y)
    assert "range(max(row_start, 0), min(row_end, 300001))" in source


def test_more_cuts_than_pieces_allowed_leave_the_loop_whole():
    parts = [rng_array((4, 2), k) for k in range(MAX_PIECES + 1)]
    source = check(lambda *p: jnp.concatenate(p, axis=1) * 2.0, *parts)
    assert "clamp" in source  # MAX_PIECES + 1 operands: the loop stays one, with its selects


def test_as_many_pieces_as_allowed_split_the_loop():
    parts = [rng_array((4, 2), k) for k in range(MAX_PIECES)]
    source = check(lambda *p: jnp.concatenate(p, axis=1) * 2.0, *parts)
    assert "clamp" not in source and f"range({2 * MAX_PIECES - 2}, {2 * MAX_PIECES})" in source


def test_a_concatenation_along_a_middle_axis_splits_that_loop():
    """A convolution's patches: the taps concatenated along a middle axis, each a shifted
    slice of a padded input. Each tap's loop reads its own slice alone (no select among nine
    values computed for every element)."""
    x = rng_array((4, 6, 5, 7))

    def patches(x):
        padded = jnp.pad(x * 2.0, ((0, 0), (0, 0), (1, 1), (1, 1)))
        taps = [padded[:, None, :, dy:dy + 5, dx:dx + 7] for dy in range(3) for dx in range(3)]
        return jnp.concatenate(taps, axis=1) + 1.0

    source = check(patches, x)
    for k in range(9):
        assert f"range({k}, {k + 1})" in source
    assert len(re.findall(r" if i1 < \d+ else ", source)) == 0  # no select over the taps


def test_a_middle_split_splits_its_pieces_innermost_loops_within_the_limit():
    """Concatenations along a middle and the last axis: the middle loop splits, and each
    piece's innermost loop too while there are at most MAX_PIECES loops in all."""
    few = [rng_array((3, 2, 5), k) for k in range(3)]
    source = check(lambda *xs: jnp.concatenate([jnp.concatenate([x, x[:, :, :2]], axis=2) for x in xs], axis=1) * 3.0,
                   *few)
    assert {"0, 2", "2, 4", "4, 6"} <= set(innermost_ranges(source))  # the middle pieces
    assert innermost_ranges(source).count("5, 7") == 3  # each piece's own split
    many = [rng_array((3, 1, 4), k) for k in range(MAX_PIECES // 2 + 1)]
    source = check(lambda *xs: jnp.concatenate([jnp.concatenate([x, x], axis=2) for x in xs], axis=1) - 1.0, *many)
    assert "4, 8" not in innermost_ranges(source)  # too many loops in all: the pieces' innermost whole
