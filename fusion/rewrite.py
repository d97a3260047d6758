"""Helpers shared by passes over the immutable IR: mapping a function over a module's
computations (returning the same module when nothing changed), replacing uses of values, and
fresh names. May import xfuse.hlo only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from xfuse.hlo import Computation, Instruction, Module


def map_computations(module: Module, fn: Callable[[Computation], Computation]) -> Module:
    """Applies `fn` to every computation; the same module object if `fn` changed none."""
    changed = False
    comps = []
    for comp in module.computations:
        new = fn(comp)
        changed |= new is not comp
        comps.append(new)
    return module.replace(computations=tuple(comps)) if changed else module


def replace_uses(comp: Computation, replacements: dict[str, str]) -> Computation:
    """Renames operands (and the root) through `replacements`, following chains a->b->c."""
    if not replacements:
        return comp

    def resolve(name: str) -> str:
        seen = set()
        while name in replacements and name not in seen:
            seen.add(name)
            name = replacements[name]
        return name

    instructions = []
    for inst in comp.instructions:
        operands = tuple(resolve(o) for o in inst.operands)
        instructions.append(inst if operands == inst.operands else inst.replace(operands=operands))
    return Computation(comp.name, tuple(instructions), resolve(comp.root))


class Namer:
    """Fresh instruction names in a computation: `base.N` not yet taken."""

    def __init__(self, taken: Iterable[str]) -> None:
        self.taken = set(taken)
        self.counter = 0

    def __call__(self, base: str) -> str:
        base = base.split(".")[0]
        while True:
            name = f"{base}.{self.counter}"
            self.counter += 1
            if name not in self.taken:
                self.taken.add(name)
                return name


def same_instructions(a: Iterable[Instruction], b: Iterable[Instruction]) -> bool:
    a, b = list(a), list(b)
    return len(a) == len(b) and all(x is y or x == y for x, y in zip(a, b))
