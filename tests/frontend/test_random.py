"""jax.random through xfuse (`xfuse.frontend.random`): the bits equal jax.jit's under either
threefry setting, the special functions jax.random needs (erf_inv, nextafter) in float64 too,
the random ops fuse into one kernel with what uses them, and typed key arrays where xfuse does
not take them get errors naming the argument, the output or the primitive and line. The corpus
(test_corpus.py) runs jax.random end to end on every backend."""

from __future__ import annotations

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import xfuse
from xfuse.frontend import FrontendError


@pytest.mark.parametrize("partitionable", [True, False])
def test_bits_uniform_and_split_equal_jax_under_either_threefry_setting(partitionable: bool) -> None:
    def f(key):
        a, b = jax.random.split(key)
        return jax.random.bits(a, (3, 700)), jax.random.uniform(b, (1000,)), jax.random.split(b, 5)

    key = np.array([0xDEADBEEF, 7], np.uint32)
    previous = jax.config.jax_threefry_partitionable
    jax.config.update("jax_threefry_partitionable", partitionable)
    try:
        want = jax.jit(f)(key)
        got = xfuse.jit(f)(key)
    finally:
        jax.config.update("jax_threefry_partitionable", previous)
    for g, w in zip(got, want):
        assert np.asarray(g).dtype == np.asarray(w).dtype
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))


def test_dropout_is_one_kernel() -> None:
    def dropout(key, x):
        return jnp.where(jax.random.bernoulli(key, 0.9, x.shape), x * 2.0, 0.0)

    key, x = jax.random.PRNGKey(3), np.linspace(-1, 1, 4096, dtype=np.float32)
    compiled = xfuse.jit(dropout).lower(key, x).compile()
    assert compiled.kernel_count() == 1
    np.testing.assert_array_equal(np.asarray(compiled(key, x)), np.asarray(jax.jit(dropout)(key, x)))


def test_erf_inv_and_nextafter_in_float64() -> None:
    x = np.concatenate([np.linspace(-1, 1, 2001), [1 - 1e-12, -1 + 1e-15, 1e-300, -0.0, 0.0, 1.5, np.nan, np.inf]])
    y = np.concatenate([np.linspace(3, -3, 2001), [2.0, -2.0, -1.0, 0.0, -0.0, 1.5, 0.0, 1.0]])
    with jax.enable_x64(True):
        want = jax.jit(lambda x: lax.erf_inv(x))(x)
        got = xfuse.jit(lambda x: lax.erf_inv(x))(x)
        step = lax.nextafter(x, y), lax.nextafter(y, x)
        got_step = xfuse.jit(lambda x, y: (lax.nextafter(x, y), lax.nextafter(y, x)))(x, y)
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == np.float64
    # erf_inv is ill-conditioned (near +-1 a last-ulp change of x moves it by many ulps): jax's
    # and xfuse's were both measured up to 19 ulps from the exact value, so compare relatively
    np.testing.assert_allclose(got, want, rtol=1e-13, atol=0)
    for w, g in zip(step, got_step):  # no subnormal inputs: XLA reads those as zero
        np.testing.assert_array_equal(np.asarray(g).view(np.uint64), np.asarray(w).view(np.uint64))


def noisy(key, x):
    return x + jax.random.normal(key, x.shape)


def test_a_typed_key_argument_or_output_is_refused_naming_it() -> None:
    x = np.ones(3, np.float32)
    with pytest.raises(TypeError, match=r"argument key: a typed PRNG key array \(key<fry>\).*key_data"):
        xfuse.jit(noisy)(jax.random.key(0), x)
    with pytest.raises(TypeError, match=r"output 1 of .* is a typed PRNG key array"):
        xfuse.jit(lambda k: (k, jax.random.wrap_key_data(k)))(jax.random.PRNGKey(0))
    np.testing.assert_allclose(  # what the messages say to do works
        np.asarray(xfuse.jit(noisy)(jax.random.key_data(jax.random.key(0)), x)),
        np.asarray(noisy(jax.random.key_data(jax.random.key(0)), x)), rtol=1e-6)


def compares_keys(key):
    k = jax.random.wrap_key_data(key)
    return k == k


def test_other_ops_on_key_arrays_name_the_primitive_and_the_line() -> None:
    with pytest.raises(FrontendError) as info:
        xfuse.jit(compares_keys)(jax.random.PRNGKey(0))
    line = inspect.getsourcelines(compares_keys)[1] + 2
    assert "'eq' on PRNG key arrays" in str(info.value) and f"test_random.py:{line}" in str(info.value)


def test_fold_in_broadcasts_keys_against_messages() -> None:
    def f(key):
        keys = jax.random.split(jax.random.wrap_key_data(key), 3)
        return jax.random.key_data(jax.vmap(jax.vmap(jax.random.fold_in, (None, 0)), (0, None))(keys, jnp.arange(4)))

    np.testing.assert_array_equal(  # vmapped fold_in pairs every key with every message
        np.asarray(xfuse.jit(f)(jax.random.PRNGKey(1))), np.asarray(jax.jit(f)(jax.random.PRNGKey(1))))
