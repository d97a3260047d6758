"""Whole programs as one native function (`native_program`): a program of kernels, small
products, branches and loops runs as one step a call, against jax.jit; its results never share
memory with its arguments, its constants or each other's calls; scalars and read-only inputs
go in and out; a straight line of small steps runs natively too, its work buffers in one
arena planned by lifetimes; a program with a large product, or whose buffers would take more
memory than the runtime's plan, keeps the runtime's steps."""

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


def test_a_straight_line_of_small_steps_runs_natively_in_a_planned_arena():
    """A model's log density and gradient (a product, a reduction, elementwise work): one step
    a call; its work buffers share one arena as the runtime's plan would place them, so the
    memory analysis is no larger than the steps' own, and it is what the driver uses."""

    def f(a, b, x):
        h = jnp.tanh(a @ b + x)
        return jnp.sum(h * h), jnp.exp(h).max(1), jnp.cos(h) * 2.0

    rng = np.random.default_rng(4)
    a, b, x = (rng.standard_normal((16, 16)).astype(np.float32) for _ in range(3))
    compiled = xfuse.jit(f).lower(a, b, x).compile()
    assert compiled.steps_per_call(a, b, x) == 1
    stepwise = compiled.executable.steps[0].run.inner
    ours, theirs = compiled.memory_analysis(), stepwise.memory_analysis()
    assert ours.output_size_in_bytes == theirs.output_size_in_bytes == 4 + 16 * 4 + 16 * 16 * 4
    assert 0 < ours.temp_size_in_bytes <= theirs.temp_size_in_bytes
    assert ours.temp_size_unplanned_in_bytes >= ours.temp_size_in_bytes
    first = compiled(a, b, x)
    second = compiled(a, b, x)
    for got, want, again in zip(first, jax.jit(f)(a, b, x), second):
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-6)
        assert not np.shares_memory(got, again)  # each call's results are its own
    assert not np.shares_memory(first[1], first[2])


def test_a_straight_line_whose_buffers_would_outgrow_the_plan_keeps_the_runtimes_steps():
    """An output fusion's product lives beside its epilogue's result in a driver, where the
    runtime writes the product into the result: that line keeps the runtime's steps."""

    def f(x, w1, b1, w2, b2):
        return jax.nn.gelu(x @ w1 + b1) @ w2 + b2

    rng = np.random.default_rng(0)
    args = [rng.standard_normal(s).astype(np.float32) for s in ((32, 64), (64, 256), (256,), (256, 64), (64,))]
    compiled = xfuse.jit(f).lower(*args).compile()
    assert compiled.steps_per_call(*args) > 1
    want = np.asarray(jax.jit(f)(*args))
    np.testing.assert_allclose(compiled(*args), want, rtol=1e-4, atol=1e-5 * np.abs(want).max())


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
