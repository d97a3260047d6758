"""Kernel shapes: which sets of instructions one kernel can compute, and why not.

A fused kernel has an iteration space (S, A): the full shape S it iterates over and the axes A
it reduces (empty for a loop fusion). An output fusion's S is its dot's result, computed in
blocks of rows by BLAS; an input fusion's (S, A) is shared by all its reductions. Members that
depend on a reduction (or the dot) are computed a row at a time, so they must stay in the row:
elementwise ops on S or on the kept shape K = S without A (or K with unit dims, keepdims
style), broadcasts from K to S along the kept axes, and reductions of the same space. Members
that depend on neither are elemental: evaluated at any index, through broadcasts, reshapes,
transposes, slices. May import xfuse.hlo only.
"""

from __future__ import annotations

from dataclasses import dataclass

from xfuse.hlo import Computation, Instruction, Kind, Op

FUSIBLE_KINDS = (Kind.ELEMENTWISE, Kind.BROADCAST, Kind.INJECTIVE, Kind.REDUCTION, Kind.DOT)


def fusible(inst: Instruction) -> bool:
    """Whether an instruction may join a fusion at all (not parameters, tuples, barriers...)."""
    return inst.info.kind in FUSIBLE_KINDS and inst.op is not Op.PARAMETER


def reduced_axes(inst: Instruction) -> tuple[int, ...]:
    if inst.op in (Op.ARGMAX, Op.ARGMIN):
        return (inst.attr("axis"),)
    return tuple(sorted(inst.attr("axes")))


def dot_row_free_axes(comp: Computation, dot: Instruction) -> tuple[int, ...]:
    """The axes of a dot's result that come from the rhs free dimensions (the columns)."""
    rhs = comp[dot.operands[1]].array_shape
    (_, rc), (_, rb) = dot.attr("contracting"), dot.attr("batch")
    n_rhs_free = rhs.rank - len(rc) - len(rb)
    rank = dot.array_shape.rank
    return tuple(range(rank - n_rhs_free, rank))


@dataclass(frozen=True)
class Space:
    """The iteration space of a fused kernel."""

    full: tuple[int, ...]  # S
    axes: tuple[int, ...]  # A: reduced axes, () for a loop fusion

    @property
    def kept(self) -> tuple[int, ...]:
        return tuple(d for i, d in enumerate(self.full) if i not in self.axes)

    @property
    def kept_unit(self) -> tuple[int, ...]:
        """K with the reduced axes kept as size 1 (jnp's keepdims)."""
        return tuple(1 if i in self.axes else d for i, d in enumerate(self.full))

    def in_row(self, dims: tuple[int, ...]) -> bool:
        return dims in (self.full, self.kept, self.kept_unit)

    def describe(self) -> str:
        if not self.axes:
            return f"[{','.join(map(str, self.full))}]"
        return f"reduce {list(self.axes)} of [{','.join(map(str, self.full))}]"


class Refusal(Exception):
    """A candidate set of members that no one kernel can compute; `str()` is the reason."""


def group_space(comp: Computation, members: set[str]) -> tuple[Space | None, Instruction | None]:
    """The space of `members` and their dot (if any); Refusal when they have none in common."""
    dots = [comp[m] for m in members if comp[m].op is Op.DOT_GENERAL]
    if len(dots) > 1:
        raise Refusal("a fusion holds at most one dot")
    dot = dots[0] if dots else None
    if dot is not None:
        inside = [o for o in dot.operands if o in members]
        if inside:
            raise Refusal(f"{dot.name}'s operands go to BLAS as they are; {inside[0]} cannot fuse into it")
    spaces = {
        Space(comp[comp[m].operands[0]].array_shape.dims, reduced_axes(comp[m]))
        for m in members
        if comp[m].info.kind is Kind.REDUCTION
    }
    if len(spaces) > 1:
        described = " vs ".join(sorted(s.describe() for s in spaces))
        raise Refusal(f"iteration spaces differ: {described}")
    space = spaces.pop() if spaces else None
    if dot is not None:
        dims = dot.array_shape.dims
        if space is None:
            space = Space(dims, ())
        elif space.full != dims:
            raise Refusal(f"iteration spaces differ: {space.describe()} vs the dot's {list(dims)}")
        elif not set(space.axes) <= set(dot_row_free_axes(comp, dot)):
            raise Refusal(f"{space.describe()} reduces across the dot's rows, which BLAS computes in blocks")
    return space, dot


def downstream(comp: Computation, members: set[str], sources: set[str]) -> set[str]:
    """Members that depend (within `members`) on any of `sources`, sources included."""
    reached = set(sources)
    for inst in comp.instructions:
        if inst.name in members and inst.name not in reached:
            if any(o in reached for o in inst.operands):
                reached.add(inst.name)
    return reached


def check_rows(comp: Computation, members: set[str], space: Space, sources: set[str]) -> None:
    """Members depending on a reduction or the dot must stay within one row of `space`."""
    for name in downstream(comp, members, sources):
        inst = comp[name]
        if name in sources and inst.op is Op.DOT_GENERAL:
            continue
        if inst.info.kind is Kind.REDUCTION:
            if comp[inst.operands[0]].array_shape.dims != space.full:
                raise Refusal(f"{name} reduces a value outside the row")
            continue
        dims = inst.array_shape.dims
        if not space.in_row(dims):
            raise Refusal(f"{name} ({inst.op} to {list(dims)}) leaves the row of {space.describe()}")
        if inst.op is Op.BROADCAST_IN_DIM:
            source = comp[inst.operands[0]].array_shape.dims
            if not _row_broadcast(source, dims, inst.attr("dims"), space):
                raise Refusal(f"{name} broadcasts across rows of {space.describe()}")
        elif inst.info.kind is not Kind.ELEMENTWISE and inst.op is not Op.RESHAPE:
            raise Refusal(f"{name} ({inst.op}) moves data across the rows of {space.describe()}")


def _row_broadcast(source, target, dims, space: Space) -> bool:
    """A broadcast from the kept shape (or keepdims form) to S along the kept axes."""
    if target != space.full:
        return source == target or (space.in_row(source) and space.in_row(target))
    kept_axes = [i for i in range(len(space.full)) if i not in space.axes]
    if source == space.kept:
        return tuple(dims) == tuple(kept_axes)
    if source == space.kept_unit:
        return tuple(dims) == tuple(range(len(space.full)))
    return False


def check_group(comp: Computation, members: set[str], outputs: set[str]) -> Space:
    """The group's space, or Refusal naming why `members` cannot be one kernel."""
    if len(outputs) > 1:
        for o in outputs:
            inst = comp[o]
            if inst.op is Op.DYNAMIC_UPDATE_SLICE and comp[inst.operands[0]].op is Op.PARAMETER:
                # a scan's stacked output: alone, the backends write just its window in place
                raise Refusal(f"{o} updates a window of {inst.operands[0]} in place, a kernel of its own")
    space, dot = group_space(comp, members)
    if space is None:  # a loop fusion: every output iterates the same space
        dims = {comp[o].array_shape.dims for o in outputs}
        if len(dims) > 1:
            raise Refusal(f"outputs of different shapes {sorted(map(list, dims))} need separate loops")
        full = dims.pop() if dims else ()
        return Space(full, ())
    sources = {m for m in members if comp[m].info.kind is Kind.REDUCTION}
    if dot is not None:
        sources.add(dot.name)
    check_rows(comp, members, space, sources)
    for o in outputs:
        if not space.in_row(comp[o].array_shape.dims):
            raise Refusal(f"output {o} {comp[o].shape} is not in the space {space.describe()}")
    return space
