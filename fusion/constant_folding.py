"""Constant folding ("fold"): an instruction whose operands are all `constant`s becomes a
`constant` holding its value, computed with the op's numpy reference exactly as the
interpreter would (so folding never changes a result, NaNs and signed zeros included). The
folded constant keeps the instruction's name and source line; the old operands are left for
`dce`.

Not folded: results of more than `max_elements` elements; ops without operands (iota, constant:
an iota is cheaper than its literal); `broadcast_in_dim` (a broadcast constant stays a broadcast
so fusion can duplicate it cheaply); fusion, call, tuple, get_tuple_element,
optimization_barrier and parameter. May import xfuse.hlo and numpy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from xfuse.hlo import Computation, Instruction, Literal, Module, Op, Shape

from .pipeline import register
from .rewrite import map_computations

NOT_FOLDED = frozenset(
    {
        Op.PARAMETER,
        Op.CONSTANT,
        Op.IOTA,
        Op.BROADCAST_IN_DIM,
        Op.FUSION,
        Op.CALL,
        Op.TUPLE,
        Op.GET_TUPLE_ELEMENT,
        Op.OPTIMIZATION_BARRIER,
    }
)


def evaluate(inst: Instruction, operands: list[Literal]) -> Literal | None:
    """`inst` applied to constant operands, as the interpreter computes it; None if it fails."""
    shape = inst.shape
    arrays = [np.array(literal.array) for literal in operands]  # writable copies
    try:
        with np.errstate(all="ignore"):
            result = np.asarray(inst.info.ref(arrays, inst.attributes, shape))
            if result.dtype != shape.dtype.numpy or result.shape != shape.dims:
                result = np.asarray(result, shape.dtype.numpy).reshape(shape.dims)
    except Exception:  # leave it to run (and fail with its location) at run time
        return None
    return Literal(result, shape.dtype)


@register("fold")
@dataclass(frozen=True, slots=True)
class ConstantFolding:
    """Replaces instructions computed from constants alone by their value."""

    name: ClassVar[str] = "fold"
    max_elements: int = 1024

    def foldable(self, inst: Instruction) -> bool:
        return (
            inst.op not in NOT_FOLDED
            and bool(inst.operands)
            and inst.info.ref is not None
            and isinstance(inst.shape, Shape)
            and inst.shape.size <= self.max_elements
        )

    def fold(self, comp: Computation) -> Computation:
        constants: dict[str, Literal] = {}
        instructions: list[Instruction] = []
        changed = False
        for inst in comp.instructions:
            if self.foldable(inst) and all(o in constants for o in inst.operands):
                value = evaluate(inst, [constants[o] for o in inst.operands])
                if value is not None:
                    inst = Instruction(
                        inst.name, Op.CONSTANT, inst.shape, (), (("value", value),), inst.loc
                    )
                    changed = True
            if inst.op is Op.CONSTANT:
                constants[inst.name] = inst.attr("value")
            instructions.append(inst)
        return comp.replace(instructions=tuple(instructions)) if changed else comp

    def run(self, module: Module) -> Module:
        return map_computations(module, self.fold)
