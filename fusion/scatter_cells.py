"""The algebraic rule `scatter_one_window_per_cell`: a scatter in which every cell of the
operand's batch receives at most one window, each window as wide as the operand along its
dimensions (the gradient of take_along_axis, x.at[:, i].add(u), a one-hot update), is a select
between the combined and the old value at each element, which fuses as elementwise work where
the scatter was a data op between kernels. May import xfuse.hlo.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from xfuse.hlo import DType, Instruction, Op, Shape

from .algebraic_parts import splat

if TYPE_CHECKING:
    from .algebraic import Context

COMBINE = {"add": Op.ADD, "mul": Op.MUL, "min": Op.MIN, "max": Op.MAX, "set": None}


def one_window_per_cell(ctx: Context, inst: Instruction) -> tuple | None:
    """(operand dim of each kept indices batch dim, operand dim of each updates dim or None)
    when each index vector lands in its own cell of the operand's batching dims (every other
    batch dimension of the indices has size 1) and every window spans its operand dimensions."""
    a = dict(inst.attrs)
    x, indices, updates = (ctx[o].array_shape for o in inst.operands)
    if a["combine"] not in COMBINE or not x.size or not updates.size:
        return None
    if a["mode"] == "clip" and indices.dtype is DType.U64:
        return None  # clip saturates indices past int64, which a conversion would wrap
    batch_of = dict(zip(a["scatter_indices_batching_dims"], a["operand_batching_dims"]))
    if any(indices.dims[j] != 1 and j not in batch_of for j in range(indices.rank - 1)):
        return None
    free = [d for d in range(x.rank) if d not in a["inserted_window_dims"] and d not in a["operand_batching_dims"]]
    windows = dict(zip(a["update_window_dims"], free))
    if any(updates.dims[w] != x.dims[d] for w, d in windows.items()):
        return None
    to_operand = a["scatter_dims_to_operand_dims"]
    scatter_dims = [t for t in range(updates.rank) if t not in windows]
    targets = []
    for t in range(updates.rank):
        targets.append(windows[t] if t in windows else batch_of.get(scatter_dims.index(t)))
    return batch_of, targets


def _spread(ctx: Context, name: str, source: Shape, targets: list, shape: Shape, loc) -> list[Instruction]:
    """`name` (of shape `source`) broadcast to `shape`: each dim goes to its target dim, a dim
    without one has size 1 and is dropped."""
    dims = source.dims
    out: list[Instruction] = []
    kept = [(t, d) for d, t in zip(dims, targets) if t is not None]
    if len(kept) != len(dims):
        reshape = Instruction(ctx.fresh("reshape"), Op.RESHAPE, source.with_dims(tuple(d for _, d in kept)),
                              (name,), (), loc)
        out.append(reshape)
        name = reshape.name
    order = sorted(range(len(kept)), key=lambda k: kept[k][0])
    if order != list(range(len(kept))):
        moved = Instruction(ctx.fresh("transpose"), Op.TRANSPOSE, source.with_dims(tuple(kept[k][1] for k in order)),
                            (name,), (("permutation", tuple(order)),), loc)
        out.append(moved)
        name = moved.name
    dims_to = tuple(sorted(t for t, _ in kept))
    out.append(Instruction(ctx.fresh("broadcast_in_dim"), Op.BROADCAST_IN_DIM, shape.with_dtype(source.dtype),
                           (name,), (("dims", dims_to),), loc))
    return out


def cell_select(ctx: Context, inst: Instruction, match: tuple) -> list[Instruction]:
    batch_of, targets = match
    a, loc = dict(inst.attrs), inst.loc
    x_name, indices_name, updates_name = inst.operands
    x, indices = ctx[x_name].array_shape, ctx[indices_name].array_shape
    out = _spread(ctx, updates_name, ctx[updates_name].array_shape, targets, x, loc)
    spread_updates = out[-1].name
    wide = Shape(DType.S64, x.dims)
    conditions = []
    clip = a["mode"] == "clip"  # otherwise a window out of bounds is dropped, as the data op drops it
    index_targets = [batch_of.get(j) for j in range(indices.rank - 1)]
    for k, d in enumerate(a["scatter_dims_to_operand_dims"]):
        inserted = d in a["inserted_window_dims"]
        if clip and not inserted:
            continue  # a window as wide as its dimension starts at 0
        start, limit = [0] * indices.rank, list(indices.dims)
        start[-1], limit[-1] = k, k + 1
        component = Instruction(ctx.fresh("slice"), Op.SLICE, indices.with_dims(tuple(limit[:-1]) + (1,)),
                                (indices_name,), (("start", tuple(start)), ("limit", tuple(limit)),
                                                  ("strides", (1,) * indices.rank)), loc)
        out.append(component)
        out.extend(_spread(ctx, component.name, component.array_shape, index_targets + [None], x, loc))
        value = out[-1].name
        if indices.dtype is not DType.S64:
            out.append(Instruction(ctx.fresh("convert_element_type"), Op.CONVERT_ELEMENT_TYPE, wide, (value,), (), loc))
            value = out[-1].name
        if not inserted:  # dropped unless at 0: a full-width window fits only there
            out.extend(splat(ctx, 0, wide, loc))
            position = out[-1].name
        else:
            if clip:
                low, high = splat(ctx, 0, wide, loc), splat(ctx, x.dims[d] - 1, wide, loc)
                out.extend(low + high)
                out.append(Instruction(ctx.fresh("clamp"), Op.CLAMP, wide, (low[-1].name, value, high[-1].name), (),
                                       loc))
                value = out[-1].name
            out.append(Instruction(ctx.fresh("iota"), Op.IOTA, wide, (), (("dimension", d),), loc))
            position = out[-1].name
        out.append(Instruction(ctx.fresh("eq"), Op.EQ, Shape(DType.PRED, x.dims), (value, position), (), loc))
        conditions.append(out[-1].name)
    new = spread_updates
    combine = COMBINE[a["combine"]]
    if combine is not None:
        out.append(Instruction(ctx.fresh(combine.value), combine, x, (x_name, spread_updates), (), loc))
        new = out[-1].name
    if not conditions:  # no index dimensions: the one window starts at 0 and covers every cell
        out.extend(splat(ctx, True, Shape(DType.PRED, x.dims), loc))
        conditions.append(out[-1].name)
    condition = conditions[0]
    for other in conditions[1:]:
        out.append(Instruction(ctx.fresh("and"), Op.AND, Shape(DType.PRED, x.dims), (condition, other), (), loc))
        condition = out[-1].name
    out.append(Instruction(inst.name, Op.SELECT_N, x, (condition, x_name, new), (), loc))
    return out
