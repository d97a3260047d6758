"""Whole programs as one native function (`native_program`): a program of kernels, small
products, branches and loops runs as one step a call, against jax.jit; its results never share
memory with its arguments, its constants or each other's calls; scalars and read-only inputs
go in and out; a program with a large product, or a straight line of steps, keeps the
runtime's steps."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import xfuse


def sampler_like(w, x, key_scale, n):
    """A gradient, a loop of leapfrog-like updates, a branch and a scalar, as a sampler's
    transition has them."""

    def energy(w):
        return 0.5 * jnp.sum(w * w) + jnp.sum(jax.nn.softplus(x @ w))

    def step(_, carry):
        w, p = carry
        p = p - 0.1 * jax.grad(energy)(w)
        return w + 0.1 * p, p

    w2, p2 = lax.fori_loop(0, n, step, (w, jnp.ones_like(w) * key_scale))
    accept = lax.cond(energy(w2) < energy(w), lambda: 1.0, lambda: 0.0)
    return w2, p2, accept, energy(w2)


def arguments():
    rng = np.random.default_rng(0)
    return (rng.standard_normal(8).astype(np.float32), rng.standard_normal((32, 8)).astype(np.float32),
            np.float32(0.3), 5)


def test_a_sampler_like_program_is_one_native_step():
    args = arguments()
    compiled = xfuse.jit(sampler_like).lower(*args).compile()
    assert compiled.steps_per_call(*args) == 1
    for n in (0, 5, 12):
        got = compiled(*args[:3], n)
        want = jax.jit(sampler_like)(*args[:3], n)
        for g, j in zip(got, want):
            assert np.asarray(g).shape == np.asarray(j).shape and np.asarray(g).dtype == np.asarray(j).dtype
            np.testing.assert_allclose(g, j, rtol=2e-5, atol=2e-6)


def test_results_never_share_memory_with_arguments_constants_or_other_calls():
    table = np.arange(6, dtype=np.float32)

    def f(x, y):
        z = lax.cond(jnp.sum(y) > 0, lambda: y * 2.0, lambda: y - 1.0)
        return x, jnp.asarray(table), z, y.reshape(2, 2)

    x, y = np.ones(3, np.float32), np.full(4, 3.0, np.float32)
    compiled = xfuse.jit(f).lower(x, y).compile()
    assert compiled.steps_per_call(x, y) == 1
    first = compiled(x, y)
    second = compiled(x, y)
    assert not np.shares_memory(first[0], x) and not np.shares_memory(first[3], y)
    assert not np.shares_memory(first[1], second[1]) and not np.shares_memory(first[2], second[2])
    first[1][:] = -1.0  # a caller writing into a result changes no later call's
    np.testing.assert_array_equal(compiled(x, y)[1], table)


def test_scalars_and_read_only_inputs():
    def f(a, s):
        total = lax.cond(s > 0, lambda: jnp.sum(a * s), lambda: jnp.sum(a))
        return total, a.max() - s

    a = np.asarray(jnp.arange(5.0, dtype=jnp.float32))  # a jax array's memory: read-only
    assert not a.flags.writeable
    compiled = xfuse.jit(f).lower(a, np.float32(2.0)).compile()
    got = compiled(a, np.float32(2.0))
    assert compiled.steps_per_call(a, np.float32(2.0)) == 1
    assert got[0].shape == () and got[1].shape == ()
    np.testing.assert_allclose(got, jax.jit(f)(a, np.float32(2.0)))


def test_a_program_with_a_large_product_keeps_the_runtimes_steps():
    def f(a, b):
        return lax.cond(jnp.sum(a) > 0, lambda: jax.nn.relu(a @ b) + 1.0, lambda: a), jnp.sum(a)

    a = np.ones((256, 256), np.float32)
    b = np.ones((256, 256), np.float32) / 256
    compiled = xfuse.jit(f).lower(a, b).compile()
    assert compiled.steps_per_call(a, b) > 1
    np.testing.assert_allclose(compiled(a, b)[0], 2.0, rtol=1e-6)


def test_a_straight_line_of_steps_keeps_the_runtimes_steps():
    def f(a, b):
        return jnp.tanh(a @ b).sum(0), jnp.exp(a).max(1)

    a, b = np.ones((8, 8), np.float32), np.ones((8, 8), np.float32)
    compiled = xfuse.jit(f).lower(a, b).compile()
    assert compiled.steps_per_call(a, b) > 1


def test_bad_input_to_a_native_program_names_the_argument():
    args = arguments()
    jitted = xfuse.jit(sampler_like)
    jitted(*args)
    assert jitted.lower(*args).compile().steps_per_call(*args) == 1
    with pytest.raises(TypeError, match="argument x"):
        jitted(args[0], "not an array", *args[2:])
    with pytest.raises(TypeError, match="argument w"):
        jitted.lower(*args).compile()(np.ones(3, np.float32), *args[1:])
    np.testing.assert_allclose(jitted(*args)[3], jax.jit(sampler_like)(*args)[3], rtol=2e-5)
