"""Common subexpression elimination ("cse"): within each computation, an instruction with the
same op, shape, operands and attributes as an earlier one is dropped and its uses read the
earlier one (which keeps its own name and source line).

Constants compare bit for bit (`Literal`): -0.0 and 0.0 stay apart, NaNs with the same payload
merge. The operands of a commutative binary op are keyed in sorted order, so `add(x, y)` and
`add(y, x)` merge (the result may differ only in which NaN comes out when both are NaN).
Parameters are never merged, nor optimization barriers (a barrier is there to stop rewrites).
May import xfuse.hlo only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from xfuse.hlo import Computation, Instruction, Module, Op

from .pipeline import register
from .rewrite import map_computations

NEVER_MERGED = frozenset({Op.PARAMETER, Op.OPTIMIZATION_BARRIER})


def cse_key(inst: Instruction) -> tuple:
    """What two instructions must share to compute the same value."""
    operands = inst.operands
    if inst.info.commutative and len(operands) == 2:
        operands = tuple(sorted(operands))
    return (inst.op, inst.shape, operands, inst.attrs)


def eliminate_common_subexpressions(comp: Computation) -> Computation:
    """`comp` with duplicates merged into their first occurrence; the same object if none."""
    first: dict[tuple, str] = {}
    merged: dict[str, str] = {}  # duplicate -> survivor; survivors are never merged away
    kept: list[Instruction] = []
    for inst in comp.instructions:
        operands = tuple(merged.get(o, o) for o in inst.operands)
        if operands != inst.operands:
            inst = inst.replace(operands=operands)
        if inst.op not in NEVER_MERGED:
            survivor = first.setdefault(cse_key(inst), inst.name)
            if survivor != inst.name:
                merged[inst.name] = survivor
                continue
        kept.append(inst)
    if not merged:
        return comp
    return Computation(comp.name, tuple(kept), merged.get(comp.root, comp.root))


@register("cse")
@dataclass(frozen=True, slots=True)
class CommonSubexpressionElimination:
    """Merges identical instructions in every computation."""

    name: ClassVar[str] = "cse"

    def run(self, module: Module) -> Module:
        return map_computations(module, eliminate_common_subexpressions)
