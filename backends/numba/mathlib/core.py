"""Intrinsics the math functions are built from: bit reinterpretation, fused multiply-add,
bare division, powers of two. Imports numba, numpy and llvmlite only.
"""

from __future__ import annotations

import numba
import numpy as np
from llvmlite import ir
from numba.core import types
from numba.extending import intrinsic

_inline = numba.njit(inline="always", fastmath=False, cache=False)

F32 = np.float32
F64 = np.float64
I64 = np.int64


def _bitcast(from_type, to_type, llvm_type):
    from_integer = isinstance(from_type, types.Integer)

    @intrinsic
    def cast(typingctx, x):
        if x != from_type and not (from_integer and x in types.integer_domain):
            return None

        def codegen(context, builder, signature, args):
            value = args[0]
            if from_integer and value.type.width != from_type.bitwidth:
                width = ir.IntType(from_type.bitwidth)
                wider = value.type.width > from_type.bitwidth
                value = builder.trunc(value, width) if wider else builder.sext(value, width)
            return builder.bitcast(value, llvm_type)

        return to_type(x), codegen

    return cast


# Reinterpretations (a register move). The float -> int ones give signed integers, so `>>` is
# an arithmetic shift; the int -> float ones accept any integer and keep its low bits.
_bits32 = _bitcast(types.float32, types.int32, ir.IntType(32))


_float32 = _bitcast(types.int32, types.float32, ir.FloatType())


_bits64 = _bitcast(types.float64, types.int64, ir.IntType(64))


_float64 = _bitcast(types.int64, types.float64, ir.DoubleType())


@intrinsic
def _fma(typingctx, a, b, c):
    """a * b + c as llvm.fmuladd: one rounding where the CPU has FMA, two where it has not."""
    if not (isinstance(a, types.Float) and a == b == c):
        return None

    def codegen(context, builder, signature, args):
        ty = args[0].type
        fn = builder.module.declare_intrinsic("llvm.fmuladd", [ty], ir.FunctionType(ty, [ty] * 3))
        return builder.call(fn, args)

    return a(a, b, c), codegen


@intrinsic
def _div(typingctx, a, b):
    """a / b as a bare fdiv: numba's `/` tests for b == 0 to raise ZeroDivisionError under the
    default error model, and that branch stops vectorisation. IEEE gives inf/NaN instead."""
    if not (isinstance(a, types.Float) and a == b):
        return None

    def codegen(context, builder, signature, args):
        return builder.fdiv(args[0], args[1])

    return a(a, b), codegen


def _has_scalef() -> bool:
    """Whether the kernels numba compiles here may use AVX-512 (its vscalefps/pd computes
    p * 2**k rounded once, in one instruction): `pipeline.target_cpu`'s features."""
    from ..pipeline import target_cpu

    return "+avx512f" in target_cpu()[1]


SCALEF = _has_scalef()


@intrinsic
def _ldexp(typingctx, p, k):
    """p * 2**k, rounded once (k an integer, as int32) as llvm.ldexp: vscalefps/pd in vector
    loops where the CPU has AVX-512 (`SCALEF`). Elsewhere LLVM makes it a call to libm's
    ldexp, so the math functions use it only where SCALEF holds."""
    if not (isinstance(p, types.Float) and isinstance(k, types.Integer)):
        return None

    def codegen(context, builder, signature, args):
        value, exponent = args
        i32 = ir.IntType(32)
        if exponent.type.width > 32:
            exponent = builder.trunc(exponent, i32)
        elif exponent.type.width < 32:
            exponent = builder.sext(exponent, i32)
        fn = builder.module.declare_intrinsic("llvm.ldexp", [value.type, i32],
                                              ir.FunctionType(value.type, [value.type, i32]))
        return builder.call(fn, [value, exponent])

    return p(p, k), codegen


@_inline
def _div3(i):
    """i // 3 for 0 <= i < 2**31, as a multiply and shift (numba's `//` checks for zero)."""
    return (I64(i) * 0xAAAAAAAB) >> 33


@_inline
def _pow2_f32(k):
    """2**k for integer k in [-126, 127]."""
    return _float32((k + 127) << 23)


@_inline
def _pow2_f64(k):
    """2**k for integer k in [-1022, 1023]."""
    return _float64((k + 1023) << 52)


@_inline
def _signbit32(x):
    return _bits32(x) < 0


@_inline
def _signbit64(x):
    return _bits64(x) < 0
