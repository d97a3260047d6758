"""A reshape of a kernel's parameter reads the parameter through its flat buffer at the
reshape's linear index (`kernels.Writer.flat_loader`), not through a division and a remainder
per dimension, which do not vectorise. Results equal the reference interpreter's, for inputs
in C order and for strided ones."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

import xfuse
from tests.backends.test_split_loops import rng_array


def check(fn, *args):
    """The kernels' source, after their results are compared with the reference interpreter's."""
    compiled = xfuse.jit(fn).lower(*args).compile()
    np.testing.assert_array_equal(compiled(*args), xfuse.jit(fn, backend="reference")(*args))
    return compiled.kernel_source()


@pytest.mark.parametrize("shape", [(256, 4, 1000), (1024000,), (32, 32, 1000)])
def test_a_reshaped_parameter_is_read_through_its_flat_buffer(shape):
    x = rng_array((1024, 1000))
    source = check(lambda x: x.reshape(shape) * 0.5 + 1.0, x)
    assert "p0_flat = p0.ravel()" in source and "p0_flat[" in source and "//" not in source


def test_a_one_dimensional_concatenation_of_raveled_matrices():
    x, y = rng_array((64, 100)), rng_array((64, 3), 1)
    source = check(lambda x, y: jnp.concatenate([x.ravel(), y.ravel()]) * 3.0 - 1.0, x, y)
    assert "p0_flat[" in source and "p1_flat[" in source


def test_a_strided_input_is_read_in_its_logical_order():
    """A view with other strides: numba's ravel copies it in C order."""
    base = rng_array((40, 30))
    x = base[::2, ::3]  # (20, 10), not contiguous
    fn = lambda x: x.reshape(200) * 2.0  # noqa: E731
    np.testing.assert_array_equal(xfuse.jit(fn)(x), xfuse.jit(fn, backend="reference")(np.ascontiguousarray(x)))
    np.testing.assert_array_equal(xfuse.jit(fn)(x), np.ascontiguousarray(x).reshape(200) * np.float32(2.0))


def test_a_reshape_of_a_computed_value_keeps_its_index_arithmetic():
    x = rng_array((8, 6))
    source = check(lambda x: (x.T * 2.0).reshape(4, 12) + 1.0, x)
    assert "//" in source and "_flat" not in source
