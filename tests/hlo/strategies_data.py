"""Recipes of the data ops for `strategies.py`'s random modules: cumulative ops, sort, top_k,
gather and scatter with random dimension numbers, host callbacks,, modes and combiners, and indices of any
integer type (so out of bounds at both ends). Imported by strategies.py into its `RECIPES`.
"""

from __future__ import annotations

from hypothesis import strategies as st

from tests.hlo.strategies import ALL_DTYPES, INTEGERS, NUMERIC, _Context, dims_of_rank
import numpy as np

from xfuse.hlo import Instruction, Op, Shape, TupleShape, callbacks
from xfuse.hlo.shape_rules_data import GATHER_MODES, SCATTER_COMBINERS

FLAG = st.sampled_from(("false", "true"))


def _cumulative(c: _Context, op: Op) -> Instruction:
    x = c.pick(NUMERIC, min_rank=1)
    axis = c.draw(st.integers(0, x.shape.rank - 1))
    return c.add(c.builder.emit(op, x, axis=axis, reverse=c.draw(FLAG)))


def _sort(c: _Context, op: Op) -> Instruction:
    x = c.pick(ALL_DTYPES, min_rank=1)
    others = [c.value_of(Shape(c.draw(st.sampled_from(ALL_DTYPES)), x.shape.dims))
              for _ in range(c.draw(st.integers(0, 2)))]
    operands = [x, *others]
    return c.add(c.builder.sort(
        *operands,
        dimension=c.draw(st.integers(0, x.shape.rank - 1)),
        is_stable=c.draw(FLAG),
        num_keys=c.draw(st.integers(1, len(operands))),
    ))


def _top_k(c: _Context, op: Op) -> Instruction:
    x = c.pick(NUMERIC, min_rank=1)
    axis = c.draw(st.integers(0, x.shape.rank - 1))
    return c.add(c.builder.top_k(x, k=c.draw(st.integers(0, x.shape.dims[axis])), axis=axis))


def _indices(c: _Context, count: int) -> Instruction:
    batch = c.draw(dims_of_rank(c.draw(st.integers(0, 2))))
    return c.value_of(Shape(c.draw(st.sampled_from(INTEGERS)), (*batch, count)))


def _window(c: _Context, x: Shape):
    """(dims indexed, in index-vector order; the subset of them with a unit window left out of
    the result; the window size of every dimension)."""
    indexed = c.draw(st.permutations(range(x.rank)))[: c.draw(st.integers(0, x.rank))]
    dropped = sorted(d for d in indexed if x.dims[d] >= 1 and c.draw(st.booleans()))
    sizes = [1 if d in dropped else c.draw(st.integers(min(1, n), n)) for d, n in enumerate(x.dims)]
    return tuple(indexed), tuple(dropped), tuple(sizes)


def _positions(c: _Context, count: int, rank: int) -> tuple[int, ...]:
    """`count` sorted positions among `rank`."""
    return tuple(sorted(c.draw(st.permutations(range(rank)))[:count]))


def _gather(c: _Context, op: Op) -> Instruction:
    x = c.pick(ALL_DTYPES, min_rank=1)
    indexed, collapsed, sizes = _window(c, x.shape)
    indices = _indices(c, len(indexed))
    kept = x.shape.rank - len(collapsed)
    offset = _positions(c, kept, indices.shape.rank - 1 + kept)
    mode = c.draw(st.sampled_from(GATHER_MODES))
    fill = [c.value_of(Shape(x.shape.dtype, ()))] if mode == "fill_or_drop" else []
    return c.add(c.builder.gather(
        x, indices, *fill, offset_dims=offset, collapsed_slice_dims=collapsed, start_index_map=indexed,
        slice_sizes=sizes, mode=mode,
    ))


def _scatter(c: _Context, op: Op) -> Instruction:
    combine = c.draw(st.sampled_from(SCATTER_COMBINERS))
    x = c.pick(ALL_DTYPES if combine in ("set", "min", "max") else NUMERIC, min_rank=1)
    indexed, inserted, sizes = _window(c, x.shape)
    indices = _indices(c, len(indexed))
    window = [sizes[d] for d in range(x.shape.rank) if d not in inserted]
    batch = indices.shape.dims[:-1]
    rank = len(batch) + len(window)
    window_dims = _positions(c, len(window), rank)
    dims, batch_it, window_it = [], iter(batch), iter(window)
    for d in range(rank):
        dims.append(next(window_it) if d in window_dims else next(batch_it))
    updates = c.value_of(Shape(x.shape.dtype, tuple(dims)))
    return c.add(c.builder.scatter(
        x, indices, updates, update_window_dims=window_dims, inserted_window_dims=inserted,
        scatter_dims_to_operand_dims=indexed, mode=c.draw(st.sampled_from(GATHER_MODES)), combine=combine,
    ))


def _host_flip(*xs):
    """The host function random callbacks call: each operand reversed, copied."""
    return tuple(np.flip(x).copy() for x in xs)


def _callback(c: _Context, op: Op) -> Instruction:
    xs = [c.pick(ALL_DTYPES) for _ in range(c.draw(st.integers(1, 2)))]
    shape = xs[0].shape if len(xs) == 1 and c.draw(st.booleans()) else TupleShape(tuple(x.shape for x in xs))
    return c.add(c.builder.callback(*xs, callback=callbacks.register(_host_flip), shape=shape))


DATA_RECIPES = {
    **{op: _cumulative for op in (Op.CUMSUM, Op.CUMPROD, Op.CUMMAX, Op.CUMMIN)},
    Op.SORT: _sort,
    Op.TOP_K: _top_k,
    Op.GATHER: _gather,
    Op.SCATTER: _scatter,
    Op.CALLBACK: _callback,
}
