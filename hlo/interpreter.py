"""The reference interpreter: runs any module on numpy arrays with the op table's references.

It is the oracle every pass and backend is checked against, so it favours exactness over speed.
A failure inside an op is re-raised as `InterpreterError` naming the instruction and its source
line. Imports numpy and this package only.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .dtypes import Shape, TupleShape
from .errors import HloError
from .ir import Computation, Module
from .ops import Op


class InterpreterError(HloError):
    """An op failed while being interpreted."""


def _check_argument(value: object, shape, what: str) -> object:
    if isinstance(shape, TupleShape):
        if not isinstance(value, (tuple, list)) or len(value) != len(shape.elements):
            raise TypeError(f"{what} should be a tuple {shape}, got {type(value).__name__}")
        return tuple(_check_argument(v, s, f"{what}[{i}]") for i, (v, s) in enumerate(zip(value, shape.elements)))
    array = np.asarray(value)
    if array.shape != shape.dims or array.dtype != shape.dtype.numpy:
        got = f"{array.dtype}{list(array.shape)}"
        raise TypeError(f"{what} should be {shape} ({shape.dtype.numpy}), got {got}")
    return array


def evaluate(module: Module, comp: Computation, args: Sequence[object]) -> object:
    """Runs `comp` of `module` on already checked arguments."""
    values: dict[str, object] = {}
    params = {p.name: p.attr("index") for p in comp.parameters}
    for inst in comp.instructions:
        operands = [values[o] for o in inst.operands]
        try:
            if inst.op is Op.PARAMETER:
                result = args[params[inst.name]]
            elif inst.op in (Op.FUSION, Op.CALL):
                result = evaluate(module, module[inst.attr("calls")], operands)
            elif inst.op is Op.WHILE:
                result = run_while(module, inst.attr("condition"), inst.attr("body"), operands)
            elif inst.op is Op.CONDITIONAL:
                result = run_conditional(module, inst.attr("branches"), operands)
            else:
                with np.errstate(all="ignore"):
                    result = inst.info.ref(operands, inst.attributes, inst.shape)
                if isinstance(inst.shape, Shape):
                    result = np.asarray(result)
                    if result.dtype != inst.shape.dtype.numpy or result.shape != inst.shape.dims:
                        result = np.asarray(result, inst.shape.dtype.numpy).reshape(inst.shape.dims)
        except InterpreterError:
            raise
        except Exception as e:  # add the instruction, as torch.fx's interpreter does
            at = f" at {inst.loc}" if inst.loc else ""
            raise InterpreterError(
                f"{inst.name} ({inst.op}) in {comp.name}{at}: {type(e).__name__}: {e}"
            ) from e
        values[inst.name] = result
    return values[comp.root]


def run_while(module: Module, condition: str, body: str, state: Sequence[object]) -> tuple:
    """The state once `condition` is false, `body` applied to it until then."""
    cond, step = module[condition], module[body]
    state = tuple(state)
    while bool(np.asarray(evaluate(module, cond, state))):
        state = tuple(evaluate(module, step, state))
    return state


def run_conditional(module: Module, branches: Sequence[str], operands: Sequence[object]) -> object:
    """Branch `operands[0]` (the last one when out of range) applied to the other operands."""
    index = int(np.asarray(operands[0]))
    if not 0 <= index < len(branches):
        index = len(branches) - 1
    return evaluate(module, module[branches[index]], list(operands[1:]))


def interpret(module: Module, *args: object) -> object:
    """Runs the entry computation on `args`: an array, or a tuple of them for a tuple root."""
    entry = module.entry_computation
    params = entry.parameters
    if len(args) != len(params):
        raise TypeError(f"{entry.name} takes {len(params)} arguments, got {len(args)}")
    checked = [
        _check_argument(a, p.shape, f"argument {i} ({p.name})")
        for i, (a, p) in enumerate(zip(args, params))
    ]
    return evaluate(module, entry, checked)
