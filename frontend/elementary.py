"""Rules for the elementary functions XLA expands into other ops (CHLO's legalization to StableHLO,
and XLA's own population_count and clz): asin, acos, sinh, cosh, asinh, acosh, atanh, and the
integer bit counts population_count and clz. Each is the same expansion over xfuse's ops, so it
fuses like any chain and every backend runs it. Registered into `rules.RULES`. May import
xfuse.hlo and numpy.

f16 and bf16 are computed in f32 and rounded once. XLA does so for sinh and cosh; the others it
computes in the narrow type, rounding after every op, which differs from this by at most an ulp
or two of the narrow type (see tests/frontend/test_elementary.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from xfuse.hlo import DType, Instruction, Op
from xfuse.hlo.dtypes import finfo

from .rules import rule
from .special import in_work_dtype
from .translate import Elementwise


def _float_rule(*names: str):
    """Registers `expand(m, x)` as the rule for `names`: x in f32 (f64 stays f64), the result
    converted back to the equation's dtype."""

    def register(expand: Callable[[Elementwise, Instruction], Instruction]):
        def translate(ctx, params, operands):
            x, m = in_work_dtype(ctx, operands[0])
            return ctx.convert(expand(m, x), ctx.out.dtype)

        translate.__doc__ = expand.__doc__
        return rule(*names)(translate)

    return register


def _largest(m: Elementwise, root: bool = False) -> float:
    """The largest finite float of `m`'s dtype, or its square root (rounded to that dtype)."""
    largest = finfo(m.dtype).max
    return float(np.sqrt(largest) if root else largest)


@_float_rule("asin")
def _asin(m: Elementwise, x):
    """asin(x) = 2 atan2(x, 1 + sqrt((1 - x)(1 + x))): NaN past +-1 (from the square root)."""
    one = m.c(1.0)
    root = m.sqrt(m.mul(m.sub(one, x), m.add(one, x)))
    half = m.atan2(x, m.add(root, one))
    return m.add(half, half)


@_float_rule("acos")
def _acos(m: Elementwise, x):
    """acos(x) = atan2(sqrt((1 - x)(1 + x)), x): pi at -1, NaN past +-1."""
    one = m.c(1.0)
    return m.atan2(m.sqrt(m.mul(m.sub(one, x), m.add(x, one))), x)


@_float_rule("sinh")
def _sinh(m: Elementwise, x):
    """sinh(x) = (e + e / (e + 1)) / 2 with e = expm1(x) for |x| < 1 (no cancellation), else
    exp(x + log(1/2)) - exp(log(1/2) - x) (finite wherever sinh is)."""
    one, log_half = m.c(1.0), m.c(math.log(0.5))
    e = m.expm1(x)
    small = m.mul(m.add(e, m.div(e, m.add(e, one))), m.c(0.5))
    large = m.sub(m.exp(m.add(x, log_half)), m.exp(m.sub(log_half, x)))
    return m.where(m.lt(m.abs(x), one), small, large)


@_float_rule("cosh")
def _cosh(m: Elementwise, x):
    """cosh(x) = exp(x + log(1/2)) + exp(log(1/2) - x) (finite wherever cosh is)."""
    log_half = m.c(math.log(0.5))
    return m.add(m.exp(m.add(x, log_half)), m.exp(m.sub(log_half, x)))


@_float_rule("asinh")
def _asinh(m: Elementwise, x):
    """asinh(x) = sign(x) log1p(|x| + x^2 / (1 + sqrt(x^2 + 1))) (keeps small |x|'s digits and
    -0.0), and sign(x) (log|x| + log 2) from sqrt(largest float) on, where x^2 would overflow."""
    one, magnitude = m.c(1.0), m.abs(x)
    square = m.mul(x, x)
    near = m.log1p(m.add(magnitude, m.div(square, m.add(m.sqrt(m.add(square, one)), one))))
    far = m.add(m.log(magnitude), m.c(math.log(2.0)))
    result = m.where(m.ge(magnitude, m.c(_largest(m, root=True))), far, near)
    return m.mul(m.sign(x), result)


@_float_rule("acosh")
def _acosh(m: Elementwise, x):
    """acosh(x) = log1p(sqrt(x - 1) (sqrt(x + 1) + sqrt(x - 1))) (exact near 1, NaN below it),
    and log(x) + log 2 from half the largest float on, where the product would overflow."""
    one = m.c(1.0)
    below = m.sqrt(m.sub(x, one))
    near = m.log1p(m.mul(below, m.add(m.sqrt(m.add(x, one)), below)))
    far = m.add(m.log(x), m.c(math.log(2.0)))
    return m.where(m.ge(x, m.c(_largest(m) / 2)), far, near)


@_float_rule("atanh")
def _atanh(m: Elementwise, x):
    """atanh(x) = (log1p(x) - log1p(-x)) / 2: +-inf at +-1, NaN past them."""
    result = m.mul(m.sub(m.log1p(x), m.log1p(m.neg(x))), m.c(0.5))
    return m.where(m.gt(m.abs(x), m.c(1.0)), m.c(math.nan), result)


# ---------------------------------------------------------------------------- bit counts
_UNSIGNED = {DType.S8: DType.U8, DType.S16: DType.U16, DType.S32: DType.U32, DType.S64: DType.U64}


def _repeat(byte: int, bits: int) -> int:
    """`byte` repeated over a word of `bits` bits (0x55 over 16 bits: 0x5555)."""
    return int.from_bytes(bytes([byte]) * (bits // 8), "little")


def _popcount(e: Elementwise, v):
    """The number of set bits of each unsigned `v` (the SWAR sum: bit pairs, nibbles, bytes, then
    the bytes added by shifts, so nothing depends on wrapping multiplication)."""
    bits = e.dtype.bits
    v = e.sub(v, e.and_(e.shift_right_logical(v, e.c(1)), e.c(_repeat(0x55, bits))))
    pairs = e.c(_repeat(0x33, bits))
    v = e.add(e.and_(v, pairs), e.and_(e.shift_right_logical(v, e.c(2)), pairs))
    v = e.and_(e.add(v, e.shift_right_logical(v, e.c(4))), e.c(_repeat(0x0F, bits)))
    shift = 8
    while shift < bits:
        v = e.add(v, e.shift_right_logical(v, e.c(shift)))
        shift *= 2
    return e.and_(v, e.c(0x7F)) if bits > 8 else v


def _bit_rule(name: str):
    """Registers `count(e, v)`, over the operand's bits as the unsigned type of its width, as
    the rule for `name`; the count comes back in the operand's type."""

    def register(count: Callable[[Elementwise, Instruction], Instruction]):
        def translate(ctx, params, operands):
            (x,) = operands
            dtype = ctx.out.dtype
            bits = _UNSIGNED.get(dtype, dtype)
            if bits is not dtype:
                x = ctx.emit(Op.BITCAST_CONVERT, x, dtype=bits)
            result = count(Elementwise(ctx, ctx.out.dims, bits), x)
            return result if bits is dtype else ctx.emit(Op.BITCAST_CONVERT, result, dtype=dtype)

        translate.__doc__ = count.__doc__
        return rule(name)(translate)

    return register


@_bit_rule("population_count")
def _population_count(e: Elementwise, v):
    """The number of one bits of each element's two's complement bits."""
    return _popcount(e, v)


@_bit_rule("clz")
def _clz(e: Elementwise, v):
    """The number of leading zero bits (the bit width for 0): the width less the popcount of v
    with its highest one bit smeared over every bit below it."""
    bits, shift = e.dtype.bits, 1
    while shift < bits:
        v = e.or_(v, e.shift_right_logical(v, e.c(shift)))
        shift *= 2
    return e.sub(e.c(bits), _popcount(e, v))
