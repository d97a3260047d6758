"""numpy references of the data ops, with `jax.lax` semantics as XLA:CPU runs them.

- cumsum/cumprod: floats in float64, each output rounded once (XLA's windowed sums round more
  often; the tests allow for it); integers wrap in their dtype. cummax/cummin propagate NaN and
  order -0.0 < +0.0, as max and min do.
- sort: stable and lexicographic over the first `num_keys` operands, in lax.sort's order: NaNs
  of either sign last, -0.0 equal to +0.0 (so a stable sort keeps their input order).
- top_k: descending in the order of the bits: -NaN < -inf < ... < -0.0 < +0.0 < ... < +NaN,
  ties to the lower index, as XLA's TopK.
- gather: `clip` and `promise_in_bounds` clamp each start index into [0, dim - slice size] (what
  XLA's gather does); `fill_or_drop` gives the fill value for a window not wholly in bounds, the
  indices first wrapped to s32 as jax does (`fill_mode_indices`).
- scatter: `clip` clamps the window starts; `fill_or_drop` and `promise_in_bounds` drop a window
  not wholly in bounds (XLA's scatter). Updates apply one after the other in row-major order of
  the updates, rounding at each step, so duplicate indices combine all their updates (add, mul,
  min, max) and for `set` the last one wins, as XLA:CPU's scatter loop does.
The index vector is the last dimension of the indices. Imports numpy only.
"""

from __future__ import annotations

import numpy as np

from . import callbacks
from .dtypes import DType, TupleShape
from .reference import maximum, minimum

F64 = np.float64


def _is_float(a: np.ndarray) -> bool:
    return DType.from_numpy(a.dtype).is_float


# ---------------------------------------------------------------------------- cumulative
def _oriented(fn):
    """fn(x, axis) over `axis`, from its end when `reverse`."""

    def ref(ops, attrs, shape):
        (x,) = ops
        axis, reverse = attrs["axis"], attrs["reverse"] == "true"
        x = np.flip(x, axis) if reverse else x
        out = np.asarray(fn(x, axis)).astype(x.dtype, copy=False)
        return np.ascontiguousarray(np.flip(out, axis) if reverse else out)

    return ref


def _cumsum(x, axis):
    if _is_float(x):
        return np.cumsum(np.asarray(x, F64), axis=axis).astype(x.dtype)
    return np.cumsum(x, axis=axis, dtype=x.dtype)


def _cumprod(x, axis):
    if _is_float(x):
        return np.cumprod(np.asarray(x, F64), axis=axis).astype(x.dtype)
    return np.cumprod(x, axis=axis, dtype=x.dtype)


def _cumulative_extreme(largest: bool):
    def fn(x, axis):
        if x.dtype == np.bool_:
            return (np.logical_or if largest else np.logical_and).accumulate(x, axis=axis)
        if not _is_float(x):
            return (np.maximum if largest else np.minimum).accumulate(x, axis=axis)
        wide = np.asarray(x, F64)
        r = (np.maximum if largest else np.minimum).accumulate(wide, axis=axis)
        # -0.0 < +0.0: a zero maximum is +0.0 once a +0.0 was seen, a zero minimum -0.0 once
        # a -0.0 was
        wanted = (wide == 0) & (np.signbit(wide) != largest)
        seen = np.logical_or.accumulate(wanted, axis=axis)
        zero = np.where(seen == largest, 0.0, -0.0)
        return np.where(r == 0, zero, r).astype(x.dtype)

    return fn


CUMSUM = _oriented(_cumsum)
CUMPROD = _oriented(_cumprod)
CUMMAX = _oriented(_cumulative_extreme(largest=True))
CUMMIN = _oriented(_cumulative_extreme(largest=False))


# ---------------------------------------------------------------------------- sort, top_k
def _total_order_bits(x: np.ndarray) -> np.ndarray:
    """int64 keys ordering floats by their bits: -NaN < -inf < ... < -0.0 < +0.0 < ... < NaN."""
    bits = np.ascontiguousarray(x).view(f"i{x.dtype.itemsize}").astype(np.int64)
    magnitude = bits & np.int64(2 ** (8 * x.dtype.itemsize - 1) - 1)
    return np.where(bits < 0, -magnitude - 1, bits)


def sort_key(x: np.ndarray) -> np.ndarray:
    """The key lax.sort compares: zeros as +0.0, every NaN as +NaN (so NaNs sort last)."""
    if x.dtype == np.bool_:
        return x.astype(np.uint8)
    if not _is_float(x):
        return x
    wide = np.asarray(x, F64)
    wide = np.where(wide == 0, 0.0, np.where(np.isnan(wide), np.nan, wide))
    return _total_order_bits(wide)


def sort(ops, attrs, shape):
    axis, num_keys = attrs["dimension"], attrs["num_keys"]
    keys = [sort_key(np.asarray(k)) for k in ops[:num_keys]]
    order = np.lexsort(keys[::-1], axis=axis)  # stable; its last key is the primary one
    results = [np.take_along_axis(x, order, axis=axis) for x in ops]
    return results[0] if len(ops) == 1 else tuple(results)


def top_k(ops, attrs, shape):
    (x,) = ops
    axis, k = attrs["axis"], attrs["k"]
    key = _total_order_bits(x) if _is_float(x) else np.asarray(x)
    if key.dtype == np.uint64:
        descending = np.iinfo(np.uint64).max - key
    else:
        descending = ~key.astype(np.int64)  # -(key + 1), with no overflow at either end
    order = np.argsort(descending, axis=axis, kind="stable")
    order = np.take(order, np.arange(k), axis=axis)
    return np.take_along_axis(x, order, axis=axis), order.astype(np.int32)


# ---------------------------------------------------------------------------- gather, scatter
def _starts(indices: np.ndarray) -> np.ndarray:
    """Indices as int64 (those of an unsigned 64-bit type past int64 saturated)."""
    if indices.dtype == np.uint64:
        indices = np.minimum(indices, np.uint64(np.iinfo(np.int64).max))
    return indices.astype(np.int64)


def _window_starts(operand_dims, indices, start_map, batching, indices_batching, window):
    """Per operand dimension, the window start of each index vector (shape: the batch dims),
    and whether the window lies wholly in bounds."""
    batch = indices.shape[:-1]
    starts = [np.zeros(batch, np.int64) for _ in operand_dims]
    inside = np.ones(batch, bool)
    for k, d in enumerate(start_map):
        s = indices[..., k]
        inside &= (s >= 0) & (s <= operand_dims[d] - window[d])
        starts[d] = np.clip(s, 0, operand_dims[d] - window[d])
    for d, b in zip(batching, indices_batching):
        shape = [1] * len(batch)
        shape[b] = batch[b]
        starts[d] = np.broadcast_to(np.arange(batch[b]).reshape(shape), batch)
    return starts, inside


def _spread(array: np.ndarray, rank: int, window_dims) -> np.ndarray:
    """`array` over the batch dims, reshaped to `rank` dims with unit window dims."""
    shape, it = [], iter(array.shape)
    for d in range(rank):
        shape.append(1 if d in window_dims else next(it))
    return array.reshape(shape)


def _ramp(size: int, at: int, rank: int) -> np.ndarray:
    shape = [1] * rank
    shape[at] = size
    return np.arange(size).reshape(shape)


def fill_mode_indices(indices: np.ndarray, dims) -> np.ndarray:
    """jax first converts a fill-mode gather's indices, wrapping, to int32 (int64 when a
    dimension passes 2**31 - 1): an s64 index of -2**63 reads element 0."""
    wide = any(d > np.iinfo(np.int32).max for d in dims)
    return indices.astype(np.int64 if wide else np.int32)


def gather(ops, attrs, shape):
    x, indices = ops[0], ops[1]
    if attrs["mode"] == "fill_or_drop":
        indices = fill_mode_indices(indices, x.shape)
    indices = _starts(indices)
    sizes = attrs["slice_sizes"]
    collapsed, batching = attrs["collapsed_slice_dims"], attrs["operand_batching_dims"]
    offset = attrs["offset_dims"]
    starts, inside = _window_starts(
        x.shape, indices, attrs["start_index_map"], batching, attrs["start_indices_batching_dims"], sizes
    )
    rank = indices.ndim - 1 + len(offset)
    kept = [d for d in range(x.ndim) if d not in collapsed and d not in batching]
    where = {d: o for d, o in zip(kept, offset)}
    index = []
    for d in range(x.ndim):
        start = _spread(starts[d], rank, offset)
        index.append(start + _ramp(sizes[d], where[d], rank) if d in where else start)
    out_dims = tuple(shape.dims)
    result = x[tuple(np.broadcast_to(i, out_dims) for i in index)] if x.ndim else np.broadcast_to(x, out_dims)
    if attrs["mode"] == "fill_or_drop":
        result = np.where(_spread(inside, rank, offset), result, ops[2])
    return np.array(result, dtype=x.dtype)


def scatter_targets(x_dims, indices, updates_dims, attrs):
    """(the flat operand position each update element goes to, whether it is applied), both
    in the row-major order of the updates."""
    window_dims, inserted = attrs["update_window_dims"], attrs["inserted_window_dims"]
    batching = attrs["operand_batching_dims"]
    free = [d for d in range(len(x_dims)) if d not in inserted and d not in batching]
    window = [1] * len(x_dims)
    for w, d in zip(window_dims, free):
        window[d] = updates_dims[w]
    starts, inside = _window_starts(
        x_dims, indices, attrs["scatter_dims_to_operand_dims"], batching,
        attrs["scatter_indices_batching_dims"], window,
    )
    rank = len(updates_dims)
    where = dict(zip(free, window_dims))
    full = []
    for d in range(len(x_dims)):
        start = _spread(starts[d], rank, window_dims)
        full.append(start + _ramp(window[d], where[d], rank) if d in where else start)
    full = [np.broadcast_to(i, updates_dims).reshape(-1) for i in full]
    if x_dims:
        flat = np.ravel_multi_index(full, x_dims)
    else:
        flat = np.zeros(int(np.prod(updates_dims)), np.int64)
    if attrs["mode"] == "clip":
        applied = np.ones(flat.shape, bool)
    else:
        applied = np.broadcast_to(_spread(inside, rank, window_dims), updates_dims).reshape(-1)
    return flat, applied


def rounds(flat: np.ndarray) -> list[np.ndarray]:
    """The positions of `flat` split into rounds holding each value at most once, the k-th
    occurrence of a value in round k: applying the rounds in order applies every value's
    occurrences in their order."""
    if flat.size == 0:
        return []
    order = np.argsort(flat, kind="stable")
    ordered = flat[order]
    starts = np.r_[0, np.flatnonzero(ordered[1:] != ordered[:-1]) + 1]
    group_start = np.repeat(starts, np.diff(np.r_[starts, ordered.size]))
    rank = np.arange(ordered.size) - group_start
    by_rank = np.argsort(rank, kind="stable")
    bounds = np.r_[0, np.cumsum(np.bincount(rank))]
    return [order[by_rank[bounds[k] : bounds[k + 1]]] for k in range(len(bounds) - 1)]


def combine(kind: str, old: np.ndarray, new: np.ndarray) -> np.ndarray:
    if kind == "set":
        return new
    if kind == "add":
        return (old + new).astype(old.dtype)
    if kind == "mul":
        return (old * new).astype(old.dtype)
    return (maximum if kind == "max" else minimum)(old, new)


def scatter(ops, attrs, shape):
    x, indices, updates = ops[0], _starts(ops[1]), ops[2]
    if x.size == 0 or updates.size == 0:
        return x.copy()
    flat, applied = scatter_targets(x.shape, indices, updates.shape, attrs)
    values = updates.reshape(-1)[applied]
    flat = flat[applied]
    out = np.array(x).reshape(-1)
    kind = attrs["combine"]
    with np.errstate(all="ignore"):
        for positions in rounds(flat):
            at = flat[positions]
            out[at] = combine(kind, out[at], values[positions])
    return out.reshape(x.shape)


def callback(ops, attrs, shape):
    shapes = shape.elements if isinstance(shape, TupleShape) else (shape,)
    results = callbacks.call(attrs["callback"], [np.asarray(o) for o in ops], [(s.dims, s.dtype.numpy) for s in shapes])
    return results if isinstance(shape, TupleShape) else results[0]
