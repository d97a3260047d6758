"""Scan fusion: a while that `xfuse.hlo.scan.scan_loop` finds elementwise over one space S
becomes one `fusion(kind=scan)`, whose kernel carries each element of S through every step
(the time loop inside the element loop), so no step launches a kernel or writes its carries
to memory. XLA runs such a loop one step at a time; a scan of elementwise cells (an
exponential moving average, a leaky integrator, a cumulative recurrence) is all dispatch and
memory traffic there.

The fused computation holds the loop itself (so it means what the while meant: every
interpreter and backend can run it as it is), the constant parts of its initial state (a
scan's zeroed ys), and returns the carries and stacks only: the counter's final value is a
constant and an invariant is its initial value, so the rewrite reads those from outside.
The loop's condition and body stay unfused: they belong to the fusion. May import xfuse.hlo.
"""

from __future__ import annotations

import numpy as np

from xfuse.hlo import Computation, Instruction, Literal, Module, Op, TupleShape, fresh_name
from xfuse.hlo.scan import ScanLoop, scan_loop

from .outline import FusionInfo
from .report import DecisionInfo


def fusion_bodies(module: Module) -> set[str]:
    """The computations fusions call, and everything those call in turn."""
    found: set[str] = set()
    pending = [i.attr("calls") for c in module.computations for i in c.instructions if i.op is Op.FUSION]
    while pending:
        name = pending.pop()
        if name in found:
            continue
        found.add(name)
        pending.extend(c for i in module[name].instructions for c in i.callees)
    return found


def scan_fusions(module: Module) -> tuple[Module, list[FusionInfo], list[DecisionInfo]]:
    """`module` with every eligible while made a scan fusion; the fusions; a decision for
    every while considered."""
    skip = fusion_bodies(module)
    taken = {c.name for c in module.computations}
    infos: list[FusionInfo] = []
    decisions: list[DecisionInfo] = []
    computations: list[Computation] = []
    changed = False
    for comp in module.computations:
        if comp.name in skip or not any(i.op is Op.WHILE for i in comp.instructions):
            computations.append(comp)
            continue
        plans = {}
        users = comp.users()
        for inst in comp.instructions:
            if inst.op is not Op.WHILE:
                continue
            plan = scan_loop(module, comp, inst)
            if isinstance(plan, ScanLoop) and (inst.name == comp.root or any(
                    comp[u].op is not Op.GET_TUPLE_ELEMENT for u in users[inst.name])):
                plan = "its whole state is used as a tuple"
            if isinstance(plan, str):
                decisions.append(DecisionInfo(inst.name, "while", "-", False, f"not a scan fusion: {plan}"))
                continue
            plans[inst.name] = plan
        if not plans:
            computations.append(comp)
            continue
        rewritten, callees, made = _rewrite(module, comp, plans, taken)
        computations.extend(callees)
        computations.append(rewritten)
        infos.extend(made)
        for info in made:
            plan = plans[info.name]
            decisions.append(DecisionInfo(
                info.name, "while", info.name, True,
                f"scan fusion: {plan.trips} steps elementwise over {list(plan.dims)}, "
                f"the time loop inside one kernel", info.bytes_saved))
        changed = True
    if not changed:
        return module, infos, decisions
    return module.replace(computations=tuple(computations)), infos, decisions


def _rewrite(module: Module, comp: Computation, plans: dict[str, ScanLoop], taken: set[str]):
    """(comp with its planned whiles fused, the fused computations, their infos)."""
    out: list[Instruction] = []
    rename: dict[str, str] = {}
    callees: list[Computation] = []
    infos: list[FusionInfo] = []
    replaced: dict[str, tuple[Instruction, ScanLoop, list[int]]] = {}
    for inst in comp.instructions:
        inst = inst.replace(operands=tuple(rename.get(o, o) for o in inst.operands))
        if inst.name in plans:
            plan = plans[inst.name]
            callee, operands = _callee(comp, inst, plan, fresh_name(f"fused_scan_{_safe(inst.name)}", taken))
            callees.append(callee)
            kept = list(plan.kept)
            fusion = Instruction(inst.name, Op.FUSION, callee.result_shape, tuple(operands),
                                 (("kind", "scan"), ("calls", callee.name)), inst.loc)
            out.append(fusion)
            replaced[inst.name] = (inst, plan, kept)
            infos.append(_info(module, inst, plan, callee))
            continue
        if inst.op is Op.GET_TUPLE_ELEMENT and inst.operands[0] in replaced:
            loop, plan, kept = replaced[inst.operands[0]]
            j = inst.attr("index")
            if j in kept:
                out.append(inst.replace(attrs=(("index", kept.index(j)),)))
            elif j == plan.counter:
                dtype = inst.array_shape.dtype
                value = Literal(np.array(plan.final_counter, dtype.numpy), dtype)
                out.append(inst.replace(op=Op.CONSTANT, operands=(), attrs=(("value", value),)))
            else:  # invariant: its initial value
                rename[inst.name] = loop.operands[j]
            continue
        out.append(inst)
    root = rename.get(comp.root, comp.root)
    return _without_dead(Computation(comp.name, tuple(out), root)), callees, infos


def _callee(comp: Computation, loop: Instruction, plan: ScanLoop, name: str) -> tuple[Computation, list[str]]:
    """The fused computation of `loop` and the operands the fusion passes it."""
    params: dict[str, str] = {}
    body: list[Instruction] = []
    state: list[str] = []
    for j, operand in enumerate(loop.operands):
        source = comp[operand]
        if source.op is Op.CONSTANT or source.op is Op.BROADCAST_IN_DIM and comp[source.operands[0]].op is Op.CONSTANT:
            inner = f"init.{j}"
            if source.op is Op.BROADCAST_IN_DIM:
                scalar = comp[source.operands[0]]
                body.append(scalar.replace(name=f"{inner}.value"))
                body.append(source.replace(name=inner, operands=(f"{inner}.value",)))
            else:
                body.append(source.replace(name=inner))
            state.append(inner)
            continue
        if operand not in params:
            params[operand] = f"p{len(params)}"
        state.append(params[operand])
    head = [Instruction(p, Op.PARAMETER, comp[o].shape, (), (("index", k),)) for k, (o, p) in enumerate(params.items())]
    # names of fixed forms (p<k>, init.<j>, loop, loop.<j>, result): none can clash
    inner_loop = loop.replace(name="loop", operands=tuple(state))
    elements = []
    for j in plan.kept:
        elements.append(Instruction(f"loop.{j}", Op.GET_TUPLE_ELEMENT, loop.shape.elements[j],
                                    ("loop",), (("index", j),), loop.loc))
    root = Instruction("result", Op.TUPLE, TupleShape(tuple(e.shape for e in elements)),
                       tuple(e.name for e in elements))
    instructions = (*head, *body, inner_loop, *elements, root)
    return Computation(name, instructions, root.name), list(params)


def _info(module: Module, loop: Instruction, plan: ScanLoop, callee: Computation) -> FusionInfo:
    body = module[loop.attr("body")]
    members = [i.name for i in body.instructions if i.op is not Op.PARAMETER]
    # each step's carries and rows no longer go through memory: two passes over the carries
    saved = 2 * plan.trips * sum(body.parameters[j].shape.nbytes for j in plan.carries)
    locs = list(dict.fromkeys(str(i.loc) for i in body.instructions if i.loc))
    outputs = [f"{loop.name}.{j}" for j in plan.kept]
    return FusionInfo(loop.name, callee.name, "scan", members, [str(body[m].op) for m in members],
                      outputs, locs, saved, extra={"trips": plan.trips, "space": list(plan.dims)})


def _without_dead(comp: Computation) -> Computation:
    """`comp` without constants and broadcasts that nothing reads any more (a fused loop's
    initial state)."""
    while True:
        users = comp.users()
        dead = {i.name for i in comp.instructions if not users[i.name] and i.name != comp.root
                and i.op in (Op.CONSTANT, Op.BROADCAST_IN_DIM)}
        if not dead:
            return comp
        comp = comp.replace(instructions=tuple(i for i in comp.instructions if i.name not in dead))


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in name)
