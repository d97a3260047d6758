"""Reductions that keep the minor dimension, in the numba backend's column form (columns.py):
against the reference interpreter and jax.jit with NaN, infinities and signed zeros in the
columns; one phase and several (softmax over axis 0, logsumexp over the middle axis), several
reduced axes around kept ones, outputs of the whole shape before and after the sums, a split
across threads whose rows end inside a block, and the form's reach (what stays in the row
form)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import xfuse
from tests.tolerances import ACCUMULATION, EXACT, TRANSCENDENTAL, assert_close
from xfuse.hlo import DType

SPECIALS = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-45, -1e-45]


def columns_with_specials(dtype, shape, seed=0, specials=True):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).astype(dtype)
    if specials:
        flat = x.reshape(-1, shape[-1])
        for c in range(0, shape[-1], 3):  # column 3j gets a few special values
            for _ in range(c % 4):
                flat[rng.integers(flat.shape[0]), c] = rng.choice(SPECIALS)
        flat[:, 1] = -0.0
        flat[:, 4] = -np.inf
    return x


CASES = {
    # name: (function, shape, tolerance, special values in the input)
    "bias_gradient": (lambda g, x: jnp.where(x > 0, g, 0.0).sum(0), (96, 40), ACCUMULATION, True),
    "max_min": (lambda x: (x.max(0), x.min(0)), (33, 70), EXACT, True),
    "mean_square": (lambda x: ((x * x).mean((0, 1, 2)), x.mean((0, 1, 2))), (4, 5, 6, 24), ACCUMULATION, False),
    "middle_axis": (lambda x: x.sum(1), (3, 50, 17), ACCUMULATION, True),
    "outer_and_middle": (lambda x: (x.sum((0, 2)), x.max((0, 2))), (6, 5, 7, 20), ACCUMULATION, False),
    "softmax_axis0": (lambda x: jax.nn.softmax(x, axis=0), (40, 36), TRANSCENDENTAL, False),
    "logsumexp_middle": (lambda x: jax.nn.logsumexp(x, axis=1), (4, 64, 32), TRANSCENDENTAL, False),
    "normalise_keepdims": (lambda x: (x - x.mean(1, keepdims=True), x.sum(1, keepdims=True)),
                           (6, 30, 17), ACCUMULATION, False),
    "batch_norm": (lambda x: (x - x.mean((0, 1, 2))) / jnp.sqrt(x.var((0, 1, 2)) + 1e-5),
                   (8, 4, 4, 32), ACCUMULATION, False),
    "full_output_and_sum": (lambda x: (jnp.tanh(x), jnp.tanh(x).sum(0)), (50, 300), ACCUMULATION, True),
}


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("name", list(CASES))
def test_column_reductions_match_reference_and_jax(name, dtype):
    fn, shape, tolerance, specials = CASES[name]
    arity = fn.__code__.co_argcount
    args = [columns_with_specials(dtype, shape, seed=s, specials=specials) for s in range(arity)]
    with jax.enable_x64(dtype == np.float64):
        compiled = xfuse.jit(fn).lower(*args).compile()
        assert "for kc in range(" in compiled.kernel_source(), "the column form was not used"
        got = jax.tree.leaves(compiled(*args))
        reference = jax.tree.leaves(xfuse.jit(fn, backend="reference")(*args))
        want_jax = jax.tree.leaves(jax.jit(fn)(*args))
    dt = DType.from_numpy(np.dtype(dtype))
    for g, r, j in zip(got, reference, want_jax):
        assert g.shape == r.shape == j.shape and g.dtype == j.dtype
        scale = np.max(np.abs(np.nan_to_num(args[0], posinf=0, neginf=0))) * max(shape)
        with np.errstate(invalid="ignore"):
            assert_close(g, r, dt, f"{name} vs reference", tolerance, scale=scale)
        np.testing.assert_array_equal(np.isnan(g), np.isnan(np.asarray(j)), err_msg=name)
        if not specials:  # jax.jit sums in its own order: its values within a few ulps more
            rtol = 1e-5 if dtype == np.float32 else 1e-13
            np.testing.assert_allclose(g, np.asarray(j), rtol=rtol, atol=rtol, err_msg=name)


def test_max_and_min_down_columns_keep_the_sign_of_zero():
    x = np.zeros((20, 16), np.float32)
    x[:, 0] = -0.0
    x[5, 1] = -0.0
    x[:, 2] = -0.0
    x[7, 2] = 0.0
    got_max = xfuse.jit(lambda x: x.max(0))(x)
    got_min = xfuse.jit(lambda x: x.min(0))(x)
    np.testing.assert_array_equal(np.signbit(got_max[:3]), [True, False, False])
    np.testing.assert_array_equal(np.signbit(got_min[:3]), [True, True, True])


@pytest.mark.parametrize("dtype", [np.int32, np.uint8, np.bool_], ids=["s32", "u8", "pred"])
def test_integer_and_boolean_columns_are_exact(dtype):
    rng = np.random.default_rng(3)
    x = rng.integers(0, 200, size=(70, 40)).astype(dtype)
    if dtype is np.bool_:
        fn = lambda x: (x.any(0), x.all(0))  # noqa: E731
    else:
        fn = lambda x: (x.sum(0), x.max(0), x.min(0))  # noqa: E731 - sums wrap as in XLA
    compiled = xfuse.jit(fn).lower(x).compile()
    assert "for kc in range(" in compiled.kernel_source()
    for g, j in zip(jax.tree.leaves(compiled(x)), jax.tree.leaves(jax.jit(fn)(x))):
        np.testing.assert_array_equal(g, np.asarray(j))


def test_a_split_across_threads_ends_inside_a_block():
    # 4096 x 1000 is worth splitting: each thread's columns end inside a block of 256
    x = columns_with_specials(np.float32, (4096, 1000), specials=False)
    compiled = xfuse.jit(lambda x: (x.sum(0), (x * x).max(0))).lower(x).compile()
    got = compiled(x)
    np.testing.assert_allclose(got[0], x.astype(np.float64).sum(0), rtol=1e-4, atol=1e-3)
    np.testing.assert_array_equal(got[1], (x * x).max(0))


@pytest.mark.parametrize("fn, shape", [
    (lambda x: x.sum(-1), (30, 40)),  # the minor dimension reduced: the row form
    (lambda x: x.sum(0), (100, 3)),  # too narrow for a vector
    (lambda x: jnp.argmax(x, axis=0), (30, 40)),  # argmax: the row form
])
def test_what_stays_in_the_row_form(fn, shape):
    x = columns_with_specials(np.float32, shape, specials=False)
    compiled = xfuse.jit(fn).lower(x).compile()
    assert "for kc in range(" not in compiled.kernel_source()
    np.testing.assert_allclose(compiled(x), jax.jit(fn)(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", ["numba", "c"])
def test_columns_read_through_a_reversal_of_the_minor_dimension(backend):
    """An index into the block's columns is one expression wherever it lands: here under a
    reversal (`32 - (kc + b)`), found by the differential fuzzer. The C backend renders the
    same form."""

    def f(v, a):
        return jnp.sum(jnp.squeeze(jnp.flip(jnp.arctan2(v, a), 2), 1), axis=0, keepdims=True)

    rng = np.random.default_rng(1)
    v = rng.standard_normal(33).astype(np.float32)
    v[::2] = np.nan
    a = rng.standard_normal((4, 1, 33)).astype(np.float32)
    compiled = xfuse.jit(f, backend=backend).lower(v, a).compile()
    got, want = compiled(v, a), np.asarray(jax.jit(f)(v, a))
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    for dtype in (np.float32, np.float64):  # and the plain sum, both ways
        x = columns_with_specials(dtype, (7, 40), specials=False)
        flipped = xfuse.jit(lambda x: x[:, ::-1].sum(0), backend=backend)(x)
        np.testing.assert_allclose(flipped, x[:, ::-1].sum(0), rtol=1e-5)
