"""Library steps: the data ops (cumulative ops, sort, top_k, gather, scatter) and broadcasts,
slices and concatenations standing alone as numpy calls, for programs that the numba and C
backends lower and AOT artifacts load with numpy alone.

A program step `{"op": "library", "fn": NAME, "attrs": {...}, "specs": [...]}` runs
`FUNCTIONS[NAME](inputs, attrs)`, whose arrays go into the step's output buffers (a function
marked `writes` takes the buffers and writes them itself). The semantics
are the reference interpreter's (`xfuse.hlo.reference_data`, which this package may not import):
floats accumulate in float64 and round once per output, sort is stable in lax.sort's order (NaN
last, -0.0 equal to +0.0), top_k orders by the bits (-NaN first, -0.0 < +0.0), a gather clamps
its window starts (or fills a window not wholly in bounds), a scatter clamps or drops windows
and applies updates in order (duplicates combine; for `set` the last wins). Imports numpy and
the standard library only.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

F64 = np.float64


def _is_float(a: np.ndarray) -> bool:
    return a.dtype.kind == "f" or a.dtype.name == "bfloat16"


# ---------------------------------------------------------------------------- min and max
def maximum(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """lax.max: NaN propagates, -0.0 < +0.0."""
    if x.dtype == np.bool_:
        return np.logical_or(x, y)
    r = np.maximum(x, y)
    return np.where((x == 0) & (y == 0), x + y, r).astype(x.dtype) if _is_float(x) else r


def minimum(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    if x.dtype == np.bool_:
        return np.logical_and(x, y)
    r = np.minimum(x, y)
    return np.where((x == 0) & (y == 0), -((-x) + (-y)), r).astype(x.dtype) if _is_float(x) else r


# ---------------------------------------------------------------------------- cumulative
def _cumulative(fn: Callable) -> Callable:
    def run(inputs, attrs):
        x = inputs[0]
        axis, reverse = attrs["axis"], attrs["reverse"]
        x = np.flip(x, axis) if reverse else x
        out = np.asarray(fn(x, axis)).astype(x.dtype, copy=False)
        return [np.flip(out, axis) if reverse else out]

    return run


def _cumsum(x, axis):
    if _is_float(x):
        return np.cumsum(np.asarray(x, F64), axis=axis).astype(x.dtype)
    return np.cumsum(x, axis=axis, dtype=x.dtype)


def _cumprod(x, axis):
    if _is_float(x):
        return np.cumprod(np.asarray(x, F64), axis=axis).astype(x.dtype)
    return np.cumprod(x, axis=axis, dtype=x.dtype)


def _extreme(largest: bool) -> Callable:
    def fn(x, axis):
        if x.dtype == np.bool_:
            return (np.logical_or if largest else np.logical_and).accumulate(x, axis=axis)
        if not _is_float(x):
            return (np.maximum if largest else np.minimum).accumulate(x, axis=axis)
        wide = np.asarray(x, F64)
        r = (np.maximum if largest else np.minimum).accumulate(wide, axis=axis)
        wanted = (wide == 0) & (np.signbit(wide) != largest)
        seen = np.logical_or.accumulate(wanted, axis=axis)
        return np.where(r == 0, np.where(seen == largest, 0.0, -0.0), r).astype(x.dtype)

    return fn


# ---------------------------------------------------------------------------- sort, top_k
def _total_order_bits(x: np.ndarray) -> np.ndarray:
    """int64 keys ordering floats by their bits: -NaN < -inf < ... < -0.0 < +0.0 < ... < NaN."""
    bits = np.ascontiguousarray(x).view(f"i{x.dtype.itemsize}").astype(np.int64)
    magnitude = bits & np.int64(2 ** (8 * x.dtype.itemsize - 1) - 1)
    return np.where(bits < 0, -magnitude - 1, bits)


def _sort_key(x: np.ndarray) -> np.ndarray:
    if x.dtype == np.bool_:
        return x.astype(np.uint8)
    if not _is_float(x):
        return x
    wide = np.asarray(x, F64)
    return _total_order_bits(np.where(wide == 0, 0.0, np.where(np.isnan(wide), np.nan, wide)))


def sort(inputs, attrs):
    axis, num_keys = attrs["dimension"], attrs["num_keys"]
    keys = [_sort_key(k) for k in inputs[:num_keys]]
    order = np.lexsort(keys[::-1], axis=axis)
    return [np.take_along_axis(x, order, axis=axis) for x in inputs]


def top_k(inputs, attrs):
    x = inputs[0]
    axis, k = attrs["axis"], attrs["k"]
    key = _total_order_bits(x) if _is_float(x) else x
    descending = np.iinfo(np.uint64).max - key if key.dtype == np.uint64 else ~key.astype(np.int64)
    order = np.take(np.argsort(descending, axis=axis, kind="stable"), np.arange(k), axis=axis)
    return [np.take_along_axis(x, order, axis=axis), order.astype(np.int32)]


# ---------------------------------------------------------------------------- gather, scatter
def _starts(indices: np.ndarray) -> np.ndarray:
    if indices.dtype == np.uint64:
        indices = np.minimum(indices, np.uint64(np.iinfo(np.int64).max))
    return indices.astype(np.int64)


def _window_starts(dims, indices, start_map, batching, indices_batching, window):
    batch = indices.shape[:-1]
    starts = [np.zeros(batch, np.int64) for _ in dims]
    inside = np.ones(batch, bool)
    for k, d in enumerate(start_map):
        s = indices[..., k]
        inside &= (s >= 0) & (s <= dims[d] - window[d])
        starts[d] = np.clip(s, 0, dims[d] - window[d])
    for d, b in zip(batching, indices_batching):
        shape = [1] * len(batch)
        shape[b] = batch[b]
        starts[d] = np.broadcast_to(np.arange(batch[b]).reshape(shape), batch)
    return starts, inside


def _spread(array: np.ndarray, rank: int, window_dims) -> np.ndarray:
    shape, it = [], iter(array.shape)
    for d in range(rank):
        shape.append(1 if d in window_dims else next(it))
    return array.reshape(shape)


def _ramp(size: int, at: int, rank: int) -> np.ndarray:
    shape = [1] * rank
    shape[at] = size
    return np.arange(size).reshape(shape)


def _row_gather(x, indices, attrs) -> np.ndarray | None:
    """x[idx] along one axis (an embedding lookup, x[:, idx], jnp.take): np.take, or None
    when the gather is not of that form."""
    (d,) = attrs["start_index_map"] if len(attrs["start_index_map"]) == 1 else (None,)
    if d is None or list(attrs["collapsed_slice_dims"]) != [d] or len(attrs["operand_batching_dims"]):
        return None
    sizes = attrs["slice_sizes"]
    if any(s != n for i, (s, n) in enumerate(zip(sizes, x.shape)) if i != d):
        return None
    batch = indices.ndim - 1
    if list(attrs["offset_dims"]) != [i for i in range(x.ndim - 1 + batch) if i < d or i >= d + batch]:
        return None
    positions = np.clip(_starts(indices[..., 0]), 0, x.shape[d] - 1)
    return np.take(x, positions, axis=d)


def fill_mode_indices(indices: np.ndarray, dims) -> np.ndarray:
    """jax first converts a fill-mode gather's indices, wrapping, to int32 (int64 when a
    dimension passes 2**31 - 1): an s64 index of -2**63 reads element 0."""
    wide = any(d > np.iinfo(np.int32).max for d in dims)
    return indices.astype(np.int64 if wide else np.int32)


def gather(inputs, attrs):
    x, indices = inputs[0], inputs[1]
    mode = attrs["mode"]
    if mode != "fill_or_drop" and x.ndim:
        fast = _row_gather(x, indices, attrs)
        if fast is not None:
            return [fast]
    if mode == "fill_or_drop":
        indices = fill_mode_indices(indices, x.shape)
    indices = _starts(indices)
    sizes, offset = attrs["slice_sizes"], attrs["offset_dims"]
    collapsed, batching = attrs["collapsed_slice_dims"], attrs["operand_batching_dims"]
    starts, inside = _window_starts(
        x.shape, indices, attrs["start_index_map"], batching, attrs["start_indices_batching_dims"], sizes
    )
    rank = indices.ndim - 1 + len(offset)
    kept = [d for d in range(x.ndim) if d not in collapsed and d not in batching]
    where = dict(zip(kept, offset))
    out_dims = list(indices.shape[:-1])
    for o, d in zip(offset, kept):
        out_dims.insert(o, sizes[d])
    index = []
    for d in range(x.ndim):
        start = _spread(starts[d], rank, offset)
        index.append(start + _ramp(sizes[d], where[d], rank) if d in where else start)
    result = x[tuple(np.broadcast_to(i, out_dims) for i in index)] if x.ndim else np.broadcast_to(x, out_dims)
    if mode == "fill_or_drop":
        result = np.where(_spread(inside, rank, offset), result, inputs[2])
    return [result]


def _targets(x_dims, indices, updates_dims, attrs):
    window_dims, inserted = attrs["update_window_dims"], attrs["inserted_window_dims"]
    batching = attrs["operand_batching_dims"]
    free = [d for d in range(len(x_dims)) if d not in inserted and d not in batching]
    window = [1] * len(x_dims)
    for w, d in zip(window_dims, free):
        window[d] = updates_dims[w]
    starts, inside = _window_starts(x_dims, indices, attrs["scatter_dims_to_operand_dims"], batching,
                                    attrs["scatter_indices_batching_dims"], window)
    rank = len(updates_dims)
    where = dict(zip(free, window_dims))
    full = []
    for d in range(len(x_dims)):
        start = _spread(starts[d], rank, window_dims)
        full.append(np.broadcast_to(start + _ramp(window[d], where[d], rank) if d in where else start,
                                    updates_dims).reshape(-1))
    size = int(np.prod(updates_dims, dtype=np.int64))
    flat = np.ravel_multi_index(full, x_dims) if x_dims else np.zeros(size, np.int64)
    if attrs["mode"] == "clip":
        return flat, None
    return flat, np.broadcast_to(_spread(inside, rank, window_dims), updates_dims).reshape(-1)


def _rounds(flat: np.ndarray) -> list[np.ndarray]:
    """Positions of `flat` in rounds holding each value once, the k-th occurrence in round k."""
    if flat.size == 0:
        return []
    order = np.argsort(flat, kind="stable")
    ordered = flat[order]
    starts = np.r_[0, np.flatnonzero(ordered[1:] != ordered[:-1]) + 1]
    rank = np.arange(ordered.size) - np.repeat(starts, np.diff(np.r_[starts, ordered.size]))
    by_rank = np.argsort(rank, kind="stable")
    bounds = np.r_[0, np.cumsum(np.bincount(rank))]
    return [order[by_rank[bounds[k] : bounds[k + 1]]] for k in range(len(bounds) - 1)]


COMBINE = {
    "add": lambda old, new: (old + new).astype(old.dtype),
    "mul": lambda old, new: (old * new).astype(old.dtype),
    "min": minimum,
    "max": maximum,
}
AT = {"add": np.add, "mul": np.multiply}


def _combine_rows(out2: np.ndarray, rows: np.ndarray, values: np.ndarray, kind: str) -> None:
    """out2[rows[k]] combined with values[k] in order of k, a round of distinct rows at a time."""
    if kind == "set":
        last = rows.size - 1 - np.unique(rows[::-1], return_index=True)[1]
        out2[rows[last]] = values[last]
        return
    for positions in _rounds(rows):
        at = rows[positions]
        out2[at] = COMBINE[kind](out2[at], values[positions])


def _row_scatter(x, indices, updates, attrs) -> np.ndarray | None:
    """A scatter of whole rows (the gradient of an embedding lookup, x.at[i].add(rows)): each
    index vector picks a row along the inserted dims and its window is the rest of the operand,
    so distinct rows never overlap and the updates apply a row at a time. None when the
    scatter is not of that form."""
    inserted, to_operand = list(attrs["inserted_window_dims"]), list(attrs["scatter_dims_to_operand_dims"])
    if len(attrs["operand_batching_dims"]) or sorted(to_operand) != inserted or not inserted:
        return None
    free = [d for d in range(x.ndim) if d not in inserted]
    window_dims = list(attrs["update_window_dims"])
    if [updates.shape[w] for w in window_dims] != [x.shape[d] for d in free]:
        return None
    scatter_dims = [d for d in range(updates.ndim) if d not in window_dims]
    width = int(np.prod([x.shape[d] for d in free], dtype=np.int64))
    count = int(np.prod(indices.shape[:-1], dtype=np.int64))
    values = np.transpose(updates, scatter_dims + window_dims).reshape(count, width)
    starts = _starts(indices).reshape(-1, len(to_operand))
    limits = np.array([x.shape[d] for d in to_operand], np.int64)
    inside = np.all((starts >= 0) & (starts < limits), axis=1)
    starts = np.clip(starts, 0, limits - 1)
    if attrs["mode"] != "clip":
        starts, values = starts[inside], values[inside]
    order = [to_operand.index(d) for d in inserted]
    rows = np.ravel_multi_index(tuple(starts[:, k] for k in order), [x.shape[d] for d in inserted])
    moved = np.transpose(x, inserted + free)
    out2 = np.array(moved).reshape(int(np.prod([x.shape[d] for d in inserted], dtype=np.int64)), width)
    _combine_rows(out2, rows, values, attrs["combine"])
    return np.transpose(out2.reshape(moved.shape), np.argsort(inserted + free))


def scatter(inputs, attrs):
    x, indices, updates = inputs
    if x.size == 0 or updates.size == 0:
        return [x.copy()]
    if x.ndim:
        fast = _row_scatter(x, indices, updates, attrs)
        if fast is not None:
            return [fast]
    flat, applied = _targets(x.shape, _starts(indices), updates.shape, attrs)
    values = updates.reshape(-1)
    if applied is not None:
        flat, values = flat[applied], values[applied]
    out = np.array(x).reshape(-1)
    kind = attrs["combine"]
    if kind == "set":  # the last update of each position wins
        last = flat.size - 1 - np.unique(flat[::-1], return_index=True)[1]
        out[flat[last]] = values[last]
    elif kind in AT and out.dtype.name != "bfloat16" and out.dtype != np.bool_:
        AT[kind].at(out, flat, values)  # in order, rounding at each step
    else:
        for positions in _rounds(flat):
            at = flat[positions]
            out[at] = COMBINE[kind](out[at], values[positions])
    return [out.reshape(x.shape)]


# ---------------------------------------------------------------------------- broadcast
def broadcast(inputs, attrs):
    """broadcast_in_dim: operand dimension i becomes result dimension dims[i] (of its size, or
    expanded from 1); a view, which the step copies into its buffer (a fill, for a scalar)."""
    (x,) = inputs
    operand, dims = attrs["operand"], attrs["dims"]
    x = np.asarray(x).reshape(operand)  # a scalar may arrive as a one-element vector
    order = sorted(range(len(dims)), key=lambda i: dims[i])
    x = x.transpose(order)
    shape = [1] * len(attrs["out"])
    for axis, i in enumerate(order):
        shape[dims[i]] = x.shape[axis]
    return [np.broadcast_to(x.reshape(shape), attrs["out"])]


def slices(inputs, attrs):
    """Each output a slice of an input: [input index, starts, limits, strides] (views, which
    the step copies into its buffers)."""
    return [inputs[k][tuple(slice(a, b, c) for a, b, c in zip(start, limit, strides))]
            for k, start, limit, strides in attrs["slices"]]


def concatenate(inputs, attrs, outputs):
    """The inputs named by `operands`, in order, one after another along `axis`, copied
    straight into the output."""
    (out,) = outputs
    axis, at = attrs["axis"], 0
    for k in attrs["operands"]:
        x = inputs[k]
        size = x.shape[axis]
        out[(slice(None),) * axis + (slice(at, at + size),)] = x
        at += size


concatenate.writes = True  # into the step's buffers: no result arrays to copy


FUNCTIONS: dict[str, Callable[[Sequence[np.ndarray], dict], list[np.ndarray]]] = {
    "broadcast": broadcast,
    "slice": slices,
    "concatenate": concatenate,
    "cumsum": _cumulative(_cumsum),
    "cumprod": _cumulative(_cumprod),
    "cummax": _cumulative(_extreme(largest=True)),
    "cummin": _cumulative(_extreme(largest=False)),
    "sort": sort,
    "top_k": top_k,
    "gather": gather,
    "scatter": scatter,
}


def library_run(step: dict) -> Callable:
    """run(inputs, outputs) for a library step."""
    name = step["fn"]
    if name not in FUNCTIONS:
        raise ValueError(f"step {step.get('name')!r}: no library function {name!r}")
    fn, attrs = FUNCTIONS[name], step["attrs"]
    if getattr(fn, "writes", False):
        return lambda inputs, outputs: fn(inputs, attrs, outputs)

    def run(inputs, outputs):
        with np.errstate(all="ignore"):
            results = fn(inputs, attrs)
        for out, result in zip(outputs, results):
            out[...] = result

    return run


def view_run(step: dict) -> Callable:
    """run(inputs) -> [the views], for a slice or broadcast step run as an alias step: its
    results are the views `slices` and `broadcast` make, not copied into buffers (a tuple of
    them for a step of several outputs in one value)."""
    name = step["fn"]
    if name not in VIEWS:
        raise ValueError(f"step {step.get('name')!r}: {name!r} makes no views")
    fn, attrs = FUNCTIONS[name], step["attrs"]
    if len(step["outputs"]) == 1 and len(step["specs"]) > 1:
        return lambda inputs: [tuple(fn(inputs, attrs))]
    return lambda inputs: fn(inputs, attrs)


def callback_run(step: dict) -> Callable:
    """run(inputs, outputs) for a host callback step: its function gets copies of the inputs
    (it may keep them; the runtime reuses its buffers), in their own shapes (a native loop's
    scalars are one-element vectors), and returns one array per output."""
    fn, specs, operand_dims = step["function"], step["specs"], [tuple(d) for d in step["operand_dims"]]

    def run(inputs, outputs):
        results = fn(*(np.array(x).reshape(d) for x, d in zip(inputs, operand_dims)))
        results = tuple(results) if isinstance(results, (tuple, list)) else (results,)
        if len(results) != len(specs):
            raise TypeError(f"{step['label']} returned {len(results)} values, expected {len(specs)}")
        for k, (out, result, (dims, dtype)) in enumerate(zip(outputs, results, specs)):
            result = np.asarray(result)
            if result.shape != tuple(dims):
                raise TypeError(f"{step['label']}: result {k} has shape {result.shape}, expected {tuple(dims)}")
            out[...] = result.astype(dtype, copy=False)

    return run


VIEWS = frozenset({"slice", "broadcast"})  # the functions whose results are views of their inputs
__all__ = ["FUNCTIONS", "VIEWS", "callback_run", "library_run", "view_run"]
