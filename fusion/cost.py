"""The cost model: flops per element of every op, bytes moved, and the machine parameters
(memory bandwidth, flop rate) that turn them into time. Fusion decisions compare the time a
fusion saves in memory traffic with the time it costs in recomputation.

The defaults were measured on the project's 2-core Zen 4 machines (see the design doc); set
them with `Machine(...)` or measure them with `Machine.measure()`. May import xfuse.hlo only.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from xfuse.hlo import Computation, Instruction, Kind, Op, Shape

# Flops per output element. Transcendentals count as the polynomial they are on CPU.
TRANSCENDENTAL = 20
FLOPS_PER_ELEMENT: dict[Op, float] = {
    Op.EXP: TRANSCENDENTAL, Op.EXP2: TRANSCENDENTAL, Op.EXPM1: TRANSCENDENTAL,
    Op.LOG: TRANSCENDENTAL, Op.LOG1P: TRANSCENDENTAL, Op.TANH: TRANSCENDENTAL,
    Op.LOGISTIC: TRANSCENDENTAL, Op.SIN: TRANSCENDENTAL, Op.COS: TRANSCENDENTAL,
    Op.TAN: TRANSCENDENTAL, Op.ATAN: TRANSCENDENTAL, Op.ATAN2: 2 * TRANSCENDENTAL,
    Op.ERF: TRANSCENDENTAL, Op.ERFC: TRANSCENDENTAL, Op.CBRT: TRANSCENDENTAL,
    Op.POW: 2 * TRANSCENDENTAL, Op.DIV: 4, Op.REM: 8, Op.SQRT: 4, Op.RSQRT: 4,
}  # fmt: skip
ZERO_FLOP_KINDS = (Kind.BROADCAST, Kind.INJECTIVE, Kind.OPAQUE)


def flops_per_element(inst: Instruction) -> float:
    """Flops to produce one element of `inst` (reductions: per input element)."""
    if inst.op is Op.INTEGER_POW:
        y = abs(int(inst.attr("y")))
        return max(1, y.bit_length() + bin(y).count("1") - 1) + (4 if inst.attr("y") < 0 else 0)
    if inst.op in FLOPS_PER_ELEMENT:
        return FLOPS_PER_ELEMENT[inst.op]
    if inst.op in (Op.CONSTANT, Op.PARAMETER, Op.CONVERT_ELEMENT_TYPE, Op.BITCAST_CONVERT):
        return 0
    if inst.info.kind in ZERO_FLOP_KINDS:
        return 0
    return 1


def elements(inst: Instruction) -> int:
    return inst.shape.size if isinstance(inst.shape, Shape) else 0


def instruction_flops(comp: Computation, inst: Instruction) -> float:
    """Flops of one instruction: per element for elementwise ops, 2*m*n*k for dots."""
    if inst.op is Op.DOT_GENERAL:
        lhs = comp[inst.operands[0]].array_shape
        contracting = inst.attr("contracting")[0]
        k = int(np.prod([lhs.dims[i] for i in contracting])) if contracting else 1
        return 2.0 * elements(inst) * k
    if inst.info.kind is Kind.REDUCTION:
        return float(comp[inst.operands[0]].shape.size)
    return flops_per_element(inst) * elements(inst)


def nbytes(inst: Instruction) -> int:
    return inst.shape.nbytes


@dataclass(frozen=True)
class Machine:
    """Throughputs used to turn bytes and flops into seconds."""

    bandwidth: float = 20e9  # bytes/s of streaming memory traffic (numpy-class copy)
    flop_rate: float = 16e9  # scalar-equivalent flops/s of fused elementwise code, one core

    def memory_time(self, nbytes: float) -> float:
        return nbytes / self.bandwidth

    def compute_time(self, flops: float) -> float:
        return flops / self.flop_rate

    @staticmethod
    def measure(size: int = 1 << 24) -> Machine:
        """Measures copy bandwidth and an elementwise flop rate with numpy (a few seconds)."""
        src = np.ones(size, np.float32)
        dst = np.empty_like(src)
        np.copyto(dst, src)
        start = time.perf_counter()
        for _ in range(4):
            np.copyto(dst, src)
        copy = (time.perf_counter() - start) / 4
        start = time.perf_counter()
        for _ in range(4):
            np.multiply(src, 1.0001, out=dst)
            np.add(dst, 0.5, out=dst)
        arith = (time.perf_counter() - start) / 4
        bandwidth = 2 * src.nbytes / copy
        flop_rate = 2 * size / max(arith - 2 * copy * 0.5, 1e-9)
        return Machine(bandwidth=bandwidth, flop_rate=max(flop_rate, bandwidth / 4))


DEFAULT_MACHINE = Machine()
