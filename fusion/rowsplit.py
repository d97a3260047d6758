"""Loop row splitting ("rowsplit"): a while loop whose body keeps the rows of a batch apart runs
as independent loops over parts of the batch, which the runtime runs at once on its threads.

A scanned RNN's step `h = tanh(x_t @ wx + h @ wh + b)` needs the step before, so the loop is a
chain of small products on one core. But each row of `h` depends only on the same row of `h`
and of `x_t` in the step before: the batch splits, and each part of it runs the whole loop on
its own, with no step waiting for another part.

The proof is an axis per value of the loop (the body and the condition): either `None`, a
value the same in every part (the counter, the weights), or the axis along which the value's
rows belong to the parts. Each op has a rule: an elementwise op keeps its operands' axis; a dot
keeps a free axis of one side when the other side is the same in every part; a reshape keeps an
axis whose extent and the product of the dims before it it keeps; a transpose, and a reversal
of other axes, move it; a dynamic slice or update
keeps an axis it takes whole; a reduction keeps an axis it does not reduce; and so on. Anything
else that reads a split value (a reduction over the batch, a dot contracting it, `h @ h.T`)
disproves it. A broadcast of a value the same in every part may be split along an axis it
broadcasts along. Where an op needs an operand split that is not yet, the requirement goes back
through the operand's producers to the loop's state, and the proof starts again with that state
element split too. The condition must read no split value, and each state element must leave
the body split as it entered.

The loop is tried split along each axis of each state element; the proof that splits the most
work wins, and only a proof that splits a matrix product is kept. The loop becomes one loop per
part over slices of its split state (the parts share one body and one condition, of the part's
shapes), and its result the concatenation of the parts' results. Each split is recorded in
`splits`. May import xfuse.hlo only.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

from xfuse.hlo import Computation, Instruction, Module, Op, Shape, TupleShape
from xfuse.hlo.ops import Kind

from .dce import live_names
from .licm import call_counts, own_loops
from .pipeline import register
from .rewrite import Namer

REDUCTIONS = frozenset({Op.REDUCE_SUM, Op.REDUCE_MAX, Op.REDUCE_MIN, Op.REDUCE_PROD, Op.REDUCE_AND, Op.REDUCE_OR})
# What a split gains is its small products running at once: a product of more multiply-adds
# than THREADED_MACS runs on BLAS's threads whole (the numba backend's SMALL_DOT), where a
# 64-row product beats two 32-row ones on a thread each (64x256 by 256x1024 with two threads:
# 174 us; 32 rows on one thread: 198 us). A loop stays whole where its small split products do
# fewer multiply-adds a step than MIN_SPLIT_MACS (handing a part to another thread costs tens
# of microseconds) or less than SMALL_SHARE of the split ones (an LSTM's 64x256 by 256x1024
# gates product with a 64x64 by 64x1024 input product: 13.9 ms split, 13.5 ms whole).
THREADED_MACS = 1 << 22
MIN_SPLIT_MACS = 1 << 18
SMALL_SHARE = 0.5
# Each part does the products that are not split in full: a loop stays whole where those do
# more than MAX_REPEATED_SHARE of the split ones (an LSTM gradient's loop split along the
# hidden features of its weight gradient would do its gates' products twice: 77 ms, whole 30).
MAX_REPEATED_SHARE = 0.25


class _Disproved(Exception):
    """The body mixes rows of different parts (the message says where)."""


class _Again(Exception):
    """The proof starts again: `need` maps values (or state element indices) to the axis they
    must be split along."""

    def __init__(self, need: dict) -> None:
        super().__init__(need)
        self.need = need


@dataclass(frozen=True)
class RowSplit:
    """One split loop, for reports."""

    loop: str
    parts: int
    rows: int
    axes: tuple  # per state element: the split axis, or None

    def __str__(self) -> str:
        split = ", ".join(f"{k}: axis {a}" for k, a in enumerate(self.axes) if a is not None)
        return (f"{self.loop}: runs as {self.parts} loops over {self.rows // self.parts} of its {self.rows} "
                f"rows each (state elements {split}); each row depends only on its own row")


def _dims(inst: Instruction) -> tuple[int, ...]:
    return inst.shape.dims if isinstance(inst.shape, Shape) else ()


class _Proof:
    """The axes of one computation's values, given its parameters' axes (`state`) and the
    values forced split (`forced`: broadcasts split along an axis they broadcast along)."""

    def __init__(self, comp: Computation, state: dict[int, int | None], forced: dict[str, int]) -> None:
        self.comp, self.state, self.forced = comp, state, forced
        self.axis: dict[str, int | None] = {}
        for inst in comp.instructions:  # the root tuple's elements are checked by `prove`
            root_tuple = inst.name == comp.root and inst.op is Op.TUPLE
            self.axis[inst.name] = None if root_tuple else self.rule(inst)

    def need(self, name: str, a: int) -> None:
        """Raises _Again with what splitting value `name` along `a` takes (or _Disproved)."""
        inst = self.comp[name]
        have = self.axis.get(name)
        if have == a:
            return
        if have is not None:
            raise _Disproved(f"{name} is split along axis {have}, needed along {a}")
        op = inst.op
        if op is Op.PARAMETER:
            raise _Again({inst.attr("index"): a})
        if op in (Op.BROADCAST_IN_DIM, Op.IOTA, Op.CONSTANT) and not self._varies(inst, a):
            raise _Again({name: a})
        if op is Op.BROADCAST_IN_DIM:
            self.need(inst.operands[0], inst.attr("dims").index(a))
        elif op is Op.RESHAPE:
            self.need(inst.operands[0], _reshaped_axis(_dims(inst), _dims(self.comp[inst.operands[0]]), a))
        elif op is Op.TRANSPOSE:
            self.need(inst.operands[0], inst.attr("permutation")[a])
        elif op is Op.REV and a not in inst.attr("dimensions"):
            self.need(inst.operands[0], a)
        elif op in (Op.DYNAMIC_SLICE, Op.SLICE) and _dims(self.comp[inst.operands[0]])[a] == _dims(inst)[a]:
            self.need(inst.operands[0], a)  # the axis taken whole
        elif op is Op.CONCATENATE and a != inst.attr("dimension"):
            for o in inst.operands:
                self.need(o, a)
        elif op is Op.DOT_GENERAL:
            (lc, rc), (lb, rb) = inst.attr("contracting"), inst.attr("batch")
            lhs, rhs = (_dims(self.comp[o]) for o in inst.operands)
            l_free = [k for k in range(len(lhs)) if k not in lc and k not in lb]
            r_free = [k for k in range(len(rhs)) if k not in rc and k not in rb]
            if a < len(lb):
                self.need(inst.operands[0], lb[a])
                self.need(inst.operands[1], rb[a])
            elif a < len(lb) + len(l_free):
                self.need(inst.operands[0], l_free[a - len(lb)])
            else:
                self.need(inst.operands[1], r_free[a - len(lb) - len(l_free)])
        elif inst.info.kind is Kind.ELEMENTWISE:
            for o in inst.operands:
                if _dims(self.comp[o]) == _dims(inst):
                    self.need(o, a)
        raise _Disproved(f"{name} ({op}) cannot be split along axis {a}")

    def _varies(self, inst: Instruction, a: int) -> bool:
        """Whether the value can differ along axis `a` (a broadcast's or an iota's other axes,
        a scalar constant's none; not an axis a broadcast takes from one of extent 1)."""
        if inst.op is Op.BROADCAST_IN_DIM:  # an operand's axis of extent 1 is broadcast too
            dims = inst.attr("dims")
            return a in dims and _dims(self.comp[inst.operands[0]])[dims.index(a)] != 1
        if inst.op is Op.IOTA:
            return a == inst.attr("dimension")
        return inst.op is Op.CONSTANT and bool(_dims(inst))

    def rule(self, inst: Instruction) -> int | None:
        op, name = inst.op, inst.name
        ins = [self.axis[o] for o in inst.operands]
        if op is Op.PARAMETER:
            return self.state.get(inst.attr("index"))
        if name in self.forced:
            if op is Op.BROADCAST_IN_DIM and any(x is not None for x in ins):
                raise _Disproved(f"{name} is both split and broadcast along axis {self.forced[name]}")
            return self.forced[name]
        if all(x is None for x in ins):
            return None
        if op is Op.BROADCAST_IN_DIM:
            return inst.attr("dims")[ins[0]]
        if op is Op.TRANSPOSE:
            return inst.attr("permutation").index(ins[0])
        if op is Op.REV:
            if ins[0] in inst.attr("dimensions"):
                raise _Disproved(f"{name} reverses the split axis")
            return ins[0]
        if op is Op.RESHAPE:
            return _reshaped_axis(_dims(self.comp[inst.operands[0]]), _dims(inst), ins[0])
        if op in REDUCTIONS or op in (Op.ARGMAX, Op.ARGMIN):
            axes = inst.attr("axes") if op in REDUCTIONS else (inst.attr("axis"),)
            if ins[0] in axes:
                raise _Disproved(f"{name} reduces over the split axis")
            return ins[0] - sum(1 for x in axes if x < ins[0])
        if op is Op.DOT_GENERAL:
            return self._dot(inst, ins)
        if op is Op.DYNAMIC_SLICE or op is Op.DYNAMIC_UPDATE_SLICE:
            arrays = 1 if op is Op.DYNAMIC_SLICE else 2
            if any(x is not None for x in ins[arrays:]):
                raise _Disproved(f"{name} starts at a split index")
            a = next(x for x in ins[:arrays] if x is not None)
            for o in inst.operands[:arrays]:
                if _dims(self.comp[o])[a] != _dims(inst)[a]:
                    raise _Disproved(f"{name} does not take the split axis whole")
                self.need(o, a)
            return a
        if op is Op.SLICE:
            a = ins[0]
            if inst.attr("start")[a] != 0 or inst.attr("limit")[a] != _dims(inst)[a] or inst.attr("strides")[a] != 1:
                raise _Disproved(f"{name} slices the split axis")
            return a
        if op is Op.CONCATENATE:
            a = next(x for x in ins if x is not None)
            if a == inst.attr("dimension"):
                raise _Disproved(f"{name} concatenates along the split axis")
            for o in inst.operands:
                self.need(o, a)
            return a
        if inst.info.kind is Kind.ELEMENTWISE:
            axes = {x for x in ins if x is not None}
            if len(axes) != 1:
                raise _Disproved(f"{name} combines values split along different axes")
            (a,) = axes
            for o in inst.operands:
                if _dims(self.comp[o]) == _dims(inst):
                    self.need(o, a)
                elif _dims(self.comp[o]):
                    raise _Disproved(f"{name} reads {o} of another shape")
            return a
        raise _Disproved(f"{name} ({op}) reads a split value")

    def _dot(self, inst: Instruction, ins: list) -> int:
        (lc, rc), (lb, rb) = inst.attr("contracting"), inst.attr("batch")
        lhs, rhs = (_dims(self.comp[o]) for o in inst.operands)
        l_free = [k for k in range(len(lhs)) if k not in lc and k not in lb]
        r_free = [k for k in range(len(rhs)) if k not in rc and k not in rb]
        la, ra = ins
        if la is not None and la in lb:
            self.need(inst.operands[1], rb[lb.index(la)])
            return lb.index(la)
        if ra is not None and ra in rb:
            self.need(inst.operands[0], lb[rb.index(ra)])
            return rb.index(ra)
        if la is not None and ra is not None:
            raise _Disproved(f"{inst.name} multiplies two split values")
        if la is not None:
            if la in lc:
                raise _Disproved(f"{inst.name} contracts the split axis")
            return len(lb) + l_free.index(la)
        if ra in rc:
            raise _Disproved(f"{inst.name} contracts the split axis")
        return len(lb) + len(l_free) + r_free.index(ra)


def _reshaped_axis(before: tuple, after: tuple, a: int) -> int:
    """The axis of `after` that holds axis `a` of `before` (the same extent, and the same
    product of the dims before it), or _Disproved."""
    prefix = math.prod(before[:a])
    for b, d in enumerate(after):
        if d == before[a] and math.prod(after[:b]) == prefix:
            return b
    raise _Disproved(f"a reshape from {before} to {after} moves axis {a}")


def prove(body: Computation, cond: Computation, state: dict[int, int]) -> tuple[dict, dict, dict] | None:
    """(state axes, body axes, condition axes) of a loop split with `state` (index -> axis) to
    start from, or None when its body mixes the rows."""
    n = len(body.parameters)
    state = {k: state.get(k) for k in range(n)}
    forced: dict[str, int] = {}
    for _ in range(8 * n + 8):
        try:
            proof = _Proof(body, state, forced)
            root = body.root_instruction
            if root.op is not Op.TUPLE:
                return None
            for k, o in enumerate(root.operands):
                if state[k] is not None:
                    proof.need(o, state[k])
                elif proof.axis[o] is not None:
                    raise _Again({k: proof.axis[o]})
            try:
                condition = _Proof(cond, state, {})
            except _Again as again:  # the condition reads a split value with a whole one
                if any(isinstance(key, str) for key in again.need):
                    return None
                raise
            if condition.axis[cond.root] is not None:
                return None
            return state, proof.axis, condition.axis
        except _Again as again:
            for key, a in again.need.items():
                if isinstance(key, int):
                    if state[key] is not None:
                        return None
                    state[key] = a
                else:
                    forced[key] = a
        except _Disproved:
            return None
    return None


def _split_macs(body: Computation, axes: dict) -> tuple[int, int, int]:
    """Multiply-adds a step of the products that reach the root do: (split, split and of at
    most `THREADED_MACS` whole, not split)."""
    live = live_names(body)
    split = small = whole = 0
    for inst in body.instructions:
        if inst.op is Op.DOT_GENERAL and inst.name in live:
            lc = inst.attr("contracting")[0]
            lhs = _dims(body[inst.operands[0]])
            macs = math.prod(_dims(inst)) * math.prod(lhs[k] for k in lc)
            if axes.get(inst.name) is None:
                whole += macs
            else:
                split += macs
                small += macs if macs <= THREADED_MACS else 0
    return split, small, whole


def _halved(comp: Computation, axes: dict, parts: int) -> Computation:
    """`comp` for one part: each split value's axis `parts` times shorter."""
    out = []
    for inst in comp.instructions:
        a = axes.get(inst.name)
        if a is None:
            out.append(inst)
            continue
        dims = list(inst.shape.dims)
        dims[a] //= parts
        attrs = inst.attrs
        if inst.op is Op.SLICE:
            attrs = tuple((k, tuple(dims[a] if i == a else x for i, x in enumerate(v)) if k == "limit" else v)
                          for k, v in attrs)
        out.append(inst.replace(shape=Shape(inst.shape.dtype, tuple(dims)), attrs=attrs))
    root = comp.root_instruction
    if root.op is Op.TUPLE:
        shapes = {i.name: i.shape for i in out}
        out = [i.replace(shape=TupleShape(tuple(shapes[o] for o in i.operands))) if i.name == root.name else i
               for i in out]
    return comp.replace(instructions=tuple(out))


def default_parts() -> int:
    """The runtime's thread count (XFUSE_NUM_THREADS, else the CPUs this process may use)."""
    value = os.environ.get("XFUSE_NUM_THREADS")
    if value and value.isdigit() and int(value) > 0:
        return int(value)
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


@register("rowsplit")
@dataclass(frozen=True)
class RowSplitLoops:
    name: str = "rowsplit"
    parts: int = 0  # 0: the runtime's thread count
    splits: list = field(default_factory=list, compare=False, repr=False)

    def run(self, module: Module) -> Module:
        parts = self.parts or min(default_parts(), 2)
        if parts < 2:
            return module
        counts = call_counts(module)
        entry = module.entry_computation
        current = {c.name: c for c in module.computations}
        instructions, root = list(entry.instructions), entry.root
        changed = False
        for loop, cond_name, body_name in own_loops(entry, counts):
            found = self.best(current[body_name], current[cond_name], parts)
            if found is None:
                continue
            state, body_axes, cond_axes = found
            current[body_name] = _halved(current[body_name], body_axes, parts)
            current[cond_name] = _halved(current[cond_name], cond_axes, parts)
            instructions, root = self.rewrite(instructions, loop, state, parts, root)
            changed = True
        if not changed:
            return module
        current[entry.name] = entry.replace(instructions=tuple(instructions), root=root)
        return module.replace(computations=tuple(current[c.name] for c in module.computations))

    def best(self, body: Computation, cond: Computation, parts: int):
        """The proof splitting the most product work, or None where none gains enough (the
        thresholds above)."""
        best, best_macs = None, 0
        tried = set()
        for k, p in enumerate(body.parameters):
            for a, extent in enumerate(_dims(p)):
                if extent < parts or extent % parts:
                    continue
                found = prove(body, cond, {k: a})
                if found is None:
                    continue
                key = tuple(sorted(found[0].items()))
                if key in tried:
                    continue
                tried.add(key)
                state, axes, _ = found
                extents = {_dims(body.parameters[j])[x] for j, x in state.items() if x is not None}
                extents |= {_dims(body[v])[x] for v, x in axes.items() if x is not None}
                if len(extents) != 1:
                    continue
                macs, small, repeated = _split_macs(body, axes)
                if small >= MIN_SPLIT_MACS and small >= SMALL_SHARE * macs and repeated <= MAX_REPEATED_SHARE * macs \
                        and macs > best_macs:
                    best, best_macs = found, macs
        return best

    def rewrite(self, instructions: list, loop: Instruction, state: dict, parts: int, root: str) -> tuple[list, str]:
        """(the instructions with `loop` split into `parts` loops, the root, renamed where it
        read an element of the loop)."""
        namer = Namer(i.name for i in instructions)
        by_name = {i.name: i for i in instructions}
        rows = next(by_name[loop.operands[k]].shape.dims[a] for k, a in state.items() if a is not None)
        size = rows // parts
        made, loops = [], []
        shared: dict[int, str] = {}  # state element -> the smaller broadcast every part starts from
        for p in range(parts):
            operands = []
            for k, o in enumerate(loop.operands):
                a = state[k]
                if a is None:
                    operands.append(o)
                    continue
                source = by_name[o]
                dims = source.shape.dims
                smaller = Shape(source.shape.dtype, tuple(size if i == a else d for i, d in enumerate(dims)))
                if source.op is Op.BROADCAST_IN_DIM and a not in source.attr("dims"):
                    # the same along the axis (a state's zeros): a smaller broadcast, no slice
                    if p == 0:
                        made.append(source.replace(name=namer(f"{loop.name}.rows"), shape=smaller))
                    operands.append(made[-1].name if p == 0 else shared[k])
                    shared[k] = operands[-1]
                    continue
                start = tuple(p * size if i == a else 0 for i in range(len(dims)))
                limit = tuple((p + 1) * size if i == a else d for i, d in enumerate(dims))
                part = Instruction(namer(f"{loop.name}.rows"), Op.SLICE, smaller,
                                   (o,), (("start", start), ("limit", limit), ("strides", (1,) * len(dims))),
                                   loop.loc)
                made.append(part)
                operands.append(part.name)
            elements = tuple(e if state[k] is None else
                             Shape(e.dtype, tuple(size if i == state[k] else d for i, d in enumerate(e.dims)))
                             for k, e in enumerate(loop.shape.elements))
            loops.append(loop.replace(name=namer(f"{loop.name}.part"), shape=TupleShape(elements),
                                      operands=tuple(operands)))
        after = []
        results = []
        for k, e in enumerate(loop.shape.elements):
            pieces = []
            for q in loops:
                g = Instruction(namer(f"{loop.name}.element"), Op.GET_TUPLE_ELEMENT, q.shape.elements[k],
                                (q.name,), (("index", k),), loop.loc)
                after.append(g)
                pieces.append(g.name)
                if state[k] is None:
                    break
            if state[k] is None:
                results.append(pieces[0])
                continue
            joined = Instruction(namer(f"{loop.name}.joined"), Op.CONCATENATE, e, tuple(pieces),
                                 (("dimension", state[k]),), loop.loc)
            after.append(joined)
            results.append(joined.name)
        regrouped = Instruction(loop.name, Op.TUPLE, loop.shape, tuple(results), (), loop.loc)
        self.splits.append(RowSplit(loop.name, parts, rows, tuple(state[k] for k in range(len(loop.operands)))))
        # An element read from the loop is read from its joined parts instead (the tuple is
        # left for other users, and to dce).
        rename = {i.name: results[i.attr("index")] for i in instructions
                  if i.op is Op.GET_TUPLE_ELEMENT and i.operands == (loop.name,)}
        out = []
        for inst in instructions:
            if inst.name == loop.name:
                out += [*made, *loops, *after, regrouped]
            elif inst.name not in rename:
                operands = tuple(rename.get(o, o) for o in inst.operands)
                out.append(inst if operands == inst.operands else inst.replace(operands=operands))
        return out, rename.get(root, root)
