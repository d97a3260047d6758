"""Rules for JAX's control flow: `cond` (lax.cond, lax.switch) to `conditional`, `while`
(lax.while_loop, fori_loop with traced bounds) to `while`, and `scan` (lax.scan, lax.map,
fori_loop with static bounds) to a `while` over a counter that reads xs[i] with dynamic_slice
and writes ys[i] with dynamic_update_slice.

Each called jaxpr becomes a computation of its own (`while.3.body`, `cond.2.branch1`), built by
a nested Context that shares the list of called computations, so the equations inside keep
their source lines. May import xfuse.hlo and jax.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from xfuse.hlo import (
    AnyShape,
    Builder,
    Computation,
    DType,
    Instruction,
    Op,
    Shape,
    TupleShape,
    fresh_name,
)

from .rules import rule
from .translate import Context, FrontendError

S32 = Shape(DType.S32, ())


def _taken(ctx: Context) -> set[str]:
    return {c.name for c in ctx.called} | {ctx.b.name, "main"}


def _subcomputation(
    ctx: Context,
    name: str,
    shapes: Sequence[AnyShape],
    translate,
) -> Computation:
    """A computation `name` with parameters of `shapes`; `translate(inner, params)` fills it in
    through a nested Context and returns its root (a list becomes a tuple)."""
    builder = Builder(name, ctx.loc)
    params = [builder.parameter(shape, name=f"p{k}") for k, shape in enumerate(shapes)]
    inner = Context(builder, ctx.rules)
    inner.called = ctx.called
    inner.loc = inner.b.loc = ctx.loc
    root = translate(inner, params)
    comp = builder.build(root)
    ctx.called.append(comp)
    return comp


def _closed(called) -> tuple[object, Sequence[object]]:
    """(jaxpr, consts) of a ClosedJaxpr or a plain Jaxpr."""
    if hasattr(called, "consts"):
        return called.jaxpr, called.consts
    return called, ()


def _root(outputs: list[Instruction]) -> Instruction | list[Instruction]:
    return outputs[0] if len(outputs) == 1 else outputs


def _elements(ctx: Context, tupled: Instruction, indices: Sequence[int]) -> list[Instruction]:
    return [ctx.emit(Op.GET_TUPLE_ELEMENT, tupled, index=k) for k in indices]


# ---------------------------------------------------------------------------- cond
@rule("cond")
def _cond(ctx: Context, params: dict, operands: list[Instruction]) -> list[Instruction]:
    """lax.cond and lax.switch: a conditional whose branches return one value or a tuple."""
    index, *args = operands
    index = ctx.convert(index, DType.S32)
    if index.array_shape.rank != 0:
        raise FrontendError(f"'cond' at {ctx.loc}: the branch index must be a scalar, got {index.shape}")
    name = ctx.b.fresh_name("cond")
    taken = _taken(ctx)
    shapes = [a.shape for a in args]
    branches = []
    for k, branch in enumerate(params["branches"]):
        jaxpr, consts = _closed(branch)

        def translate(inner: Context, ps, jaxpr=jaxpr, consts=consts):
            outputs = inner.inline(jaxpr, consts, ps)
            return _root(outputs) if outputs else []

        branches.append(_subcomputation(ctx, fresh_name(f"{name}.branch{k}", taken), shapes, translate))
    result_shape = branches[0].result_shape
    result = ctx.emit(
        Op.CONDITIONAL, index, *args, branches=tuple(b.name for b in branches), shape=result_shape, name=name
    )
    if isinstance(result_shape, TupleShape):
        return _elements(ctx, result, range(len(result_shape.elements)))
    return [result]


# ---------------------------------------------------------------------------- while
@rule("while")
def _while(ctx: Context, params: dict, operands: list[Instruction]) -> list[Instruction]:
    """lax.while_loop: the state is the condition's consts, the body's consts and the carry;
    the consts pass through the body unchanged.

    A vmapped loop whose condition depends on the batch has a condition of the batch's shape
    (JAX's batched predicate): as JAX lowers it, the loop runs while any element's holds, and
    the body keeps the old carry where the element's condition (on the old carry) is false."""
    n_cond, n_body = int(params["cond_nconsts"]), int(params["body_nconsts"])
    cond_consts, body_consts = operands[:n_cond], operands[n_cond : n_cond + n_body]
    carry = operands[n_cond + n_body :]
    state = [*cond_consts, *body_consts, *carry]
    shapes = [s.shape for s in state]
    name = ctx.b.fresh_name("while")
    taken = _taken(ctx)
    cond_jaxpr, cond_closed = _closed(params["cond_jaxpr"])
    body_jaxpr, body_closed = _closed(params["body_jaxpr"])
    n_fixed = n_cond + n_body

    batched = bool(cond_jaxpr.outvars[0].aval.shape)

    def condition(inner: Context, ps):
        (pred,) = inner.inline(cond_jaxpr, cond_closed, [*ps[:n_cond], *ps[n_fixed:]])
        if batched:
            pred = inner.emit(Op.REDUCE_OR, pred, axes=tuple(range(pred.array_shape.rank)))
        return pred

    def body(inner: Context, ps):
        updated = inner.inline(body_jaxpr, body_closed, [*ps[n_cond:n_fixed], *ps[n_fixed:]])
        if batched:
            (pred,) = inner.inline(cond_jaxpr, cond_closed, [*ps[:n_cond], *ps[n_fixed:]])
            updated = [_select_batch(inner, pred, new, old) for new, old in zip(updated, ps[n_fixed:])]
        return [*ps[:n_fixed], *updated]

    cond_comp = _subcomputation(ctx, fresh_name(f"{name}.cond", taken), shapes, condition)
    body_comp = _subcomputation(ctx, fresh_name(f"{name}.body", taken), shapes, body)
    loop = ctx.emit(Op.WHILE, *state, condition=cond_comp.name, body=body_comp.name, name=name)
    return _elements(ctx, loop, range(n_fixed, len(state)))


def _select_batch(ctx: Context, pred: Instruction, new: Instruction, old: Instruction) -> Instruction:
    """new where pred, else old; pred (the batch's shape) spread over new's trailing dims. A
    value with no batch dims (the same in every element) is taken as updated."""
    dims, rank = new.array_shape.dims, pred.array_shape.rank
    if new.array_shape.rank < rank or dims[:rank] != pred.array_shape.dims:
        return new
    if dims != pred.array_shape.dims:
        pred = ctx.emit(Op.BROADCAST_IN_DIM, pred, shape=pred.array_shape.with_dims(dims), dims=tuple(range(rank)))
    return ctx.emit(Op.SELECT_N, pred, old, new)


# ---------------------------------------------------------------------------- scan
@rule("scan")
def _scan(ctx: Context, params: dict, operands: list[Instruction]) -> list[Instruction]:
    """lax.scan as a while over (i, consts, carry, xs, ys): step t = i (length - 1 - i when
    `reverse`) reads xs[t] and writes ys[t]; the result is the final carry and the ys."""
    length, reverse = int(params["length"]), bool(params["reverse"])
    jaxpr, closed = _closed(params["jaxpr"])
    n_consts, n_carry = _scan_counts(params, jaxpr, operands, ctx.out_shapes)
    consts, init = operands[:n_consts], operands[n_consts : n_consts + n_carry]
    xs = operands[n_consts + n_carry :]
    y_shapes = ctx.out_shapes[n_carry:]
    zero_ys = [_zeros(ctx, shape) for shape in y_shapes]
    if length == 0:  # no step: the carry as given, and empty ys
        return [*init, *zero_ys]
    state = [ctx.constant(np.int32(0), DType.S32), *consts, *init, *xs, *zero_ys]
    shapes = [s.shape for s in state]
    first_x = 1 + n_consts + n_carry
    first_y = first_x + len(xs)
    name = ctx.b.fresh_name("scan")
    taken = _taken(ctx)

    def condition(inner: Context, ps):
        return inner.emit(Op.LT, ps[0], inner.constant(np.int32(length), DType.S32))

    def body(inner: Context, ps):
        i = ps[0]
        step = i
        if reverse:
            step = inner.emit(Op.SUB, inner.constant(np.int32(length - 1), DType.S32), i)
        x_t = [_read_row(inner, x, step) for x in ps[first_x:first_y]]
        outputs = inner.inline(jaxpr, closed, [*ps[1:first_x], *x_t])
        carry, ys_t = outputs[:n_carry], outputs[n_carry:]
        ys = [_write_row(inner, ys, y, step) for ys, y in zip(ps[first_y:], ys_t)]
        following = inner.emit(Op.ADD, i, inner.constant(np.int32(1), DType.S32))
        return [following, *ps[1 : 1 + n_consts], *carry, *ps[first_x:first_y], *ys]

    cond_comp = _subcomputation(ctx, fresh_name(f"{name}.cond", taken), shapes, condition)
    body_comp = _subcomputation(ctx, fresh_name(f"{name}.body", taken), shapes, body)
    loop = ctx.emit(Op.WHILE, *state, condition=cond_comp.name, body=body_comp.name, name=name)
    first_carry = 1 + n_consts
    return _elements(ctx, loop, [*range(first_carry, first_carry + n_carry), *range(first_y, len(state))])


def _scan_counts(params: dict, jaxpr, operands: list[Instruction], out_shapes) -> tuple[int, int]:
    """(consts, carry) counts of a scan: its `num_consts` and `num_carry` where jax gives them
    (up to 0.10); else (jax 0.11, whose scan describes its operands as trees instead) from the
    shapes, which tell them apart: a scanned operand or stacked result has the step's shape with
    the length in front, a constant or carry the step's own."""
    if "num_consts" in params and "num_carry" in params:
        return int(params["num_consts"]), int(params["num_carry"])

    def stacked(outer: list, inner: list) -> int:  # how many trailing outer ones are stacked
        count = 0
        while count < len(outer) and tuple(outer[-1 - count]) != tuple(inner[-1 - count]):
            count += 1
        return count

    n_xs = stacked([o.array_shape.dims for o in operands], [v.aval.shape for v in jaxpr.invars])
    n_ys = stacked([s.dims for s in out_shapes], [v.aval.shape for v in jaxpr.outvars])
    n_carry = len(out_shapes) - n_ys
    return len(operands) - n_xs - n_carry, n_carry


def _zeros(ctx: Context, shape: Shape) -> Instruction:
    zero = ctx.constant(np.zeros((), shape.dtype.numpy), shape.dtype)
    return ctx.emit(Op.BROADCAST_IN_DIM, zero, shape=shape, dims=())


def _row_indices(ctx: Context, step: Instruction, rank: int) -> list[Instruction]:
    zero = ctx.constant(np.int32(0), DType.S32)
    return [step, *[zero] * (rank - 1)]


def _read_row(ctx: Context, xs: Instruction, step: Instruction) -> Instruction:
    """xs[step], as a dynamic slice of one row reshaped to drop the leading axis."""
    shape = xs.array_shape
    row = shape.with_dims((1, *shape.dims[1:]))
    sliced = ctx.emit(Op.DYNAMIC_SLICE, xs, *_row_indices(ctx, step, shape.rank), shape=row)
    return ctx.emit(Op.RESHAPE, sliced, shape=shape.with_dims(shape.dims[1:]))


def _write_row(ctx: Context, ys: Instruction, y: Instruction, step: Instruction) -> Instruction:
    """ys with row `step` replaced by y."""
    shape = ys.array_shape
    row = ctx.emit(Op.RESHAPE, y, shape=shape.with_dims((1, *shape.dims[1:])))
    return ctx.emit(Op.DYNAMIC_UPDATE_SLICE, ys, row, *_row_indices(ctx, step, shape.rank))
