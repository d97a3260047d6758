"""float64 math functions (see the package docstring for their error), and the f64 pieces the
float32 functions borrow: the trig reduction, erfc's tail, log2 and exp2.
"""

from __future__ import annotations

import math

import numpy as np

from .core import F32, F64, SCALEF, _bits64, _div, _div3, _float64, _fma, _inline, _ldexp, _pow2_f64, _signbit64



# Trig: x - n*pi/2 in f64 with pi/2 in three parts (25 + 25 + 53 bits): n*P1 and n*P2 are
# exact for |n| < 2**28, so the reduced argument is good to ~2**-75 absolute for |x| < 2**28.
_MAGIC_F64 = F64(6755399441055744.0)  # 1.5 * 2**52


_LOG2E_F64 = F64(1.4426950408889634)


_LN2_HI_F64 = F64(6.93147180369123816490e-01)  # 32 significant bits


_LN2_LO_F64 = F64(1.90821492927058770002e-10)


if SCALEF:

    @_inline
    def _scale_f64(p, k):
        """p * 2**k, rounded once: one vscalefpd."""
        return _ldexp(p, k)

else:

    @_inline
    def _scale_f64(p, k):
        """p * 2**k for k in [-2044, 2046], rounded once: two factors in the normal range."""
        k1 = k >> 1
        return p * _pow2_f64(k1) * _pow2_f64(k - k1)


@_inline
def _exp_parts_f64(x):
    """(e**r, k) for x = k ln2 + r, x clamped below at -750 (e**-750 rounds to 0)."""
    x = F64(-750.0) if x < F64(-750.0) else x  # the ternaries keep NaN
    t = _fma(x, _LOG2E_F64, _MAGIC_F64)
    n = t - _MAGIC_F64
    r = _fma(n, -_LN2_HI_F64, x)
    r = _fma(n, -_LN2_LO_F64, r)
    # 1 + r + r**2 * P(r), |r| <= 0.354, minimax, relative error 2**-57.6
    p = _fma(F64(2.4997913935584626e-08), r, F64(2.763315529879028e-07))
    p = _fma(p, r, F64(2.7557608403948446e-06))
    p = _fma(p, r, F64(2.4801485454970366e-05))
    p = _fma(p, r, F64(0.00019841269464527985))
    p = _fma(p, r, F64(0.0013888888950409103))
    p = _fma(p, r, F64(0.008333333333521934))
    p = _fma(p, r, F64(0.04166666666650726))
    p = _fma(p, r, F64(0.16666666666666358))
    p = _fma(p, r, F64(0.5000000000000013))
    return F64(1.0) + _fma(r * r, p, r), _bits64(t) - _bits64(_MAGIC_F64)


@_inline
def _exp_upto710_f64(x):
    """e**x for x <= 710 or NaN: exp_f64 without its upper clamp."""
    p, k = _exp_parts_f64(x)
    return _scale_f64(p, k)


if SCALEF:
    _scale_down_f64 = _scale_f64  # one vscalefpd, whatever k
else:

    @_inline
    def _scale_down_f64(p, k):
        """p * 2**k for k in [-2021, 22], rounded once: the first factor is exact (a normal
        number), so the second rounds (as `_scale_down_f32`)."""
        return p * _pow2_f64(k + 1000) * F64(2.0**-1000)


@_inline
def _exp_neg_f64(x):
    """e**x for x <= 0 or NaN, bit for bit as exp_f64 (logistic's argument): k <= 0."""
    p, k = _exp_parts_f64(x)
    return _scale_down_f64(p, k)


@_inline
def exp_f64(x):
    x = F64(x)
    return _exp_upto710_f64(F64(710.0) if x > F64(710.0) else x)


@_inline
def exp2_f64(x):
    x = F64(x)
    x = F64(1030.0) if x > F64(1030.0) else x
    x = F64(-1080.0) if x < F64(-1080.0) else x
    t = x + _MAGIC_F64
    r = x - (t - _MAGIC_F64)
    # 1 + r * P(r), |r| <= 0.51, minimax, relative error 2**-57.7
    p = _fma(F64(4.434337233689063e-10), r, F64(7.07454347006645e-09))
    p = _fma(p, r, F64(1.0178208920905621e-07))
    p = _fma(p, r, F64(1.321543105262002e-06))
    p = _fma(p, r, F64(1.5252733453949584e-05))
    p = _fma(p, r, F64(0.00015403530465114872))
    p = _fma(p, r, F64(0.0013333558146833965))
    p = _fma(p, r, F64(0.009618129107588256))
    p = _fma(p, r, F64(0.05550410866481976))
    p = _fma(p, r, F64(0.24022650695910144))
    p = _fma(p, r, F64(0.6931471805599453))
    return _scale_f64(_fma(p, r, F64(1.0)), _bits64(t) - _bits64(_MAGIC_F64))


@_inline
def _expm1_reduce_f64(x):
    """(expm1(r), k) for x = k ln2 + r, x in [-40, 710] or NaN."""
    t = _fma(x, _LOG2E_F64, _MAGIC_F64)
    n = t - _MAGIC_F64
    r = _fma(n, -_LN2_HI_F64, x)
    r = _fma(n, -_LN2_LO_F64, r)
    # r + r**2/2 + r**3 * P(r), minimax, relative error 2**-61.3
    p = _fma(F64(2.0878989020926506e-09), r, F64(2.5110955663721446e-08))
    p = _fma(p, r, F64(2.75573926308993e-07))
    p = _fma(p, r, F64(2.7557239251027345e-06))
    p = _fma(p, r, F64(2.4801587185233e-05))
    p = _fma(p, r, F64(0.0001984126989039925))
    p = _fma(p, r, F64(0.0013888888888951847))
    p = _fma(p, r, F64(0.008333333333320264))
    p = _fma(p, r, F64(0.04166666666666656))
    p = _fma(p, r, F64(0.16666666666666677))
    return _fma(r * r, _fma(p, r, F64(0.5)), r), _bits64(t) - _bits64(_MAGIC_F64)


@_inline
def expm1_f64(x):
    x = F64(x)
    xc = F64(710.0) if x > F64(710.0) else x
    xc = F64(-40.0) if xc < F64(-40.0) else xc
    e, k = _expm1_reduce_f64(xc)
    kb = 512 if k > 512 else 0
    s = _pow2_f64(k - kb)
    y = _fma(s, e, s - _pow2_f64(-kb)) * _pow2_f64(kb)
    return x if abs(x) < F64(2.0**-54) else y


@_inline
def _expm1_nonneg_f64(x):
    """expm1_f64(x) for x in [+0, 44] or NaN, bit for bit (tanh's argument): as
    `_expm1_nonneg_f32`, |k| <= 64 and tiny arguments come out as they went in."""
    e, k = _expm1_reduce_f64(x)
    s = _pow2_f64(k)
    return _fma(s, e, s - F64(1.0))


# Lg1..Lg7 from FreeBSD/musl log: |(log(1+s) - log(1-s))/s - Lg(s)| < 2**-58.45.
@_inline
def _log_poly_f64(f, k, c):
    s = _div(f, F64(2.0) + f)
    z = s * s
    w = z * z
    t1 = w * (F64(3.999999999940941908e-01) + w * (F64(2.222219843214978396e-01)
                                                   + w * F64(1.531383769920937332e-01)))
    t2 = z * (F64(6.666666666666735130e-01) + w * (F64(2.857142874366239149e-01)
                                                   + w * (F64(1.818357216161805012e-01)
                                                          + w * F64(1.479819860511658591e-01))))
    hfsq = F64(0.5) * f * f
    dk = F64(k)
    lo = dk * F64(1.90821492927058770002e-10) + c
    return dk * F64(6.93147180369123816490e-01) - ((hfsq - (s * (hfsq + t2 + t1) + lo)) - f)


@_inline
def _log_split_f64(x):
    """(f, k) with x = 2**k * (1 + f), 1 + f in [sqrt(2)/2, sqrt(2)), for normal x > 0."""
    ix = _bits64(x)
    hx = (ix >> 32) + (0x3FF00000 - 0x3FE6A09E)
    k = (hx >> 20) - 0x3FF
    m = _float64((((hx & 0x000FFFFF) + 0x3FE6A09E) << 32) | (ix & 0xFFFFFFFF))
    return m - F64(1.0), k


@_inline
def log_f64(x):
    x = F64(x)
    subnormal = x < F64(2.2250738585072014e-308)
    f, k = _log_split_f64(x * F64(18014398509481984.0) if subnormal else x)  # 2**54
    y = _log_poly_f64(f, k - (54 if subnormal else 0), F64(0.0))
    y = y if x < F64(np.inf) else x
    y = F64(-np.inf) if x == F64(0.0) else y
    return F64(np.nan) if x < F64(0.0) else y


@_inline
def _log2_f64(x):
    """log2(x) for x >= 0 not subnormal (every f32 is), to about 2 ulp; for pow_f32."""
    f, k = _log_split_f64(x)
    y = F64(k) + _log_poly_f64(f, 0, F64(0.0)) * _LOG2E_F64
    y = y if x < F64(np.inf) else x
    return F64(-np.inf) if x == F64(0.0) else y


@_inline
def log1p_f64(x):
    x = F64(x)
    u = F64(1.0) + x
    f, k = _log_split_f64(u)
    c = _div(F64(1.0) - (u - x) if k >= 2 else x - (u - F64(1.0)), u)
    c = F64(0.0) if k >= 54 else c
    near = k == 0
    y = _log_poly_f64(x if near else f, k, F64(0.0) if near else c)
    y = x if abs(x) < F64(2.0**-54) else y
    y = y if x < F64(np.inf) else x
    y = F64(-np.inf) if x == F64(-1.0) else y
    return F64(np.nan) if x < F64(-1.0) else y


@_inline
def tanh_f64(x):
    x = F64(x)
    a = abs(x)
    a = F64(22.0) if a > F64(22.0) else a  # tanh(22) rounds to 1
    t = _expm1_nonneg_f64(a + a)
    q = _div(t, t + F64(2.0))  # its sign bit is clear, a NaN's too (a's sign went)
    return _float64(_bits64(q) | (_bits64(x) & np.int64(-0x8000000000000000)))


@_inline
def logistic_f64(x):
    x = F64(x)
    e = _exp_neg_f64(-abs(x))
    return _div(F64(1.0) if x >= F64(0.0) else e, F64(1.0) + e)


@_inline
def erf_f64(x):
    return math.erf(F64(x))  # libm: a loop calling it does not vectorise


@_inline
def erfc_f64(x):
    return math.erfc(F64(x))


@_inline
def sin_f64(x):
    return math.sin(F64(x))


@_inline
def cos_f64(x):
    return math.cos(F64(x))


@_inline
def tan_f64(x):
    return math.tan(F64(x))


@_inline
def pow_f64(x, y):
    return np.power(F64(x), F64(y))


_PIO4_F64 = F64(0.7853981633974483)


_PIO4_LO_F64 = F64(3.061616997868383e-17)


_PIO2_F64 = F64(1.5707963267948966)


_PIO2_LO_F64 = F64(6.123233995736766e-17)


_PI_F64 = F64(3.141592653589793)


_PI_LO_F64 = F64(1.2246467991473532e-16)


@_inline
def _atan_ratio_f64(num, den):
    """atan(num/den) for 0 <= num <= den: Cephes atan's P/Q, relative error 2.2e-16."""
    mid = num > F64(0.66) * den
    t = _div(num - den if mid else num, num + den if mid else den)
    z = t * t
    p = _fma(F64(-8.750608600031904122785e-01), z, F64(-1.615753718733365076637e01))
    p = _fma(p, z, F64(-7.500855792314704667340e01))
    p = _fma(p, z, F64(-1.228866684490136173410e02))
    p = _fma(p, z, F64(-6.485021904942025371773e01))
    q = z + F64(2.485846490142306297962e01)
    q = _fma(q, z, F64(1.650270098316988542046e02))
    q = _fma(q, z, F64(4.328810604912902668951e02))
    q = _fma(q, z, F64(4.853903996359136964868e02))
    q = _fma(q, z, F64(1.945506571482613964425e02))
    y = _fma(t, _div(z * p, q), t)
    return _PIO4_F64 + (y + _PIO4_LO_F64) if mid else y


@_inline
def atan_f64(x):
    x = F64(x)
    a = abs(x)
    swap = a > F64(1.0)
    y = _atan_ratio_f64(F64(1.0) if swap else a, a if swap else F64(1.0))
    y = _PIO2_F64 + (_PIO2_LO_F64 - y) if swap else y
    return math.copysign(y, x)


@_inline
def atan2_f64(y, x):
    y = F64(y)
    x = F64(x)
    ax = abs(x)
    ay = abs(y)
    swap = ay > ax
    big = (ax > F64(1e307)) | (ay > F64(1e307))
    small = (ax < F64(2.0**-500)) & (ay < F64(2.0**-500))
    scale = F64(0.25) if big else (F64(2.0**500) if small else F64(1.0))
    ax = ax * scale
    ay = ay * scale
    v = _atan_ratio_f64(ax if swap else ay, ay if swap else ax)
    v = (F64(0.0) if ax == F64(0.0) else _PIO4_F64) if ax == ay else v
    v = _PIO2_F64 + (_PIO2_LO_F64 - v) if swap else v
    v = _PI_F64 + (_PI_LO_F64 - v) if _signbit64(x) else v
    return math.copysign(v, y)


@_inline
def cbrt_f64(x):
    """musl cbrt, branch-free: 5-bit guess, a polynomial to 23 bits, one rounded Newton step."""
    x = F64(x)
    a = abs(x)
    subnormal = a < F64(2.2250738585072014e-308)
    hx = _bits64(a * F64(18014398509481984.0) if subnormal else a) >> 32  # 2**54
    t = _float64((_div3(hx) + (696219795 if subnormal else 715094163)) << 32)
    r = (t * t) * _div(t, a)
    t = t * ((F64(1.87595182427177009643) + r * (F64(-1.88497979543377169875)
                                                 + r * F64(1.621429720105354466140)))
             + ((r * r) * r) * (F64(-0.758397934778766047437) + r * F64(0.145996192886612446982)))
    t = _float64((_bits64(t) + 0x80000000) & -0x40000000)  # round to 23 bits: t*t is exact
    s = t * t
    r = _div(a, s)
    r = _div(r - t, t + t + r)
    y = t + t * r
    ok = (a > F64(0.0)) & (a < F64(np.inf))
    return math.copysign(y, x) if ok else x


@_inline
def rsqrt_f64(x):
    x = F64(x)
    return _div(F64(1.0), np.sqrt(x))
