"""Rules for the data primitives: cumulative ops, sort (argsort is a sort with an iota
operand), top_k, gather and the scatters, registered into `rules.RULES`.

`GatherScatterMode` becomes the `mode` attribute (clip, fill_or_drop, promise_in_bounds); a
gather's fill value, jax's default when not given (NaN, the most negative signed integer, the
largest unsigned one, True), becomes a scalar constant operand. A scatter's combiner comes from
its primitive; a `scatter` whose update_jaxpr does more than take the update
(`x.at[i].apply(f)`) raises FrontendError. May import xfuse.hlo and jax.
"""

from __future__ import annotations

import numpy as np

from xfuse.hlo import DType, Op

from .rules import RULES, rule
from .translate import FrontendError

MODES = {"CLIP": "clip", "FILL_OR_DROP": "fill_or_drop", "PROMISE_IN_BOUNDS": "promise_in_bounds"}


def _flag(value: object) -> str:
    return "true" if value else "false"


def _cumulative(op: Op):
    def translate(ctx, params, operands):
        (x,) = operands
        return ctx.emit(op, x, axis=int(params["axis"]), reverse=_flag(params.get("reverse", False)))

    return translate


for _op in (Op.CUMSUM, Op.CUMPROD, Op.CUMMAX, Op.CUMMIN):
    RULES[_op.value] = _cumulative(_op)


def _elements(ctx, tupled, count: int) -> list:
    return [ctx.emit(Op.GET_TUPLE_ELEMENT, tupled, index=i) for i in range(count)]


@rule("sort")
def _sort(ctx, params, operands):
    result = ctx.emit(
        Op.SORT,
        *operands,
        dimension=int(params["dimension"]),
        is_stable=_flag(params.get("is_stable", False)),
        num_keys=int(params.get("num_keys", 1)),
    )
    return result if len(operands) == 1 else _elements(ctx, result, len(operands))


@rule("top_k")
def _top_k(ctx, params, operands):
    (x,) = operands
    axis = params.get("axis", -1)
    axis = int(axis) % x.array_shape.rank if x.array_shape.rank else 0
    values, indices = _elements(ctx, ctx.emit(Op.TOP_K, x, k=int(params["k"]), axis=axis), 2)
    return values, ctx.convert(indices, ctx.out_shapes[1].dtype)


def _mode(ctx, params) -> str:
    mode = params.get("mode")
    name = getattr(mode, "name", str(mode))
    if name not in MODES:
        raise FrontendError(f"'{ctx.primitive}' at {ctx.loc}: the mode {mode} is not supported")
    return MODES[name]


def default_fill(dtype: DType) -> object:
    """jax's fill value for a gather in fill mode given none."""
    if dtype.is_float:
        return np.nan
    if dtype.is_pred:
        return True
    info = np.iinfo(dtype.numpy)
    return info.min if dtype.is_signed else info.max


def _indices(ctx, indices):
    if indices.array_shape.rank == 0:
        raise FrontendError(f"'{ctx.primitive}' at {ctx.loc}: scalar indices are not supported")
    return indices


@rule("gather")
def _gather(ctx, params, operands):
    x, indices = operands
    numbers = params["dimension_numbers"]
    mode = _mode(ctx, params)
    extra = []
    if mode == "fill_or_drop":
        fill = params.get("fill_value")
        dtype = x.array_shape.dtype
        extra.append(ctx.constant(default_fill(dtype) if fill is None else fill, dtype))
    return ctx.emit(
        Op.GATHER,
        x,
        _indices(ctx, indices),
        *extra,
        offset_dims=tuple(numbers.offset_dims),
        collapsed_slice_dims=tuple(numbers.collapsed_slice_dims),
        start_index_map=tuple(numbers.start_index_map),
        operand_batching_dims=tuple(getattr(numbers, "operand_batching_dims", ())),
        start_indices_batching_dims=tuple(getattr(numbers, "start_indices_batching_dims", ())),
        slice_sizes=tuple(int(s) for s in params["slice_sizes"]),
        mode=mode,
    )


def _takes_update(jaxpr) -> bool:
    """Whether an update_jaxpr is `lambda old, new: new`."""
    if jaxpr is None:
        return True
    inner = getattr(jaxpr, "jaxpr", jaxpr)
    return not inner.eqns and len(inner.invars) == 2 and list(inner.outvars) == [inner.invars[1]]


def _scatter(combine: str):
    def translate(ctx, params, operands):
        x, indices, updates = operands
        if combine == "set" and not _takes_update(params.get("update_jaxpr")):
            raise FrontendError(
                f"'{ctx.primitive}' at {ctx.loc}: a scatter applying a function "
                "(x.at[i].apply(f)) is not supported"
            )
        kind = combine
        if combine == "sub":  # a - b is a + (-b), exactly, floats and wrapping integers alike
            updates, kind = ctx.emit(Op.NEG, updates), "add"
        numbers = params["dimension_numbers"]
        return ctx.emit(
            Op.SCATTER,
            x,
            _indices(ctx, indices),
            updates,
            update_window_dims=tuple(numbers.update_window_dims),
            inserted_window_dims=tuple(numbers.inserted_window_dims),
            scatter_dims_to_operand_dims=tuple(numbers.scatter_dims_to_operand_dims),
            operand_batching_dims=tuple(getattr(numbers, "operand_batching_dims", ())),
            scatter_indices_batching_dims=tuple(getattr(numbers, "scatter_indices_batching_dims", ())),
            mode=_mode(ctx, params),
            combine=kind,
        )

    return translate


RULES["scatter"] = _scatter("set")
for _name in ("add", "sub", "mul", "min", "max"):
    RULES[f"scatter-{_name}"] = _scatter(_name)
