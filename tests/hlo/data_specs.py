"""`test_ops_vs_jax.py`'s specs for the data ops: cumulative ops, sort, top_k, gather, scatter.

Imported by test_ops_vs_jax.py once its helpers exist; the specs join its table, so each op runs
against `jax.lax` on XLA:CPU for every dtype it accepts. Indices run out of bounds at both ends
(and to the limits of their type) and repeat, for every mode and combiner.
"""

from __future__ import annotations

import numpy as np
from jax import lax

from tests.hlo.test_ops_vs_jax import (
    ACCUMULATION,
    ALL,
    NUMERIC,
    Rng,
    Spec,
    Trial,
    factors,
    shaped,
    summands,
)
from xfuse.hlo import DType, Op

MODES = {"clip": "clip", "fill_or_drop": "fill", "promise_in_bounds": "promise_in_bounds"}


def _along(fn, x: np.ndarray, axis: int, reverse: bool) -> np.ndarray:
    x = np.flip(x, axis) if reverse else x
    out = fn(x, axis=axis)
    return np.flip(out, axis) if reverse else out


def cumulative_trials(lax_fn, values, scale_fn=None):
    def trials(dtype: DType, rng: Rng) -> list[Trial]:
        out = []
        for axis in (0, 1):
            for reverse in (False, True):
                x = values(dtype, (4, 16), rng)
                scale = None
                if scale_fn is not None and dtype.is_float:
                    with np.errstate(invalid="ignore"):  # inf * 0
                        scale = _along(scale_fn, np.abs(x.astype(np.float64)), axis, reverse)
                out.append(Trial(lambda x, a=axis, r=reverse: lax_fn(x, a, reverse=r), (x,),
                                 {"axis": axis, "reverse": "true" if reverse else "false"}, scale=scale))
        return out

    return trials


def _ints_or(values):
    """`values` for floats, edge values (which wrap) for integers."""
    return lambda dtype, shape, rng: values(dtype, shape, rng) if dtype.is_float else shaped(dtype, shape, rng)


def extreme_trials(lax_fn):
    base = cumulative_trials(lax_fn, shaped)

    def trials(dtype: DType, rng: Rng) -> list[Trial]:
        out = base(dtype, rng)
        if dtype.is_float:
            zeros = np.array([[-0.0, 0.0, -0.0], [0.0, -0.0, 0.0], [-0.0, -0.0, 1.0]]).astype(dtype.numpy)
            out.append(Trial(lambda x: lax_fn(x, 1), (zeros,), {"axis": 1}, label="signed zeros"))
        return out

    return trials


def _tied(dtype: DType, shape, rng: Rng) -> np.ndarray:
    return rng.integers(0, 2 if dtype.is_pred else 3, shape).astype(dtype.numpy)


def sort_trials(dtype: DType, rng: Rng) -> list[Trial]:
    x, tied = shaped(dtype, (5, 12), rng), _tied(dtype, (5, 12), rng)
    position = np.arange(60, dtype=np.int32).reshape(5, 12)
    out = [
        Trial(lambda x, d=d: lax.sort(x, dimension=d), (x,), {"dimension": d, "is_stable": "true"})
        for d in (0, 1)
    ]
    for keys in (1, 2):
        out.append(Trial(lambda k, v, n=keys: lax.sort((k, v), dimension=1, num_keys=n), (tied, x),
                         {"dimension": 1, "is_stable": "true", "num_keys": keys}))
    out.append(Trial(lambda x, p: lax.sort((x, p), dimension=0), (x, position),
                     {"dimension": 0, "is_stable": "true"}, label="argsort"))
    return out


def top_k_trials(dtype: DType, rng: Rng) -> list[Trial]:
    x, tied = shaped(dtype, (5, 12), rng), _tied(dtype, (5, 12), rng)
    return [
        Trial(lambda x: lax.top_k(x, 4, axis=1), (x,), {"k": 4, "axis": 1}),
        Trial(lambda x: lax.top_k(x, 3, axis=0), (x,), {"k": 3, "axis": 0}),
        Trial(lambda x: lax.top_k(x, 12, axis=1), (tied,), {"k": 12, "axis": 1}, label="ties"),
    ]


def _out_of_bounds(count: int, limit: int, index_dtype: DType, rng: Rng) -> np.ndarray:
    """Indices in [-3, limit + 3], repeating, with the index type's extremes."""
    values = rng.integers(-3, limit + 4, count)
    info = np.iinfo(index_dtype.numpy)
    values[:4] = [1, 1, info.max, info.min]
    return np.clip(values, info.min, info.max).astype(index_dtype.numpy)


GATHER_LAYOUTS = [  # name, index vector -> (start_index_map, collapsed, offset, slice_sizes, batching)
    ("rows", ((0,), (0,), (1,), (1, 6), ((), ()))),
    ("columns", ((1,), (1,), (0,), (5, 1), ((), ()))),
    ("points", ((0, 1), (0, 1), (), (1, 1), ((), ()))),
    ("windows", ((1,), (), (1, 2), (5, 2), ((), ()))),
    ("batched", ((1,), (1,), (), (1, 1), ((0,), (0,)))),
]


def _gather_indices(layout: str, index_dtype: DType, rng: Rng) -> np.ndarray:
    if layout == "points":
        return np.stack([_out_of_bounds(7, 5, index_dtype, rng), _out_of_bounds(7, 6, index_dtype, rng)], -1)
    if layout == "batched":
        return _out_of_bounds(5, 6, index_dtype, rng).reshape(5, 1, 1)
    return _out_of_bounds(7, 6, index_dtype, rng).reshape(7, 1)


def gather_trials(dtype: DType, rng: Rng) -> list[Trial]:
    x = shaped(dtype, (5, 6), rng)
    fill = np.asarray(True if dtype.is_pred else 7, dtype.numpy)
    out = []
    for (layout, (start_map, collapsed, offset, sizes, (ob, ib))), index_dtype, mode in zip(
        GATHER_LAYOUTS * 3, [DType.S32] * 5 + [DType.U8, DType.S64, DType.S8, DType.S32, DType.U32] * 2,
        ["clip"] * 5 + ["fill_or_drop"] * 5 + ["promise_in_bounds"] * 5,
    ):
        numbers = lax.GatherDimensionNumbers(offset, collapsed, start_map, ob, ib)
        attrs = {"offset_dims": offset, "collapsed_slice_dims": collapsed, "start_index_map": start_map,
                 "operand_batching_dims": ob, "start_indices_batching_dims": ib, "slice_sizes": sizes,
                 "mode": mode}
        indices = _gather_indices(layout, index_dtype, rng)

        def lax_fn(x, i, n=numbers, s=sizes, m=mode):
            return lax.gather(x, i, n, s, mode=MODES[m], fill_value=fill.item() if m == "fill_or_drop" else None)

        def build(b, x, i, a=attrs):
            extra = [b.constant(fill)] if a["mode"] == "fill_or_drop" else []
            return b.emit(Op.GATHER, x, i, *extra, **a)

        out.append(Trial(lax_fn, (x, indices), attrs, label=f"{layout}, {index_dtype} indices", build=build))
    return out


SCATTERS = {"set": lax.scatter, "add": lax.scatter_add, "mul": lax.scatter_mul, "min": lax.scatter_min,
            "max": lax.scatter_max}
SCATTER_LAYOUTS = [  # name, (update_window_dims, inserted, to_operand, batching), indices, updates
    ("rows", ((1,), (0,), (0,), ((), ())), (7, 1), (7, 3)),
    ("points", ((), (0, 1), (0, 1), ((), ())), (7, 2), (7,)),
    ("windows", ((1, 2), (), (0,), ((), ())), (4, 1), (4, 2, 3)),
    ("batched", ((), (1,), (1,), ((0,), (0,))), (6, 2, 1), (6, 2)),
]


def scatter_trials(dtype: DType, rng: Rng) -> list[Trial]:
    x = shaped(dtype, (6, 3), rng)
    out = []
    modes = ("fill_or_drop", "clip", "promise_in_bounds")
    for k, (combine, (layout, (window, inserted, to_operand, (ob, ib)), ishape, ushape)) in enumerate(
        [(c, layout) for c in ("add", "mul", "min", "max", "set") for layout in SCATTER_LAYOUTS]
    ):
        mode = modes[k % 3]
        limit = 3 if layout == "points" and k % 2 else 6
        indices = _out_of_bounds(int(np.prod(ishape)), limit, DType.S32, rng).reshape(ishape)
        updates = shaped(dtype, ushape, rng)[::-1].copy() if k % 2 else moderate_like(x, ushape, rng)
        numbers = lax.ScatterDimensionNumbers(window, inserted, to_operand, ob, ib)
        attrs = {"update_window_dims": window, "inserted_window_dims": inserted,
                 "scatter_dims_to_operand_dims": to_operand, "operand_batching_dims": ob,
                 "scatter_indices_batching_dims": ib, "mode": mode, "combine": combine}
        fn = SCATTERS[combine]
        out.append(Trial(lambda x, i, u, f=fn, n=numbers, m=mode: f(x, i, u, n, mode=MODES[m]),
                         (x, indices, updates), attrs, label=layout))
    return out


def moderate_like(x: np.ndarray, shape, rng: Rng) -> np.ndarray:
    """Small integers as x's dtype: products and sums of a few stay exact."""
    return rng.integers(-3, 4, shape).astype(x.dtype)


DATA_SPECS = {
    Op.CUMSUM: Spec(NUMERIC, cumulative_trials(lax.cumsum, _ints_or(summands), np.cumsum), ACCUMULATION),
    Op.CUMPROD: Spec(NUMERIC, cumulative_trials(lax.cumprod, _ints_or(factors), np.cumprod), ACCUMULATION),
    Op.CUMMAX: Spec(NUMERIC, extreme_trials(lax.cummax)),
    Op.CUMMIN: Spec(NUMERIC, extreme_trials(lax.cummin)),
    Op.SORT: Spec(ALL, sort_trials),
    Op.TOP_K: Spec(NUMERIC, top_k_trials),
    Op.GATHER: Spec(ALL, gather_trials),
    Op.SCATTER: Spec(NUMERIC, scatter_trials),
}
