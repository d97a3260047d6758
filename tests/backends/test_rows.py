"""Row reductions long enough for `rows` (sums reordered into vector lanes, exact max and min
over integer keys) against the reference interpreter and jax.jit: NaN anywhere, infinities of
both signs, -0.0 against +0.0, subnormals, rows of one repeated value, and their reuse of the
row buffer by later passes (softmax, log-softmax), and the buffer itself: in the kernel's stack
frame up to 64 KiB, private to each call."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import jax
import jax.numpy as jnp
import numba
import numpy as np
import pytest

import xfuse
from tests.tolerances import ACCUMULATION, EXACT, TRANSCENDENTAL, assert_close
from xfuse.backends.numba import row_forms, scalar
from xfuse.backends.numba.analysis import STACK_ROW_BYTES
from xfuse.hlo import DType

SPECIALS = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-45, -1e-45, 3.0e38, -3.0e38]


def rows_with_specials(dtype, shape=(24, 67), seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).astype(dtype)
    for r in range(shape[0]):  # row r gets r % 6 special values, row 5k+1 is all -0.0, ...
        for _ in range(r % 6):
            x[r, rng.integers(shape[1])] = rng.choice(SPECIALS)
    x[1] = -0.0
    x[2] = 0.0
    x[2, 7] = -0.0
    x[3] = -np.inf
    x[4] = np.nan
    return x


REDUCTIONS = {
    "sum": (lambda x: jnp.sum(x, axis=-1), ACCUMULATION),
    "max": (lambda x: jnp.max(x, axis=-1), EXACT),
    "min": (lambda x: jnp.min(x, axis=-1), EXACT),
    "sum_of_exp": (lambda x: jnp.sum(jnp.exp(x), axis=-1), ACCUMULATION),
    "max_of_square": (lambda x: jnp.max(x * x - 1.0, axis=-1), EXACT),
    "softmax": (lambda x: jax.nn.softmax(x, axis=-1), TRANSCENDENTAL),
    "log_softmax": (lambda x: jax.nn.log_softmax(x, axis=-1), TRANSCENDENTAL),
    "mean_and_max": (lambda x: (jnp.mean(x, axis=-1), jnp.max(jnp.abs(x), axis=-1)), ACCUMULATION),
}


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("name", list(REDUCTIONS))
def test_row_reductions_match_reference_and_jax(name, dtype):
    fn, tolerance = REDUCTIONS[name]
    x = rows_with_specials(dtype)
    with jax.enable_x64(dtype == np.float64):
        compiled = xfuse.jit(fn).lower(x).compile()
        assert "rows." in compiled.kernel_source(), "the row helpers were not used"
        got = compiled(x)
        reference = xfuse.jit(fn, backend="reference")(x)
        want_jax = jax.jit(fn)(x)
    got, reference = jax.tree.leaves(got), jax.tree.leaves(reference)
    for g, r, j in zip(got, reference, jax.tree.leaves(want_jax)):
        dt = DType.from_numpy(np.dtype(dtype))
        scale = np.max(np.abs(np.nan_to_num(x, posinf=0, neginf=0)), axis=-1)
        scale = scale if g.ndim == 1 else scale[:, None] * np.ones_like(g)
        with np.errstate(over="ignore"):
            scale = scale * x.shape[-1]
        assert_close(g, r, dt, f"{name} vs reference", tolerance, scale=scale)
        np.testing.assert_array_equal(np.isnan(g), np.isnan(np.asarray(j)), err_msg=f"{name}: NaNs vs jax")


def test_max_and_min_keep_the_sign_of_zero():
    x = np.zeros((4, 64), np.float32)
    x[0] = -0.0
    x[1, 5] = -0.0
    x[2] = -0.0
    x[2, 60] = 0.0
    x[3, ::2] = -0.0
    mx = xfuse.jit(lambda x: jnp.max(x, axis=-1))(x)
    mn = xfuse.jit(lambda x: jnp.min(x, axis=-1))(x)
    np.testing.assert_array_equal(np.signbit(mx), [True, False, False, False])
    np.testing.assert_array_equal(np.signbit(mn), [True, True, True, True])


ARG_REDUCTIONS = {
    "argmax": lambda x: jnp.argmax(x, axis=-1),
    "argmin": lambda x: jnp.argmin(x, axis=-1),
    "argmax_of_square": lambda x: jnp.argmax(x * x - 1.0, axis=-1),  # a row buffer, not the input's row
    "argmin_and_max": lambda x: (jnp.argmin(x, axis=-1), jnp.max(x, axis=-1)),
}


def first_extreme(x: np.ndarray, largest: bool) -> np.ndarray:
    """jax's argmax (argmin) written out: the first NaN in a row, else the first element equal
    to the row's max (min), -0.0 equal to +0.0."""
    out = np.zeros(x.shape[:-1], np.int64)
    for r, row in enumerate(x.reshape(-1, x.shape[-1])):
        nans = np.flatnonzero(np.isnan(row))
        out.reshape(-1)[r] = nans[0] if nans.size else np.flatnonzero(row == (row.max() if largest else row.min()))[0]
    return out


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("shape", [(24, 67), (300, 24), (12, 1000)])
@pytest.mark.parametrize("name", list(ARG_REDUCTIONS))
def test_arg_reductions_go_through_rows_and_keep_the_first_index(name, shape, dtype, monkeypatch):
    """argmax and argmin: the extreme through `rows`' keys, then the first element equal to it
    (or the first NaN): against the in-order loop carrying both (ROW_SUMS_MIN past the row),
    the reference, jax.jit and the rule written out. Ties of -0.0 and +0.0 keep the first."""
    fn = ARG_REDUCTIONS[name]
    x = rows_with_specials(dtype, shape=shape, seed=shape[1])
    x[6, 3:] = x[6, 3]  # a tie along the row
    x[7, :] = -np.inf
    x[8, ::3] = -0.0
    x[8, 1::3] = 0.0
    with jax.enable_x64(dtype == np.float64):
        compiled = xfuse.jit(fn).lower(x).compile()
        assert f"rows.{name[:6]}_{DType.from_numpy(np.dtype(dtype)).value}" in compiled.kernel_source()
        got = jax.tree.leaves(compiled(x))
        reference = jax.tree.leaves(xfuse.jit(fn, backend="reference")(x))
        want_jax = jax.tree.leaves(jax.jit(fn)(x))
        monkeypatch.setattr(row_forms, "ROW_SUMS_MIN", 1 << 30)
        monkeypatch.setattr(row_forms, "TILED_ROW", 0)
        looped = xfuse.jit(fn).lower(x).compile()
        assert "rows.arg" not in looped.kernel_source()
        before = jax.tree.leaves(looped(x))
    np.testing.assert_array_equal(got[0], before[0])
    np.testing.assert_array_equal(got[0], reference[0])
    np.testing.assert_array_equal(got[0], want_jax[0])
    with np.errstate(over="ignore"):  # +-3e38 squared: infinity, in xfuse's f32 too
        operand = x * x - 1.0 if name == "argmax_of_square" else x
    np.testing.assert_array_equal(got[0], first_extreme(operand, largest=name.startswith("argmax")))


def test_the_c_backend_finds_the_same_first_indices():
    x = rows_with_specials(np.float32, shape=(24, 67), seed=2)
    for fn in (ARG_REDUCTIONS["argmax"], ARG_REDUCTIONS["argmin"]):
        compiled = xfuse.jit(fn, backend="c").lower(x).compile()
        assert "rows_arg" in compiled.kernel_source()
        np.testing.assert_array_equal(compiled(x), xfuse.jit(fn, backend="reference")(x))


SHIFTS = {  # name: (fn, whether its exp's argument is x - max(x) over the axis it spreads back on)
    "softmax": (lambda x: jax.nn.softmax(x, axis=-1), True),
    "shift_by_own_max": (lambda x: jnp.exp(x - jnp.max(x, axis=1, keepdims=True)), True),
    "shift_by_own_column_max": (lambda x: jnp.exp(x - jnp.max(x, axis=0)[None, :]), True),
    "max_of_another_row": (lambda x: jnp.exp(x - jnp.max(x, axis=1)[None, :]), False),
    "max_of_other_array": (lambda x: jnp.exp(x - jnp.max(x * 0.5, axis=1, keepdims=True)), False),
}


@pytest.mark.parametrize("name", list(SHIFTS))
def test_exp_of_a_shift_by_the_rows_max_uses_the_nonpositive_exp(name):
    """x - max(x), the max over the axes its broadcast adds back, is at most 0 (or NaN), and
    its exp is `exp_nonpositive_f32`, exp_f32 bit for bit there. The max of another row (spread
    on the wrong axis) or of another array leaves positive arguments (up to 80 here, past the nonpositive exp's range),
    which keep exp_f32."""
    fn, nonpositive = SHIFTS[name]
    x = rows_with_specials(np.float32, shape=(48, 48))
    with np.errstate(over="ignore"):  # the rows' +-3e38 become infinities
        x[10:20] *= 40.0  # arguments far from 0 (exp over/underflows)
    compiled = xfuse.jit(fn).lower(x).compile()
    assert ("exp_nonpositive_f32" in compiled.kernel_source()) == nonpositive
    got = np.asarray(compiled(x))
    want = np.asarray(xfuse.jit(fn, backend="reference")(x))
    assert_close(got, want, DType.F32, name, TRANSCENDENTAL)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(np.asarray(jax.jit(fn)(x))))


@pytest.mark.parametrize("name", ["max_f32", "min_f32"])
def test_float32_keys_stay_32_bits_wide(name):
    """numba widens int32 arithmetic to int64; the f32 extremes cast their keys back, so the
    vectorised loop compares i32 lanes (eight per AVX2 vector), not i64 ones (four)."""
    import re

    from xfuse.backends.numba.compile import CALLED_ROWS

    import numba

    fn = getattr(CALLED_ROWS, name)  # compiled to be called by kernels only
    call = numba.njit(lambda row: fn(row))
    call(np.zeros(64, np.float32))
    ir = fn.inspect_llvm(fn.signatures[0])
    assert re.search(r"<\d+ x i32>", ir), "the key loop did not vectorise"
    assert not re.search(r"<\d+ x i64>", ir), "the keys were widened to 64 bits"
    x = rows_with_specials(np.float32, shape=(6, 1000), seed=3)
    for row in x:
        got = np.float32(call(row))
        want = (np.max if name == "max_f32" else np.min)(row)
        if np.isnan(want):
            assert np.isnan(got)
        else:
            assert got == want and np.signbit(got) == np.signbit(want) or (want == 0 and got == 0)


@pytest.mark.parametrize("length", [67, 16384, 16385])  # f32 rows: 64 KiB fits, a float more does not
def test_row_buffers_live_in_the_stack_frame_up_to_64_kib(length):
    x = rows_with_specials(np.float32, shape=(6, length))
    fn = REDUCTIONS["softmax"][0]
    compiled = xfuse.jit(fn).lower(x).compile()
    source = compiled.kernel_source()
    on_stack = length * 4 <= STACK_ROW_BYTES
    assert ("scalar.row_buffer(" in source) == on_stack and ("np.empty(" in source) == (not on_stack)
    got, reference = compiled(x), xfuse.jit(fn, backend="reference")(x)
    assert_close(np.asarray(got), np.asarray(reference), DType.F32, "softmax", TRANSCENDENTAL)


def test_row_buffers_are_private_to_each_call():
    """Two threads filling and summing their buffers at once each see only their own values."""

    @numba.njit(nogil=True)
    def fill_and_sum(value, times):
        buffer = scalar.row_buffer(4096, np.float64)
        total = 0.0
        for _ in range(times):
            for i in range(4096):
                buffer[i] = value
            for i in range(4096):
                total += buffer[i]
        return total

    fill_and_sum(0.0, 1)
    with ThreadPoolExecutor(2) as pool:
        totals = list(pool.map(fill_and_sum, [1.0, 2.0], [3000, 3000]))
    assert totals == [1.0 * 4096 * 3000, 2.0 * 4096 * 3000]
