"""Scalar helpers that generated kernels call for the ops whose `jax.lax` semantics Python's
operators do not give: NaN-propagating max/min that order -0.0 below +0.0, division and
remainder rounding toward zero with lax's results for x/0 and MIN/-1, shifts past the bit
width, saturating float->int conversion, rounding. All inline and branch-free enough for LLVM
to turn into selects, so loops calling them still vectorise.
"""

from __future__ import annotations

import math

import numba
import numpy as np
from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic

inline = numba.njit(inline="always", cache=False)


@inline
def fmax(a, b):
    """max with NaN propagation; of two equal values (+0.0 and -0.0) the one with no sign bit."""
    r = a if (a > b) | (a != a) else b
    return r if a != b else (a if float_bits(a) < float_bits(b) else b)


@inline
def fmin(a, b):
    """min with NaN propagation; -0.0 is below +0.0."""
    r = a if (a < b) | (a != a) else b
    return r if a != b else (a if float_bits(a) > float_bits(b) else b)


@inline
def imax(a, b):
    return a if a > b else b


@inline
def imin(a, b):
    return a if a < b else b


@inline
def clamp(i, lo, hi):
    """An index clamped into [lo, hi] (lo <= hi), as XLA clamps start indices. Python's min and
    max would each compile an overload of numba's for every signature, once a process (0.02-0.04
    s each); called with int64 bounds (`emitter.clamp_text`), this compiles once."""
    return lo if i < lo else (hi if i > hi else i)


@inline
def round_away(x):
    t = np.trunc(x)
    away = abs(x - t) >= 0.5
    return t + math.copysign(1.0, x) if away else t


@inline
def is_finite(x):
    return (x - x) == 0


# ---------------------------------------------------------------------------- bit casts
@intrinsic
def float_bits(typingctx, x):
    """The bits of a float32 or float64 as an unsigned integer of the same width."""
    width = x.bitwidth
    sig = getattr(types, f"uint{width}")(x)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(width))

    return sig, codegen


def _bitcast_to(target):
    """An intrinsic: the bits of a number read as `target`, a numba type of the same width."""

    @intrinsic
    def bitcast(typingctx, x):
        if not isinstance(x, (types.Integer, types.Float)) or x.bitwidth != target.bitwidth:
            return None

        def codegen(context, builder, signature, args):
            return builder.bitcast(args[0], context.get_value_type(target))

        return target(x), codegen

    return bitcast


# bitcast_u32(x), bitcast_f64(x), ...: lax.bitcast_convert_type between dtypes of one width
_BITCASTS = {name: _bitcast_to(getattr(types, {"s": "int", "u": "uint", "f": "float"}[name[0]] + name[1:]))
             for name in ("s8", "u8", "s16", "u16", "s32", "u32", "s64", "u64", "f32", "f64")}
globals().update({f"bitcast_{name}": fn for name, fn in _BITCASTS.items()})
f32_bits, bits_f32 = _BITCASTS["u32"], _BITCASTS["f32"]  # a float32's bits as a uint32, and back


# f16 and bf16 values are held in float32 inside kernels; these give and take their bits.
@inline
def bf16_bits(x):
    """The bits of a bfloat16 held in a float32."""
    return np.uint16(f32_bits(np.float32(x)) >> np.uint32(16))


@inline
def bits_bf16(b):
    return bits_f32(np.uint32(np.uint32(b) << np.uint32(16)))


@inline
def f16_bits(x):
    """The bits of a float16 held in a float32 (exactly representable: a kernel rounds to f16)."""
    x = np.float32(x)
    bits = f32_bits(x)
    sign = np.uint16((bits >> np.uint32(16)) & np.uint32(0x8000))
    ax = abs(x)
    if x != x:  # the payload numpy's widening kept
        return np.uint16(sign | np.uint16(0x7C00 | ((bits >> np.uint32(13)) & np.uint32(0x3FF))))
    if ax == np.inf:
        return np.uint16(sign | np.uint16(0x7C00))
    if ax < np.float32(6.103515625e-05):  # subnormal or zero: a multiple of 2**-24
        return np.uint16(sign | np.uint16(ax * np.float32(16777216.0)))
    exponent = ((bits >> np.uint32(23)) & np.uint32(0xFF)) - np.uint32(112)
    return np.uint16(sign | np.uint16((exponent << np.uint32(10)) | ((bits >> np.uint32(13)) & np.uint32(0x3FF))))


@inline
def bits_f16(b):
    b = np.uint32(np.uint16(b))
    sign = (b & np.uint32(0x8000)) << np.uint32(16)
    exponent, mantissa = (b >> np.uint32(10)) & np.uint32(0x1F), b & np.uint32(0x3FF)
    if exponent == np.uint32(0):
        value = np.float32(mantissa) * np.float32(5.9604644775390625e-08)
        return -value if sign else value
    if exponent == np.uint32(31):
        return bits_f32(np.uint32(sign | np.uint32(0x7F800000) | (mantissa << np.uint32(13))))
    return bits_f32(np.uint32(sign | ((exponent + np.uint32(112)) << np.uint32(23)) | (mantissa << np.uint32(13))))


@inline
def round_bf16(x):
    """x rounded to the nearest bfloat16 (ties to even), kept in float32."""
    bits = f32_bits(np.float32(x))
    lsb = (bits >> np.uint32(16)) & np.uint32(1)
    kept = (bits + np.uint32(0x7FFF) + lsb) & np.uint32(0xFFFF0000)
    return x if x != x else bits_f32(np.uint32(kept))


@inline
def round_f16(x):
    """x rounded to the nearest float16 (ties to even, subnormals, overflow), kept in float32."""
    x = np.float32(x)
    ax = abs(x)
    bits = f32_bits(x)
    lsb = (bits >> np.uint32(13)) & np.uint32(1)
    normal = bits_f32(np.uint32((bits + np.uint32(0xFFF) + lsb) & np.uint32(0xFFFFE000)))
    tiny = np.float32(np.rint(x * np.float32(16777216.0)) / np.float32(16777216.0))
    r = tiny if ax < np.float32(6.103515625e-05) else normal
    r = np.float32(math.copysign(np.inf, x)) if abs(r) >= np.float32(65520.0) else r
    return x if (x != x) | (ax == np.inf) else r


# ---------------------------------------------------------------------------- row buffers
@intrinsic(prefer_literal=True)
def row_buffer(typingctx, count, dtype):
    """A 1-D array of `count` (a literal) elements of `dtype` in the calling function's stack
    frame, allocated once in its entry block: a kernel's row buffer without numba's np.empty,
    whose overload compiles for each dtype once a process (0.2 s) and allocates on the heap at
    every call. It lives as long as the frame, so it is never returned or kept."""
    if not isinstance(count, types.IntegerLiteral) or not isinstance(dtype, types.NumberClass):
        return None
    n, item = count.literal_value, dtype.instance_type
    array = types.Array(item, 1, "C")

    def codegen(context, builder, signature, args):
        from numba.np.arrayobj import populate_array  # numba.np: 0.1 s to import, not needed earlier

        data_type = context.get_data_type(item)
        size = context.get_constant(types.intp, context.get_abi_sizeof(data_type))
        buffer = context.make_array(array)(context, builder)
        populate_array(buffer, data=cgutils.alloca_once(builder, data_type, size=n),
                       shape=[context.get_constant(types.intp, n)], strides=[size], itemsize=size,
                       meminfo=None)
        return buffer._getvalue()

    return array(count, dtype), codegen


# ---------------------------------------------------------------------------- trip counts
@intrinsic
def opaque(typingctx, value):
    """`value`, an integer (as intp), through an empty inline assembly block: LLVM cannot see
    the number, so a loop running to it is not unrolled whole. A loop along a short row with a
    known trip count is: LLVM then copies its body (an inlined exp) 10 to 20 times and leaves
    each copy scalar, where the loop vectoriser would have taken the loop as it is
    (`row_forms.ROW_LOOPS`)."""
    if not isinstance(value, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        v = context.cast(builder, args[0], signature.args[0], types.intp)
        asm = ir.FunctionType(v.type, [v.type])
        return builder.asm(asm, "", "=r,0", [v], side_effect=False)

    return types.intp(value), codegen
