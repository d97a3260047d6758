"""Primitives with no rule of their own whose implementation is JAX code (a library's own, as
equinox's `unvmap_any`): traced through their implementation and inlined, so they fuse like
any other op; a primitive whose implementation binds itself (JAX's own) still raises the clear
UnsupportedPrimitiveError naming it."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.extend import core as jcore
from jax.interpreters import mlir

import xfuse
from xfuse.frontend import UnsupportedPrimitiveError


def _softsign_impl(x, *, scale):
    return scale * x / (1.0 + jnp.abs(x))


softsign_p = jcore.Primitive("test_softsign")
softsign_p.def_impl(_softsign_impl)
softsign_p.def_abstract_eval(lambda x, *, scale: jax.core.ShapedArray(x.shape, x.dtype))
mlir.register_lowering(softsign_p, mlir.lower_fun(_softsign_impl, multiple_results=False))


def test_a_library_primitive_runs_through_its_implementation():
    def f(x):
        return softsign_p.bind(jnp.sin(x), scale=2.0) + 1.0

    x = np.linspace(-4, 4, 64, dtype=np.float32)
    x[3] = np.nan
    x[5] = -np.inf
    compiled = xfuse.jit(f).lower(x).compile()
    assert compiled.kernel_count() == 1  # sin, the primitive's body and the add: one kernel
    got, want = compiled(x), jax.jit(f)(x)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(np.asarray(want)))


def test_equinox_unvmap_primitives_run():
    import equinox.internal as unvmap  # the test extra installs equinox

    def f(x):
        return jnp.where(unvmap.unvmap_any(x > 3.0), x * 2.0, x), unvmap.unvmap_max(x)

    x = np.arange(5, dtype=np.float32)
    for got, want in zip(xfuse.jit(f)(x), jax.jit(f)(x)):
        np.testing.assert_array_equal(got, want)


def test_a_primitive_whose_implementation_binds_itself_names_the_primitive():
    def f(x):
        return jax.lax.cumlogsumexp(x)

    with pytest.raises(UnsupportedPrimitiveError, match="cumlogsumexp"):
        xfuse.jit(f)(np.ones(4, np.float32))
