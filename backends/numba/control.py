"""Lowering of control flow to runtime steps (`xfuse.runtime.control`): a while's condition
and body, and each branch of a conditional, become nested programs of their own; the runtime
runs the loop and picks the branch. A body's fusion that only writes a window of a state
element (a scan's ys[t]) is marked so the runtime writes that window in place (`window`).
Shared by the numba and C backends; imports neither numba nor the C toolchain.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from xfuse.hlo import Computation, Instruction, Module, Op, TupleShape

from .kernels import write_kernel


def _flat(comp: Computation) -> bool:
    """Whether a nested program of `comp` returns the elements of its tuple root (a `tuple`
    root) rather than one value."""
    return comp.root_instruction.op is Op.TUPLE


def control_step(
    module: Module,
    inst: Instruction,
    common: dict,
    lower: Callable[[Computation, str], dict],
    prefix: str,
) -> dict:
    """The step of a while or conditional; `lower(comp, prefix, loop_body)` makes a nested
    program (a loop body's with its windows, see `window`)."""
    if inst.op is Op.WHILE:
        condition, body = module[inst.attr("condition")], module[inst.attr("body")]
        program = lower(body, f"{prefix}{inst.name}.body.", True)
        return {
            "op": "while",
            **common,
            "condition": lower(condition, f"{prefix}{inst.name}.cond.", False),
            "body": program,
            "flat": _flat(body),
            "label": f"while {body.name}",
            "computations": [condition.name, body.name],  # loops of one body: a split loop's parts
            "owned": sorted(s["window"]["state"] for s in program["steps"] if "window" in s),
        }
    branches = [module[name] for name in inst.attr("branches")]
    return {
        "op": "conditional",
        **common,
        "branches": [lower(b, f"{prefix}{inst.name}.branch{k}.", False) for k, b in enumerate(branches)],
        "tupled": [_flat(b) for b in branches],
        "label": f"conditional over {', '.join(b.name for b in branches)}",
    }


# ---------------------------------------------------------------------------- windows
def entry(shape) -> list:
    return [list(shape.dims), shape.dtype.numpy.name]


def kernel_name(name: str) -> str:
    return "k_" + "".join(c if c.isalnum() else "_" for c in name)


def part(body: Computation, roots: list[str], name: str) -> Computation:
    """The part of a fused computation that computes `roots` (a tuple of them when several),
    with every parameter kept, so it takes the fusion's inputs as they are."""
    needed = set(roots)
    for inst in reversed(body.instructions):
        if inst.name in needed:
            needed.update(inst.operands)
    kept = [i for i in body.instructions if i.op is Op.PARAMETER or i.name in needed]
    if len(roots) == 1:
        return Computation(name, tuple(kept), roots[0])
    shape = TupleShape(tuple(body[r].shape for r in roots))
    return Computation(name, (*kept, Instruction(f"{name}.root", Op.TUPLE, shape, tuple(roots))), f"{name}.root")


def window(comp: Computation, inst: Instruction, fused: Computation, name: str, lowered) -> dict | None:
    """The window of a loop body's fusion `inst` that is only a dynamic_update_slice of a
    state element, which the body passes to nothing else and returns in the same place (a
    scan's stacked output): the runtime then writes just the update into that element's
    buffer, which the loop owns (it copies the initial value once), instead of copying the
    whole stack every step, as XLA does. `comp`: the body; `fused`: the fusion's computation
    (canonical names); `name`: its kernel's; the parts computing the update and the starts
    become kernels of `lowered`. None when the fusion is not such a window."""
    root = fused.root_instruction
    if root.op is not Op.DYNAMIC_UPDATE_SLICE or root.array_shape.rank == 0:
        return None
    index = {p.name: k for k, p in enumerate(fused.parameters)}
    target = root.operands[0]
    if target not in index or root.operands.count(target) != 1 or any(
            target in i.operands for i in fused.instructions if i is not root):
        return None
    operand = inst.operands[index[target]]
    state = comp[operand]
    results = comp.root_instruction
    if state.op is not Op.PARAMETER or results.op is not Op.TUPLE or inst.operands.count(operand) != 1:
        return None
    k = state.attr("index")
    if any(operand in i.operands for i in comp.instructions if i is not inst) \
            or k >= len(results.operands) or results.operands[k] != inst.name or results.operands.count(inst.name) != 1:
        return None
    update, starts = root.operands[1], list(root.operands[2:])
    return {"state": k, "target": index[target], "update": update, "starts": starts,
            "dims": list(root.array_shape.dims), "update_dims": list(fused[update].array_shape.dims),
            "parts": _parts(fused, [update, *starts], name, lowered)}


def _parts(fused: Computation, roots: list[str], name: str, lowered) -> dict:
    """A program from the fusion's inputs to `roots`: a parameter (or a reshape of one) or a
    constant as it is, any other value a kernel of its own (the update one loop kernel, each
    computed start a scalar one)."""
    params = list(range(len(fused.parameters)))
    slots: dict[str, int] = {p.name: k for k, p in enumerate(fused.parameters)}
    steps, constants, results = [], {}, []
    for j, root in enumerate(roots):
        if fused[root].op is Op.RESHAPE and fused[fused[root].operands[0]].op is Op.PARAMETER:
            root = fused[root].operands[0]  # the same elements in the same order: no copy
        if root not in slots:
            slot = slots[root] = len(slots)
            inst = fused[root]
            if inst.op is Op.CONSTANT:
                key = f"c{len(lowered.constants)}"
                lowered.constants[key] = np.array(inst.attr("value").array)
                constants[str(slot)] = key
            else:
                computation = part(fused, [root], f"{name}_part{j}")
                kernel = kernel_name(f"{name}_part{j}")
                source = write_kernel(computation, kernel, "loop")
                lowered.kernels[kernel] = source
                lowered.bodies[kernel] = computation
                steps.append({"op": "kernel", "name": f"{name}.part{j}", "inputs": params, "outputs": [slot],
                              "kernel": kernel, "label": f"window part {j} of {name}",
                              "specs": [entry(inst.array_shape)],
                              "params": [entry(fused[p].array_shape) for p in source.params],
                              "rows": source.rows, "parallel": source.parallel, "in_place": False, "dot": None})
        results.append(slots[root])
    return {"params": params, "results": results, "n_values": len(slots), "steps": steps, "constants": constants,
            "param_specs": [entry(p.shape) for p in fused.parameters]}
