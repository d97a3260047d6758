"""float32 math functions (see the package docstring for their error)."""

from __future__ import annotations

import math

import numpy as np

from .core import (F32, F64, SCALEF, _bits32, _bits64, _div, _div3, _float32, _fma, _inline, _ldexp, _pow2_f32,
                   _signbit32)
from .f64 import _MAGIC_F64, _log2_f64, exp2_f64, exp_f64



_MAGIC_F32 = F32(12582912.0)  # 1.5 * 2**23: x + MAGIC rounds x to an integer, |x| < 2**22


_LOG2E_F32 = F32(1.4426950408889634)


_LN2_HI_F32 = F32(0.693145751953125)  # 15 significant bits: n * LN2_HI is exact


_LN2_LO_F32 = F32(1.428606765330187e-06)

# numba widens int32 arithmetic to int64, so the integer steps below cast back to int32: a
# vectorised loop then keeps them in 32-bit lanes, and `F32(k)` converts int32 lanes (AVX2 has
# no vector int64 -> float conversion: log's loop ran scalar conversions, 1.7 ns an element).
I32 = np.int32


@_inline
def _exponent_f32(t):
    """The integer n of t = MAGIC + n (t from an fma adding _MAGIC_F32), as int32."""
    return I32(_bits32(t) - _bits32(_MAGIC_F32))


@_inline
def _exp_poly_f32(r):
    """e**r for |r| <= 0.364: 1 + r + r**2 * P(r), minimax, relative error 2**-27.8."""
    p = _fma(F32(0.0013807121431455016), r, F32(0.008372330106794834))
    p = _fma(p, r, F32(0.04166875779628754))
    p = _fma(p, r, F32(0.16666489839553833))
    p = _fma(p, r, F32(0.49999991059303284))
    return F32(1.0) + _fma(r * r, p, r)


if SCALEF:

    @_inline
    def _scale_f32(p, k):
        """p * 2**k, rounded once: one vscalefps (exp over float32: 0.35 against 0.59 ns)."""
        return _ldexp(p, k)

else:

    @_inline
    def _scale_f32(p, k):
        """p * 2**k for k in [-252, 254], rounded once: two factors in the normal range."""
        k1 = I32(k >> 1)
        return p * _pow2_f32(k1) * _pow2_f32(I32(k - k1))


@_inline
def _exp_parts_f32(x):
    """(e**r, k) for x = k ln2 + r, x clamped below at -110 (e**-110 rounds to 0)."""
    x = F32(-110.0) if x < F32(-110.0) else x  # the ternaries keep NaN
    t = _fma(x, _LOG2E_F32, _MAGIC_F32)
    n = t - _MAGIC_F32
    r = _fma(n, -_LN2_HI_F32, x)
    r = _fma(n, -_LN2_LO_F32, r)
    return _exp_poly_f32(r), _exponent_f32(t)


@_inline
def _exp_upto90_f32(x):
    """e**x for x <= 90 or NaN: exp_f32 without its upper clamp."""
    p, k = _exp_parts_f32(x)
    return _scale_f32(p, k)


@_inline
def exp_f32(x):
    x = F32(x)
    return _exp_upto90_f32(F32(90.0) if x > F32(90.0) else x)


@_inline
def exp2_f32(x):
    x = F32(x)
    x = F32(130.0) if x > F32(130.0) else x
    x = F32(-160.0) if x < F32(-160.0) else x
    t = x + _MAGIC_F32
    r = x - (t - _MAGIC_F32)
    # 1 + r * P(r), |r| <= 0.5, minimax, relative error 2**-28.9
    p = _fma(F32(0.00015353361959569156), r, F32(0.0013398875016719103))
    p = _fma(p, r, F32(0.00961843691766262))
    p = _fma(p, r, F32(0.055503323674201965))
    p = _fma(p, r, F32(0.24022647738456726))
    p = _fma(p, r, F32(0.6931471824645996))
    return _scale_f32(_fma(p, r, F32(1.0)), _exponent_f32(t))


@_inline
def _expm1_reduce_f32(x):
    """(expm1(r), k) for x = k ln2 + r, x in [-20, 90] or NaN."""
    t = _fma(x, _LOG2E_F32, _MAGIC_F32)
    n = t - _MAGIC_F32
    r = _fma(n, -_LN2_HI_F32, x)
    r = _fma(n, -_LN2_LO_F32, r)
    # expm1(r) = r + r**2/2 + r**3 * P(r), minimax, relative error 2**-25.7
    p = _fma(F32(0.0013899077894166112), r, F32(0.008369358256459236))
    p = _fma(p, r, F32(0.041666895151138306))
    p = _fma(p, r, F32(0.1666652411222458))
    return _fma(r * r, _fma(p, r, F32(0.5)), r), _exponent_f32(t)


@_inline
def expm1_f32(x):
    x = F32(x)
    xc = F32(90.0) if x > F32(90.0) else x
    xc = F32(-20.0) if xc < F32(-20.0) else xc
    e, k = _expm1_reduce_f32(xc)
    # expm1(x) = 2**k * e + (2**k - 1), with 2**k split so that it cannot overflow early.
    kb = I32(64) if k > 64 else I32(0)
    s = _pow2_f32(I32(k - kb))
    y = _fma(s, e, s - _pow2_f32(-kb)) * _pow2_f32(kb)
    return x if abs(x) < F32(2.0**-25) else y  # keeps -0.0 and subnormals


@_inline
def _expm1_nonneg_f32(x):
    """expm1_f32(x) for x in [+0, 20] or NaN, bit for bit (tanh's argument): |k| <= 29, so
    neither the clamps nor the split of 2**k are needed, nor the test for tiny arguments: below
    2**-25 the reduction leaves r = x, and r + r**2 * P(r) rounds to r (-0.0 would not keep
    its sign)."""
    e, k = _expm1_reduce_f32(x)
    s = _pow2_f32(k)
    return _fma(s, e, s - F32(1.0))


# Lg1..Lg4 from FreeBSD/musl logf: |(log(1+s) - log(1-s))/s - Lg(s)| < 2**-34.24.
@_inline
def _log_poly_f32(f, k, c):
    """log(1 + f) + k*ln2 + c for f in [sqrt(2)/2 - 1, sqrt(2) - 1], as musl logf/log1pf."""
    s = _div(f, F32(2.0) + f)
    z = s * s
    w = z * z
    t1 = w * (F32(0.40000972152) + w * F32(0.24279078841))
    t2 = z * (F32(0.66666662693) + w * F32(0.28498786688))
    hfsq = F32(0.5) * f * f
    dk = F32(k)
    lo = dk * F32(9.0580006145e-06) + c
    return s * (hfsq + t2 + t1) + lo - hfsq + f + dk * F32(6.9313812256e-01)


@_inline
def log_f32(x):
    x = F32(x)
    subnormal = x < F32(1.1754943508222875e-38)
    xs = x * F32(33554432.0) if subnormal else x  # 2**25
    ix = I32(_bits32(xs) + (0x3F800000 - 0x3F3504F3))
    k = I32((ix >> 23) - 0x7F - (25 if subnormal else 0))
    f = _float32((ix & 0x007FFFFF) + 0x3F3504F3) - F32(1.0)
    y = _log_poly_f32(f, k, F32(0.0))
    y = y if x < F32(np.inf) else x  # +inf, NaN
    y = F32(-np.inf) if x == F32(0.0) else y
    return F32(np.nan) if x < F32(0.0) else y


@_inline
def log1p_f32(x):
    x = F32(x)
    u = F32(1.0) + x
    iu = I32(_bits32(u) + (0x3F800000 - 0x3F3504F3))
    k = I32((iu >> 23) - 0x7F)
    # c: the rounding error of u, as a correction to log(u).
    c = _div(F32(1.0) - (u - x) if k >= 2 else x - (u - F32(1.0)), u)
    c = F32(0.0) if k >= 25 else c
    f = _float32((iu & 0x007FFFFF) + 0x3F3504F3) - F32(1.0)
    near = k == 0  # 1 + x in [sqrt(2)/2, sqrt(2)): use x itself, exact
    y = _log_poly_f32(x if near else f, k, F32(0.0) if near else c)
    y = x if abs(x) < F32(2.0**-24) else y  # keeps -0.0 and subnormals
    y = y if x < F32(np.inf) else x
    y = F32(-np.inf) if x == F32(-1.0) else y
    return F32(np.nan) if x < F32(-1.0) else y


@_inline
def tanh_f32(x):
    x = F32(x)
    a = abs(x)
    a = F32(10.0) if a > F32(10.0) else a  # tanh(10) rounds to 1
    t = _expm1_nonneg_f32(a + a)
    q = _div(t, t + F32(2.0))  # its sign bit is clear, a NaN's too (a's sign went)
    return _float32(I32(_bits32(q) | (_bits32(x) & I32(-0x80000000))))


if SCALEF:
    _scale_down_f32 = _scale_f32  # one vscalefps, whatever k
else:

    @_inline
    def _scale_down_f32(p, k):
        """p * 2**k for k in [-188, 63], rounded once: the first factor is exact (a normal
        number), so the second rounds. Half the integer work of `_scale_f32`, whose range
        needs the exponent split in two."""
        return p * _pow2_f32(I32(k + 63)) * F32(2.0**-63)


@_inline
def exp_nonpositive_f32(x):
    """e**x for x <= 0 or NaN, bit for bit as exp_f32 (k <= 0): logistic's argument, and
    softmax's x - max(x), which the kernel writer calls it for."""
    p, k = _exp_parts_f32(F32(x))
    return _scale_down_f32(p, k)


@_inline
def logistic_f32(x):
    x = F32(x)
    e = exp_nonpositive_f32(-abs(x))
    return _div(F32(1.0) if x >= F32(0.0) else e, F32(1.0) + e)


@_inline
def _erf_small_f32(a):
    """erf(a) for 0 <= a <= 0.875: a + a * P(a**2), minimax, relative error 2**-26.8."""
    z = a * a
    p = _fma(F32(-0.0006203291122801602), z, F32(0.005032189190387726))
    p = _fma(p, z, F32(-0.026791468262672424))
    p = _fma(p, z, F32(0.11282455176115036))
    p = _fma(p, z, F32(-0.3761255145072937))
    p = _fma(p, z, F32(0.12837915122509003))
    return _fma(a, p, a)


_ERFC_S = (  # S(t) = (a + 2) * erfc(a) * e**a**2, t = (a - 2)/(a + 2), a in [0.5, 10.5]
    1.0215827226638794, -0.6871606707572937, 0.27947190403938293, -0.03644370287656784,
    -0.021506227552890778, 0.006494564935564995, 0.0030552020762115717, -0.000898313766811043,
    -0.0005458142259158194, 0.00012497164425440133,
)  # minimax in t, relative error 2**-28.4: S is flat, so the rounding of t barely moves it


@_inline
def _erfc_large_f32(a):
    """erfc(a) for 0.875 <= a <= 4.5 to 3 ulp: only erf's 1 - erfc(a) uses it."""
    d = _div(F32(1.0), a + F32(2.0))
    t = (a - F32(2.0)) * d
    c = _ERFC_S
    q = _fma(F32(c[9]), t, F32(c[8]))
    q = _fma(q, t, F32(c[7]))
    q = _fma(q, t, F32(c[6]))
    q = _fma(q, t, F32(c[5]))
    q = _fma(q, t, F32(c[4]))
    q = _fma(q, t, F32(c[3]))
    q = _fma(q, t, F32(c[2]))
    q = _fma(q, t, F32(c[1]))
    q = _fma(q, t, F32(c[0]))
    return exp_f32(-(a * a)) * (q * d)


@_inline
def _erfc_large_f64(a):
    """erfc(a) for f32 a in [0.47, 10.5], in f64 (a*a is exact): erfc_f32's relative error."""
    d = _div(F64(1.0), a + F64(2.0))
    t = (a - F64(2.0)) * d
    c = _ERFC_S
    q = _fma(F64(c[9]), t, F64(c[8]))
    q = _fma(q, t, F64(c[7]))
    q = _fma(q, t, F64(c[6]))
    q = _fma(q, t, F64(c[5]))
    q = _fma(q, t, F64(c[4]))
    q = _fma(q, t, F64(c[3]))
    q = _fma(q, t, F64(c[2]))
    q = _fma(q, t, F64(c[1]))
    q = _fma(q, t, F64(c[0]))
    return exp_f64(-(a * a)) * (q * d)


@_inline
def erf_f32(x):
    x = F32(x)
    a = abs(x)
    large = F32(1.0) - _erfc_large_f32(F32(4.5) if a > F32(4.5) else a)  # erf(3.92) rounds to 1
    return math.copysign(_erf_small_f32(a) if a < F32(0.875) else large, x)


@_inline
def erfc_f32(x):
    """erfc needs relative accuracy down to 1e-45: the tail runs in f64 (the erf part in f32)."""
    x = F32(x)
    a = abs(x)
    e = F32(_erfc_large_f64(F64(F32(10.5) if a > F32(10.5) else a)))
    s = _erf_small_f32(a)
    positive = e if a >= F32(0.47) else F32(1.0) - s  # 1 - s only while erfc(a) > 0.5
    negative = F32(1.0) + (s if a < F32(0.875) else F32(1.0) - e)  # 1 + erf(a)
    return negative if x < F32(0.0) else positive


_TWO_OVER_PI = F64(0.6366197723675814)


_PIO2_1 = F64(1.5707963109016418)


_PIO2_2 = F64(1.5893254712295857e-08)


_PIO2_3 = F64(6.123233995736766e-17)


@_inline
def _reduce_pio2_f64(x):
    """(r, q): x = q*pi/2 + r with |r| <= pi/4 and q's low two bits, for f32 x, in f64."""
    xd = F64(x)
    t = _fma(xd, _TWO_OVER_PI, _MAGIC_F64)
    n = t - _MAGIC_F64
    r = _fma(n, -_PIO2_1, xd)
    r = _fma(n, -_PIO2_2, r)
    r = _fma(n, -_PIO2_3, r)
    r = F64(0.7854) if r > F64(0.7854) else r  # only past |x| = 2**28 (the callers use libm there)
    r = F64(-0.7854) if r < F64(-0.7854) else r
    return r, _bits64(t) & 3


# The f64 reduction is exact below 2**28; past it (and for NaN and inf) the trig functions call
# libm, whose reduction is exact for any argument. A branch, so those loops run scalar.
_HUGE_TRIG_F32 = F32(268435456.0)


@_inline
def _reduce_pio2_f32(x):
    r, q = _reduce_pio2_f64(x)
    return F32(r), q


@_inline
def _sin_poly_f32(r):
    """sin(r), |r| <= pi/4: r + r**3 * S(r**2), relative error 2**-28."""
    z = r * r
    p = _fma(F32(-0.0001951463200384751), z, F32(0.008332155644893646))
    p = _fma(p, z, F32(-0.16666655242443085))
    return _fma(r * z, p, r)


@_inline
def _cos_poly_f32(r):
    """cos(r), |r| <= pi/4: 1 - r**2/2 + r**4 * C(r**2), relative error 2**-33."""
    z = r * r
    p = _fma(F32(2.443241282890085e-05), z, F32(-0.0013887309469282627))
    p = _fma(p, z, F32(0.04166664555668831))
    return _fma(z * z, p, F32(1.0) - F32(0.5) * z)


@_inline
def sin_f32(x):
    x = F32(x)
    if not abs(x) < _HUGE_TRIG_F32:
        return F32(math.sin(F64(x)))  # libm reduces exactly; NaN and inf give NaN
    r, q = _reduce_pio2_f32(x)
    y = _cos_poly_f32(r) if q & 1 else _sin_poly_f32(r)
    y = -y if q & 2 else y
    return x if x == F32(0.0) else y  # sin(-0.0) = -0.0


@_inline
def cos_f32(x):
    x = F32(x)
    if not abs(x) < _HUGE_TRIG_F32:
        return F32(math.cos(F64(x)))  # libm reduces exactly; NaN and inf give NaN
    r, q = _reduce_pio2_f32(x)
    y = _sin_poly_f32(r) if q & 1 else _cos_poly_f32(r)
    return -y if (q + 1) & 2 else y


@_inline
def tan_f32(x):
    """sin/cos with f32 coefficients but in f64 (from the f64 reduced argument): a quotient of
    two f32 polynomials would reach 3 ulp."""
    x = F32(x)
    if not abs(x) < _HUGE_TRIG_F32:
        return F32(math.tan(F64(x)))  # libm reduces exactly; NaN and inf give NaN
    r, q = _reduce_pio2_f64(x)
    z = r * r
    s = _fma(F64(-0.0001951463200384751), z, F64(0.008332155644893646))
    s = _fma(r * z, _fma(s, z, F64(-0.16666655242443085)), r)
    c = _fma(F64(2.443241282890085e-05), z, F64(-0.0013887309469282627))
    c = _fma(z * z, _fma(c, z, F64(0.04166664555668831)), F64(1.0) - F64(0.5) * z)
    y = F32(_div(-c, s) if q & 1 else _div(s, c))
    return x if x == F32(0.0) else y


_PIO4_HI_F32 = F32(0.7853981852531433)


_PIO4_LO_F32 = F32(-2.1855694143368964e-08)


_PIO2_HI_F32 = F32(1.5707963705062866)


_PIO2_LO_F32 = F32(-4.371138828673793e-08)


_PI_HI_F32 = F32(3.1415927410125732)


_PI_LO_F32 = F32(-8.742277657347586e-08)


@_inline
def _atan_ratio_f32(num, den):
    """atan(num/den) for 0 <= num <= den, den > 0 (NaN where num/den is NaN)."""
    mid = num > F32(0.41421356237309503) * den  # past tan(pi/8): atan(t) = pi/4 + atan(...)
    t = _div(num - den if mid else num, num + den if mid else den)
    z = t * t
    p = _fma(F32(-0.06073610857129097), z, F32(0.10592078417539597))
    p = _fma(p, z, F32(-0.14243310689926147))
    p = _fma(p, z, F32(0.199984610080719))
    p = _fma(p, z, F32(-0.33333316445350647))
    y = _fma(t * z, p, t)
    return _PIO4_HI_F32 + (y + _PIO4_LO_F32) if mid else y


@_inline
def atan_f32(x):
    x = F32(x)
    a = abs(x)
    swap = a > F32(1.0)
    y = _atan_ratio_f32(F32(1.0) if swap else a, a if swap else F32(1.0))
    y = _PIO2_HI_F32 + (_PIO2_LO_F32 - y) if swap else y
    return math.copysign(y, x)


@_inline
def atan2_f32(y, x):
    y = F32(y)
    x = F32(x)
    ax = abs(x)
    ay = abs(y)
    swap = ay > ax
    # Exact power-of-two scaling keeps num + den finite and tan(pi/8) * den normal.
    big = (ax > F32(1e37)) | (ay > F32(1e37))
    small = (ax < F32(2.0**-60)) & (ay < F32(2.0**-60))
    scale = F32(0.25) if big else (F32(2.0**60) if small else F32(1.0))
    ax = ax * scale
    ay = ay * scale
    v = _atan_ratio_f32(ax if swap else ay, ay if swap else ax)
    v = (F32(0.0) if ax == F32(0.0) else _PIO4_HI_F32) if ax == ay else v  # 0/0, inf/inf
    v = _PIO2_HI_F32 + (_PIO2_LO_F32 - v) if swap else v
    v = _PI_HI_F32 + (_PI_LO_F32 - v) if _signbit32(x) else v
    return math.copysign(v, y)


@_inline
def cbrt_f32(x):
    """musl cbrtf: a 5-bit guess from the exponent bits, then two Halley steps in f64."""
    x = F32(x)
    a = abs(x)
    subnormal = a < F32(1.1754943508222875e-38)
    bits = _bits32(a * F32(16777216.0) if subnormal else a)  # 2**24
    t = F64(_float32(_div3(bits) + (642849266 if subnormal else 709958130)))  # musl: 5 bits
    ad = F64(a)
    for _ in range(2):  # two Halley steps in f64 (unrolled): 16 bits, then 47
        r = t * t * t
        t = t * _div(ad + ad + r, ad + r + r)
    y = F32(t)
    ok = (a > F32(0.0)) & (a < F32(np.inf))
    return math.copysign(y, x) if ok else x


@_inline
def pow_f32(x, y):
    """x**y with C99/numpy special cases; exp2(y * log2|x|) in f64, so nearly exact."""
    x = F32(x)
    y = F32(y)
    ax = abs(x)
    ay = abs(y)
    m = F32(exp2_f64(F64(y) * _log2_f64(F64(ax))))
    is_int = (ay >= F32(8388608.0)) | ((ay + F32(8388608.0)) - F32(8388608.0) == ay)
    half = F32(0.5) * ay
    is_odd = is_int & (ay < F32(16777216.0)) & ((half + F32(8388608.0)) - F32(8388608.0) != half)
    m = F32(1.0) if (ax == F32(1.0)) & ((x == F32(1.0)) | (y == y)) else m  # 1**y, (-1)**+-inf
    m = -m if _signbit32(x) & is_odd else m
    negative_finite = (x < F32(0.0)) & (x > F32(-np.inf))
    m = F32(np.nan) if negative_finite & (ay < F32(np.inf)) & (not is_int) else m  # (-8)**(1/3)
    return F32(1.0) if y == F32(0.0) else m


@_inline
def rsqrt_f32(x):
    """1/sqrt(x), two correct roundings (x86 has no exact rsqrt; vsqrtps + vdivps vectorise)."""
    x = F32(x)
    return _div(F32(1.0), np.sqrt(x))
