"""The example device's code generator: a module of elementwise ops becomes a list of numpy
calls (standing in for the device's own kernels). It only sees what its capabilities let xfuse
give it: parameters, constants, tuples, loop fusions and the ops in `OPS`.
"""

from __future__ import annotations

import numpy as np

from xfuse.hlo import Op

# op -> how to compute it from its operands (arrays) and the instruction
OPS = {
    "add": lambda a, inst: np.add(*a),
    "sub": lambda a, inst: np.subtract(*a),
    "mul": lambda a, inst: np.multiply(*a),
    "div": lambda a, inst: np.divide(*a),
    "max": lambda a, inst: _signed_zero(np.maximum(*a), *a, lambda x, y: x + y),
    "min": lambda a, inst: _signed_zero(np.minimum(*a), *a, lambda x, y: -(-x - y)),
    "neg": lambda a, inst: np.negative(*a),
    "abs": lambda a, inst: np.abs(*a),
    "exp": lambda a, inst: np.exp(*a),
    "log": lambda a, inst: np.log(*a),
    "tanh": lambda a, inst: np.tanh(*a),
    "broadcast_in_dim": lambda a, inst: _broadcast(a[0], inst),
}
CALLS: dict[str, int] = {}  # programs run, by module name: the tests read it


def _signed_zero(result, x, y, zeros):
    """lax's max(-0.0, +0.0) is +0.0 and its min -0.0, whichever operand comes first."""
    both = (x == 0) & (y == 0)
    return np.where(both, zeros(x, y), result) if np.any(both) else result


def _broadcast(x: np.ndarray, inst) -> np.ndarray:
    dims = inst.attr("dims")
    shape = [1] * len(inst.shape.dims)
    for source, target in enumerate(dims):
        shape[target] = x.shape[source]
    return np.broadcast_to(x.reshape(shape), inst.shape.dims)


def _program(module, comp):
    """[(name, function, operand names)] for `comp`, fusions inlined as calls."""
    steps = []
    for inst in comp.instructions:
        if inst.op is Op.PARAMETER:
            continue
        if inst.op is Op.CONSTANT:
            value = np.asarray(inst.attr("value").array)
            steps.append((inst.name, lambda a, inst, v=value: v, ()))
        elif inst.op is Op.TUPLE:
            steps.append((inst.name, lambda a, inst: tuple(a), inst.operands))
        elif inst.op is Op.GET_TUPLE_ELEMENT:
            steps.append((inst.name, lambda a, inst: a[0][inst.attr("index")], inst.operands))
        elif inst.op is Op.FUSION:
            inner = _runner(module, module[inst.attr("calls")])
            steps.append((inst.name, lambda a, inst, run=inner: run(a), inst.operands))
        else:
            steps.append((inst.name, OPS[inst.op.value], inst.operands, ))
    return steps


def _runner(module, comp):
    params = [p.name for p in comp.parameters]
    steps = [(name, fn, operands, comp[name]) for name, fn, operands in _program(module, comp)]
    root = comp.root

    def run(args):
        values = dict(zip(params, args))
        with np.errstate(all="ignore"):
            for name, fn, operands, inst in steps:
                result = fn([values[o] for o in operands], inst)
                if not isinstance(result, tuple):
                    result = np.asarray(result, inst.shape.dtype.numpy)
                values[name] = result
        return values[root]

    return run


def compile_module(module, trace: bool = False):
    entry = module.entry_computation
    run = _runner(module, entry)
    tuple_root = hasattr(entry.root_instruction.shape, "elements")

    def executable(arrays):
        CALLS[module.name] = CALLS.get(module.name, 0) + 1
        if trace:
            print(f"example device: running {module.name}")
        result = run(list(arrays))
        return [np.array(r) for r in result] if tuple_root else [np.array(result)]

    return executable
