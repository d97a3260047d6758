"""`cost_analysis`: flops and bytes accessed per kernel and in total, like jax's
`Compiled.cost_analysis()`. A kernel is a fusion or an instruction that computes on its own;
its bytes are what it reads (its operands) and writes (its result). May import xfuse.hlo only.
"""

from __future__ import annotations

from xfuse.hlo import Computation, Module, Op
from xfuse.hlo.scan import ScanLoop, scan_loop

from .cost import instruction_flops
from .fuse import UNCOUNTED


def cost_analysis(module: Module) -> dict:
    """{"flops", "bytes accessed", "kernels": [{"name", "kind", "flops", "bytes accessed"}]}."""
    entry = module.entry_computation
    kernels = []
    for inst in entry.instructions:
        if inst.op in UNCOUNTED:
            continue
        if inst.op is Op.FUSION:
            body = module[inst.attr("calls")]
            flops = sum(instruction_flops(body, i) for i in body.instructions)
            kind = inst.attr("kind")
            if kind == "scan":
                flops += _scan_flops(module, body)
        else:
            flops = instruction_flops(entry, inst)
            kind = str(inst.op)
        read = sum(entry[o].shape.nbytes for o in dict.fromkeys(inst.operands))
        kernels.append(
            {
                "name": inst.name,
                "kind": kind,
                "flops": float(flops),
                "bytes accessed": float(read + inst.shape.nbytes),
            }
        )
    return {
        "flops": float(sum(k["flops"] for k in kernels)),
        "bytes accessed": float(sum(k["bytes accessed"] for k in kernels)),
        "kernels": kernels,
    }


def _scan_flops(module: Module, comp: Computation) -> int:
    """A scan fusion's loop: its body's flops once per step."""
    loop = next((i for i in comp.instructions if i.op is Op.WHILE), None)
    plan = scan_loop(module, comp, loop) if loop is not None else None
    if not isinstance(plan, ScanLoop):
        return 0
    body = module[loop.attr("body")]
    return plan.trips * sum(instruction_flops(body, i) for i in body.instructions)
