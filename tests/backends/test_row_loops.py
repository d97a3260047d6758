"""Loops along short and middling rows (`row_forms.ROW_LOOPS`, `row_forms.LOOP_ROWS`,
`row_forms.SHORT_ROW`):

- an input kernel's passes along rows of 9 to 63 elements, and a loop kernel's innermost loop
  of 9 to 23, run to a trip count LLVM cannot see (`scalar.opaque`), so it vectorises them
  instead of unrolling them whole; the values are those of the kernels with known counts, bit
  for bit;
- row sums, maxima and minima from 9 elements go through `rows` (vectorised);
- a loop kernel whose last dimension holds 2 to 8 elements and cannot be flattened (a
  broadcast along it) is unrolled along it and reads and writes through flat views, as an
  input kernel over short rows is.

Against the same kernels with their loops as before, the reference interpreter and jax.jit:
NaN, infinities, -0.0, subnormals, integer wraparound, selects that a concatenation or a pad
make along the short axis."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numba
import numpy as np
import pytest

import xfuse
from tests.tolerances import ACCUMULATION, EXACT, TRANSCENDENTAL, assert_close, flush_subnormals, same_bits
from xfuse.backends.numba import row_forms, scalar
from xfuse.backends.numba.lowering import lower
from xfuse.runtime import program
from xfuse.hlo import DType

from .test_short_rows import FLOAT_REDUCTIONS, check_row_reduction, short_rows_with_specials


def test_opaque_is_the_value_it_hides():
    @numba.njit
    def count(n):
        total = 0
        for i in range(scalar.opaque(n)):
            total += i
        return total, scalar.opaque(np.int32(-3))

    assert count(10) == (45, -3)
    assert count(0) == (0, -3)


def source(fn, *args) -> str:
    return xfuse.jit(fn).lower(*args).compile().kernel_source()


def softmax(v):
    return jax.nn.softmax(v, axis=-1)


@pytest.mark.parametrize("length", [9, 16, 31, 63])
def test_middling_rows_loop_to_an_opaque_count_through_rows(length):
    text = source(softmax, np.ones((64, length), np.float32))
    assert f"n{length} = scalar.opaque({length})" in text
    assert f"range(n{length})" in text and f"range({length})" not in text
    assert "rows.max_f32" in text and "rows.sum_f32" in text  # 9 to 31 looped in order before


@pytest.mark.parametrize("length", [64, 200])
def test_long_rows_keep_known_counts(length):
    text = source(softmax, np.ones((64, length), np.float32))
    assert "opaque" not in text and f"range({length})" in text


def test_short_rows_of_a_small_input_keep_known_counts():
    text = source(softmax, np.ones((64, 8), np.float32))  # under SHORT_ROW_MIN_ELEMENTS
    assert "opaque" not in text and "range(8)" in text


def _bias_tanh(x, b):
    return jnp.tanh(x + b)


@pytest.mark.parametrize("length, opaque", [(9, True), (23, True), (24, False), (48, False)])
def test_a_loop_kernels_middling_last_loop(length, opaque):
    text = source(_bias_tanh, np.ones((64, length), np.float32), np.ones(length, np.float32))
    assert ("scalar.opaque" in text) is opaque, text
    assert (f"range({length})" in text) is not opaque


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("length", [9, 10, 17, 31, 33])
@pytest.mark.parametrize("name", list(FLOAT_REDUCTIONS))
def test_middling_row_reductions_match_known_counts_the_reference_and_jax(name, length, dtype, monkeypatch):
    x = short_rows_with_specials(dtype, 200, length, seed=length)
    check_row_reduction(name, x, monkeypatch, "ROW_LOOPS",
                        new_form=lambda text: not re.search(r"range\(\d+\)", text),  # no known count
                        old_form=lambda text: "opaque" not in text)


def test_middling_rows_past_the_parallel_threshold():
    rng = np.random.default_rng(3)
    for shape in [(65536, 10), (32768, 16), (16384, 32)]:
        x = rng.standard_normal(shape).astype(np.float32)
        x[7, 3], x[9] = np.nan, -np.inf
        got = xfuse.jit(softmax)(x)
        assert_close(got, xfuse.jit(softmax, backend="reference")(x), DType.F32, f"softmax over {shape}",
                     ACCUMULATION, scale=np.ones_like(got))
        clean = x.copy()
        clean[7, 3], clean[9] = 0.5, 1.0
        assert_close(xfuse.jit(softmax)(clean), np.asarray(jax.jit(softmax)(clean)), DType.F32,
                     f"softmax over {shape} vs jax", ACCUMULATION, scale=np.ones_like(got))


# ---------------------------------------------------------------- loop kernels over short rows
@pytest.fixture
def small_inputs_too(monkeypatch):
    monkeypatch.setattr(row_forms, "SHORT_ROW_MIN_ELEMENTS", 0)


LOOP_CASES = {  # (function, operand shapes given the rows and the short length, tolerance)
    "tanh_of_bias": (_bias_tanh, lambda r, n: [(r, n), (n,)], TRANSCENDENTAL),
    "max_with_row": (lambda x, s: jnp.maximum(x, s) * 2.0, lambda r, n: [(r, n), (r, 1)], EXACT),
    "outer": (lambda a, b: jnp.exp(a[:, None] - b[None, :]), lambda r, n: [(r,), (n,)], TRANSCENDENTAL),
    "concat_along_the_row": (lambda x, y: jnp.maximum(jnp.concatenate([x, y * 2.0], axis=1), 0.5),
                             lambda r, n: [(r, 1), (r, n - 1)], EXACT),
    "pad_along_the_row": (lambda x, b: jnp.pad(x, ((0, 0), (1, 0)), constant_values=-1.0) * b,
                          lambda r, n: [(r, n - 1), (n,)], EXACT),
    "three_dims": (lambda x, b: jnp.where(x > b, x, b * 0.5), lambda r, n: [(r // 8, 8, n), (n,)], EXACT),
}


def _operands(shapes, dtype, seed):
    rng = np.random.default_rng(seed)
    out = []
    for k, shape in enumerate(shapes):
        a = rng.standard_normal(shape).astype(dtype)
        flat = a.reshape(-1)  # NaN, infinities, zeros of both signs and a subnormal, spread out
        at = np.arange(6) * 17 + k
        at = at[at < flat.size]
        flat[at] = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-45], dtype)[: at.size]
        out.append(a)
    return out


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("length", [2, 5, 8])
@pytest.mark.parametrize("name", list(LOOP_CASES))
def test_short_last_axes_of_loop_kernels_unroll_and_match(name, length, dtype, monkeypatch, small_inputs_too):
    fn, shapes, tolerance = LOOP_CASES[name]
    args = _operands(shapes(256, length), dtype, seed=length)
    with jax.enable_x64(dtype == np.float64):
        compiled = xfuse.jit(fn).lower(*args).compile()
        text = compiled.kernel_source()
        last = f"i{len(jax.eval_shape(fn, *args).shape) - 1}"
        assert "out0_flat" in text and not re.search(rf"for {last} ", text), text
        got = compiled(*args)
        reference = xfuse.jit(fn, backend="reference")(*args)
        clean = [flush_subnormals(np.where(np.isnan(a), a.dtype.type(0.25), a)) for a in args]
        got_clean, want_jax = compiled(*clean), np.asarray(jax.jit(fn)(*clean))
        monkeypatch.setattr(row_forms, "SHORT_ROW", 0)
        looped = xfuse.jit(fn).lower(*args).compile()
        assert "_flat" not in looped.kernel_source()
        before = looped(*args)
    assert same_bits(got, before).all(), f"{name}: differs from the looped kernel"
    dt = DType.from_numpy(np.dtype(dtype))
    assert_close(got, reference, dt, f"{name} vs reference", tolerance)
    assert_close(got_clean, want_jax, dt, f"{name} vs jax", tolerance)


def test_integer_loop_kernels_over_short_rows_wrap_as_jax(small_inputs_too):
    x = np.arange(-600, 600, dtype=np.int32).reshape(200, 6) * 7_000_000
    b = np.array([3, -1, 0, 2**30, -(2**31), 5], np.int32)

    def fn(x, b):
        return x * b + (x >> 3), (x > b).astype(jnp.int8)

    compiled = xfuse.jit(fn).lower(x, b).compile()
    assert "out0_flat" in compiled.kernel_source()
    for got, ref, want in zip(compiled(x, b), xfuse.jit(fn, backend="reference")(x, b), jax.jit(fn)(x, b)):
        np.testing.assert_array_equal(got, ref)
        np.testing.assert_array_equal(got, np.asarray(want))


def test_a_short_loop_kernel_past_the_parallel_threshold():
    rng = np.random.default_rng(5)
    x, b = rng.standard_normal((131072, 4)).astype(np.float32), rng.standard_normal(4).astype(np.float32)
    compiled = xfuse.jit(_bias_tanh).lower(x, b).compile()
    assert "out0_flat" in compiled.kernel_source()
    # xfuse's tanh, not XLA's (within their documented ulps of each other): against the reference
    got = compiled(x, b)
    assert_close(got, xfuse.jit(_bias_tanh, backend="reference")(x, b), DType.F32, "tanh(x + b) over 131072x4",
                 TRANSCENDENTAL)
    np.testing.assert_array_equal(got, xfuse.jit(_bias_tanh, backend="numba", passes="none")(x, b))


# ---------------------------------------------------------------- output fusions over short rows
def _head(x, w, b):
    return jax.nn.softmax(jax.nn.relu(x @ w + b), axis=-1)


def _dense(x, w, b):
    return jnp.tanh(x @ w + b)


@pytest.mark.parametrize("classes", [2, 5, 8])
@pytest.mark.parametrize("fn", [_head, _dense], ids=["softmax_head", "tanh_dense"])
def test_output_fusions_over_short_rows_read_the_product_flat(fn, classes, monkeypatch, small_inputs_too):
    rng = np.random.default_rng(classes)
    x = rng.standard_normal((300, 24)).astype(np.float32)
    w = rng.standard_normal((24, classes)).astype(np.float32)
    b = rng.standard_normal(classes).astype(np.float32)
    x[3, 5], x[7, 0], x[11] = np.nan, np.inf, -0.0  # a NaN row, an infinite one, a row of -0.0
    compiled = xfuse.jit(fn).lower(x, w, b).compile()
    text = compiled.kernel_source()
    assert "dot_flat = dot.ravel()" in text and "out0_flat" in text, text
    got = compiled(x, w, b)
    monkeypatch.setattr(row_forms, "SHORT_ROW", 0)
    monkeypatch.setattr(row_forms, "TILED_ROW", 0)
    looped = xfuse.jit(fn).lower(x, w, b).compile()
    assert "dot_flat" not in looped.kernel_source()
    assert same_bits(got, looped(x, w, b)).all(), "differs from the kernel with row loops"
    # the product's rows sum 24 terms (BLAS and the reference in their own orders) before the
    # epilogue: errors relative to the sum of the terms' magnitudes, or to 1 for softmax
    with np.errstate(invalid="ignore"):  # inf * 0 in the row of -0.0's product
        scale = np.ones_like(got) if fn is _head else (np.abs(x) @ np.abs(w) + np.abs(b))
    reference = xfuse.jit(fn, backend="reference")(x, w, b)
    assert_close(got, reference, DType.F32, f"{fn.__name__} vs reference", ACCUMULATION, scale=scale)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(reference))
    clean = np.nan_to_num(x, nan=0.5, posinf=2.0)
    assert_close(compiled(clean, w, b), np.asarray(jax.jit(fn)(clean, w, b)), DType.F32, f"{fn.__name__} vs jax",
                 ACCUMULATION, scale=np.ones_like(got) if fn is _head else (np.abs(clean) @ np.abs(w) + np.abs(b)))


def test_short_row_output_fusions_over_blocks_of_the_product(monkeypatch, small_inputs_too):
    """The product made a block of rows at a time (`runtime.program.BLOCK_BYTES`): each block's
    flat view starts at its first row (`dot_start`)."""
    monkeypatch.setattr(program, "BLOCK_BYTES", 37 * 4 * 4)  # blocks of 37 rows, the last one short
    rng = np.random.default_rng(8)
    x, w, b = (rng.standard_normal(s).astype(np.float32) for s in ((300, 24), (24, 4), (4,)))
    for fn in (_head, _dense):
        compiled = xfuse.jit(fn).lower(x, w, b).compile()
        assert "dot_flat" in compiled.kernel_source()
        got = compiled(x, w, b)
        scale = np.ones_like(got) if fn is _head else np.abs(x) @ np.abs(w) + np.abs(b)
        assert_close(got, xfuse.jit(fn, backend="reference")(x, w, b), DType.F32, f"{fn.__name__} in blocks",
                     ACCUMULATION, scale=scale)


def test_a_short_row_output_fusion_keeps_the_product_apart_from_its_output():
    """Its loop over rows, vectorised across the row's elements, would fall back to scalar code
    over a product computed into the output (LLVM's check that the two do not overlap)."""
    rng = np.random.default_rng(9)
    x = rng.standard_normal((65536, 32)).astype(np.float32)
    w = rng.standard_normal((32, 4)).astype(np.float32)
    b = rng.standard_normal(4).astype(np.float32)
    compiled = xfuse.jit(_dense).lower(x, w, b).compile()
    assert "dot_flat" in compiled.kernel_source()
    step = next(s for s in lower(compiled.module).program["steps"] if s.get("dot"))
    assert not step["dot"]["in_out"]
    got = compiled(x, w, b)
    assert_close(got, xfuse.jit(_dense, backend="reference")(x, w, b), DType.F32, "tanh(x @ w + b) over 65536x4",
                 ACCUMULATION, scale=np.abs(x) @ np.abs(w) + np.abs(b))


@pytest.mark.parametrize("case", ["softmax_12", "bias_tanh_4", "bias_tanh_10", "head_5"])
def test_the_c_backend_takes_the_same_forms(case, small_inputs_too):
    """The C backend renders the same kernel source: `scalar.opaque` (the count itself there:
    gcc vectorises short loops with their counts known), the unrolled short rows and the
    product read flat."""
    rng = np.random.default_rng(4)
    kind, n = case.rsplit("_", 1)
    n = int(n)
    x = rng.standard_normal((96, n)).astype(np.float32)
    x[2, 1], x[3] = np.nan, -np.inf
    fn, args = {
        "softmax": (softmax, (x,)),
        "bias_tanh": (_bias_tanh, (x, rng.standard_normal(n).astype(np.float32))),
        "head": (_head, (x, rng.standard_normal((n, n)).astype(np.float32), rng.standard_normal(n).astype(np.float32))),
    }[kind]
    compiled = xfuse.jit(fn, backend="c").lower(*args).compile()
    text = compiled.kernel_source()
    assert ("scalar_opaque" in text) if n > row_forms.SHORT_ROW else ("_flat" in text), text
    got = compiled(*args)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(xfuse.jit(fn, backend="reference")(*args)))
    tolerance = TRANSCENDENTAL if kind == "bias_tanh" else ACCUMULATION
    scale = None if kind == "bias_tanh" else np.ones_like(got)
    assert_close(got, xfuse.jit(fn, backend="reference")(*args), DType.F32, f"{case} on the C backend", tolerance,
                 scale=scale)
