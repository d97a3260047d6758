"""Loop-invariant code motion ("licm"): an instruction of a while body computed only from state
elements the body passes through unchanged (and constants) is computed once, before the loop,
and enters the loop as an extra state element that the body passes along; the condition takes
(and ignores) it too.

The while instruction keeps its name and shape: it becomes a tuple of the first elements of the
widened loop, so its users are unchanged (`simplify` forwards their tuple elements). Loops whose
body or condition another instruction also calls are left alone, as are instructions that
depend on no state element at all (constants and what is computed from constants alone: `fold`
takes those), and, as in XLA's pass, data movement a fusion inside the loop does for free and
instructions larger than what they read, unless a hoisted instruction reads them. Each
hoisting is recorded in `hoisted`.

A scan reads its inputs a slice per step, so a product of a step's input and an invariant
matrix (an RNN's `x_t @ w`) depends on the loop counter and cannot be hoisted as it is. When
the slice runs along free dimensions of the product, the product of the slice is the slice of
the product: `dot(slice(xs, t), w)` becomes `slice(dot(xs, w), t)`, and `dot(xs, w)`, now
invariant, is hoisted: one large matrix product for BLAS instead of one small one per step.
The rewrite is kept only where it lets the product be hoisted. May import xfuse.hlo only.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from xfuse.hlo import Computation, Instruction, Literal, Module, Op, Shape, TupleShape

from .pipeline import register
from .rewrite import Namer

NEVER_HOISTED = frozenset(
    {Op.PARAMETER, Op.CONSTANT, Op.TUPLE, Op.OPTIMIZATION_BARRIER, Op.WHILE, Op.CONDITIONAL}
)

# Moved only along with an instruction that reads them: a fusion in the loop does these for free.
NOT_WORTH_ALONE = frozenset(
    {Op.BROADCAST_IN_DIM, Op.RESHAPE, Op.TRANSPOSE, Op.SLICE, Op.REV, Op.IOTA, Op.GET_TUPLE_ELEMENT}
)


@dataclass(frozen=True)
class Hoisting:
    """One loop's hoisted instructions, for reports."""

    loop: str
    body: str
    instructions: tuple[str, ...]

    def __str__(self) -> str:
        names = ", ".join(self.instructions)
        return f"{self.loop}: hoisted {names} out of {self.body} (they read only loop-invariant values)"


def invariant_parameters(body: Computation) -> set[str]:
    """The parameters a body returns unchanged at their own position of its tuple root."""
    root = body.root_instruction
    if root.op is not Op.TUPLE:
        return set()
    params = body.parameters
    return {p.name for k, p in enumerate(params) if k < len(root.operands) and root.operands[k] == p.name}


def invariant_instructions(body: Computation) -> list[Instruction]:
    """The instructions of `body` computed from invariant parameters and constants only, that
    read at least one invariant parameter (directly or not), in the body's order."""
    fixed = invariant_parameters(body)
    constants = {i.name for i in body.instructions if i.op is Op.CONSTANT}
    hoisted: list[Instruction] = []
    reads_state: set[str] = set(fixed)
    for inst in body.instructions:
        if inst.op in NEVER_HOISTED or not inst.operands:
            continue
        if not all(o in fixed or o in constants or o in reads_state for o in inst.operands):
            continue
        if not any(o in reads_state for o in inst.operands):
            continue
        hoisted.append(inst)
        reads_state.add(inst.name)
    return _worth_hoisting(body, hoisted)


def _worth_hoisting(body: Computation, candidates: list[Instruction]) -> list[Instruction]:
    """The candidates worth their state element (as XLA's pass decides): not data movement a
    fusion does for free, and not larger than what they read; with what they read among the
    candidates."""
    by_name = {i.name: i for i in candidates}
    kept: set[str] = set()

    def keep(name: str) -> None:
        if name in by_name and name not in kept:
            kept.add(name)
            for operand in by_name[name].operands:
                keep(operand)

    for inst in candidates:
        read = sum(body[o].shape.nbytes for o in dict.fromkeys(inst.operands))
        if inst.op not in NOT_WORTH_ALONE and inst.shape.nbytes <= read:
            keep(inst.name)
    return [i for i in candidates if i.name in kept]


def _sliced_rows(body: Computation, value: Instruction, fixed: set[str]):
    """(array, starts) when `value` is a dynamic_slice of an invariant parameter taking one
    element along its first `t` dims and all of the others, possibly reshaped to drop those t
    unit dims; else None."""
    sliced = value
    if value.op is Op.RESHAPE:
        sliced = body[value.operands[0]]
    if sliced.op is not Op.DYNAMIC_SLICE or sliced.operands[0] not in fixed:
        return None
    array = body[sliced.operands[0]].array_shape
    sizes = sliced.array_shape.dims
    t = next((k for k, (n, d) in enumerate(zip(sizes, array.dims)) if n != 1 or d == 1), len(sizes))
    if t == 0 or sizes[t:] != array.dims[t:] or value.array_shape.dims not in (sizes, sizes[t:]):
        return None
    return sliced.operands[0], sliced.operands[1 : 1 + t]


def products_of_slices(body: Computation) -> Computation:
    """`body` with each `dot(slice(xs, t), w)` of invariant `xs` and `w` (see the module's
    docstring) written as `slice(dot(xs, w), t)`, where the whole product is no larger than
    what it reads (the test `_worth_hoisting` applies)."""
    fixed = invariant_parameters(body)
    namer = Namer([i.name for i in body.instructions])
    out: list[Instruction] = []
    for inst in body.instructions:
        found = None
        if inst.op is Op.DOT_GENERAL and inst.operands[1] in fixed and inst.attr("batch") == ((), ()):
            found = _sliced_rows(body, body[inst.operands[0]], fixed)
        if found is None:
            out.append(inst)
            continue
        xs, starts = found
        lhs_dims = body[xs].array_shape.dims
        lc, rc = inst.attr("contracting")
        kept = body[inst.operands[0]].array_shape.rank  # rank of the slice as the dot reads it
        drop = len(lhs_dims) - kept  # the unit dims the reshape dropped (0 without one)
        contracting = (tuple(c + drop for c in lc), tuple(rc))
        if any(c < len(starts) for c in contracting[0]):  # it sums over the sliced dims
            out.append(inst)
            continue
        free = [d for k, d in enumerate(lhs_dims) if k not in contracting[0]]
        rhs = body[inst.operands[1]].array_shape
        free += [d for k, d in enumerate(rhs.dims) if k not in rc]
        dtype = inst.array_shape.dtype
        whole = Shape(dtype, tuple(free))
        if whole.nbytes > body[xs].shape.nbytes + rhs.nbytes:
            out.append(inst)
            continue
        product = Instruction(namer("dot_general"), Op.DOT_GENERAL, whole, (xs, inst.operands[1]),
                              (("contracting", contracting), ("batch", ((), ()))), inst.loc)
        index = body[starts[0]].array_shape.dtype
        zero = Instruction(namer("constant"), Op.CONSTANT, Shape(index, ()), (),
                           (("value", Literal(np.zeros((), index.numpy), index)),), inst.loc)
        rows = (1,) * len(starts) + tuple(free[len(starts):])
        step = Instruction(namer("dynamic_slice"), Op.DYNAMIC_SLICE, Shape(dtype, rows),
                           (product.name, *starts, *[zero.name] * (len(free) - len(starts))), (), inst.loc)
        out += [product, zero, step, Instruction(inst.name, Op.RESHAPE, inst.shape, (step.name,), (), inst.loc)]
    return body if len(out) == len(body.instructions) else body.replace(instructions=tuple(out))


def call_counts(module: Module) -> dict[str, int]:
    counts: dict[str, int] = {}
    for comp in module.computations:
        for inst in comp.instructions:
            for name in inst.callees:
                counts[name] = counts.get(name, 0) + 1
    return counts


def own_loops(comp: Computation, counts: dict[str, int]):
    """(loop, condition name, body name) for each while of `comp` that alone calls its
    condition and its body (`counts`: `call_counts` of the module)."""
    for inst in comp.instructions:
        if inst.op is not Op.WHILE:
            continue
        cond_name, body_name = inst.attr("condition"), inst.attr("body")
        if counts.get(cond_name) == 1 and counts.get(body_name) == 1 and cond_name != body_name:
            yield inst, cond_name, body_name


@register("licm")
@dataclass(frozen=True)
class LoopInvariantCodeMotion:
    name: str = "licm"
    hoisted: list = field(default_factory=list, compare=False, repr=False)

    def run(self, module: Module) -> Module:
        counts = call_counts(module)
        current = {c.name: c for c in module.computations}
        changed = False
        for comp in module.computations:  # callees first: inner loops are hoisted into outer bodies
            for inst, cond_name, body_name in own_loops(current[comp.name], counts):
                rewritten = self.hoist(current[comp.name], inst, current[cond_name], current[body_name])
                if rewritten is not None:
                    current[comp.name], current[cond_name], current[body_name] = rewritten
                    changed = True
        if not changed:
            return module
        return module.replace(computations=tuple(current[c.name] for c in module.computations))

    def hoist(
        self, comp: Computation, loop: Instruction, cond: Computation, body: Computation
    ) -> tuple[Computation, Computation, Computation] | None:
        """(comp, cond, body) with the invariants of `loop` hoisted, or None if it has none."""
        rewritten = products_of_slices(body)
        hoisted = invariant_instructions(rewritten)
        if rewritten is not body:  # keep the rewrite only where the whole products move out
            moved = {i.name for i in hoisted}
            products = {i.name for i in rewritten.instructions if i.op is Op.DOT_GENERAL} - {
                i.name for i in body.instructions}
            if products <= moved:
                body = rewritten
            else:
                hoisted = invariant_instructions(body)
        if not hoisted:
            return None
        hoisted_names = {i.name for i in hoisted}
        users = body.users()
        # values the rest of the body reads: they become new state elements
        live_out = [i for i in hoisted if any(u not in hoisted_names for u in users[i.name])]
        if not live_out or any(isinstance(i.shape, TupleShape) for i in live_out):
            return None
        params = body.parameters
        namer = Namer([i.name for i in comp.instructions])
        outside = {p.name: loop.operands[k] for k, p in enumerate(params)}
        before: list[Instruction] = []
        for inst in body.instructions:  # constants the hoisted instructions read, copied out
            if inst.op is Op.CONSTANT and any(inst.name in h.operands for h in hoisted):
                outside[inst.name] = namer(inst.name)
                before.append(inst.replace(name=outside[inst.name]))
        for inst in hoisted:
            outside[inst.name] = namer(inst.name)
            operands = tuple(outside[o] for o in inst.operands)
            before.append(inst.replace(name=outside[inst.name], operands=operands))
        n = len(params)
        extra_shapes = tuple(i.shape for i in live_out)
        widened_shape = TupleShape((*loop.shape.elements, *extra_shapes))
        loop_users = [i for i in comp.instructions if loop.name in i.operands]
        # Read only through its tuple elements: the widened loop keeps the name. Otherwise
        # the name is a tuple of the widened loop's first elements.
        in_place = loop.name != comp.root and all(u.op is Op.GET_TUPLE_ELEMENT for u in loop_users)
        widened = loop.replace(
            name=loop.name if in_place else namer(loop.name),
            shape=widened_shape,
            operands=(*loop.operands, *(outside[i.name] for i in live_out)),
        )
        after: list[Instruction] = [widened]
        if not in_place:
            elements = [
                Instruction(namer(f"{loop.name}.element"), Op.GET_TUPLE_ELEMENT, s, (widened.name,),
                            (("index", k),), loop.loc)
                for k, s in enumerate(loop.shape.elements)
            ]  # fmt: skip
            names = tuple(e.name for e in elements)
            regrouped = Instruction(loop.name, Op.TUPLE, loop.shape, names, (), loop.loc)
            after.extend([*elements, regrouped])
        new_comp_instructions: list[Instruction] = []
        for inst in comp.instructions:
            if inst.name == loop.name:
                new_comp_instructions.extend([*before, *after])
            else:
                new_comp_instructions.append(inst)
        new_comp = comp.replace(instructions=tuple(new_comp_instructions))
        new_body = self._widen_body(body, hoisted_names, live_out, n)
        new_cond = self._widen(cond, live_out, n)
        self.hoisted.append(Hoisting(loop.name, body.name, tuple(i.name for i in hoisted)))
        return new_comp, new_cond, new_body

    @staticmethod
    def _new_parameters(comp: Computation, live_out: list[Instruction], n: int) -> list[Instruction]:
        namer = Namer([i.name for i in comp.instructions])
        return [
            Instruction(namer("invariant"), Op.PARAMETER, i.shape, (), (("index", n + k),), i.loc)
            for k, i in enumerate(live_out)
        ]

    def _widen(self, cond: Computation, live_out: list[Instruction], n: int) -> Computation:
        """The condition with the new state elements as parameters it does not read."""
        extra = self._new_parameters(cond, live_out, n)
        return cond.replace(instructions=(*cond.instructions, *extra))

    def _widen_body(
        self, body: Computation, hoisted: set[str], live_out: list[Instruction], n: int
    ) -> Computation:
        """The body without the hoisted instructions, reading the new parameters instead and
        passing them along at the end of its root tuple."""
        extra = self._new_parameters(body, live_out, n)
        rename = {i.name: p.name for i, p in zip(live_out, extra)}
        instructions: list[Instruction] = [*extra]
        root = body.root_instruction
        for inst in body.instructions:
            if inst.name in hoisted:
                continue
            operands = tuple(rename.get(o, o) for o in inst.operands)
            if inst.name == root.name:
                operands = (*operands, *(p.name for p in extra))
                shape = TupleShape((*inst.shape.elements, *(p.shape for p in extra)))
                inst = inst.replace(operands=operands, shape=shape)
            elif operands != inst.operands:
                inst = inst.replace(operands=operands)
            instructions.append(inst)
        # parameters first, in index order, so the computation reads like the others
        params = sorted((i for i in instructions if i.op is Op.PARAMETER), key=lambda p: p.attr("index"))
        rest = [i for i in instructions if i.op is not Op.PARAMETER]
        return body.replace(instructions=(*params, *rest))
