"""Reductions along rows of 9 to 23 elements (`row_forms.TILED_ROW`): the short-row form (the
loops along the row unrolled, LLVM vectorising across rows) over blocks of 64 rows, the inputs
of the row space copied into stack tiles column by column, the outputs written to tiles and
copied out in order (`row_forms.tile_order`).

Against the kernels with loops along each row, their sums in order too (so bit for bit), the
reference interpreter and jax.jit: NaN, infinities, -0.0, subnormals, integer wraparound, a
last block of fewer rows, three dimensions, rows split across threads, an output fusion's
product, more than one output, and the C backend rendering the same source."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import xfuse
from tests.tolerances import ACCUMULATION, TRANSCENDENTAL, assert_close, same_bits
from xfuse.backends.numba import row_forms
from xfuse.hlo import DType
from xfuse.runtime import program

from .test_short_rows import FLOAT_REDUCTIONS, INT_REDUCTIONS, check_row_reduction, short_rows_with_specials

# the same kernels along each row, summing in order: no tiles, no `rows`
ROW_LOOPS = {"TILED_ROW": 0, "ROW_SUMS_MIN": 1 << 30}


@pytest.fixture
def small_inputs_too(monkeypatch):
    monkeypatch.setattr(row_forms, "SHORT_ROW_MIN_ELEMENTS", 0)


def softmax(v):
    return jax.nn.softmax(v, axis=-1)


def source(fn, *args) -> str:
    return xfuse.jit(fn).lower(*args).compile().kernel_source()


def tiled(text: str) -> bool:
    """Blocks of rows, the input's tile filled first (and outputs of the row space, if any,
    copied out in order)."""
    blocks = re.search(r"for k\d_t in range\(.*, 64\):", text) and "t_p0 = scalar.row_buffer" in text
    return bool(blocks) and ("out0_flat" not in text or "tile_order_" in text)


@pytest.mark.parametrize("length", [9, 16, 23])
def test_middling_rows_of_a_large_input_go_through_tiles(length):
    text = source(softmax, np.ones((row_forms.SHORT_ROW_MIN_ELEMENTS // length + 1, length), np.float32))
    assert tiled(text), text
    assert f"t_p0 = scalar.row_buffer({64 * length}, np.float32)" in text
    assert not re.search(r"for r\d", text) and "rows." not in text, text  # unrolled, summed in order
    assert text.count("exp_nonpositive_f32") == length


def test_a_small_input_keeps_its_row_loops():
    assert not tiled(source(softmax, np.ones((512, 12), np.float32)))  # under SHORT_ROW_MIN_ELEMENTS


@pytest.mark.parametrize("shape", [(4096, 24), (63, 12), (64, 8, 12), (4096, 8)])
def test_other_rows_are_not_tiled(shape, small_inputs_too):
    """Rows past TILED_ROW, fewer than 64 rows on the innermost kept axis, and rows of up to 8
    (unrolled without tiles)."""
    assert not tiled(source(softmax, np.ones(shape, np.float32)))


LIGHT = {"sum", "max", "min_of_square", "unit_vectors"}  # one phase through `rows`, nothing transcendental
TILED_CASES = [(name, length) for name in FLOAT_REDUCTIONS
               for length in ([9, 12, 15] if name in LIGHT else [9, 12, 16, 23])]


@pytest.mark.parametrize("name", sorted(LIGHT))
def test_light_reductions_are_tiled_up_to_15(name, small_inputs_too):
    fn, _ = FLOAT_REDUCTIONS[name]
    assert tiled(source(fn, np.ones((64, 15), np.float32)))
    for length in (16, 23):
        text = source(fn, np.ones((64, length), np.float32))
        assert not tiled(text) and "rows." in text, text


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("name, length", TILED_CASES)
def test_tiled_reductions_match_row_loops_the_reference_and_jax(name, length, dtype, monkeypatch, small_inputs_too):
    x = short_rows_with_specials(dtype, 300, length, seed=length)  # blocks of 64 rows, the last of 44
    check_row_reduction(name, x, monkeypatch, ROW_LOOPS, new_form=tiled, old_form=lambda text: not tiled(text))


@pytest.mark.parametrize("dtype", [np.int8, np.int32], ids=["i8", "i32"])
@pytest.mark.parametrize("name", list(INT_REDUCTIONS))
def test_tiled_integer_and_boolean_rows_are_exact(name, dtype, small_inputs_too):
    fn = INT_REDUCTIONS[name]
    info = np.iinfo(dtype)
    x = np.random.default_rng(2).integers(-3, 4, size=(200, 13)).astype(dtype)
    x[0] = info.max  # a sum and a product that wrap
    x[1] = info.min
    x[2] = 0
    compiled = xfuse.jit(fn).lower(x).compile()
    assert tiled(compiled.kernel_source()), compiled.kernel_source()
    got = compiled(x)
    np.testing.assert_array_equal(got, xfuse.jit(fn, backend="reference")(x))
    np.testing.assert_array_equal(got, np.asarray(jax.jit(fn)(x)))


@pytest.mark.parametrize("name", ["softmax", "argmax", "layer_norm"])
def test_three_dims_tile_the_innermost_kept_axis(name, monkeypatch, small_inputs_too):
    x = short_rows_with_specials(np.float32, 3 * 100, 11, seed=7).reshape(3, 100, 11)
    check_row_reduction(name, x, monkeypatch, ROW_LOOPS, new_form=lambda text: tiled(text) and "k1_t" in text,
                        old_form=lambda text: not tiled(text))


@pytest.mark.parametrize("name", ["softmax", "argmax", "logsumexp", "layer_norm"])
def test_tiled_rows_split_across_threads(name):
    """Past the parallel threshold: each thread's range of rows starts anywhere, not at a block
    of 64."""
    x = short_rows_with_specials(np.float32, 65537, 12, seed=11)
    fn, tolerance = FLOAT_REDUCTIONS[name]
    compiled = xfuse.jit(fn).lower(x).compile()
    assert tiled(compiled.kernel_source())
    got = compiled(x)
    reference = xfuse.jit(fn, backend="reference")(x)
    if name == "argmax":
        np.testing.assert_array_equal(got, reference)
        return
    with np.errstate(over="ignore"):
        scale = np.max(np.abs(np.nan_to_num(x, posinf=0, neginf=0)), axis=-1) * x.shape[-1]
    scale = np.ones_like(got) if name == "softmax" else (scale if got.ndim == 1 else scale[:, None] * np.ones_like(got))
    assert_close(got, reference, DType.F32, f"{name} over 65537x12", tolerance, scale=scale)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(reference))


def _head(x, w, b):
    return jax.nn.softmax(jax.nn.relu(x @ w + b), axis=-1)


@pytest.mark.parametrize("blocks", [False, True], ids=["whole", "in_blocks_of_100_rows"])
@pytest.mark.parametrize("classes", [10, 16])
def test_an_output_fusions_product_goes_through_its_tile(classes, blocks, monkeypatch, small_inputs_too):
    """The product's tile reads its block of rows from `dot_start`, whole or a block at a time
    (`program.BLOCK_BYTES`), the blocks' rows not a multiple of 64."""
    if blocks:
        monkeypatch.setattr(program, "BLOCK_BYTES", 100 * classes * 4)
    rng = np.random.default_rng(classes)
    x = rng.standard_normal((300, 24)).astype(np.float32)
    w = rng.standard_normal((24, classes)).astype(np.float32)
    b = rng.standard_normal(classes).astype(np.float32)
    x[3, 5], x[7, 0], x[11] = np.nan, np.inf, -0.0
    compiled = xfuse.jit(_head).lower(x, w, b).compile()
    text = compiled.kernel_source()
    assert "t_dot = scalar.row_buffer" in text and "dot_start" in text and "tile_order_" in text, text
    got = compiled(x, w, b)
    for setting, value in ROW_LOOPS.items():
        monkeypatch.setattr(row_forms, setting, value)
    looped = xfuse.jit(_head).lower(x, w, b).compile()
    assert "t_dot" not in looped.kernel_source()
    assert same_bits(got, looped(x, w, b)).all(), "differs from the kernel with row loops"
    reference = xfuse.jit(_head, backend="reference")(x, w, b)
    assert_close(got, reference, DType.F32, "head vs reference", ACCUMULATION, scale=np.ones_like(got))
    np.testing.assert_array_equal(np.isnan(got), np.isnan(reference))
    clean = np.nan_to_num(x, nan=0.5, posinf=2.0)
    assert_close(compiled(clean, w, b), np.asarray(jax.jit(_head)(clean, w, b)), DType.F32, "head vs jax",
                 ACCUMULATION, scale=np.ones_like(got))


def _several(x):
    peak = jnp.max(x, axis=-1, keepdims=True)
    shifted = x - peak
    return jnp.exp(shifted) / jnp.sum(jnp.exp(shifted), axis=-1, keepdims=True), shifted * 2.0, peak[:, 0]


def _reversed(x):
    return jax.nn.softmax(x[:, ::-1] * 2.0, axis=-1)


@pytest.mark.parametrize("fn", [_several, _reversed], ids=["several_outputs", "reversed_row"])
def test_more_outputs_and_other_indices(fn, monkeypatch, small_inputs_too):
    x = short_rows_with_specials(np.float32, 150, 14, seed=3)
    compiled = xfuse.jit(fn).lower(x).compile()
    assert tiled(compiled.kernel_source()), compiled.kernel_source()
    got = compiled(x)
    for setting, value in ROW_LOOPS.items():
        monkeypatch.setattr(row_forms, setting, value)
    before = xfuse.jit(fn).lower(x).compile()(x)
    reference = xfuse.jit(fn, backend="reference")(x)
    for k, (g, b, r) in enumerate(zip(*(v if isinstance(v, tuple) else (v,) for v in (got, before, reference)))):
        assert same_bits(g, b).all(), f"output {k} differs from the kernel with row loops"
        assert_close(g, r, DType.F32, f"output {k}", ACCUMULATION, scale=np.ones_like(g) if k == 0 else None)


def _heavy(v):
    return jax.nn.softmax(jax.scipy.special.erf(v) * jnp.tanh(v) * jnp.exp(-v * v) * jnp.log1p(v * v)
                          + jnp.sin(v) * jnp.cos(v), axis=-1)


@pytest.mark.parametrize("case", ["heavy_body", "past_the_unrolling_bound"])
def test_long_bodies_are_written_along_their_rows(case, monkeypatch, small_inputs_too):
    """A tiled kernel past TILED_CALLS calls of the math library (a long compile), or whose loops
    along the row would not all unroll (a loop left inside the block), is written along its rows
    instead: the same kernel as with the tiles off."""
    x = short_rows_with_specials(np.float32, 130, 12, seed=5)
    fn = _heavy if case == "heavy_body" else FLOAT_REDUCTIONS["layer_norm"][0]
    if case == "past_the_unrolling_bound":
        assert tiled(source(fn, x))
        monkeypatch.setattr(row_forms, "SHORT_ROW_LINES", 1)
    compiled = xfuse.jit(fn).lower(x).compile()
    text = compiled.kernel_source()
    assert not tiled(text) and "rows." in text, text
    got = compiled(x)
    monkeypatch.setattr(row_forms, "TILED_ROW", 0)
    untiled = xfuse.jit(fn).lower(x).compile()
    assert untiled.kernel_source() == text
    reference = xfuse.jit(fn, backend="reference")(x)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(reference))
    assert_close(got, reference, DType.F32, case, TRANSCENDENTAL if case == "heavy_body" else ACCUMULATION,
                 scale=np.ones_like(got) if case == "heavy_body" else np.abs(reference) + 1.0)


@pytest.mark.parametrize("name", ["softmax", "argmax", "layer_norm"])
def test_the_c_backend_renders_tiled_kernels(name, small_inputs_too):
    fn, tolerance = FLOAT_REDUCTIONS[name]
    x = short_rows_with_specials(np.float32, 200, 12, seed=9)
    compiled = xfuse.jit(fn, backend="c").lower(x).compile()
    assert "k0_t" in compiled.kernel_source(), compiled.kernel_source()
    got = compiled(x)
    reference = xfuse.jit(fn, backend="reference")(x)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(reference))
    if name == "argmax":
        np.testing.assert_array_equal(got, reference)
    else:
        assert_close(got, reference, DType.F32, f"{name} on the C backend", tolerance,
                     scale=np.ones_like(got) if name == "softmax" else np.abs(reference) + 1.0)



def _operand_cases(rng):
    x = rng.standard_normal((130, 5)).astype(np.float32)
    y = rng.standard_normal((130, 7)).astype(np.float32)
    xy = np.concatenate([x, y], axis=1)
    xy[4, 2], xy[9] = np.nan, -np.inf
    return {  # name: (function, operands): the row space built from other shapes
        "concatenation": (lambda x, y: jax.nn.softmax(jnp.concatenate([x, y * 2.0], axis=1), axis=-1), (x, y)),
        "pad": (lambda x: jax.nn.softmax(jnp.pad(x, ((0, 0), (3, 4)), constant_values=-1.0), axis=-1), (x,)),
        "row_scale_and_bias": (lambda v, b, s: jax.nn.log_softmax(v * s + b, axis=-1),
                               (xy, rng.standard_normal(12).astype(np.float32),
                                rng.standard_normal((130, 1)).astype(np.float32))),
        "iota": (lambda v: jnp.argmax(v + jnp.arange(12, dtype=jnp.float32) * 0.1, axis=-1), (xy,)),
        "variance_and_mean": (lambda v: jnp.var(v, axis=-1) + jnp.mean(v, axis=-1), (xy,)),
    }


@pytest.mark.parametrize("name", list(_operand_cases(np.random.default_rng(0))))
def test_rows_built_from_other_shapes(name, small_inputs_too):
    """Concatenations and pads along the row, broadcasts of a row's scale and of a bias along
    it, an iota: only the operands of the row space's own shape go through tiles."""
    fn, args = _operand_cases(np.random.default_rng(0))[name]
    compiled = xfuse.jit(fn).lower(*args).compile()
    assert re.search(r"for k0_t in range", compiled.kernel_source()), compiled.kernel_source()
    got = compiled(*args)
    reference = xfuse.jit(fn, backend="reference")(*args)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(reference))
    if got.dtype.kind != "f":
        np.testing.assert_array_equal(got, reference)
        np.testing.assert_array_equal(got, np.asarray(jax.jit(fn)(*args)))
        return
    finite = np.isfinite(reference)
    assert_close(got[finite], reference[finite], DType.F32, name, ACCUMULATION,
                 scale=np.maximum(np.abs(reference[finite]), 1.0))
    clean = [np.nan_to_num(a, nan=0.5, neginf=-3.0) for a in args]
    want_jax = np.asarray(jax.jit(fn)(*clean))
    assert_close(compiled(*clean), want_jax, DType.F32, f"{name} vs jax", ACCUMULATION,
                 scale=np.maximum(np.abs(want_jax), 1.0))
