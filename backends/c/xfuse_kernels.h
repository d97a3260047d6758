/* xfuse_kernels.h: the helpers generated C kernels call, a line-for-line port of the numba
 * backend's: its math library (backends/numba/mathlib: `<name>_f32` and `<name>_f64` for exp,
 * exp2, expm1, log, log1p, tanh, logistic, erf, erfc, sin, cos, tan, atan, atan2, cbrt, pow and
 * rsqrt), its scalar helpers (backends/numba/scalar.py, as `scalar_<name>`) and its row
 * reductions (backends/numba/rows.py, as `rows_<name>`). Header-only, everything static inline;
 * includes only <stdint.h>, <stdbool.h>, <string.h> and <math.h>.
 *
 * Each function computes what its Python original computes, operation for operation, so results
 * are bit for bit the numba backend's (NaN payloads aside): the same polynomials, the same
 * order of operations (build with -ffp-contract=off, no -ffast-math), the same fused
 * multiply-adds (`xf_fma_*` is llvm.fmuladd: fused where the target has FMA, a product and a
 * sum where it has not) and the same libm calls where the Python calls libm (f64 erf, erfc, sin,
 * cos, tan and pow; f32 sin, cos and tan past |x| = 2**28, NaN and inf). Error bounds and limits
 * are the mathlib package docstring's. Everything else is selects and integer/float
 * reinterpretation (memcpy, a register move), so a loop calling these vectorises.
 *
 * Integers: numba computes with int64 where the Python mixes int32 with int literals; here the
 * f32 functions and the f64 log's exponent use int32_t where every value fits (the results are
 * the same, 32-bit lanes keep the vectors as wide as the floats, and int32 -> double converts
 * without AVX-512), with unsigned arithmetic where a NaN's bits may wrap (a NaN's result never
 * depends on them).
 * Private pieces carry the prefix `xf_`. The row sums need -fopenmp-simd (the C backend's
 * flags have it) for `#pragma omp simd`, which lets the compiler reorder them into vector lanes
 * as numba's `reassoc` flag does.
 */
#ifndef XFUSE_KERNELS_H
#define XFUSE_KERNELS_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

/* ============================================================================ core intrinsics */
static inline int32_t xf_bits32(float x) {
    int32_t i;
    memcpy(&i, &x, sizeof i);
    return i;
}

static inline float xf_float32(uint32_t i) { /* any integer: its low 32 bits */
    float x;
    memcpy(&x, &i, sizeof x);
    return x;
}

static inline int64_t xf_bits64(double x) {
    int64_t i;
    memcpy(&i, &x, sizeof i);
    return i;
}

static inline double xf_float64(uint64_t i) {
    double x;
    memcpy(&x, &i, sizeof x);
    return x;
}

/* a * b + c as llvm.fmuladd: one rounding where the CPU has FMA, two where it has not. */
#if defined(__FMA__) || defined(__ARM_FEATURE_FMA)
static inline float xf_fma_f32(float a, float b, float c) { return __builtin_fmaf(a, b, c); }
static inline double xf_fma_f64(double a, double b, double c) { return __builtin_fma(a, b, c); }
#else
static inline float xf_fma_f32(float a, float b, float c) { return a * b + c; }
static inline double xf_fma_f64(double a, double b, double c) { return a * b + c; }
#endif

/* i // 3 for 0 <= i < 2**31, as a multiply and shift. */
static inline uint32_t xf_div3(uint32_t i) {
    return (uint32_t)(((uint64_t)i * 0xAAAAAAABu) >> 33);
}

/* 2**k for integer k in [-126, 127]. */
static inline float xf_pow2_f32(int32_t k) { return xf_float32(((uint32_t)k + 127u) << 23); }

/* 2**k for integer k in [-1022, 1023]. */
static inline double xf_pow2_f64(int64_t k) { return xf_float64(((uint64_t)k + 1023u) << 52); }

static inline bool xf_signbit32(float x) { return xf_bits32(x) < 0; }

static inline bool xf_signbit64(double x) { return xf_bits64(x) < 0; }

/* ============================================================================ f64 math */
#define XF_MAGIC_F64 6755399441055744.0 /* 1.5 * 2**52 */
#define XF_LOG2E_F64 1.4426950408889634
#define XF_LN2_HI_F64 6.93147180369123816490e-01 /* 32 significant bits */
#define XF_LN2_LO_F64 1.90821492927058770002e-10

static inline double xf_scale_f64(double p, int64_t k) {
    int64_t k1 = k >> 1;
    return p * xf_pow2_f64(k1) * xf_pow2_f64(k - k1);
}

/* e**x for x <= 710 or NaN: exp_f64 without its upper clamp. */
static inline double xf_exp_upto710_f64(double x) {
    x = x < -750.0 ? -750.0 : x; /* the ternaries keep NaN */
    double t = xf_fma_f64(x, XF_LOG2E_F64, XF_MAGIC_F64);
    double n = t - XF_MAGIC_F64;
    double r = xf_fma_f64(n, -XF_LN2_HI_F64, x);
    r = xf_fma_f64(n, -XF_LN2_LO_F64, r);
    /* 1 + r + r**2 * P(r), |r| <= 0.354, minimax, relative error 2**-57.6 */
    double p = xf_fma_f64(2.4997913935584626e-08, r, 2.763315529879028e-07);
    p = xf_fma_f64(p, r, 2.7557608403948446e-06);
    p = xf_fma_f64(p, r, 2.4801485454970366e-05);
    p = xf_fma_f64(p, r, 0.00019841269464527985);
    p = xf_fma_f64(p, r, 0.0013888888950409103);
    p = xf_fma_f64(p, r, 0.008333333333521934);
    p = xf_fma_f64(p, r, 0.04166666666650726);
    p = xf_fma_f64(p, r, 0.16666666666666358);
    p = xf_fma_f64(p, r, 0.5000000000000013);
    return xf_scale_f64(1.0 + xf_fma_f64(r * r, p, r), xf_bits64(t) - xf_bits64(XF_MAGIC_F64));
}

static inline double exp_f64(double x) { return xf_exp_upto710_f64(x > 710.0 ? 710.0 : x); }

static inline double exp2_f64(double x) {
    x = x > 1030.0 ? 1030.0 : x;
    x = x < -1080.0 ? -1080.0 : x;
    double t = x + XF_MAGIC_F64;
    double r = x - (t - XF_MAGIC_F64);
    /* 1 + r * P(r), |r| <= 0.51, minimax, relative error 2**-57.7 */
    double p = xf_fma_f64(4.434337233689063e-10, r, 7.07454347006645e-09);
    p = xf_fma_f64(p, r, 1.0178208920905621e-07);
    p = xf_fma_f64(p, r, 1.321543105262002e-06);
    p = xf_fma_f64(p, r, 1.5252733453949584e-05);
    p = xf_fma_f64(p, r, 0.00015403530465114872);
    p = xf_fma_f64(p, r, 0.0013333558146833965);
    p = xf_fma_f64(p, r, 0.009618129107588256);
    p = xf_fma_f64(p, r, 0.05550410866481976);
    p = xf_fma_f64(p, r, 0.24022650695910144);
    p = xf_fma_f64(p, r, 0.6931471805599453);
    return xf_scale_f64(xf_fma_f64(p, r, 1.0), xf_bits64(t) - xf_bits64(XF_MAGIC_F64));
}

/* expm1(r) for the reduced argument of x in [-40, 710] or NaN, with k: x = k ln2 + r. */
static inline double xf_expm1_reduce_f64(double x, int64_t *k) {
    double t = xf_fma_f64(x, XF_LOG2E_F64, XF_MAGIC_F64);
    double n = t - XF_MAGIC_F64;
    double r = xf_fma_f64(n, -XF_LN2_HI_F64, x);
    r = xf_fma_f64(n, -XF_LN2_LO_F64, r);
    /* r + r**2/2 + r**3 * P(r), minimax, relative error 2**-61.3 */
    double p = xf_fma_f64(2.0878989020926506e-09, r, 2.5110955663721446e-08);
    p = xf_fma_f64(p, r, 2.75573926308993e-07);
    p = xf_fma_f64(p, r, 2.7557239251027345e-06);
    p = xf_fma_f64(p, r, 2.4801587185233e-05);
    p = xf_fma_f64(p, r, 0.0001984126989039925);
    p = xf_fma_f64(p, r, 0.0013888888888951847);
    p = xf_fma_f64(p, r, 0.008333333333320264);
    p = xf_fma_f64(p, r, 0.04166666666666656);
    p = xf_fma_f64(p, r, 0.16666666666666677);
    *k = xf_bits64(t) - xf_bits64(XF_MAGIC_F64);
    return xf_fma_f64(r * r, xf_fma_f64(p, r, 0.5), r);
}

static inline double expm1_f64(double x) {
    double xc = x > 710.0 ? 710.0 : x;
    xc = xc < -40.0 ? -40.0 : xc;
    int64_t k;
    double e = xf_expm1_reduce_f64(xc, &k);
    int64_t kb = k > 512 ? 512 : 0;
    double s = xf_pow2_f64(k - kb);
    double y = xf_fma_f64(s, e, s - xf_pow2_f64(-kb)) * xf_pow2_f64(kb);
    return fabs(x) < 0x1p-54 ? x : y;
}

/* expm1_f64(x) for x in [-40, 44] or NaN, bit for bit: |k| <= 64, so neither the clamps nor
 * the split of 2**k are needed (tanh's argument). */
static inline double xf_expm1_mid_f64(double x) {
    int64_t k;
    double e = xf_expm1_reduce_f64(x, &k);
    double s = xf_pow2_f64(k);
    double y = xf_fma_f64(s, e, s - 1.0);
    return fabs(x) < 0x1p-54 ? x : y;
}

/* Lg1..Lg7 from FreeBSD/musl log: |(log(1+s) - log(1-s))/s - Lg(s)| < 2**-58.45. */
static inline double xf_log_poly_f64(double f, int32_t k, double c) {
    double s = f / (2.0 + f);
    double z = s * s;
    double w = z * z;
    double t1 = w * (3.999999999940941908e-01
                     + w * (2.222219843214978396e-01 + w * 1.531383769920937332e-01));
    double t2 = z * (6.666666666666735130e-01
                     + w * (2.857142874366239149e-01
                            + w * (1.818357216161805012e-01 + w * 1.479819860511658591e-01)));
    double hfsq = 0.5 * f * f;
    double dk = (double)k;
    double lo = dk * 1.90821492927058770002e-10 + c;
    return dk * 6.93147180369123816490e-01 - ((hfsq - (s * (hfsq + t2 + t1) + lo)) - f);
}

/* f with x = 2**k * (1 + f), 1 + f in [sqrt(2)/2, sqrt(2)), for normal x > 0; k in *k.
 * The high word and k are int32 (numba: int64), so that (double)k vectorises without AVX-512:
 * hx wraps only for a NaN, whose result every caller replaces. */
static inline double xf_log_split_f64(double x, int32_t *k) {
    int64_t ix = xf_bits64(x);
    int32_t hx = (int32_t)((uint32_t)(ix >> 32) + (0x3FF00000u - 0x3FE6A09Eu));
    *k = (hx >> 20) - 0x3FF;
    double m = xf_float64((((uint64_t)(hx & 0x000FFFFF) + 0x3FE6A09Eu) << 32)
                          | ((uint64_t)ix & 0xFFFFFFFFu));
    return m - 1.0;
}

static inline double log_f64(double x) {
    bool subnormal = x < 2.2250738585072014e-308;
    int32_t k;
    double f = xf_log_split_f64(subnormal ? x * 18014398509481984.0 : x, &k); /* 2**54 */
    double y = xf_log_poly_f64(f, k - (subnormal ? 54 : 0), 0.0);
    y = x < (double)INFINITY ? y : x;
    y = x == 0.0 ? -(double)INFINITY : y;
    return x < 0.0 ? (double)NAN : y;
}

/* log2(x) for x >= 0 not subnormal (every f32 is), to about 2 ulp; for pow_f32. */
static inline double xf_log2_f64(double x) {
    int32_t k;
    double f = xf_log_split_f64(x, &k);
    double y = (double)k + xf_log_poly_f64(f, 0, 0.0) * XF_LOG2E_F64;
    y = x < (double)INFINITY ? y : x;
    return x == 0.0 ? -(double)INFINITY : y;
}

static inline double log1p_f64(double x) {
    double u = 1.0 + x;
    int32_t k;
    double f = xf_log_split_f64(u, &k);
    double c = (k >= 2 ? 1.0 - (u - x) : x - (u - 1.0)) / u;
    c = k >= 54 ? 0.0 : c;
    bool near = k == 0;
    double y = xf_log_poly_f64(near ? x : f, k, near ? 0.0 : c);
    y = fabs(x) < 0x1p-54 ? x : y;
    y = x < (double)INFINITY ? y : x;
    y = x == -1.0 ? -(double)INFINITY : y;
    return x < -1.0 ? (double)NAN : y;
}

static inline double tanh_f64(double x) {
    double a = fabs(x);
    a = a > 22.0 ? 22.0 : a; /* tanh(22) rounds to 1 */
    double t = xf_expm1_mid_f64(a + a);
    return copysign(t / (t + 2.0), x);
}

static inline double logistic_f64(double x) {
    double e = xf_exp_upto710_f64(-fabs(x));
    return (x >= 0.0 ? 1.0 : e) / (1.0 + e);
}

/* libm, as in the Python: a loop calling these does not vectorise. */
static inline double erf_f64(double x) { return erf(x); }

static inline double erfc_f64(double x) { return erfc(x); }

static inline double sin_f64(double x) { return sin(x); }

static inline double cos_f64(double x) { return cos(x); }

static inline double tan_f64(double x) { return tan(x); }

static inline double pow_f64(double x, double y) { return pow(x, y); }

#define XF_PIO4_F64 0.7853981633974483
#define XF_PIO4_LO_F64 3.061616997868383e-17
#define XF_PIO2_F64 1.5707963267948966
#define XF_PIO2_LO_F64 6.123233995736766e-17
#define XF_PI_F64 3.141592653589793
#define XF_PI_LO_F64 1.2246467991473532e-16

/* atan(num/den) for 0 <= num <= den: Cephes atan's P/Q, relative error 2.2e-16. */
static inline double xf_atan_ratio_f64(double num, double den) {
    bool mid = num > 0.66 * den;
    double t = (mid ? num - den : num) / (mid ? num + den : den);
    double z = t * t;
    double p = xf_fma_f64(-8.750608600031904122785e-01, z, -1.615753718733365076637e01);
    p = xf_fma_f64(p, z, -7.500855792314704667340e01);
    p = xf_fma_f64(p, z, -1.228866684490136173410e02);
    p = xf_fma_f64(p, z, -6.485021904942025371773e01);
    double q = z + 2.485846490142306297962e01;
    q = xf_fma_f64(q, z, 1.650270098316988542046e02);
    q = xf_fma_f64(q, z, 4.328810604912902668951e02);
    q = xf_fma_f64(q, z, 4.853903996359136964868e02);
    q = xf_fma_f64(q, z, 1.945506571482613964425e02);
    double y = xf_fma_f64(t, (z * p) / q, t);
    return mid ? XF_PIO4_F64 + (y + XF_PIO4_LO_F64) : y;
}

static inline double atan_f64(double x) {
    double a = fabs(x);
    bool swap = a > 1.0;
    double y = xf_atan_ratio_f64(swap ? 1.0 : a, swap ? a : 1.0);
    y = swap ? XF_PIO2_F64 + (XF_PIO2_LO_F64 - y) : y;
    return copysign(y, x);
}

static inline double atan2_f64(double y, double x) {
    double ax = fabs(x);
    double ay = fabs(y);
    bool swap = ay > ax;
    bool big = (ax > 1e307) | (ay > 1e307);
    bool small = (ax < 0x1p-500) & (ay < 0x1p-500);
    double scale = big ? 0.25 : (small ? 0x1p500 : 1.0);
    ax = ax * scale;
    ay = ay * scale;
    double v = xf_atan_ratio_f64(swap ? ax : ay, swap ? ay : ax);
    v = ax == ay ? (ax == 0.0 ? 0.0 : XF_PIO4_F64) : v;
    v = swap ? XF_PIO2_F64 + (XF_PIO2_LO_F64 - v) : v;
    v = xf_signbit64(x) ? XF_PI_F64 + (XF_PI_LO_F64 - v) : v;
    return copysign(v, y);
}

/* musl cbrt, branch-free: 5-bit guess, a polynomial to 23 bits, one rounded Newton step. */
static inline double cbrt_f64(double x) {
    double a = fabs(x);
    bool subnormal = a < 2.2250738585072014e-308;
    int64_t hx = xf_bits64(subnormal ? a * 18014398509481984.0 : a) >> 32; /* 2**54 */
    double t = xf_float64((uint64_t)(xf_div3((uint32_t)hx) + (subnormal ? 696219795u : 715094163u))
                          << 32);
    double r = (t * t) * (t / a);
    t = t * ((1.87595182427177009643 + r * (-1.88497979543377169875 + r * 1.621429720105354466140))
             + ((r * r) * r) * (-0.758397934778766047437 + r * 0.145996192886612446982));
    t = xf_float64(((uint64_t)xf_bits64(t) + 0x80000000u) & 0xFFFFFFFFC0000000u); /* t*t exact */
    double s = t * t;
    r = a / s;
    r = (r - t) / (t + t + r);
    double y = t + t * r;
    bool ok = (a > 0.0) & (a < (double)INFINITY);
    return ok ? copysign(y, x) : x;
}

static inline double rsqrt_f64(double x) { return 1.0 / sqrt(x); }

/* ============================================================================ f32 math */
#define XF_MAGIC_F32 12582912.0f /* 1.5 * 2**23: x + MAGIC rounds x to an integer, |x| < 2**22 */
#define XF_LOG2E_F32 1.4426950408889634f
#define XF_LN2_HI_F32 0.693145751953125f /* 15 significant bits: n * LN2_HI is exact */
#define XF_LN2_LO_F32 1.428606765330187e-06f

/* e**r for |r| <= 0.364: 1 + r + r**2 * P(r), minimax, relative error 2**-27.8. */
static inline float xf_exp_poly_f32(float r) {
    float p = xf_fma_f32(0.0013807121431455016f, r, 0.008372330106794834f);
    p = xf_fma_f32(p, r, 0.04166875779628754f);
    p = xf_fma_f32(p, r, 0.16666489839553833f);
    p = xf_fma_f32(p, r, 0.49999991059303284f);
    return 1.0f + xf_fma_f32(r * r, p, r);
}

/* p * 2**k for k in [-252, 254], rounded once: two factors in the normal range. */
static inline float xf_scale_f32(float p, int32_t k) {
    int32_t k1 = k >> 1;
    return p * xf_pow2_f32(k1) * xf_pow2_f32(k - k1);
}

/* e**x for x <= 90 or NaN: exp_f32 without its upper clamp. */
static inline float xf_exp_upto90_f32(float x) {
    x = x < -110.0f ? -110.0f : x; /* the ternaries keep NaN */
    float t = xf_fma_f32(x, XF_LOG2E_F32, XF_MAGIC_F32);
    float n = t - XF_MAGIC_F32;
    float r = xf_fma_f32(n, -XF_LN2_HI_F32, x);
    r = xf_fma_f32(n, -XF_LN2_LO_F32, r);
    return xf_scale_f32(xf_exp_poly_f32(r), xf_bits32(t) - xf_bits32(XF_MAGIC_F32));
}

static inline float exp_f32(float x) { return xf_exp_upto90_f32(x > 90.0f ? 90.0f : x); }

/* p * 2**k for k in [-188, 63], rounded once: the first factor is exact (a normal number). */
static inline float xf_scale_down_f32(float p, int32_t k) { return p * xf_pow2_f32(k + 63) * 0x1p-63f; }

/* e**x for x <= 0 or NaN, bit for bit as exp_f32 (k <= 0: one exponent offset suffices). */
static inline float exp_nonpositive_f32(float x) {
    x = x < -110.0f ? -110.0f : x;
    float t = xf_fma_f32(x, XF_LOG2E_F32, XF_MAGIC_F32);
    float n = t - XF_MAGIC_F32;
    float r = xf_fma_f32(n, -XF_LN2_HI_F32, x);
    r = xf_fma_f32(n, -XF_LN2_LO_F32, r);
    return xf_scale_down_f32(xf_exp_poly_f32(r), xf_bits32(t) - xf_bits32(XF_MAGIC_F32));
}

static inline float exp2_f32(float x) {
    x = x > 130.0f ? 130.0f : x;
    x = x < -160.0f ? -160.0f : x;
    float t = x + XF_MAGIC_F32;
    float r = x - (t - XF_MAGIC_F32);
    /* 1 + r * P(r), |r| <= 0.5, minimax, relative error 2**-28.9 */
    float p = xf_fma_f32(0.00015353361959569156f, r, 0.0013398875016719103f);
    p = xf_fma_f32(p, r, 0.00961843691766262f);
    p = xf_fma_f32(p, r, 0.055503323674201965f);
    p = xf_fma_f32(p, r, 0.24022647738456726f);
    p = xf_fma_f32(p, r, 0.6931471824645996f);
    return xf_scale_f32(xf_fma_f32(p, r, 1.0f), xf_bits32(t) - xf_bits32(XF_MAGIC_F32));
}

/* expm1(r) for the reduced argument of x in [-20, 90] or NaN, with k: x = k ln2 + r. */
static inline float xf_expm1_reduce_f32(float x, int32_t *k) {
    float t = xf_fma_f32(x, XF_LOG2E_F32, XF_MAGIC_F32);
    float n = t - XF_MAGIC_F32;
    float r = xf_fma_f32(n, -XF_LN2_HI_F32, x);
    r = xf_fma_f32(n, -XF_LN2_LO_F32, r);
    /* expm1(r) = r + r**2/2 + r**3 * P(r), minimax, relative error 2**-25.7 */
    float p = xf_fma_f32(0.0013899077894166112f, r, 0.008369358256459236f);
    p = xf_fma_f32(p, r, 0.041666895151138306f);
    p = xf_fma_f32(p, r, 0.1666652411222458f);
    *k = xf_bits32(t) - xf_bits32(XF_MAGIC_F32);
    return xf_fma_f32(r * r, xf_fma_f32(p, r, 0.5f), r);
}

static inline float expm1_f32(float x) {
    float xc = x > 90.0f ? 90.0f : x;
    xc = xc < -20.0f ? -20.0f : xc;
    int32_t k;
    float e = xf_expm1_reduce_f32(xc, &k);
    /* expm1(x) = 2**k * e + (2**k - 1), with 2**k split so that it cannot overflow early. */
    int32_t kb = k > 64 ? 64 : 0;
    float s = xf_pow2_f32(k - kb);
    float y = xf_fma_f32(s, e, s - xf_pow2_f32(-kb)) * xf_pow2_f32(kb);
    return fabsf(x) < 0x1p-25f ? x : y; /* keeps -0.0 and subnormals */
}

/* expm1_f32(x) for x in [-20, 20] or NaN, bit for bit: |k| <= 29, so neither the clamps nor
 * the split of 2**k are needed (tanh's argument; the vectorised loop is much shorter). */
static inline float xf_expm1_mid_f32(float x) {
    int32_t k;
    float e = xf_expm1_reduce_f32(x, &k);
    float s = xf_pow2_f32(k);
    float y = xf_fma_f32(s, e, s - 1.0f);
    return fabsf(x) < 0x1p-25f ? x : y;
}

/* log(1 + f) + k*ln2 + c for f in [sqrt(2)/2 - 1, sqrt(2) - 1], as musl logf/log1pf.
 * Lg1..Lg4 from FreeBSD/musl logf: |(log(1+s) - log(1-s))/s - Lg(s)| < 2**-34.24. */
static inline float xf_log_poly_f32(float f, int32_t k, float c) {
    float s = f / (2.0f + f);
    float z = s * s;
    float w = z * z;
    float t1 = w * (0.40000972152f + w * 0.24279078841f);
    float t2 = z * (0.66666662693f + w * 0.28498786688f);
    float hfsq = 0.5f * f * f;
    float dk = (float)k;
    float lo = dk * 9.0580006145e-06f + c;
    return s * (hfsq + t2 + t1) + lo - hfsq + f + dk * 6.9313812256e-01f;
}

/* (bits + 0x3F800000 - 0x3F3504F3) as int32: wraps only for a NaN, whose result is replaced. */
static inline int32_t xf_log_bits_f32(float x) {
    return (int32_t)((uint32_t)xf_bits32(x) + (0x3F800000u - 0x3F3504F3u));
}

static inline float log_f32(float x) {
    bool subnormal = x < 1.1754943508222875e-38f;
    float xs = subnormal ? x * 33554432.0f : x; /* 2**25 */
    int32_t ix = xf_log_bits_f32(xs);
    int32_t k = (ix >> 23) - 0x7F - (subnormal ? 25 : 0);
    float f = xf_float32(((uint32_t)ix & 0x007FFFFFu) + 0x3F3504F3u) - 1.0f;
    float y = xf_log_poly_f32(f, k, 0.0f);
    y = x < INFINITY ? y : x; /* +inf, NaN */
    y = x == 0.0f ? -INFINITY : y;
    return x < 0.0f ? NAN : y;
}

static inline float log1p_f32(float x) {
    float u = 1.0f + x;
    int32_t iu = xf_log_bits_f32(u);
    int32_t k = (iu >> 23) - 0x7F;
    /* c: the rounding error of u, as a correction to log(u). */
    float c = (k >= 2 ? 1.0f - (u - x) : x - (u - 1.0f)) / u;
    c = k >= 25 ? 0.0f : c;
    float f = xf_float32(((uint32_t)iu & 0x007FFFFFu) + 0x3F3504F3u) - 1.0f;
    bool near = k == 0; /* 1 + x in [sqrt(2)/2, sqrt(2)): use x itself, exact */
    float y = xf_log_poly_f32(near ? x : f, k, near ? 0.0f : c);
    y = fabsf(x) < 0x1p-24f ? x : y; /* keeps -0.0 and subnormals */
    y = x < INFINITY ? y : x;
    y = x == -1.0f ? -INFINITY : y;
    return x < -1.0f ? NAN : y;
}

static inline float tanh_f32(float x) {
    float a = fabsf(x);
    a = a > 10.0f ? 10.0f : a; /* tanh(10) rounds to 1 */
    float t = xf_expm1_mid_f32(a + a);
    return copysignf(t / (t + 2.0f), x);
}

static inline float logistic_f32(float x) {
    float e = exp_nonpositive_f32(-fabsf(x));
    return (x >= 0.0f ? 1.0f : e) / (1.0f + e);
}

/* erf(a) for 0 <= a <= 0.875: a + a * P(a**2), minimax, relative error 2**-26.8. */
static inline float xf_erf_small_f32(float a) {
    float z = a * a;
    float p = xf_fma_f32(-0.0006203291122801602f, z, 0.005032189190387726f);
    p = xf_fma_f32(p, z, -0.026791468262672424f);
    p = xf_fma_f32(p, z, 0.11282455176115036f);
    p = xf_fma_f32(p, z, -0.3761255145072937f);
    p = xf_fma_f32(p, z, 0.12837915122509003f);
    return xf_fma_f32(a, p, a);
}

/* S(t) = (a + 2) * erfc(a) * e**a**2, t = (a - 2)/(a + 2), a in [0.5, 10.5]: minimax in t,
 * relative error 2**-28.4 (S is flat, so the rounding of t barely moves it). */
#define XF_ERFC_S0 1.0215827226638794
#define XF_ERFC_S1 (-0.6871606707572937)
#define XF_ERFC_S2 0.27947190403938293
#define XF_ERFC_S3 (-0.03644370287656784)
#define XF_ERFC_S4 (-0.021506227552890778)
#define XF_ERFC_S5 0.006494564935564995
#define XF_ERFC_S6 0.0030552020762115717
#define XF_ERFC_S7 (-0.000898313766811043)
#define XF_ERFC_S8 (-0.0005458142259158194)
#define XF_ERFC_S9 0.00012497164425440133

/* erfc(a) for 0.875 <= a <= 4.5 to 3 ulp: only erf's 1 - erfc(a) uses it. The coefficients
 * are the double ones rounded to float (a cast of a constant: folded, no double arithmetic). */
static inline float xf_erfc_large_f32(float a) {
    float d = 1.0f / (a + 2.0f);
    float t = (a - 2.0f) * d;
    float q = xf_fma_f32((float)XF_ERFC_S9, t, (float)XF_ERFC_S8);
    q = xf_fma_f32(q, t, (float)XF_ERFC_S7);
    q = xf_fma_f32(q, t, (float)XF_ERFC_S6);
    q = xf_fma_f32(q, t, (float)XF_ERFC_S5);
    q = xf_fma_f32(q, t, (float)XF_ERFC_S4);
    q = xf_fma_f32(q, t, (float)XF_ERFC_S3);
    q = xf_fma_f32(q, t, (float)XF_ERFC_S2);
    q = xf_fma_f32(q, t, (float)XF_ERFC_S1);
    q = xf_fma_f32(q, t, (float)XF_ERFC_S0);
    return exp_f32(-(a * a)) * (q * d);
}

/* erfc(a) for f32 a in [0.47, 10.5], in f64 (a*a is exact): erfc_f32's relative error. */
static inline double xf_erfc_large_f64(double a) {
    double d = 1.0 / (a + 2.0);
    double t = (a - 2.0) * d;
    double q = xf_fma_f64(XF_ERFC_S9, t, XF_ERFC_S8);
    q = xf_fma_f64(q, t, XF_ERFC_S7);
    q = xf_fma_f64(q, t, XF_ERFC_S6);
    q = xf_fma_f64(q, t, XF_ERFC_S5);
    q = xf_fma_f64(q, t, XF_ERFC_S4);
    q = xf_fma_f64(q, t, XF_ERFC_S3);
    q = xf_fma_f64(q, t, XF_ERFC_S2);
    q = xf_fma_f64(q, t, XF_ERFC_S1);
    q = xf_fma_f64(q, t, XF_ERFC_S0);
    return exp_f64(-(a * a)) * (q * d);
}

static inline float erf_f32(float x) {
    float a = fabsf(x);
    float large = 1.0f - xf_erfc_large_f32(a > 4.5f ? 4.5f : a); /* erf(3.92) rounds to 1 */
    return copysignf(a < 0.875f ? xf_erf_small_f32(a) : large, x);
}

/* erfc needs relative accuracy down to 1e-45: the tail runs in f64 (the erf part in f32). */
static inline float erfc_f32(float x) {
    float a = fabsf(x);
    float e = (float)xf_erfc_large_f64((double)(a > 10.5f ? 10.5f : a));
    float s = xf_erf_small_f32(a);
    float positive = a >= 0.47f ? e : 1.0f - s; /* 1 - s only while erfc(a) > 0.5 */
    float negative = 1.0f + (a < 0.875f ? s : 1.0f - e); /* 1 + erf(a) */
    return x < 0.0f ? negative : positive;
}

#define XF_TWO_OVER_PI 0.6366197723675814
#define XF_PIO2_1 1.5707963109016418
#define XF_PIO2_2 1.5893254712295857e-08
#define XF_PIO2_3 6.123233995736766e-17

/* x = q*pi/2 + r with |r| <= pi/4, for f32 x, in f64: returns r, q's low two bits in *q.
 * pi/2 in three parts (25 + 25 + 53 bits): n*P1 and n*P2 are exact for |n| < 2**28. */
static inline double xf_reduce_pio2_f64(float x, int32_t *q) {
    double xd = (double)x;
    double t = xf_fma_f64(xd, XF_TWO_OVER_PI, XF_MAGIC_F64);
    double n = t - XF_MAGIC_F64;
    double r = xf_fma_f64(n, -XF_PIO2_1, xd);
    r = xf_fma_f64(n, -XF_PIO2_2, r);
    r = xf_fma_f64(n, -XF_PIO2_3, r);
    r = r > 0.7854 ? 0.7854 : r; /* only past |x| = 2**28 (the callers use libm there) */
    r = r < -0.7854 ? -0.7854 : r;
    *q = (int32_t)(xf_bits64(t) & 3);
    return r;
}

/* The f64 reduction is exact below 2**28; past it (and for NaN and inf) the trig functions
 * call libm, whose reduction is exact for any argument. A branch, so those loops run scalar. */
#define XF_HUGE_TRIG_F32 268435456.0f

static inline float xf_reduce_pio2_f32(float x, int32_t *q) {
    return (float)xf_reduce_pio2_f64(x, q);
}

/* sin(r), |r| <= pi/4: r + r**3 * S(r**2), relative error 2**-28. */
static inline float xf_sin_poly_f32(float r) {
    float z = r * r;
    float p = xf_fma_f32(-0.0001951463200384751f, z, 0.008332155644893646f);
    p = xf_fma_f32(p, z, -0.16666655242443085f);
    return xf_fma_f32(r * z, p, r);
}

/* cos(r), |r| <= pi/4: 1 - r**2/2 + r**4 * C(r**2), relative error 2**-33. */
static inline float xf_cos_poly_f32(float r) {
    float z = r * r;
    float p = xf_fma_f32(2.443241282890085e-05f, z, -0.0013887309469282627f);
    p = xf_fma_f32(p, z, 0.04166664555668831f);
    return xf_fma_f32(z * z, p, 1.0f - 0.5f * z);
}

static inline float sin_f32(float x) {
    if (!(fabsf(x) < XF_HUGE_TRIG_F32))
        return (float)sin((double)x); /* libm reduces exactly; NaN and inf give NaN */
    int32_t q;
    float r = xf_reduce_pio2_f32(x, &q);
    float y = (q & 1) ? xf_cos_poly_f32(r) : xf_sin_poly_f32(r);
    y = (q & 2) ? -y : y;
    return x == 0.0f ? x : y; /* sin(-0.0) = -0.0 */
}

static inline float cos_f32(float x) {
    if (!(fabsf(x) < XF_HUGE_TRIG_F32))
        return (float)cos((double)x); /* libm reduces exactly; NaN and inf give NaN */
    int32_t q;
    float r = xf_reduce_pio2_f32(x, &q);
    float y = (q & 1) ? xf_sin_poly_f32(r) : xf_cos_poly_f32(r);
    return ((q + 1) & 2) ? -y : y;
}

/* sin/cos with f32 coefficients but in f64 (from the f64 reduced argument): a quotient of two
 * f32 polynomials would reach 3 ulp. The coefficients are the f64 values of the Python's. */
static inline float tan_f32(float x) {
    if (!(fabsf(x) < XF_HUGE_TRIG_F32))
        return (float)tan((double)x); /* libm reduces exactly; NaN and inf give NaN */
    int32_t q;
    double r = xf_reduce_pio2_f64(x, &q);
    double z = r * r;
    double s = xf_fma_f64(-0.0001951463200384751, z, 0.008332155644893646);
    s = xf_fma_f64(r * z, xf_fma_f64(s, z, -0.16666655242443085), r);
    double c = xf_fma_f64(2.443241282890085e-05, z, -0.0013887309469282627);
    c = xf_fma_f64(z * z, xf_fma_f64(c, z, 0.04166664555668831), 1.0 - 0.5 * z);
    float y = (float)((q & 1) ? -c / s : s / c);
    return x == 0.0f ? x : y;
}

#define XF_PIO4_HI_F32 0.7853981852531433f
#define XF_PIO4_LO_F32 (-2.1855694143368964e-08f)
#define XF_PIO2_HI_F32 1.5707963705062866f
#define XF_PIO2_LO_F32 (-4.371138828673793e-08f)
#define XF_PI_HI_F32 3.1415927410125732f
#define XF_PI_LO_F32 (-8.742277657347586e-08f)

/* atan(num/den) for 0 <= num <= den, den > 0 (NaN where num/den is NaN). */
static inline float xf_atan_ratio_f32(float num, float den) {
    bool mid = num > 0.41421356237309503f * den; /* past tan(pi/8): pi/4 + atan(...) */
    float t = (mid ? num - den : num) / (mid ? num + den : den);
    float z = t * t;
    float p = xf_fma_f32(-0.06073610857129097f, z, 0.10592078417539597f);
    p = xf_fma_f32(p, z, -0.14243310689926147f);
    p = xf_fma_f32(p, z, 0.199984610080719f);
    p = xf_fma_f32(p, z, -0.33333316445350647f);
    float y = xf_fma_f32(t * z, p, t);
    return mid ? XF_PIO4_HI_F32 + (y + XF_PIO4_LO_F32) : y;
}

static inline float atan_f32(float x) {
    float a = fabsf(x);
    bool swap = a > 1.0f;
    float y = xf_atan_ratio_f32(swap ? 1.0f : a, swap ? a : 1.0f);
    y = swap ? XF_PIO2_HI_F32 + (XF_PIO2_LO_F32 - y) : y;
    return copysignf(y, x);
}

static inline float atan2_f32(float y, float x) {
    float ax = fabsf(x);
    float ay = fabsf(y);
    bool swap = ay > ax;
    /* Exact power-of-two scaling keeps num + den finite and tan(pi/8) * den normal. */
    bool big = (ax > 1e37f) | (ay > 1e37f);
    bool small = (ax < 0x1p-60f) & (ay < 0x1p-60f);
    float scale = big ? 0.25f : (small ? 0x1p60f : 1.0f);
    ax = ax * scale;
    ay = ay * scale;
    float v = xf_atan_ratio_f32(swap ? ax : ay, swap ? ay : ax);
    v = ax == ay ? (ax == 0.0f ? 0.0f : XF_PIO4_HI_F32) : v; /* 0/0, inf/inf */
    v = swap ? XF_PIO2_HI_F32 + (XF_PIO2_LO_F32 - v) : v;
    v = xf_signbit32(x) ? XF_PI_HI_F32 + (XF_PI_LO_F32 - v) : v;
    return copysignf(v, y);
}

/* musl cbrtf: a 5-bit guess from the exponent bits, then two Halley steps in f64. */
static inline float cbrt_f32(float x) {
    float a = fabsf(x);
    bool subnormal = a < 1.1754943508222875e-38f;
    uint32_t bits = (uint32_t)xf_bits32(subnormal ? a * 16777216.0f : a); /* 2**24 */
    double t = (double)xf_float32(xf_div3(bits) + (subnormal ? 642849266u : 709958130u));
    double ad = (double)a;
    double r = t * t * t; /* two Halley steps in f64: 16 bits, then 47 */
    t = t * ((ad + ad + r) / (ad + r + r));
    r = t * t * t;
    t = t * ((ad + ad + r) / (ad + r + r));
    float y = (float)t;
    bool ok = (a > 0.0f) & (a < INFINITY);
    return ok ? copysignf(y, x) : x;
}

/* x**y with C99/numpy special cases; exp2(y * log2|x|) in f64, so nearly exact. */
static inline float pow_f32(float x, float y) {
    float ax = fabsf(x);
    float ay = fabsf(y);
    float m = (float)exp2_f64((double)y * xf_log2_f64((double)ax));
    bool is_int = (ay >= 8388608.0f) | ((ay + 8388608.0f) - 8388608.0f == ay);
    float half = 0.5f * ay;
    bool is_odd = is_int & (ay < 16777216.0f) & ((half + 8388608.0f) - 8388608.0f != half);
    m = ((ax == 1.0f) & ((x == 1.0f) | (y == y))) ? 1.0f : m; /* 1**y, (-1)**+-inf */
    m = (xf_signbit32(x) & is_odd) ? -m : m;
    bool negative_finite = (x < 0.0f) & (x > -INFINITY);
    m = (negative_finite & (ay < INFINITY) & !is_int) ? NAN : m; /* (-8)**(1/3) */
    return y == 0.0f ? 1.0f : m;
}

/* 1/sqrt(x), two correct roundings (x86 has no exact rsqrt; vsqrtps + vdivps vectorise). */
static inline float rsqrt_f32(float x) { return 1.0f / sqrtf(x); }

/* ============================================================================ scalar helpers */
static inline uint32_t scalar_f32_bits(float x) { /* the bits of a float32 as a uint32 */
    uint32_t i;
    memcpy(&i, &x, sizeof i);
    return i;
}

static inline float scalar_bits_f32(uint32_t i) { return xf_float32(i); }

static inline uint64_t xf_f64_bits(double x) {
    uint64_t i;
    memcpy(&i, &x, sizeof i);
    return i;
}

/* lax.bitcast_convert_type: the bits of x read as another type of the same width. */
#define XF_BITCAST(to, x) ({ __typeof__(x) xf_from_ = (x); to xf_to_; memcpy(&xf_to_, &xf_from_, sizeof xf_to_); xf_to_; })
#define scalar_bitcast_s8(x) XF_BITCAST(int8_t, x)
#define scalar_bitcast_u8(x) XF_BITCAST(uint8_t, x)
#define scalar_bitcast_s16(x) XF_BITCAST(int16_t, x)
#define scalar_bitcast_u16(x) XF_BITCAST(uint16_t, x)
#define scalar_bitcast_s32(x) XF_BITCAST(int32_t, x)
#define scalar_bitcast_u32(x) XF_BITCAST(uint32_t, x)
#define scalar_bitcast_s64(x) XF_BITCAST(int64_t, x)
#define scalar_bitcast_u64(x) XF_BITCAST(uint64_t, x)
#define scalar_bitcast_f32(x) XF_BITCAST(float, x)
#define scalar_bitcast_f64(x) XF_BITCAST(double, x)

/* f16 and bf16 values are held in float inside kernels; these give and take their bits. */
static inline uint16_t scalar_bf16_bits(float x) { return (uint16_t)(scalar_f32_bits(x) >> 16); }
static inline float scalar_bits_bf16(uint16_t b) { return xf_float32((uint32_t)b << 16); }
static inline uint16_t scalar_f16_bits(float x) {
    uint32_t bits = scalar_f32_bits(x);
    uint16_t sign = (uint16_t)((bits >> 16) & 0x8000u);
    float ax = fabsf(x);
    if (x != x) return sign | 0x7C00u | (uint16_t)((bits >> 13) & 0x3FFu); /* the payload widening kept */
    if (ax == INFINITY) return sign | 0x7C00u;
    if (ax < 6.103515625e-05f) return sign | (uint16_t)(ax * 16777216.0f); /* a multiple of 2**-24 */
    return sign | (uint16_t)(((((bits >> 23) & 0xFFu) - 112u) << 10) | ((bits >> 13) & 0x3FFu));
}
static inline float scalar_bits_f16(uint16_t b) {
    uint32_t sign = ((uint32_t)b & 0x8000u) << 16, exponent = ((uint32_t)b >> 10) & 0x1Fu, mantissa = b & 0x3FFu;
    if (exponent == 0) {
        float value = (float)mantissa * 5.9604644775390625e-08f;
        return sign ? -value : value;
    }
    if (exponent == 31) return xf_float32(sign | 0x7F800000u | (mantissa << 13));
    return xf_float32(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

/* The bits of a float32 or float64 as an unsigned integer of the same width. */
#define scalar_float_bits(x) _Generic((x), float: scalar_f32_bits, double: xf_f64_bits)(x)

/* max with NaN propagation; of two equal values (+0.0 and -0.0) the one with no sign bit. */
static inline float xf_fmax_f32(float a, float b) {
    float r = ((a > b) | (a != a)) ? a : b;
    return a != b ? r : (scalar_f32_bits(a) < scalar_f32_bits(b) ? a : b);
}

static inline double xf_fmax_f64(double a, double b) {
    double r = ((a > b) | (a != a)) ? a : b;
    return a != b ? r : (xf_f64_bits(a) < xf_f64_bits(b) ? a : b);
}

/* min with NaN propagation; -0.0 is below +0.0. */
static inline float xf_fmin_f32(float a, float b) {
    float r = ((a < b) | (a != a)) ? a : b;
    return a != b ? r : (scalar_f32_bits(a) > scalar_f32_bits(b) ? a : b);
}

static inline double xf_fmin_f64(double a, double b) {
    double r = ((a < b) | (a != a)) ? a : b;
    return a != b ? r : (xf_f64_bits(a) > xf_f64_bits(b) ? a : b);
}

#define scalar_fmax(a, b) _Generic((a), float: xf_fmax_f32, double: xf_fmax_f64)((a), (b))
#define scalar_fmin(a, b) _Generic((a), float: xf_fmin_f32, double: xf_fmin_f64)((a), (b))

/* numba's scalar.opaque hides a loop's count from LLVM, which unrolls short loops whole and
 * leaves the copies scalar. gcc vectorises them with the count known, and hiding it was slower
 * (softmax over 65536x10 on one thread: 2.17 ms hidden, 1.63 ms known; rows of 16 and 32 and
 * tanh(x + b) over rows of 10 within 10%), so here it is the count itself. */
#define scalar_opaque(n) ((int64_t)(n))

/* An index clamped into [lo, hi] (scalar.clamp): int64, as numba computes indices. */
static inline int64_t scalar_clamp(int64_t i, int64_t lo, int64_t hi) {
    return i < lo ? lo : (i > hi ? hi : i);
}

#define XF_INT_MAX_MIN(suffix, type)                                                      \
    static inline type xf_imax_##suffix(type a, type b) { return a > b ? a : b; }         \
    static inline type xf_imin_##suffix(type a, type b) { return a < b ? a : b; }

XF_INT_MAX_MIN(bool, bool)
XF_INT_MAX_MIN(char, char)
XF_INT_MAX_MIN(schar, signed char)
XF_INT_MAX_MIN(uchar, unsigned char)
XF_INT_MAX_MIN(short, short)
XF_INT_MAX_MIN(ushort, unsigned short)
XF_INT_MAX_MIN(int, int)
XF_INT_MAX_MIN(uint, unsigned int)
XF_INT_MAX_MIN(long, long)
XF_INT_MAX_MIN(ulong, unsigned long)
XF_INT_MAX_MIN(llong, long long)
XF_INT_MAX_MIN(ullong, unsigned long long)
#undef XF_INT_MAX_MIN

/* Every integer type by its C name (int8_t..uint64_t are among them, whichever they are). */
#define XF_INT_GENERIC(op, a)                                                              \
    _Generic((a), bool: xf_##op##_bool, char: xf_##op##_char, signed char: xf_##op##_schar, \
             unsigned char: xf_##op##_uchar, short: xf_##op##_short,                       \
             unsigned short: xf_##op##_ushort, int: xf_##op##_int,                         \
             unsigned int: xf_##op##_uint, long: xf_##op##_long,                           \
             unsigned long: xf_##op##_ulong, long long: xf_##op##_llong,                   \
             unsigned long long: xf_##op##_ullong)

#define scalar_imax(a, b) XF_INT_GENERIC(imax, a)((a), (b))
#define scalar_imin(a, b) XF_INT_GENERIC(imin, a)((a), (b))

/* Round half away from zero. */
static inline float xf_round_away_f32(float x) {
    float t = truncf(x);
    bool away = fabsf(x - t) >= 0.5f;
    return away ? t + copysignf(1.0f, x) : t;
}

static inline double xf_round_away_f64(double x) {
    double t = trunc(x);
    bool away = fabs(x - t) >= 0.5;
    return away ? t + copysign(1.0, x) : t;
}

static inline bool xf_is_finite_f32(float x) { return (x - x) == 0.0f; }

static inline bool xf_is_finite_f64(double x) { return (x - x) == 0.0; }

#define scalar_round_away(x) _Generic((x), float: xf_round_away_f32, double: xf_round_away_f64)(x)
#define scalar_is_finite(x) _Generic((x), float: xf_is_finite_f32, double: xf_is_finite_f64)(x)

/* x rounded to the nearest bfloat16 (ties to even), kept in float32. */
static inline float scalar_round_bf16(float x) {
    uint32_t bits = scalar_f32_bits(x);
    uint32_t lsb = (bits >> 16) & 1u;
    uint32_t kept = (bits + 0x7FFFu + lsb) & 0xFFFF0000u;
    return x != x ? x : xf_float32(kept);
}

/* x rounded to the nearest float16 (ties to even, subnormals, overflow), kept in float32. */
static inline float scalar_round_f16(float x) {
    float ax = fabsf(x);
    uint32_t bits = scalar_f32_bits(x);
    uint32_t lsb = (bits >> 13) & 1u;
    float normal = xf_float32((bits + 0xFFFu + lsb) & 0xFFFFE000u);
    float tiny = rintf(x * 16777216.0f) / 16777216.0f;
    float r = ax < 6.103515625e-05f ? tiny : normal;
    r = fabsf(r) >= 65520.0f ? copysignf(INFINITY, x) : r;
    return ((x != x) | (ax == INFINITY)) ? x : r;
}

/* ============================================================================ row reductions */
/* Sums in any order (vector lanes): 32 f32 or 16 f64 partial sums, four AVX2 vectors, so that
 * four additions are in flight (one accumulator waits on each addition's latency: 1.6x slower
 * on a row in cache), then the sum of the partials. NaN and infinities propagate as in any
 * order of the sum. */
static inline __attribute__((always_inline)) float rows_sum_f32(const float *a, int64_t n) {
    float part[32] = {0};
    int64_t body = n - n % 32;
    for (int64_t i = 0; i < body; i += 32)
#pragma omp simd
        for (int j = 0; j < 32; j++)
            part[j] += a[i + j];
    for (int64_t i = body; i < n; i++)
        part[i - body] += a[i];
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int j = 0; j < 32; j++)
        s += part[j];
    return s;
}

static inline __attribute__((always_inline)) double rows_sum_f64(const double *a, int64_t n) {
    double part[16] = {0};
    int64_t body = n - n % 16;
    for (int64_t i = 0; i < body; i += 16)
#pragma omp simd
        for (int j = 0; j < 16; j++)
            part[j] += a[i + j];
    for (int64_t i = body; i < n; i++)
        part[i - body] += a[i];
    double s = 0.0;
#pragma omp simd reduction(+ : s)
    for (int j = 0; j < 16; j++)
        s += part[j];
    return s;
}

/* A float's bits as a signed integer, negative ones with the magnitude bits flipped: integer
 * order is then float order, and the map is its own inverse. NaNs land outside the keys of
 * [-inf, +inf], so one pass finds both extreme keys (two integer reductions, which vectorise)
 * and a NaN shows as a key beyond an infinity's. An empty row gives a NaN (the keys' start). */
#define XF_MAG32 INT32_C(0x7FFFFFFF)
#define XF_MAG64 INT64_C(0x7FFFFFFFFFFFFFFF)
#define XF_KEY_INF32 INT32_C(0x7F800000)
#define XF_KEY_NEG_INF32 INT32_C(-0x7F800001)
#define XF_KEY_INF64 INT64_C(0x7FF0000000000000)
#define XF_KEY_NEG_INF64 INT64_C(-0x7FF0000000000001)

static inline int32_t xf_keys32(const float *a, int64_t n, int32_t *lo_out) {
    int32_t hi = INT32_MIN, lo = INT32_MAX;
    for (int64_t i = 0; i < n; i++) {
        int32_t b = xf_bits32(a[i]);
        int32_t key = b ^ ((b >> 31) & XF_MAG32);
        hi = key > hi ? key : hi;
        lo = key < lo ? key : lo;
    }
    *lo_out = lo;
    return hi;
}

static inline int64_t xf_keys64(const double *a, int64_t n, int64_t *lo_out) {
    int64_t hi = INT64_MIN, lo = INT64_MAX;
    for (int64_t i = 0; i < n; i++) {
        int64_t b = xf_bits64(a[i]);
        int64_t key = b ^ ((b >> 63) & XF_MAG64);
        hi = key > hi ? key : hi;
        lo = key < lo ? key : lo;
    }
    *lo_out = lo;
    return hi;
}

static inline float rows_max_f32(const float *a, int64_t n) {
    int32_t lo, hi = xf_keys32(a, n, &lo);
    bool nan = (hi > XF_KEY_INF32) | (lo < XF_KEY_NEG_INF32);
    return nan ? NAN : xf_float32((uint32_t)(hi ^ ((hi >> 31) & XF_MAG32)));
}

static inline float rows_min_f32(const float *a, int64_t n) {
    int32_t lo, hi = xf_keys32(a, n, &lo);
    bool nan = (hi > XF_KEY_INF32) | (lo < XF_KEY_NEG_INF32);
    return nan ? NAN : xf_float32((uint32_t)(lo ^ ((lo >> 31) & XF_MAG32)));
}

static inline double rows_max_f64(const double *a, int64_t n) {
    int64_t lo, hi = xf_keys64(a, n, &lo);
    bool nan = (hi > XF_KEY_INF64) | (lo < XF_KEY_NEG_INF64);
    return nan ? (double)NAN : xf_float64((uint64_t)(hi ^ ((hi >> 63) & XF_MAG64)));
}

static inline double rows_min_f64(const double *a, int64_t n) {
    int64_t lo, hi = xf_keys64(a, n, &lo);
    bool nan = (hi > XF_KEY_INF64) | (lo < XF_KEY_NEG_INF64);
    return nan ? (double)NAN : xf_float64((uint64_t)(lo ^ ((lo >> 63) & XF_MAG64)));
}

/* The first index of a row's max (min), or of its first NaN (rows.py's argmax_f32 and others). */
#define XF_FIRST(T) \
    static inline int64_t xf_first_##T(const T *a, int64_t n, T value) { \
        if (value != value) { \
            for (int64_t i = 0; i < n; ++i) if (a[i] != a[i]) return i; \
        } \
        for (int64_t i = 0; i < n; ++i) if (a[i] == value) return i; \
        return 0; \
    }
XF_FIRST(float)
XF_FIRST(double)

static inline int64_t rows_argmax_f32(const float *a, int64_t n) { return xf_first_float(a, n, rows_max_f32(a, n)); }
static inline int64_t rows_argmin_f32(const float *a, int64_t n) { return xf_first_float(a, n, rows_min_f32(a, n)); }
static inline int64_t rows_argmax_f64(const double *a, int64_t n) { return xf_first_double(a, n, rows_max_f64(a, n)); }
static inline int64_t rows_argmin_f64(const double *a, int64_t n) { return xf_first_double(a, n, rows_min_f64(a, n)); }

#endif /* XFUSE_KERNELS_H */
