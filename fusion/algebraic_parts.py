"""The patterns and rewrites the algebraic simplifier's rules (`algebraic.RULES`) are built
from: splat predicates, patterns (a match or None) and rewrites (an existing value or new
instructions). Each sees the computation through the simplifier's `Context`. May import
xfuse.hlo and numpy.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from xfuse.hlo import DType, Instruction, Literal, Op, Shape

if TYPE_CHECKING:
    from .algebraic import Context

Replacement = str | list[Instruction]  # an existing value, or new instructions (last replaces)
Pattern = Callable[["Context", Instruction], object]
Rewrite = Callable[["Context", Instruction, object], Replacement]


# ---------------------------------------------------------------------------- splat predicates
ValueTest = Callable[[object, DType], bool]


def integer_zero(value: object, dtype: DType) -> bool:
    return dtype.is_integer and value == 0


def negative_zero(value: object, dtype: DType) -> bool:
    return dtype.is_float and value == 0 and math.copysign(1.0, value) < 0


def positive_zero(value: object, dtype: DType) -> bool:
    return dtype.is_float and value == 0 and math.copysign(1.0, value) > 0


def one(value: object, dtype: DType) -> bool:
    return not dtype.is_pred and value == 1


def lowest(value: object, dtype: DType) -> bool:
    """The least value of `dtype`: -inf, the integer minimum, false."""
    if dtype.is_float:
        return value == -math.inf
    return value == (False if dtype.is_pred else int(np.iinfo(dtype.numpy).min))


def highest(value: object, dtype: DType) -> bool:
    """The greatest value of `dtype`: +inf, the integer maximum, true."""
    if dtype.is_float:
        return value == math.inf
    return value == (True if dtype.is_pred else int(np.iinfo(dtype.numpy).max))


def any_of(*tests: ValueTest) -> ValueTest:
    return lambda value, dtype: any(test(value, dtype) for test in tests)


# ---------------------------------------------------------------------------- patterns
def rhs_is(test: ValueTest) -> Pattern:
    """`op(x, c)` with `c` a splat passing `test`: matches x."""

    def pattern(ctx: Context, inst: Instruction) -> str | None:
        x, c = inst.operands
        value = ctx.splat(c)
        return x if value is not None and test(value, inst.shape.dtype) else None

    return pattern


def either_is(test: ValueTest) -> Pattern:
    """`op(x, c)` or `op(c, x)` with `c` a splat passing `test`: matches x."""

    def pattern(ctx: Context, inst: Instruction) -> str | None:
        lhs, rhs = inst.operands
        for x, c in ((lhs, rhs), (rhs, lhs)):
            value = ctx.splat(c)
            if value is not None and test(value, inst.shape.dtype):
                return x
        return None

    return pattern


def operand_is(op: Op) -> Pattern:
    """`outer(inner(...))` with `inner` of `op`: matches the inner instruction."""

    def pattern(ctx: Context, inst: Instruction) -> Instruction | None:
        inner = ctx[inst.operands[0]]
        return inner if inner.op is op else None

    return pattern


def same_op_twice(ctx: Context, inst: Instruction) -> str | None:
    """`f(f(x))`: matches x."""
    inner = ctx[inst.operands[0]]
    return inner.operands[0] if inner.op is inst.op else None


def same_shape_operand(ctx: Context, inst: Instruction) -> str | None:
    """A one-operand op whose result has its operand's exact shape and dtype: matches x."""
    x = inst.operands[0]
    return x if ctx[x].shape == inst.shape else None


def attr_is(key: str, wanted: Callable[[object, Instruction, Context], bool]) -> Pattern:
    """The attribute `key` passes `wanted`: matches the (first) operand."""

    def pattern(ctx: Context, inst: Instruction) -> str | None:
        return inst.operands[0] if wanted(inst.attr(key), inst, ctx) else None

    return pattern


def all_operands_same(ctx: Context, inst: Instruction) -> str | None:
    """`op(x, x, ...)` (for select_n: every case the same value): matches x."""
    values = inst.operands[1:] if inst.op is Op.SELECT_N else inst.operands
    return values[0] if len(set(values)) == 1 else None


def constant_selector(ctx: Context, inst: Instruction) -> str | None:
    """`select_n(c, cases...)` with `c` a splat naming a case: matches that case."""
    which, *cases = inst.operands
    value = ctx.splat(which)
    if value is None:
        return None
    index = int(value)  # pred: false picks case 0, true case 1
    return cases[index] if 0 <= index < len(cases) else None


def full_slice(ctx: Context, inst: Instruction) -> str | None:
    x = inst.operands[0]
    dims = ctx[x].shape.dims
    everything = (tuple(0 for _ in dims), dims, tuple(1 for _ in dims))
    attrs = (inst.attr("start"), inst.attr("limit"), inst.attr("strides"))
    return x if attrs == everything else None


def no_padding(ctx: Context, inst: Instruction) -> str | None:
    padding = inst.attr("low") + inst.attr("high") + inst.attr("interior")
    return inst.operands[0] if not any(padding) else None


def single_operand(ctx: Context, inst: Instruction) -> str | None:
    return inst.operands[0] if len(inst.operands) == 1 else None


def reduce_no_axes(ctx: Context, inst: Instruction) -> str | None:
    # A reduction over no axes returns its operand, -0.0 included (as XLA:CPU does).
    return None if inst.attr("axes") else inst.operands[0]


def identity_permutation(permutation: object, inst: Instruction, ctx: Context) -> bool:
    return tuple(permutation) == tuple(range(len(permutation)))


def no_dimensions(dimensions: object, inst: Instruction, ctx: Context) -> bool:
    return len(dimensions) == 0


def exponent(y: int) -> Callable[[object, Instruction, Context], bool]:
    return lambda value, inst, ctx: value == y


def identity_broadcast(ctx: Context, inst: Instruction) -> str | None:
    x = inst.operands[0]
    same = ctx[x].shape == inst.shape
    return x if same and inst.attr("dims") == tuple(range(inst.shape.rank)) else None


# ---------------------------------------------------------------------------- rewrites
def forward(ctx: Context, inst: Instruction, match: object) -> Replacement:
    """The matched value replaces the instruction."""
    return match


def bypass_inner(ctx: Context, inst: Instruction, inner: Instruction) -> Replacement:
    """`reshape(reshape(x))` -> `reshape(x)`: the outer op, reading the inner one's operand."""
    return [inst.replace(operands=inner.operands)]


def compose_transposes(ctx: Context, inst: Instruction, inner: Instruction) -> Replacement:
    # out dim i is inner dim outer[i], which is x dim inner[outer[i]].
    outer_perm, inner_perm = inst.attr("permutation"), inner.attr("permutation")
    composed = tuple(int(inner_perm[p]) for p in outer_perm)
    return [inst.replace(operands=inner.operands, attrs=(("permutation", composed),))]


def transposed_dot_operand(ctx: Context, inst: Instruction) -> tuple[int, Instruction] | None:
    """A dot_general operand made by a transpose that keeps its free dimensions in order (so the
    result's dimensions stay where they are): matches (0 for lhs or 1 for rhs, the transpose)."""
    (lc, rc), (lb, rb) = inst.attr("contracting"), inst.attr("batch")
    for side, paired in enumerate((set(lc) | set(lb), set(rc) | set(rb))):
        inner = ctx[inst.operands[side]]
        if inner.op is Op.TRANSPOSE:
            perm = inner.attr("permutation")
            free = [int(perm[d]) for d in range(len(perm)) if d not in paired]
            if free == sorted(free):
                return side, inner
    return None


def fold_transpose_into_dot(ctx: Context, inst: Instruction, match: tuple) -> Replacement:
    # dimension d of the transpose is dimension perm[d] of its operand
    side, inner = match
    perm = inner.attr("permutation")
    through = lambda dims: tuple(int(perm[d]) for d in dims)  # noqa: E731
    contracting, batch = [list(pair) for pair in (inst.attr("contracting"), inst.attr("batch"))]
    contracting[side], batch[side] = through(contracting[side]), through(batch[side])
    attrs = dict(inst.attrs) | {"contracting": tuple(contracting), "batch": tuple(batch)}
    operands = list(inst.operands)
    operands[side] = inner.operands[0]
    return [inst.replace(operands=tuple(operands), attrs=tuple(attrs.items()))]


def swapped_dot(ctx: Context, inst: Instruction) -> Instruction | None:
    """`transpose(dot_general(a, b))` where the transpose is the dot's only use and its
    permutation keeps the batch dimensions first and puts b's free dimensions before a's, each
    in their order: the result of `dot_general(b, a)`. Matches the dot."""
    dot = ctx[inst.operands[0]]
    if dot.op is not Op.DOT_GENERAL or ctx.uses(dot.name) != 1:
        return None
    return dot if tuple(inst.attr("permutation")) == _swapping(ctx, dot) else None


def _swapping(ctx: Context, dot: Instruction) -> tuple[int, ...] | None:
    """The permutation of `dot`'s result that is `dot_general(b, a)`: batch dimensions first,
    then b's free dimensions, then a's; None where either operand has none free."""
    (lc, _), (lb, _) = dot.attr("contracting"), dot.attr("batch")
    lhs, rhs = ctx[dot.operands[0]].shape, ctx[dot.operands[1]].shape
    batch = len(lb)
    left, right = lhs.rank - len(lc) - batch, rhs.rank - len(lc) - batch
    if left == 0 or right == 0:
        return None
    return (*range(batch), *range(batch + left, batch + left + right), *range(batch, batch + left))


def swapped_dot_slices(ctx: Context, inst: Instruction) -> Instruction | None:
    """`transpose(slice(dot_general(a, b)))` with the permutation `swapped_dot` takes, where
    every read of the dot is a slice read only through that same transpose (the gates of a
    vmapped recurrent cell, split from one product and read batch-first): matches the slice."""
    sliced = ctx[inst.operands[0]]
    if sliced.op is not Op.SLICE or any(s != 1 for s in sliced.attr("strides")):
        return None
    dot = ctx[sliced.operands[0]]
    if dot.op is not Op.DOT_GENERAL or ctx.comp.root == dot.name:
        return None
    perm = tuple(inst.attr("permutation"))
    if perm != _swapping(ctx, dot):
        return None
    readers = [i for i in ctx.instructions.values() if dot.name in i.operands]
    for reader in readers:
        if reader.op is not Op.SLICE or ctx.comp.root == reader.name:
            return None
        for user in ctx.instructions.values():
            if reader.name in user.operands and (user.op is not Op.TRANSPOSE or tuple(user.attr("permutation")) != perm):
                return None
    return sliced


def swap_sliced_dot(ctx: Context, inst: Instruction, sliced: Instruction) -> Replacement:
    """The slice, permuted, of the dot with its operands swapped (one per slice; `cse` merges
    them, and the old dot is left to `dce`)."""
    dot = ctx[sliced.operands[0]]
    perm = inst.attr("permutation")
    (swapped,) = swap_dot_operands(ctx, dot.replace(name=ctx.fresh("dot_general"),
                                                    shape=dot.shape.with_dims(tuple(dot.shape.dims[p] for p in perm))), dot)
    attrs = {k: tuple(v[p] for p in perm) for k, v in sliced.attrs}
    return [swapped, sliced.replace(name=inst.name, shape=inst.shape, operands=(swapped.name,),
                                    attrs=tuple((k, attrs[k]) for k, _ in sliced.attrs), loc=inst.loc)]


def swap_dot_operands(ctx: Context, inst: Instruction, dot: Instruction) -> Replacement:
    (lc, rc), (lb, rb) = dot.attr("contracting"), dot.attr("batch")
    attrs = dict(dot.attrs) | {"contracting": (rc, lc), "batch": (rb, lb)}
    operands = (dot.operands[1], dot.operands[0])
    return [dot.replace(name=inst.name, shape=inst.shape, operands=operands,
                        attrs=tuple(attrs.items()))]


def no_contraction(ctx: Context, inst: Instruction) -> tuple | None:
    """A dot_general that sums nothing (no contracting dimensions) and keeps its operands'
    dtype, each operand's dimensions landing in the result in their order: an outer product (a
    scalar times a vector among them). Matches where each operand's dimensions go."""
    (lc, _), (lb, rb) = inst.attr("contracting"), inst.attr("batch")
    lhs, rhs = ctx[inst.operands[0]].shape, ctx[inst.operands[1]].shape
    if lc or inst.shape.dtype != lhs.dtype:
        return None
    left = [d for d in range(lhs.rank) if d not in lb]
    right = [d for d in range(rhs.rank) if d not in rb]

    def placed(batch, free, first) -> tuple[int, ...]:
        where = {d: k for k, d in enumerate(batch)} | {d: first + k for k, d in enumerate(free)}
        return tuple(where[d] for d in range(len(batch) + len(free)))

    spread = placed(lb, left, len(lb)), placed(rb, right, len(lb) + len(left))
    return spread if all(list(s) == sorted(s) for s in spread) else None


def outer_product(ctx: Context, inst: Instruction, spread: tuple) -> Replacement:
    broadcasts = [Instruction(ctx.fresh("broadcast_in_dim"), Op.BROADCAST_IN_DIM, inst.shape,
                              (operand,), (("dims", dims),), inst.loc)
                  for operand, dims in zip(inst.operands, spread)]
    product = Instruction(inst.name, Op.MUL, inst.shape, tuple(b.name for b in broadcasts), (),
                          inst.loc)
    return [*broadcasts, product]


def compose_broadcasts(ctx: Context, inst: Instruction, inner: Instruction) -> Replacement:
    # x dim i lands in inner dim inner_dims[i], which lands in out dim outer_dims[inner_dims[i]].
    outer_dims, inner_dims = inst.attr("dims"), inner.attr("dims")
    composed = tuple(int(outer_dims[d]) for d in inner_dims)
    return [inst.replace(operands=inner.operands, attrs=(("dims", composed),))]


def splat(ctx: Context, value: object, shape: Shape, loc, name: str | None = None) -> list[Instruction]:
    """A constant `value` of `shape`'s dtype, broadcast to `shape` (the constant alone for a
    scalar); the last instruction, which holds it, is named `name` (else a fresh name)."""
    literal = Literal(value, shape.dtype)
    if shape.rank == 0:
        return [Instruction(name or ctx.fresh("constant"), Op.CONSTANT, shape, (), (("value", literal),), loc)]
    scalar = Instruction(ctx.fresh("constant"), Op.CONSTANT, literal.shape, (), (("value", literal),), loc)
    return [scalar, Instruction(name or ctx.fresh("broadcast_in_dim"), Op.BROADCAST_IN_DIM, shape,
                                (scalar.name,), (("dims", ()),), loc)]


def splat_of_one(ctx: Context, inst: Instruction, match: object) -> Replacement:
    """A constant 1 of the result's dtype, broadcast to the result's shape."""
    return splat(ctx, 1, inst.shape, inst.loc, inst.name)


def power_of_two_divisor(ctx: Context, inst: Instruction) -> float | None:
    """`x / c` with `c` a float splat +-2**k whose reciprocal is a finite value of the dtype
    (exactly 2**-k, subnormal or not): matches 1/c."""
    dtype = inst.shape.dtype
    value = ctx.splat(inst.operands[1])
    if not dtype.is_float or value is None or value == 0 or not math.isfinite(value):
        return None
    mantissa, _ = math.frexp(abs(value))
    if mantissa != 0.5:
        return None
    reciprocal = 1.0 / value
    with np.errstate(over="ignore"):
        stored = np.array(reciprocal).astype(dtype.numpy)
    return reciprocal if np.isfinite(stored) and float(stored) == reciprocal else None


def multiply_by_reciprocal(ctx: Context, inst: Instruction, reciprocal: float) -> Replacement:
    """`x * (1/c)`, the reciprocal a splat of the result's dtype."""
    operand = splat(ctx, reciprocal, inst.shape, inst.loc)
    return [*operand, Instruction(inst.name, Op.MUL, inst.shape, (inst.operands[0], operand[-1].name), (),
                                  inst.loc)]
