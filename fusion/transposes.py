"""The algebraic rule `transpose_up_to_its_inverse`: a transpose moves toward its operands,
through elementwise ops, slices, broadcasts and reshapes that only add or drop unit
dimensions, when it meets there a transpose it undoes (a layer that moves channels last for
its pooling, and the next layer that moves them back first). The two then compose to nothing,
so no kernel reads an array across its minor axis for a round trip of layouts (what XLA's
layout assignment gets by choosing layouts). Only moved where it cancels, so no other program
changes. May import xfuse.hlo.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from xfuse.hlo import Instruction, Kind, Op

if TYPE_CHECKING:
    from .algebraic import Context

DEPTH = 16  # ops between the two transposes, at most


def _inverse(perm) -> tuple[int, ...]:
    inverse = [0] * len(perm)
    for i, p in enumerate(perm):
        inverse[p] = i
    return tuple(inverse)


def _splat(ctx: Context, name: str) -> bool:
    inst = ctx[name]
    return inst.op is Op.BROADCAST_IN_DIM and ctx[inst.operands[0]].shape.rank == 0


def _unit_reshape(ctx: Context, inst: Instruction) -> bool:
    """A reshape that only adds or drops dimensions of size 1."""
    x = ctx[inst.operands[0]].array_shape
    return [d for d in x.dims if d != 1] == [d for d in inst.array_shape.dims if d != 1]


def _through_reshape(ctx: Context, inst: Instruction, perm) -> tuple[int, ...]:
    """The permutation of the reshape's operand that puts its dimensions in the order `perm`
    gives the reshape's: non-unit ones as they come out, the unit ones after the first of
    them (neither the rows a kernel splits over threads nor its innermost loop)."""
    x, y = ctx[inst.operands[0]].array_shape.dims, inst.array_shape.dims
    x_big = [i for i, d in enumerate(x) if d != 1]
    y_big = [i for i, d in enumerate(y) if d != 1]
    of_y = dict(zip(y_big, x_big))
    order = [of_y[p] for p in perm if p in of_y]
    return (*order[:1], *(i for i, d in enumerate(x) if d == 1), *order[1:])


def _through_broadcast(inst: Instruction, perm) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(the operand's permutation, the new broadcast dims) with transpose(broadcast(x)) =
    broadcast(transpose(x))."""
    inverse = _inverse(perm)
    positions = [inverse[d] for d in inst.attr("dims")]
    order = tuple(sorted(range(len(positions)), key=positions.__getitem__))
    return order, tuple(sorted(positions))


def cancels(ctx: Context, name: str, perm, depth: int = DEPTH) -> bool:
    """Whether transposing `name` by `perm`, moved up through the ops above it, meets
    transposes that it undoes (or vanishes into a broadcast) on every path."""
    inst = ctx[name]
    if tuple(perm) == tuple(range(len(perm))):
        return True
    if depth == 0:
        return False
    if inst.op is Op.TRANSPOSE:
        inner = inst.attr("permutation")
        return all(int(inner[p]) == i for i, p in enumerate(perm))
    if inst.op is Op.SLICE:
        return cancels(ctx, inst.operands[0], perm, depth - 1)
    if inst.op is Op.RESHAPE and _unit_reshape(ctx, inst):
        return cancels(ctx, inst.operands[0], _through_reshape(ctx, inst, perm), depth - 1)
    if inst.op is Op.BROADCAST_IN_DIM:
        return cancels(ctx, inst.operands[0], _through_broadcast(inst, perm)[0], depth - 1)
    if inst.info.kind is Kind.ELEMENTWISE and inst.operands and inst.op is not Op.CONSTANT:
        moved = [o for o in inst.operands if not _splat(ctx, o)]
        return bool(moved) and all(ctx[o].shape.dims == inst.shape.dims for o in inst.operands) \
            and all(cancels(ctx, o, perm, depth - 1) for o in moved)
    return False


def up_to_its_inverse(ctx: Context, inst: Instruction) -> Instruction | None:
    """A transpose (not the identity) whose operand is an op it moves through and that
    `cancels`: matches that operand."""
    perm = inst.attr("permutation")
    inner = ctx[inst.operands[0]]
    if inner.op is Op.TRANSPOSE or tuple(perm) == tuple(range(len(perm))):
        return None
    movable = inner.op in (Op.SLICE, Op.BROADCAST_IN_DIM) or inner.op is Op.RESHAPE and _unit_reshape(ctx, inner) \
        or inner.info.kind is Kind.ELEMENTWISE and inner.op is not Op.CONSTANT and bool(inner.operands)
    return inner if movable and cancels(ctx, inner.name, perm) else None


def _transposed(ctx: Context, name: str, perm, loc) -> Instruction:
    x = ctx[name].array_shape
    return Instruction(ctx.fresh("transpose"), Op.TRANSPOSE, x.with_dims(tuple(x.dims[p] for p in perm)),
                       (name,), (("permutation", tuple(perm)),), loc)


def move_up(ctx: Context, inst: Instruction, inner: Instruction) -> list[Instruction]:
    perm, loc = tuple(inst.attr("permutation")), inst.loc
    if inner.op is Op.SLICE:
        moved = _transposed(ctx, inner.operands[0], perm, loc)
        attrs = tuple((k, tuple(v[p] for p in perm)) for k, v in inner.attrs)
        return [moved, Instruction(inst.name, Op.SLICE, inst.shape, (moved.name,), attrs, loc)]
    if inner.op is Op.RESHAPE:
        moved = _transposed(ctx, inner.operands[0], _through_reshape(ctx, inner, perm), loc)
        return [moved, Instruction(inst.name, Op.RESHAPE, inst.shape, (moved.name,), (), loc)]
    if inner.op is Op.BROADCAST_IN_DIM:
        order, dims = _through_broadcast(inner, perm)
        moved = _transposed(ctx, inner.operands[0], order, loc)
        return [moved, Instruction(inst.name, Op.BROADCAST_IN_DIM, inst.shape, (moved.name,), (("dims", dims),), loc)]
    out, operands = [], []
    for o in inner.operands:  # elementwise: each operand transposed, a splat broadcast anew
        if _splat(ctx, o):
            splat = ctx[o]
            out.append(Instruction(ctx.fresh("broadcast_in_dim"), Op.BROADCAST_IN_DIM,
                                   splat.array_shape.with_dims(inst.shape.dims), splat.operands, (("dims", ()),), loc))
        else:
            out.append(_transposed(ctx, o, perm, loc))
        operands.append(out[-1].name)
    return [*out, inner.replace(name=inst.name, shape=inst.shape, operands=tuple(operands), loc=loc)]
