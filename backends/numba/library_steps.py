"""Library steps of a lowered program: the data ops (cumulative ops, sort, top_k, scatter),
which no kernel holds (a gather is kernel code: `emitter.Emitter.op_gather`), and broadcasts
standing alone, run as numpy calls from `xfuse.runtime.library`. A step names the function and carries the instruction's attributes
as JSON values (int lists, flags as bools), so an AOT artifact runs it with numpy alone.
Imports xfuse.hlo only.
"""

from __future__ import annotations

from xfuse.hlo import Instruction, Op, TupleShape, callbacks

LIBRARY_OPS = frozenset({Op.CUMSUM, Op.CUMPROD, Op.CUMMAX, Op.CUMMIN, Op.SORT, Op.TOP_K, Op.SCATTER})
FLAGS = ("reverse", "is_stable")


def _json(name: str, value: object) -> object:
    if name in FLAGS:
        return value == "true"
    return list(value) if isinstance(value, tuple) else value


def library_step_of(fn: str, attrs: dict, inst: Instruction, common: dict) -> dict:
    """A library step running `fn` with `attrs` (JSON values) for `inst`; a tuple result is one
    packed value."""
    shapes = list(inst.shape.elements) if isinstance(inst.shape, TupleShape) else [inst.shape]
    return {"op": "library", **common, "fn": fn, "attrs": attrs, "label": str(inst.op),
            "specs": [[list(s.dims), s.dtype.numpy.name] for s in shapes]}


def library_step(inst: Instruction, common: dict) -> dict:
    """The step computing `inst` (one of LIBRARY_OPS) with its own attributes."""
    attrs = {name: _json(name, value) for name, value in inst.attrs}
    return library_step_of(inst.op.value, attrs, inst, common)


def callback_step(inst: Instruction, operands: list, common: dict) -> dict:
    """The step calling `inst`'s host function (a Python object, so a program holding one
    is not written into an AOT artifact); `operands`: their shapes. Several results are one
    packed value."""
    number = inst.attr("callback")
    at = f" at {inst.loc}" if inst.loc else ""
    shapes = inst.shape.elements if isinstance(inst.shape, TupleShape) else (inst.shape,)
    return {"op": "callback", **common, "function": callbacks.lookup(number),
            "label": f"host callback {number}{at}",
            "specs": [[list(s.dims), s.dtype.numpy.name] for s in shapes],
            "operand_dims": [list(shape.dims) for shape in operands]}
