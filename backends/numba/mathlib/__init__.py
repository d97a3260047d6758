"""Branch-free scalar math for numba kernels: `<name>_f32` and `<name>_f64` for exp, exp2, expm1,
log, log1p, tanh, logistic, erf, erfc, sin, cos, tan, atan, atan2, cbrt, pow and rsqrt, and
`exp_nonpositive_f32`: exp_f32 bit for bit where x <= 0, with less integer work.

numba from PyPI has no SVML, so `np.exp` in a loop is a scalar libm call that stops LLVM from
vectorising the loop. These are polynomials, selects (ternaries LLVM turns into blends) and
int/float reinterpretation, all inlined, so a loop calling them vectorises, under either numba
error model (divisions are bare `fdiv`s). No fastmath: NaN, +-inf and -0.0 give jax.lax's
results, and subnormal results are kept (gradual underflow, never flushed). Instead of the
"contract" flag, the fused multiply-adds are explicit `llvm.fmuladd` calls (Horner steps,
Cody-Waite reductions with exact products), so no other expression is contracted.

f32 is computed in f32 except where that cannot reach the error cheaply, which runs in f64:
the trig argument reduction (and tan's quotient), erfc's tail, cbrt's Halley steps and pow's
log2/exp2. Max error in ulps against the correctly rounded value, measured with FMA over 1e6
random points per function and dtype plus the edge values (tests/backends/test_mathlib.py,
whose bounds these are; f64 against long double numpy; "libm" is a scalar libm call):

    fn        f32  f64            fn        f32  f64
    exp       1    1              sin       2    libm
    exp2      1    1              cos       2    libm
    expm1     2    2              tan       1    libm
    log       1    1              atan      2    1
    log1p     1    1              atan2     2    1
    tanh      2    3              cbrt      1    1
    logistic  2    2              pow       1    libm
    erf       1    libm           rsqrt     1    1
    erfc      1    libm

Limits: f32 sin/cos/tan reduce with pi/2 in three parts, in f64, exact for |x| < 2**28; past
that (and for NaN and inf) they branch to libm, whose reduction is exact for any argument, so a
loop calling them runs scalar (correct like XLA's, never the wrong period).
The f64 erf, erfc, sin, cos, tan and pow are libm calls: exact enough, but a loop calling them
does not vectorise. On a CPU without FMA, fmuladd rounds twice (errors may grow by an ulp) and
vector fmuladd may be split into calls. exp and exp2 scale by 2**k with `llvm.ldexp` (one
vscalefps/pd) where numba compiles for AVX-512 (`core.SCALEF`), else with two factors built
from integers: both round once, so the results are the same bit for bit. `core` holds the intrinsics, `f64` the float64 functions
(and the f64 pieces the f32 ones borrow), `f32` the float32 ones. Imports numba, numpy and
llvmlite only.
"""

from __future__ import annotations


from .f32 import (
    atan2_f32, atan_f32, cbrt_f32, cos_f32, erf_f32, erfc_f32, exp2_f32, exp_f32, exp_nonpositive_f32,
    expm1_f32, log1p_f32, log_f32, logistic_f32, pow_f32, rsqrt_f32, sin_f32, tan_f32, tanh_f32,
)
from .f64 import (
    atan2_f64, atan_f64, cbrt_f64, cos_f64, erf_f64, erfc_f64, exp2_f64, exp_f64, expm1_f64,
    log1p_f64, log_f64, logistic_f64, pow_f64, rsqrt_f64, sin_f64, tan_f64, tanh_f64,
)

__all__ = ["atan2_f32", "atan2_f64", "atan_f32", "atan_f64", "cbrt_f32", "cbrt_f64", "cos_f32", "cos_f64", "erf_f32", "erf_f64", "erfc_f32", "erfc_f64", "exp2_f32", "exp2_f64", "exp_f32", "exp_f64", "exp_nonpositive_f32", "expm1_f32", "expm1_f64", "log1p_f32", "log1p_f64", "log_f32", "log_f64", "logistic_f32", "logistic_f64", "pow_f32", "pow_f64", "rsqrt_f32", "rsqrt_f64", "sin_f32", "sin_f64", "tan_f32", "tan_f64", "tanh_f32", "tanh_f64"]
