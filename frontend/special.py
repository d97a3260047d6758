"""Rules for the special functions JAX has as primitives and XLA expands into elementwise ops
(as its client library and CHLO's legalization do): erf_inv, lgamma, digamma, and nextafter on
the bits. Each is written here as the same expansion over xfuse's ops, so it fuses like any
chain and every backend runs it. Registered into `rules.RULES`. May import xfuse.hlo.
"""

from __future__ import annotations

import functools
import math

import jax
import numpy as np
from jax import lax

from xfuse.hlo import DType, Op

from .rules import rule
from .translate import Elementwise, FrontendError


def in_work_dtype(ctx, x):
    """x in the dtype XLA computes these in: f16 and bf16 in f32."""
    dtype = DType.F64 if ctx.out.dtype is DType.F64 else DType.F32
    x = ctx.convert(x, dtype)
    return x, Elementwise(ctx, x.array_shape.dims, dtype)


# Giles, "Approximating the erfinv function" (GPU Computing Gems, 2011), single precision: the
# polynomial XLA evaluates for erf_inv, in w - 2.5 where w = -log1p(-x*x) < 5, else in sqrt(w) - 3.
_ERF_INV_SMALL_W = (2.81022636e-08, 3.43273939e-07, -3.5233877e-06, -4.39150654e-06, 0.00021858087,
                    -0.00125372503, -0.00417768164, 0.246640727, 1.50140941)
_ERF_INV_LARGE_W = (-0.000200214257, 0.000100950558, 0.00134934322, -0.00367342844, 0.00573950773,
                    -0.0076224613, 0.00943887047, 1.00167406, 2.83297682)


@rule("erf_inv")
def _erf_inv(ctx, params, operands):
    """erf_inv as XLA expands it (f16 and bf16 through f32): Giles' polynomial times x, and
    +-inf at +-1 (NaN past them, from the log of a negative number). float64 takes that value
    as a first guess and refines it with Newton steps (`_erf_inv_f64`)."""
    x, m = in_work_dtype(ctx, operands[0])
    if m.dtype is DType.F32:
        result = _giles(m, x)
    else:
        result = _erf_inv_f64(m, x)
        result = m.where(m.gt(m.abs(x), m.c(1.0)), m.c(math.nan), result)  # NaN, as the f32 log gives
    result = m.where(m.eq(m.abs(x), m.c(1.0)), m.mul(x, m.c(math.inf)), result)
    return ctx.convert(result, ctx.out.dtype)


def _giles(m: Elementwise, x):
    """Giles' single-precision polynomial for erf_inv(x), in f32 (`m`'s dtype)."""
    w = m.neg(m.log1p(m.neg(m.mul(x, x))))
    small = m.lt(w, m.c(5.0))
    w = m.where(small, m.sub(w, m.c(2.5)), m.sub(m.sqrt(w), m.c(3.0)))
    p = None
    for lo, hi in zip(_ERF_INV_SMALL_W, _ERF_INV_LARGE_W):
        k = m.where(small, m.c(lo), m.c(hi))
        p = k if p is None else m.add(k, m.mul(p, w))
    return m.mul(p, x)


def _erf_inv_f64(m: Elementwise, x):
    """erf_inv in float64, where the tail matters: for |x| <= 0.9, Newton on erf(r) = x from the
    f32 polynomial; past it, Newton on log(erfc(r)) = log(1 - |x|) (1 - |x| is exact there),
    which is nearly quadratic in r, from the asymptotic r^2 = -log(t) - log(r sqrt(pi)). The
    result is as good as erf's and erfc's own, times erf_inv's condition number."""
    ctx, half_root_pi = m.ctx, m.c(0.886226925452758)  # sqrt(pi) / 2
    near = m.clamp(m.c(-0.95), x, m.c(0.95))  # the central guess stays finite
    guess = _giles(Elementwise(ctx, m.dims, DType.F32), ctx.convert(near, DType.F32))
    central = ctx.convert(guess, DType.F64)
    for _ in range(3):  # r -= (erf(r) - x) * sqrt(pi)/2 * exp(r^2)
        error = m.sub(m.erf(central), x)
        central = m.sub(central, m.mul(error, m.mul(half_root_pi, m.exp(m.mul(central, central)))))
    magnitude = m.abs(x)
    t = m.sub(m.c(1.0), m.clamp(m.c(0.5), magnitude, m.c(1.0 - 2.0**-53)))
    log_t = m.log(t)
    tail = m.sqrt(m.neg(log_t))
    tail = m.sqrt(m.sub(m.neg(log_t), m.log(m.mul(tail, m.c(math.sqrt(math.pi))))))
    for _ in range(4):  # r += (log(erfc(r)) - log(t)) * erfc(r) * sqrt(pi)/2 * exp(r^2)
        erfc = m.erfc(tail)
        error = m.sub(m.log(erfc), log_t)
        tail = m.add(tail, m.mul(error, m.mul(m.mul(erfc, half_root_pi), m.exp(m.mul(tail, tail)))))
    signed_tail = m.where(m.lt(x, m.c(0.0)), m.neg(tail), tail)
    return m.where(m.gt(magnitude, m.c(0.9)), signed_tail, central)


@rule("nextafter")
def _nextafter(ctx, params, operands):
    """The float next to x toward y, on the bits as XLA expands it: y where x == y, NaN where
    either is NaN, the smallest subnormal of y's sign where x is zero, else x's bits one step
    (as an integer of its width) away from or toward zero."""
    dims, dtype = ctx.out.dims, ctx.out.dtype
    if dtype not in (DType.F32, DType.F64):
        raise FrontendError(f"nextafter on {dtype} at {ctx.loc}: xfuse takes float32 and float64")
    x, y = (ctx.broadcast_to(v, dims) for v in operands)
    bits = DType.U32 if dtype is DType.F32 else DType.U64
    e = Elementwise(ctx, dims, bits)
    xi, yi = ctx.emit(Op.BITCAST_CONVERT, x, dtype=bits), ctx.emit(Op.BITCAST_CONVERT, y, dtype=bits)
    sign, magnitude = e.c(1 << (bits.bits - 1)), e.c((1 << (bits.bits - 1)) - 1)
    x_abs, y_abs = e.and_(xi, magnitude), e.and_(yi, magnitude)
    x_sign, y_sign = e.and_(xi, sign), e.and_(yi, sign)
    smaller = e.or_(e.gt(x_abs, y_abs), e.ne(x_sign, y_sign))
    stepped = e.where(smaller, e.sub(xi, e.c(1)), e.add(xi, e.c(1)))
    result = e.where(e.eq(x_abs, e.c(0)), e.or_(y_sign, e.c(1)), stepped)
    result = e.where(e.eq(x, y), y, ctx.emit(Op.BITCAST_CONVERT, result, dtype=dtype))
    return e.where(e.or_(e.ne(x, x), e.ne(y, y)), e.c(math.nan, dtype), result)


# Lanczos' approximation of the gamma function with g = 7 and 9 terms (as in Numerical Recipes
# and XLA): gamma(z + 1) = sqrt(2 pi) t^(z + 1/2) e^-t A(z), t = z + g + 1/2,
# A(z) = c0 + sum_k c_k / (z + k).
_LANCZOS_G = 7.0
_LANCZOS_BASE = 0.99999999999980993227684700473478
_LANCZOS = (676.520368121885098567009190444019, -1259.13921672240287047156078755283,
            771.3234287776530788486528258894, -176.61502916214059906584551354,
            12.507343278686904814458936853, -0.13857109526572011689554707,
            9.984369578019570859563e-6, 1.50563273514931155834e-7)


def _lanczos(m: Elementwise, x, derivative: bool = False):
    """What lgamma and digamma share: (reflect, z, A(z), A'(z), t, log t), where reflect is
    x < 1/2, z is -x there and x - 1 elsewhere, A'(z) = -sum c_k / (z + k)^2 with `derivative`
    (else zero), and log t = log(g + 1/2) + log1p(z / (g + 1/2)) (log1p keeps small z's digits)."""
    reflect = m.lt(x, m.c(0.5))
    z = m.where(reflect, m.neg(x), m.sub(x, m.c(1.0)))
    total, slope = m.c(_LANCZOS_BASE), m.c(0.0)
    for k, coefficient in enumerate(_LANCZOS, start=1):
        shifted = m.add(z, m.c(float(k)))
        total = m.add(total, m.div(m.c(coefficient), shifted))
        if derivative:
            slope = m.sub(slope, m.div(m.c(coefficient), m.mul(shifted, shifted)))
    t = m.add(z, m.c(_LANCZOS_G + 0.5))
    log_t = m.add(m.c(math.log(_LANCZOS_G + 0.5)), m.log1p(m.div(z, m.c(_LANCZOS_G + 0.5))))
    return reflect, z, total, slope, t, log_t


@rule("lgamma")
def _lgamma(ctx, params, operands):
    """log|gamma(x)| by Lanczos' approximation, through Euler's reflection below 1/2:
    log|gamma(x)| = log(pi) - log|sin(pi x)| - log|gamma(1 - x)|, the sine of the fraction of
    |x| folded into [0, 1/2] so that near-integers keep their precision. +inf at the poles
    (0 and the negative integers) and at +-inf, as XLA."""
    x, m = in_work_dtype(ctx, operands[0])
    reflect, z, a, _, t, log_t = _lanczos(m, x)
    log_y = m.add(m.add(m.c(0.5 * math.log(2 * math.pi)),
                        m.mul(m.sub(m.add(z, m.c(0.5)), m.div(t, log_t)), log_t)), m.log(a))
    magnitude = m.abs(x)
    fraction = m.sub(magnitude, m.floor(magnitude))
    folded = m.where(m.gt(fraction, m.c(0.5)), m.sub(m.c(1.0), fraction), fraction)
    log_sin = m.log(m.sin(m.mul(m.c(math.pi), folded)))
    reflected = m.where(m.is_finite(log_sin), m.sub(m.sub(m.c(math.log(math.pi)), log_sin), log_y), m.neg(log_sin))
    result = m.where(reflect, reflected, log_y)
    result = m.where(m.eq(magnitude, m.c(math.inf)), m.c(math.inf), result)
    return ctx.convert(result, ctx.out.dtype)


@rule("digamma")
def _digamma(ctx, params, operands):
    """gamma'(x)/gamma(x) from the same approximation: log t + A'(z)/A(z) - g/t, through
    digamma(x) = digamma(1 - x) - pi cot(pi x) below 1/2 (x first shifted into [-1/2, 1/2] by
    a whole number, for the cotangent's precision). NaN at the poles (0 and the negative
    integers), as XLA; at zero whatever this jax's XLA gives (`_digamma_at_zero`)."""
    x, m = in_work_dtype(ctx, operands[0])
    reflect, _, a, slope, t, log_t = _lanczos(m, x, derivative=True)
    y = m.sub(m.add(log_t, m.div(slope, a)), m.div(m.c(_LANCZOS_G), t))
    reduced = m.add(x, m.abs(m.floor(m.add(x, m.c(0.5)))))
    angle = m.mul(m.c(math.pi), reduced)
    reflected = m.sub(y, m.div(m.mul(m.c(math.pi), m.cos(angle)), m.sin(angle)))
    result = m.where(reflect, reflected, y)
    pole = m.and_(m.le(x, m.c(0.0)), m.eq(x, m.floor(x)))
    result = m.where(pole, m.c(math.nan), result)
    at_zero = _digamma_at_zero()
    if not math.isnan(at_zero):
        result = m.where(m.eq(x, m.c(0.0)), m.c(at_zero), result)
    return ctx.convert(result, ctx.out.dtype)


@functools.cache
def _digamma_at_zero() -> float:
    """digamma(0) and digamma(-0) as this jax's XLA computes them: NaN, as at the other poles,
    up to jax 0.10; -inf (both) from jax 0.11 on. Asked of XLA:CPU once."""
    with jax.default_device(jax.devices("cpu")[0]):
        return float(jax.jit(lax.digamma)(np.float32(0.0)))
