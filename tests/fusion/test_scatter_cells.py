"""The rule `scatter_one_window_per_cell` (fusion/scatter_cells.py): scatters where each cell of
the operand's batch receives at most one full-width window become selects, in every mode,
combiner and index type, with indices out of range, signed zeros and NaN; results agree with
jax.jit and the reference interpreter, and no scatter is left. Scatters of another form keep
the data op."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import xfuse
from xfuse.hlo import interpret

RNG = np.random.default_rng(17)
MODES = {"clip": lax.GatherScatterMode.CLIP, "fill_or_drop": lax.GatherScatterMode.FILL_OR_DROP,
         "promise_in_bounds": lax.GatherScatterMode.PROMISE_IN_BOUNDS}
SCATTERS = {"set": lax.scatter, "add": lax.scatter_add, "mul": lax.scatter_mul, "min": lax.scatter_min,
            "max": lax.scatter_max}


def _agree(fn, *args):
    """xfuse.jit's result equals jax.jit's and the reference interpreter's, NaN (not its sign)
    and the sign of zero included; returns the fused module's text."""
    jitted = xfuse.jit(fn)
    compiled = jitted.lower(*args).compile()
    got, want = np.asarray(jitted(*args)), np.asarray(jax.jit(fn)(*args))
    reference = interpret(jitted.lower(*args).module, *args)
    reference = reference[0] if isinstance(reference, (list, tuple)) else reference
    for other in (want, reference):
        np.testing.assert_array_equal(got, other)
        numbers = ~np.isnan(got) if got.dtype.kind == "f" else np.ones(got.shape, bool)
        np.testing.assert_array_equal(np.signbit(got[numbers]), np.signbit(other[numbers]))
    return compiled.as_text()


def _operand(dtype) -> np.ndarray:
    x = RNG.standard_normal((9, 6)).astype(dtype) if np.dtype(dtype).kind == "f" else \
        RNG.integers(-50, 50, (9, 6)).astype(dtype)
    if np.dtype(dtype).kind == "f":
        x[0, :] = -0.0
        x[1, 2] = np.nan
    return x


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("combine", list(SCATTERS))
def test_a_batched_point_scatter_is_a_select(mode, combine):
    numbers = lax.ScatterDimensionNumbers(update_window_dims=(), inserted_window_dims=(1,),
                                          scatter_dims_to_operand_dims=(1,), operand_batching_dims=(0,),
                                          scatter_indices_batching_dims=(0,))
    for dtype, index_dtype in [(np.float32, np.int32), (np.int32, np.int8), (np.float32, np.uint32),
                               (np.float32, np.uint8), (np.int16, np.int16)]:
        x = _operand(dtype)
        info = np.iinfo(index_dtype)
        indices = np.array([0, 5, 3, -1, 6, info.max, info.min, 2, 0], np.int64).clip(info.min, info.max)
        indices = indices.astype(index_dtype)[:, None]
        updates = _operand(dtype)[:, 0]
        if np.dtype(dtype).kind == "f":
            updates[2] = np.nan
        if mode == "promise_in_bounds":  # only in-bounds indices are promised
            indices = np.abs(indices.astype(np.int64)).clip(0, 5).astype(index_dtype)

        def fn(x, i, u):
            return SCATTERS[combine](x, i, u, numbers, mode=MODES[mode])

        assert "scatter(" not in _agree(fn, x, indices, updates)


@pytest.mark.parametrize("mode", ["drop", "clip"])
def test_a_column_update_and_the_gradient_of_take_along_axis_are_selects(mode):
    x = _operand(np.float32)
    u = _operand(np.float32)[:, 1]
    for column in (0, 4, 6, -1):
        text = _agree(lambda x, u, c=column: x.at[:, c].add(u, mode=mode), x, u)
        assert "scatter(" not in text

    labels = np.array([0, 5, 3, -1, 6, 2, 1, 1, 4], np.int32)

    def loss(logits, labels):
        picked = jnp.take_along_axis(jax.nn.log_softmax(logits), labels[:, None], axis=1)
        return -jnp.nansum(picked)

    logits = RNG.standard_normal((9, 6)).astype(np.float32)
    grad = jax.grad(loss)
    got, want = np.asarray(xfuse.jit(grad)(logits, labels)), np.asarray(jax.jit(grad)(logits, labels))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert "scatter(" not in xfuse.jit(grad).lower(logits, labels).compile().as_text()


def test_a_promised_scatter_drops_windows_out_of_bounds_as_the_data_op_does():
    """promise_in_bounds leaves out-of-bounds indices to the implementation: the data op (and
    XLA's scatter) drops such a window, and so does the select, in a full-width dimension too."""
    numbers = lax.ScatterDimensionNumbers(update_window_dims=(0, 1), inserted_window_dims=(2,),
                                          scatter_dims_to_operand_dims=(0, 2))
    x = np.zeros((1, 1, 3), np.int8)
    updates = np.full((1, 1), -128, np.int8)
    for index in ([-128, -128], [0, 1], [1, 1], [0, 3]):
        indices = np.array(index, np.int8)
        jitted = xfuse.jit(lambda x, i, u: lax.scatter(x, i, u, numbers, mode=MODES["promise_in_bounds"]))
        assert "scatter(" not in jitted.lower(x, indices, updates).compile().as_text()
        got = np.asarray(jitted(x, indices, updates))
        reference = interpret(jitted.lower(x, indices, updates).module, x, indices, updates)
        reference = reference[0] if isinstance(reference, (list, tuple)) else reference
        np.testing.assert_array_equal(got, reference)
        assert (got != 0).sum() == (index == [0, 1]), index


def test_scatters_of_other_forms_stay_data_ops():
    x = _operand(np.float32)
    rows = np.array([1, 1, 4], np.int32)  # two updates meet in row 1
    updates = RNG.standard_normal((3, 6)).astype(np.float32)
    text = _agree(lambda x, i, u: x.at[i].add(u), x, rows, updates)
    assert "scatter(" in text


@pytest.mark.parametrize("mode", list(MODES))
def test_a_scatter_without_index_dimensions_writes_its_one_window(mode):
    numbers = lax.ScatterDimensionNumbers(update_window_dims=(0, 1), inserted_window_dims=(),
                                          scatter_dims_to_operand_dims=())
    x, update = _operand(np.float32), _operand(np.float32) * 2.0
    indices = np.zeros((0,), np.int32)
    for combine in SCATTERS:
        fn = lambda x, i, u, c=combine: SCATTERS[c](x, i, u, numbers, mode=MODES[mode])  # noqa: E731
        _agree(fn, x, indices, update)
    flags = np.array([True])
    fn = lambda x, i, u: lax.scatter(x, i, u, lax.ScatterDimensionNumbers((0,), (), ()), mode=MODES[mode])  # noqa: E731
    _agree(fn, flags, indices, ~flags)  # (fill_or_drop: a select whose condition is always true)


def test_a_vmapped_update_of_whole_windows_is_a_select():
    """jax.vmap of a dynamic_update_slice whose update fills the operand (a solver saving its
    state): a clip-mode scatter whose windows all start at 0, so every cell takes its update."""
    def save(ys, i, y):
        return jax.vmap(lambda a, k, b: lax.dynamic_update_slice(a, b, (k, 0)))(ys, i, y)

    ys, y = RNG.standard_normal((4, 3, 5)).astype(np.float32), RNG.standard_normal((4, 3, 5)).astype(np.float32)
    y[1, 2, 3] = np.nan
    assert "scatter" in str(jax.make_jaxpr(save)(ys, np.arange(4, dtype=np.int32), y))
    text = _agree(save, ys, np.array([0, 2, -1, 9], np.int32), y)
    assert "scatter(" not in text
