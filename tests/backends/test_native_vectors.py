"""Loops whose products have a vector operand (a sampler's leapfrog steps: the gradient of a
log density through X @ w) run as one native driver: matrix times vector in either operand
order and either contracting dimension, a vector times a vector, and a scalar times a vector
(a dot that sums nothing: an elementwise multiply). Against jax.jit with special values, and
the steps the runtime runs per call counted: the same for any trip count."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import xfuse

PRODUCTS = {
    "matrix_vector": lambda a, v: a @ v,  # [m,k] @ [k]
    "vector_matrix": lambda a, v: jnp.tanh(a @ v) @ a,  # [m] @ [m,k]: the matrix read by rows
    "transposed_matrix": lambda a, v: a.T @ (a @ v),  # contracting the matrix's first axis
    "vector_vector": lambda a, v: v * jnp.dot(v, v) * 1e-3 + v,
    "scalar_vector": lambda a, v: jnp.dot(jnp.sum(v) * 1e-2, v) + v,
}


def looped(product):
    def run(a, v, n):
        return lax.fori_loop(0, n, lambda i, x: 0.5 * x + 0.01 * product(a, x), v)

    return run


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("name", list(PRODUCTS))
def test_vector_products_run_in_the_native_loop(name, dtype):
    rng = np.random.default_rng(0)
    a = rng.standard_normal((24, 24)).astype(dtype) / 5
    v = rng.standard_normal(24).astype(dtype)
    run = looped(PRODUCTS[name])
    with jax.enable_x64(dtype == np.float64):
        compiled = xfuse.jit(run).lower(a, v, 3).compile()
        steps = [compiled.steps_per_call(a, v, n) for n in (1, 4, 9)]
        assert steps[0] == steps[1] == steps[2], f"{name}: the loop ran in Python ({steps})"
        rtol = 1e-5 if dtype == np.float32 else 1e-12
        for n in (0, 1, 9):
            np.testing.assert_allclose(compiled(a, v, n), jax.jit(run)(a, v, n), rtol=rtol, atol=rtol)


def test_special_values_pass_through_vector_products_as_in_jax():
    a = np.eye(16, dtype=np.float32)
    a[3, 5] = np.inf
    v = np.linspace(-1, 1, 16, dtype=np.float32)
    v[7] = np.nan
    v[2] = -0.0
    for name in ("matrix_vector", "vector_matrix"):
        run = looped(PRODUCTS[name])
        got, want = xfuse.jit(run)(a, v, 2), jax.jit(run)(a, v, 2)
        np.testing.assert_array_equal(np.isnan(got), np.isnan(np.asarray(want)), err_msg=name)
        np.testing.assert_array_equal(np.isinf(got), np.isinf(np.asarray(want)), err_msg=name)
        finite = np.isfinite(got)
        np.testing.assert_allclose(got[finite], np.asarray(want)[finite], rtol=1e-5, atol=1e-6)


def test_a_leapfrog_integrator_runs_natively():
    """Hamiltonian dynamics for a logistic-regression posterior, as samplers write them."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((64, 8)).astype(np.float32)
    y = (rng.random(64) < 0.5).astype(np.float32)

    def potential(w):
        logits = x @ w
        return 0.5 * jnp.sum(w * w) - jnp.sum(y * jax.nn.log_sigmoid(logits)
                                              + (1 - y) * jax.nn.log_sigmoid(-logits))

    def integrate(w, p, steps):
        def leapfrog(_, state):
            w, p = state
            p = p - 0.05 * jax.grad(potential)(w)
            w = w + 0.1 * p
            return w, p - 0.05 * jax.grad(potential)(w)

        return lax.fori_loop(0, steps, leapfrog, (w, p))

    w, p = np.full(8, 0.1, np.float32), rng.standard_normal(8).astype(np.float32)
    compiled = xfuse.jit(integrate).lower(w, p, 4).compile()
    assert compiled.steps_per_call(w, p, 4) == compiled.steps_per_call(w, p, 16)
    for got, want in zip(compiled(w, p, 16), jax.jit(integrate)(w, p, 16)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_a_loop_inside_a_loop_runs_inline_in_the_driver():
    """Tree doubling as samplers write it: an outer while whose body runs an inner while with
    a data-dependent trip count, the inner one branching; one native driver for both."""

    def doubling(v, limit):
        def outer(state):
            depth, x = state

            def inner(carry):
                i, y = carry
                y = lax.cond(i % 2 == 0, lambda y: jnp.sin(y) + 0.5, lambda y: y * 0.9, y)
                return i + 1, y

            _, x = lax.while_loop(lambda c: c[0] < 2 ** depth, inner, (0, x))
            return depth + 1, x

        return lax.while_loop(lambda s: (s[0] < limit) & (jnp.sum(s[1]) < 1e6), outer, (0, v))

    v = np.linspace(-1, 1, 16, dtype=np.float32)
    compiled = xfuse.jit(doubling).lower(v, 2).compile()
    assert compiled.steps_per_call(v, 1) == compiled.steps_per_call(v, 6)
    for limit in (0, 1, 6):
        for got, want in zip(compiled(v, limit), jax.jit(doubling)(v, limit)):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mode", ["drop", "clip"])
@pytest.mark.parametrize("combine", ["set", "add"])
def test_a_row_scattered_in_a_loop_is_written_by_the_driver(combine, mode):
    """x.at[i].set(row) (a sampler recording its momenta), i running past the end: dropped
    (a fill_or_drop scatter), or clamped, as jax.jit does."""

    def record(rows, v, n):
        def body(i, carry):
            rows, v = carry
            v = jnp.cos(v) + 0.1 * i
            at = rows.at[i]
            rows = at.set(v, mode=mode) if combine == "set" else at.add(v, mode=mode)
            return rows, v

        return lax.fori_loop(0, n, body, (rows, v))

    rows = np.zeros((5, 8), np.float32)
    rows[2, 3] = np.nan
    v = np.linspace(0, 1, 8, dtype=np.float32)
    compiled = xfuse.jit(record).lower(rows, v, 3).compile()
    assert compiled.steps_per_call(rows, v, 2) == compiled.steps_per_call(rows, v, 9)
    for n in (0, 3, 9):
        for got, want in zip(compiled(rows, v, n), jax.jit(record)(rows, v, n)):
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    assert np.isnan(rows[2, 3]) and np.count_nonzero(np.nan_to_num(rows)) == 0  # left as it was
