"""jax backend rules for the data ops: cumulative ops, sort, top_k, gather and scatter as
`jax.lax` calls, made to agree with the reference interpreter (`hlo/reference_data.py`):

- cumsum/cumprod of f16 and bf16 accumulate in f32 and round once per output, as reductions do.
- sort is always stable (an unstable sort may order ties either way; the reference keeps them).
- a gather in `promise_in_bounds` mode is emitted in `clip` mode: XLA:CPU clamps either way,
  other devices need not. In `fill_or_drop` mode the fill value is an operand, so the windows
  out of bounds are masked here (`gather_fill`), as jax masks them itself (indices wrapped to
  s32 first, as jax does).
- a scatter in `promise_in_bounds` mode is emitted in `fill_or_drop` mode (XLA drops those
  updates on every device). Duplicate indices of a `set` scatter: the last wins on XLA:CPU.
Registered into `emit.RULES` and `emit.NAMESPACE` by emit.py. May import xfuse.hlo, numpy
and jax.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from xfuse.hlo import Op, TupleShape, callbacks

HALVES = {"f16": "np.float16", "bf16": "jnp.bfloat16"}
SCATTERS = {"set": "lax.scatter", "add": "lax.scatter_add", "mul": "lax.scatter_mul",
            "min": "lax.scatter_min", "max": "lax.scatter_max"}


def gather_fill(x, indices, fill, dimension_numbers, slice_sizes):
    """A gather with the windows not wholly in bounds giving `fill` (a traced scalar)."""
    wide = any(d > np.iinfo(np.int32).max for d in x.shape)  # as jax converts them, wrapping
    indices = lax.convert_element_type(indices, np.int64 if wide else np.int32)
    gathered = lax.gather(x, indices, dimension_numbers, slice_sizes, mode=lax.GatherScatterMode.CLIP)
    start_map = dimension_numbers.start_index_map
    upper = np.array([x.shape[d] - slice_sizes[d] for d in start_map]).astype(indices.dtype)
    inside = jnp.all((indices >= 0) & (indices <= upper), axis=-1)
    batch_dims = [d for d in range(gathered.ndim) if d not in dimension_numbers.offset_dims]
    mask = lax.broadcast_in_dim(inside, gathered.shape, tuple(batch_dims))
    return jnp.where(mask, gathered, fill)


def _ints(values) -> str:
    return repr(tuple(int(v) for v in values))


def _cumulative(fn: str, accumulate_halves: bool):
    def rule(c) -> str:
        x = c.args[0]
        reverse = c.attr("reverse") == "true"
        call = f"{fn}({{}}, {c.attr('axis')}, reverse={reverse})"
        if accumulate_halves and c.dtype.value in HALVES:
            wide = call.format(f"lax.convert_element_type({x}, np.float32)")
            return f"lax.convert_element_type({wide}, {HALVES[c.dtype.value]})"
        return call.format(x)

    return rule


def _sort(c) -> str:
    operands = ", ".join(c.args)
    dimension, keys = c.attr("dimension"), c.attr("num_keys")
    if len(c.args) == 1:
        return f"lax.sort({operands}, dimension={dimension}, is_stable=True)"
    return f"tuple(lax.sort(({operands}), dimension={dimension}, is_stable=True, num_keys={keys}))"


def _top_k(c) -> str:
    return f"lax.top_k({c.args[0]}, {c.attr('k')}, axis={c.attr('axis')})"


def _gather(c) -> str:
    a = c.attr
    numbers = (f"lax.GatherDimensionNumbers(offset_dims={_ints(a('offset_dims'))}, "
               f"collapsed_slice_dims={_ints(a('collapsed_slice_dims'))}, "
               f"start_index_map={_ints(a('start_index_map'))}, "
               f"operand_batching_dims={_ints(a('operand_batching_dims'))}, "
               f"start_indices_batching_dims={_ints(a('start_indices_batching_dims'))})")
    sizes = _ints(a("slice_sizes"))
    if a("mode") == "fill_or_drop":
        x, indices, fill = c.args
        return f"gather_fill({x}, {indices}, {fill}, {numbers}, {sizes})"
    x, indices = c.args
    return f"lax.gather({x}, {indices}, {numbers}, {sizes}, mode=lax.GatherScatterMode.CLIP)"


def _scatter(c) -> str:
    a = c.attr
    numbers = (f"lax.ScatterDimensionNumbers(update_window_dims={_ints(a('update_window_dims'))}, "
               f"inserted_window_dims={_ints(a('inserted_window_dims'))}, "
               f"scatter_dims_to_operand_dims={_ints(a('scatter_dims_to_operand_dims'))}, "
               f"operand_batching_dims={_ints(a('operand_batching_dims'))}, "
               f"scatter_indices_batching_dims={_ints(a('scatter_indices_batching_dims'))})")
    mode = "CLIP" if a("mode") == "clip" else "FILL_OR_DROP"
    x, indices, updates = c.args
    fn = SCATTERS[a("combine")]
    return f"{fn}({x}, {indices}, {updates}, {numbers}, mode=lax.GatherScatterMode.{mode})"


def host_callback(number: int, dims_and_dtypes: tuple, *args) -> tuple:
    """A callback instruction as jax.pure_callback of the registered function."""
    shapes = tuple(jax.ShapeDtypeStruct(dims, dtype) for dims, dtype in dims_and_dtypes)
    specs = tuple((s.shape, s.dtype) for s in shapes)
    return tuple(jax.pure_callback(lambda *a: callbacks.call(number, a, specs), shapes, *args))


def _callback(c) -> str:
    tupled = isinstance(c.inst.shape, TupleShape)
    specs = tuple((s.dims, s.dtype.numpy.name) for s in (c.inst.shape.elements if tupled else (c.inst.shape,)))
    call = f"host_callback({c.attr('callback')}, {specs!r}, {', '.join(c.args)})"
    return call if tupled else f"{call}[0]"


DATA_RULES = {
    Op.CUMSUM: _cumulative("lax.cumsum", accumulate_halves=True),
    Op.CUMPROD: _cumulative("lax.cumprod", accumulate_halves=True),
    Op.CUMMAX: _cumulative("lax.cummax", accumulate_halves=False),
    Op.CUMMIN: _cumulative("lax.cummin", accumulate_halves=False),
    Op.SORT: _sort,
    Op.TOP_K: _top_k,
    Op.GATHER: _gather,
    Op.SCATTER: _scatter,
    Op.CALLBACK: _callback,
}
DATA_NAMESPACE = {"gather_fill": gather_fill, "host_callback": host_callback}
