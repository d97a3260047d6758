"""Dead code elimination ("dce"): drops instructions the root of their computation does not
reach (parameters stay: they are the computation's signature) and computations the entry no
longer calls, directly or through other computations. Returns the same module when nothing is
dead. May import xfuse.hlo only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from xfuse.hlo import Computation, Module, Op

from .pipeline import register


def live_names(comp: Computation) -> set[str]:
    """The instructions the root reaches through operands (the root included)."""
    live: set[str] = set()
    stack = [comp.root]
    while stack:
        name = stack.pop()
        if name in live:
            continue
        live.add(name)
        stack.extend(comp[name].operands)
    return live


def remove_dead_instructions(comp: Computation) -> Computation:
    """`comp` without its dead instructions; the same object if none is dead."""
    live = live_names(comp)
    kept = tuple(i for i in comp.instructions if i.name in live or i.op is Op.PARAMETER)
    if len(kept) == len(comp.instructions):
        return comp
    return comp.replace(instructions=kept)


@register("dce")
@dataclass(frozen=True, slots=True)
class DeadCodeElimination:
    """Removes dead instructions, then the computations nothing live calls any more."""

    name: ClassVar[str] = "dce"

    def run(self, module: Module) -> Module:
        cleaned: dict[str, Computation] = {}
        pending = [module.entry]
        while pending:  # from the entry down through the calls that survive
            name = pending.pop()
            if name in cleaned:
                continue
            comp = remove_dead_instructions(module[name])
            cleaned[name] = comp
            pending.extend(name for i in comp.instructions for name in i.callees)
        kept = tuple(cleaned[c.name] for c in module.computations if c.name in cleaned)
        unchanged = len(kept) == len(module.computations) and all(
            new is old for new, old in zip(kept, module.computations)
        )
        return module if unchanged else module.replace(computations=kept)
