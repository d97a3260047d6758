"""Module clean-up before code generation: calls inlined, and every kernel body renamed to
canonical names (p0, p1, ... for parameters, v0, v1, ... for the rest) so any HLO name, however
odd (`ROOT`, `Gv.wcAVpY`, a Python keyword), becomes a valid Python identifier.
"""

from __future__ import annotations

from xfuse.hlo import Computation, Instruction, Module, Op, fresh_name


def inline_calls(module: Module, comp: Computation) -> Computation:
    """`comp` with every `call` replaced by the called computation's instructions."""
    if not any(i.op is Op.CALL for i in comp.instructions):
        return comp
    out: list[Instruction] = []
    rename: dict[str, str] = {}
    taken = {i.name for i in comp.instructions}
    for inst in comp.instructions:
        operands = tuple(rename.get(o, o) for o in inst.operands)
        if inst.op is not Op.CALL:
            out.append(inst.replace(operands=operands))
            continue
        called = inline_calls(module, module[inst.attr("calls")])
        inner: dict[str, str] = {}
        for child in called.instructions:
            if child.op is Op.PARAMETER:
                inner[child.name] = operands[child.attr("index")]
                continue
            name = fresh_name(f"{inst.name}.{child.name}", taken)
            inner[child.name] = name
            out.append(child.replace(name=name, operands=tuple(inner[o] for o in child.operands)))
        rename[inst.name] = inner[called.root_instruction.name]
    root = rename.get(comp.root_instruction.name, comp.root_instruction.name)
    return Computation(comp.name, tuple(out), root)


def canonical(comp: Computation) -> Computation:
    """`comp` with parameters named p<index> and every other instruction v<position>."""
    names: dict[str, str] = {}
    for k, inst in enumerate(comp.instructions):
        names[inst.name] = f"p{inst.attr('index')}" if inst.op is Op.PARAMETER else f"v{k}"
    body = tuple(
        inst.replace(name=names[inst.name], operands=tuple(names[o] for o in inst.operands))
        for inst in comp.instructions
    )
    return Computation(comp.name, body, names[comp.root_instruction.name])
