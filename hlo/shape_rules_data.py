"""Shape rules of the data ops: cumulative ops, sort, top_k, gather and scatter.

Same signature as `shape_rules.py`: `rule(operands, attrs, result) -> shape`, or `ShapeError`.
Gather and scatter follow `jax.lax`'s dimension numbers with the index vector in the last
dimension of the indices (as jax.numpy always emits them); a gather in `fill_or_drop` mode takes
its fill value as a third, scalar operand. Imports numpy-free modules of this package only.
"""

from __future__ import annotations

from collections.abc import Sequence

from .dtypes import DType, Shape, TupleShape
from .shape_rules import ShapeError, _array, _check_axes, _dtype_class_check

GATHER_MODES = ("clip", "fill_or_drop", "promise_in_bounds")
SCATTER_COMBINERS = ("set", "add", "mul", "min", "max")


def cumulative(allowed: str):
    def rule(operands, attrs, result):
        x = _array(operands[0], "the operand")
        _dtype_class_check(allowed, "the operand", x.dtype)
        _check_axes([attrs["axis"]], x.rank, "axis")
        return x

    return rule


def sort(operands, attrs, result):
    xs = [_array(s, f"operand {i}") for i, s in enumerate(operands)]
    if not xs:
        raise ShapeError("sort needs at least one operand")
    _check_axes([attrs["dimension"]], xs[0].rank, "dimension")
    for x in xs[1:]:
        if x.dims != xs[0].dims:
            raise ShapeError(f"sort operands {xs[0]} and {x} differ in dimensions")
    if not 1 <= attrs["num_keys"] <= len(xs):
        raise ShapeError(f"num_keys={attrs['num_keys']} must be in 1..{len(xs)} (the operand count)")
    return xs[0] if len(xs) == 1 else TupleShape(tuple(xs))


def top_k(operands, attrs, result):
    x = _array(operands[0], "the operand")
    _dtype_class_check("numeric", "the operand", x.dtype)
    axis, k = attrs["axis"], attrs["k"]
    _check_axes([axis], x.rank, "axis")
    if not 0 <= k <= x.dims[axis]:
        raise ShapeError(f"k={k} out of range for dimension {axis} of {x}")
    dims = x.dims[:axis] + (k,) + x.dims[axis + 1 :]
    return TupleShape((x.with_dims(dims), Shape(DType.S32, dims)))


def _sorted_unique(values: Sequence[int], what: str) -> None:
    if list(values) != sorted(set(values)):
        raise ShapeError(f"{what} {tuple(values)} must be sorted and without duplicates")


def _indices(shape, what: str) -> Shape:
    i = _array(shape, what)
    if not i.dtype.is_integer or i.rank < 1:
        raise ShapeError(f"{what} {i} must be integers with the index vector as the last dimension")
    return i


def _batching(operand: Shape, indices: Shape, operand_dims, indices_dims, what: str) -> None:
    if len(operand_dims) != len(indices_dims):
        raise ShapeError(f"operand_batching_dims {operand_dims} and {what} {indices_dims} differ in length")
    _check_axes(operand_dims, operand.rank, "operand_batching_dims")
    _check_axes(indices_dims, indices.rank - 1, what)
    for a, b in zip(operand_dims, indices_dims):
        if operand.dims[a] != indices.dims[b]:
            raise ShapeError(f"batching dimension {a} of {operand} and {b} of {indices} differ")


def gather(operands, attrs, result):
    if len(operands) not in (2, 3):
        raise ShapeError(f"gather takes an operand, indices and (fill_or_drop) a fill value, got {len(operands)}")
    x = _array(operands[0], "the operand")
    idx = _indices(operands[1], "the indices")
    mode = attrs["mode"]
    if (len(operands) == 3) != (mode == "fill_or_drop"):
        raise ShapeError(f"a fill value operand is given exactly in mode fill_or_drop, not {mode}")
    if len(operands) == 3:
        fill = _array(operands[2], "the fill value")
        if fill.rank != 0 or fill.dtype != x.dtype:
            raise ShapeError(f"fill value {fill} must be a scalar of dtype {x.dtype}")
    offset, collapsed, start_map = attrs["offset_dims"], attrs["collapsed_slice_dims"], attrs["start_index_map"]
    batching, sizes = attrs["operand_batching_dims"], attrs["slice_sizes"]
    if len(sizes) != x.rank:
        raise ShapeError(f"slice_sizes {sizes} need one entry per dimension of {x}")
    for d, (s, n) in enumerate(zip(sizes, x.dims)):
        if not 0 <= s <= n:
            raise ShapeError(f"slice size {s} out of range for dimension {d} of {x}")
    if idx.dims[-1] != len(start_map):
        raise ShapeError(f"start_index_map {start_map} needs {idx.dims[-1]} entries, the index vector of {idx}")
    _check_axes(start_map, x.rank, "start_index_map")
    _check_axes(list(collapsed) + list(batching), x.rank, "collapsed_slice_dims and operand_batching_dims")
    _sorted_unique(collapsed, "collapsed_slice_dims")
    _sorted_unique(batching, "operand_batching_dims")
    if set(start_map) & set(batching):
        raise ShapeError(f"start_index_map {start_map} and operand_batching_dims {batching} overlap")
    for d in list(collapsed) + list(batching):
        if sizes[d] != 1:
            raise ShapeError(f"collapsed or batching dimension {d} needs slice size 1, got {sizes[d]}")
    _batching(x, idx, batching, attrs["start_indices_batching_dims"], "start_indices_batching_dims")
    kept = [sizes[d] for d in range(x.rank) if d not in collapsed and d not in batching]
    batch = idx.dims[:-1]
    rank = len(batch) + len(kept)
    if len(offset) != len(kept):
        raise ShapeError(f"offset_dims {offset} need {len(kept)} entries (the uncollapsed slice dims)")
    _check_axes(offset, rank, "offset_dims")
    _sorted_unique(offset, "offset_dims")
    dims, batch_it, kept_it = [], iter(batch), iter(kept)
    for d in range(rank):
        dims.append(next(kept_it) if d in offset else next(batch_it))
    return x.with_dims(tuple(dims))


def scatter(operands, attrs, result):
    x = _array(operands[0], "the operand")
    idx = _indices(operands[1], "the indices")
    updates = _array(operands[2], "the updates")
    if updates.dtype != x.dtype:
        raise ShapeError(f"updates {updates} and operand {x} differ in dtype")
    if attrs["combine"] != "set":
        _dtype_class_check("numeric" if attrs["combine"] in ("add", "mul") else "any", "the operand", x.dtype)
    window, inserted = attrs["update_window_dims"], attrs["inserted_window_dims"]
    to_operand, batching = attrs["scatter_dims_to_operand_dims"], attrs["operand_batching_dims"]
    if idx.dims[-1] != len(to_operand):
        raise ShapeError(
            f"scatter_dims_to_operand_dims {to_operand} needs {idx.dims[-1]} entries, the index vector of {idx}"
        )
    _check_axes(to_operand, x.rank, "scatter_dims_to_operand_dims")
    _check_axes(list(inserted) + list(batching), x.rank, "inserted_window_dims and operand_batching_dims")
    _sorted_unique(inserted, "inserted_window_dims")
    _sorted_unique(batching, "operand_batching_dims")
    _sorted_unique(window, "update_window_dims")
    _check_axes(window, updates.rank, "update_window_dims")
    _batching(x, idx, batching, attrs["scatter_indices_batching_dims"], "scatter_indices_batching_dims")
    free = [d for d in range(x.rank) if d not in inserted and d not in batching]
    if len(window) != len(free):
        raise ShapeError(f"update_window_dims {window} need {len(free)} entries for {x}")
    scatter_dims = [updates.dims[d] for d in range(updates.rank) if d not in window]
    if tuple(scatter_dims) != idx.dims[:-1]:
        raise ShapeError(f"updates {updates} do not match the index dims {idx.dims[:-1]} of {idx}")
    for w, d in zip(window, free):
        if updates.dims[w] > x.dims[d]:
            raise ShapeError(f"update window dimension {w} of {updates} exceeds dimension {d} of {x}")
    return x


def callback(operands, attrs, result):
    """callback: the declared array its function returns, or tuple of them."""
    arrays = result.elements if isinstance(result, TupleShape) else (result,)
    if not all(isinstance(s, Shape) for s in arrays):
        raise ShapeError("a callback's result must be given: an array, or a tuple of arrays")
    if attrs["callback"] < 0:
        raise ShapeError(f"callback={attrs['callback']} is not a callback number")
    return result
