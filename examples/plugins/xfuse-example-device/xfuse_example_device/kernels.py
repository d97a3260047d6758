"""The example device's own relu kernel, registered for the pattern max(x, 0) (what
`jax.nn.relu` traces to) on the example backend and on xfuse's numba backend.
"""

from __future__ import annotations

import numpy as np

from xfuse.backends.registry import KernelRegistration
from xfuse.hlo import Op

CALLS = {"relu": 0}  # times the kernel ran: the tests read it


def relu(x: np.ndarray) -> np.ndarray:
    CALLS["relu"] += 1
    zero = np.zeros((), x.dtype)
    return np.maximum(x, zero) + zero  # NaN stays NaN as in lax.max; -0.0 becomes +0.0


def _is_zero_constant(comp, name: str) -> list[str] | None:
    """[broadcast, constant] when `name` is a zero scalar broadcast, else None."""
    inst = comp[name]
    if inst.op is not Op.BROADCAST_IN_DIM:
        return None
    source = comp[inst.operands[0]]
    if source.op is not Op.CONSTANT or source.shape.dims != ():
        return None
    value = source.attr("value").array
    if value != 0 or np.signbit(value):
        return None
    return [inst.name, source.name]


def match_relu(comp, inst) -> list[str] | None:
    """The instructions of max(x, 0) rooted at `inst`, or None."""
    if inst.op is not Op.MAX or inst.shape.dtype.value not in ("f32", "f64"):
        return None
    for zero in reversed(inst.operands):
        found = _is_zero_constant(comp, zero)
        if found is not None:
            return [inst.name, *found]
    return None


def registrations() -> list[KernelRegistration]:
    return [
        KernelRegistration("example", "example.relu", relu, match=match_relu),
        KernelRegistration("numba", "example.relu", relu, match=match_relu),
    ]
