"""Lowering of control flow to runtime steps (`xfuse.runtime.control`): a while's condition
and body, and each branch of a conditional, become nested programs of their own; the runtime
runs the loop and picks the branch. Shared by the numba and C backends; imports neither numba
nor the C toolchain.
"""

from __future__ import annotations

from collections.abc import Callable

from xfuse.hlo import Computation, Instruction, Module, Op


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
    """The step of a while or conditional; `lower(comp, prefix)` makes a nested program."""
    if inst.op is Op.WHILE:
        condition, body = module[inst.attr("condition")], module[inst.attr("body")]
        return {
            "op": "while",
            **common,
            "condition": lower(condition, f"{prefix}{inst.name}.cond."),
            "body": lower(body, f"{prefix}{inst.name}.body."),
            "flat": _flat(body),
            "label": f"while {body.name}",
        }
    branches = [module[name] for name in inst.attr("branches")]
    return {
        "op": "conditional",
        **common,
        "branches": [lower(b, f"{prefix}{inst.name}.branch{k}.") for k, b in enumerate(branches)],
        "tupled": [_flat(b) for b in branches],
        "label": f"conditional over {', '.join(b.name for b in branches)}",
    }
