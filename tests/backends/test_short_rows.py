"""Reductions along short rows (`row_forms.SHORT_ROW`): the loops along the row unrolled, the
arrays of the iteration space read and written through flat views, so LLVM vectorises across
rows. Against the same kernels written with their row loops (bit for bit: each row still
combines its elements in order), the reference interpreter and jax.jit: NaN, infinities, -0.0,
integer wraparound and ties, several kept dimensions, and rows split across threads."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import xfuse
from tests.tolerances import ACCUMULATION, EXACT, TRANSCENDENTAL, assert_close, flush_subnormals, same_bits
from xfuse.backends.numba import row_forms
from xfuse.hlo import DType


def layer_norm(x):
    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean((x - mean) ** 2, axis=-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + 1e-5) * jnp.arange(1, x.shape[-1] + 1, dtype=x.dtype)


FLOAT_REDUCTIONS = {
    "sum": (lambda x: jnp.sum(x, axis=-1), ACCUMULATION),
    "max": (lambda x: jnp.max(x, axis=-1), EXACT),
    "min_of_square": (lambda x: jnp.min(x * x - 1.0, axis=-1), EXACT),
    # a row's outputs sum to 1, and its sum adds the exps in order: errors relative to 1
    "softmax": (lambda x: jax.nn.softmax(x, axis=-1), ACCUMULATION),
    "logsumexp": (lambda x: jax.nn.logsumexp(x, axis=-1), TRANSCENDENTAL),
    "layer_norm": (layer_norm, ACCUMULATION),
    "argmax": (lambda x: jnp.argmax(x, axis=-1), EXACT),
    "unit_vectors": (lambda x: x / jnp.sqrt(jnp.sum(x * x, axis=-1, keepdims=True)), ACCUMULATION),
}


# No values near the largest float: a sum of two overflows in f32 (as in XLA), not in the
# reference's f64 (test_rows has them)
SPECIALS = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-45, -1e-45, 1e30, -1e30]


def short_rows_with_specials(dtype, rows: int, length: int, seed: int) -> np.ndarray:
    """Rows with NaN, infinities, signed zeros, subnormals and large values here and there; a
    row of -0.0, one of +0.0 with one -0.0, one of -inf, one of NaN."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, length)).astype(dtype)
    for r in range(8, rows):
        for _ in range(r % 4):
            x[r, rng.integers(length)] = rng.choice(SPECIALS)
    x[1] = -0.0
    x[2] = 0.0
    x[2, length - 1] = -0.0
    x[3] = -np.inf
    x[4] = np.nan
    x[5, 0] = np.inf
    return x


@pytest.fixture
def small_inputs_too(monkeypatch):
    """The unrolled form for inputs of any size (by default from SHORT_ROW_MIN_ELEMENTS), so
    the cases below stay small."""
    monkeypatch.setattr(row_forms, "SHORT_ROW_MIN_ELEMENTS", 0)


def source(fn, x) -> str:
    return xfuse.jit(fn).lower(x).compile().kernel_source()


def test_small_inputs_keep_their_loops():
    softmax = lambda v: jax.nn.softmax(v, axis=-1)  # noqa: E731
    rows = row_forms.SHORT_ROW_MIN_ELEMENTS // 8
    assert re.search(r"for r\d", source(softmax, np.ones((rows - 1, 8), np.float32)))
    assert not re.search(r"for r\d", source(softmax, np.ones((rows, 8), np.float32)))


@pytest.mark.parametrize("length", [2, 5, 8])
def test_short_rows_unroll_and_go_through_flat_views(length, small_inputs_too):
    x = np.ones((64, length), np.float32)
    text = source(lambda v: jax.nn.softmax(v, axis=-1), x)
    assert "p0_flat" in text and "out0_flat" in text
    assert not re.search(r"for r\d", text), text  # no loop along the row
    assert text.count("exp_nonpositive_f32") == length  # unrolled; each exp kept for the last pass
    assert f"buf_v5 = scalar.row_buffer({length}, np.float32)" in text


def test_a_row_longer_than_the_bound_keeps_its_loop(small_inputs_too):
    x = np.ones((64, row_forms.TILED_ROW + 1), np.float32)
    text = source(lambda v: jax.nn.softmax(v, axis=-1), x)
    assert re.search(r"for r\d", text) and "_flat" not in text


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("length", [2, 3, 8])
@pytest.mark.parametrize("name", list(FLOAT_REDUCTIONS))
def test_short_row_reductions_match_their_looped_kernels_the_reference_and_jax(name, length, dtype, monkeypatch,
                                                                         small_inputs_too):
    x = short_rows_with_specials(dtype, 300, length, seed=length)
    check_row_reduction(name, x, monkeypatch, ("SHORT_ROW", "TILED_ROW"), new_form=lambda text: "_flat" in text,
                        old_form=lambda text: "_flat" not in text)


def check_row_reduction(name, x, monkeypatch, settings, new_form, old_form) -> None:
    """Reduction `name` of FLOAT_REDUCTIONS over `x` in a kernel of the form `new_form` (a test
    of its source) against the kernel of `old_form` made with `row_forms.<setting>` at 0 (a
    name, or several; or a dict of values), bit for bit, and against the reference and jax.jit."""
    settings = {settings: 0} if isinstance(settings, str) else settings
    settings = settings if isinstance(settings, dict) else dict.fromkeys(settings, 0)
    fn, tolerance = FLOAT_REDUCTIONS[name]
    with jax.enable_x64(x.dtype == np.float64):
        compiled = xfuse.jit(fn).lower(x).compile()
        assert new_form(compiled.kernel_source()), compiled.kernel_source()
        got = compiled(x)
        reference = xfuse.jit(fn, backend="reference")(x)
        # against jax: subnormals flushed (XLA:CPU reads them as zeros) and NaNs replaced (its
        # max over a short last axis drops them: an all-NaN row of 31 gives a number; lax.max
        # propagates NaN, as xfuse and the reference do, checked above)
        flushed = flush_subnormals(np.where(np.isnan(x), x.dtype.type(1.5), x))
        got_flushed, want_jax = compiled(flushed), np.asarray(jax.jit(fn)(flushed))
        for setting, value in settings.items():
            monkeypatch.setattr(row_forms, setting, value)
        other = xfuse.jit(fn).lower(x).compile()
        assert old_form(other.kernel_source()), other.kernel_source()
        before = other(x)
    assert same_bits(got, before).all(), f"{name}: differs from the kernel made with {settings}"
    assert_row_results(name, x, got, reference, got_flushed, want_jax, tolerance)


def assert_row_results(name, x, got, reference, got_flushed, want_jax, tolerance) -> None:
    """A row reduction's results against the reference's (relative to the row's largest
    magnitude times its length; softmax's to 1), and where they are NaN against jax's."""
    if got.dtype.kind != "f":
        np.testing.assert_array_equal(got, reference)
        np.testing.assert_array_equal(got_flushed, want_jax)
        return
    with np.errstate(over="ignore"):
        scale = np.max(np.abs(np.nan_to_num(x, posinf=0, neginf=0)), axis=-1) * x.shape[-1]
    scale = scale if got.ndim == x.ndim - 1 else scale[..., None] * np.ones_like(got)
    if name == "softmax":
        scale = np.ones_like(got)
    assert_close(got, reference, DType.from_numpy(x.dtype), f"{name} vs reference", tolerance, scale=scale)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(reference), err_msg=f"{name}: NaNs vs reference")
    np.testing.assert_array_equal(np.isnan(got_flushed), np.isnan(want_jax), err_msg=f"{name}: NaNs vs jax")


INT_REDUCTIONS = {
    "sum": lambda x: jnp.sum(x, axis=-1, dtype=x.dtype),  # wraps around, as XLA's does
    "max": lambda x: jnp.max(x, axis=-1),
    "argmin": lambda x: jnp.argmin(x, axis=-1),  # ties: the first index
    "any_positive": lambda x: jnp.any(x > 0, axis=-1),
    "all_positive": lambda x: jnp.all(x > 0, axis=-1),
    "prod": lambda x: jnp.prod(x, axis=-1, dtype=x.dtype),
}


@pytest.mark.parametrize("dtype", [np.int8, np.int32], ids=["i8", "i32"])
@pytest.mark.parametrize("name", list(INT_REDUCTIONS))
def test_short_integer_and_boolean_rows_are_exact(name, dtype, small_inputs_too):
    fn = INT_REDUCTIONS[name]
    info = np.iinfo(dtype)
    rng = np.random.default_rng(1)
    x = rng.integers(-3, 4, size=(257, 6)).astype(dtype)
    x[0] = info.max  # a sum and a product that wrap
    x[1] = info.min
    x[2] = 0
    compiled = xfuse.jit(fn).lower(x).compile()
    assert "_flat" in compiled.kernel_source()
    got = compiled(x)
    np.testing.assert_array_equal(got, xfuse.jit(fn, backend="reference")(x))
    np.testing.assert_array_equal(got, np.asarray(jax.jit(fn)(x)))


def test_several_kept_dimensions_and_rows_split_across_threads():  # both past the size bound
    rng = np.random.default_rng(2)
    x = rng.standard_normal((64, 515, 4)).astype(np.float32)  # kept 64 x 515: the inner kept loop
    x[3, 7] = [np.nan, 1.0, -np.inf, 2.0]
    x[5, 9] = [np.inf, np.inf, 0.0, -0.0]

    def fn(v, b):
        return jax.nn.softmax(v * 2.0 + b, axis=-1), jnp.max(v, axis=-1)

    b = np.array([0.5, -1.0, 0.0, 3.0], np.float32)  # read at the row's index, not through a view
    compiled = xfuse.jit(fn).lower(x, b).compile()
    assert "p0_flat" in compiled.kernel_source() and "p1_flat" not in compiled.kernel_source()
    got = compiled(x, b)
    reference = xfuse.jit(fn, backend="reference")(x, b)
    for g, w in zip(got, reference):
        assert_close(g, w, DType.F32, "softmax and max over a 3-D array", TRANSCENDENTAL)
        np.testing.assert_array_equal(np.isnan(g), np.isnan(w))
    # jax 0.10's XLA:CPU gives 2.0 for this row's max (its reduction over a short last axis of
    # this array drops the NaN; over a (1, 4) array it gives NaN): lax.max propagates NaN
    assert np.isnan(got[1][3, 7]) and np.isnan(got[0][3, 7]).all()
    # and -0.0 for a row of [0, 0, 0, -0.0] (lax.max takes +0.0 over -0.0, as xfuse and the
    # reference do): against jax, rows with neither
    clean = np.where(np.isfinite(x) & (x != 0), x, np.float32(1.0))
    got_softmax, got_max = compiled(clean, b)
    want_softmax, want_max = jax.jit(fn)(clean, b)
    # a row's outputs sum to 1: errors relative to 1 (XLA:GPU's exp and division are its own)
    assert_close(got_softmax, np.asarray(want_softmax), DType.F32, "softmax over a 3-D array vs jax", ACCUMULATION,
                 scale=np.ones_like(got_softmax))
    assert_close(got_max, np.asarray(want_max), DType.F32, "max over a 3-D array vs jax", EXACT)

    big = rng.standard_normal((65536, 8)).astype(np.float32)  # past the parallel threshold
    softmax = lambda v: jax.nn.softmax(v, axis=-1)
    got = xfuse.jit(softmax)(big)
    # each of exp, the sum and the division rounds (XLA's and the reference's in their own
    # ways), and a row's outputs sum to 1: errors relative to 1
    assert_close(got, xfuse.jit(softmax, backend="reference")(big), DType.F32, "softmax over 65536 rows of 8",
                 ACCUMULATION, scale=np.ones_like(got))
    assert_close(got, np.asarray(jax.jit(softmax)(big)), DType.F32, "softmax over 65536 rows of 8 vs jax",
                 ACCUMULATION, scale=np.ones_like(got))


def test_a_pass_too_long_to_copy_keeps_its_loop_over_the_flat_views(small_inputs_too):
    x = np.linspace(3.0, 9.0, 64 * 8, dtype=np.float32).reshape(64, 8)  # away from lgamma's zeros

    def fn(v):
        return jnp.sum(jax.scipy.special.gammaln(v), axis=-1)

    compiled = xfuse.jit(fn).lower(x).compile()
    text = compiled.kernel_source()
    assert re.search(r"for r\d", text) and "p0_flat" in text  # lgamma's expansion: copied 8 times, too long
    assert_close(compiled(x), np.asarray(jax.jit(fn)(x)), DType.F32, "sum of lgamma over rows of 8", ACCUMULATION,
                 scale=np.sum(np.abs(np.asarray(jax.jit(jax.scipy.special.gammaln)(x))), axis=-1))
