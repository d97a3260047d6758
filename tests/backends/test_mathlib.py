"""xfuse.backends.numba.mathlib: error in ulps of every function and dtype over 1e6 random
points and the edge values (NaN, +-inf, +-0.0, subnormals, overflow and underflow thresholds,
the ends of each domain), jax.lax's exact results at special values, and a check that loops
calling the functions vectorise (LLVM vector types, no libm call).

f32 results are compared with numpy's float64 result rounded to float32; f64 results with
numpy's long double result rounded to float64 (plain float64 where long double is double).
Each function is compiled once per module, in one loop kernel per (function, dtype).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from functools import cache

import numba
import numpy as np
import pytest

from xfuse.backends.numba import mathlib

SEED = 20240611
SAMPLE = 1_000_000
F32, F64 = np.float32, np.float64
DTYPES = {"f32": F32, "f64": F64}
LONG = np.longdouble  # 80-bit on x86-64 Linux: the f64 references


# ------------------------------------------------------------------------------------ helpers
def _unary_kernel(fn):
    @numba.njit
    def kernel(x, out):
        for i in range(x.size):
            out[i] = fn(x[i])

    return kernel


def _binary_kernel(fn):
    @numba.njit
    def kernel(x, y, out):
        for i in range(x.size):
            out[i] = fn(x[i], y[i])

    return kernel


@cache
def kernel(name: str, suffix: str):
    """The compiled loop `out[i] = name_suffix(x[i], ...)`, compiled on first use."""
    fn = getattr(mathlib, f"{name}_{suffix}")
    k = _binary_kernel(fn) if SPECS[name].arity == 2 else _unary_kernel(fn)
    dtype = DTYPES[suffix]
    array = numba.types.Array(numba.from_dtype(dtype), 1, "C")
    k.compile((array,) * (SPECS[name].arity + 1))
    return k


def evaluate(name: str, suffix: str, *args: np.ndarray) -> np.ndarray:
    dtype = DTYPES[suffix]
    args = [np.ascontiguousarray(a, dtype=dtype) for a in args]
    out = np.empty_like(args[0])
    kernel(name, suffix)(*args, out)
    return out


def reference(name: str, suffix: str, *args: np.ndarray) -> np.ndarray:
    """numpy's value in a wider type, rounded to the dtype."""
    dtype = DTYPES[suffix]
    wide = F64 if dtype is F32 else LONG
    with np.errstate(all="ignore"):
        wide_args = (np.asarray(a, dtype=dtype).astype(wide) for a in args)
        return SPECS[name].reference(*wide_args).astype(dtype)


def ordered(a: np.ndarray) -> np.ndarray:
    """Floats as integers in the same order, adjacent floats one apart (-0.0 and +0.0 equal)."""
    ints = a.view(np.int32 if a.dtype == F32 else np.int64).astype(np.int64)
    magnitude = ints & (0x7FFFFFFF if a.dtype == F32 else 0x7FFFFFFFFFFFFFFF)
    return np.where(ints < 0, -magnitude, magnitude)


def ulp_errors(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """Distance in ulps; inf where one is NaN and the other not or a zero has the wrong sign."""
    errors = np.abs(ordered(got) - ordered(want)).astype(F64)
    got_nan, want_nan = np.isnan(got), np.isnan(want)
    errors[got_nan & want_nan] = 0
    errors[got_nan != want_nan] = np.inf
    zero = (want == 0) & (got == 0)
    errors[zero & (np.signbit(got) != np.signbit(want))] = np.inf
    return errors


def assert_within(name, suffix, args, got, want, max_ulps):
    errors = ulp_errors(got, want)
    worst = int(np.argmax(errors))
    at = ", ".join(repr(a[worst]) for a in args)
    assert errors[worst] <= max_ulps, (
        f"{name}_{suffix}({at}) = {got[worst]!r}, want {want[worst]!r}: {errors[worst]} ulps "
        f"(allowed {max_ulps}); {np.count_nonzero(errors > max_ulps)} of {errors.size} over")


# ------------------------------------------------------------------------------------ samplers
def uniform(lo, hi):
    return lambda rng, n, dtype: rng.uniform(lo, hi, n)


def log_uniform(lo, hi, signed=True):
    def draw(rng, n, dtype):
        v = np.exp(rng.uniform(math.log(lo), math.log(hi), n))
        return v * rng.choice([-1.0, 1.0], n) if signed else v

    return draw


def any_finite(positive=False):
    """Uniform over the bit patterns of finite floats: every binade equally often."""

    def draw(rng, n, dtype):
        if dtype is F32:
            bits = rng.integers(0, 0x7F800000, n, dtype=np.int64).astype(np.uint32)
            sign = np.uint32(0 if positive else 1) * rng.integers(0, 2, n, dtype=np.uint32)
            return (bits | (sign << np.uint32(31))).view(F32).astype(F64)
        bits = rng.integers(0, 0x7FF0000000000000, n, dtype=np.int64).astype(np.uint64)
        sign = np.uint64(0 if positive else 1) * rng.integers(0, 2, n, dtype=np.uint64)
        return (bits | (sign << np.uint64(63))).view(F64)

    return draw


def integers(lo, hi):
    return lambda rng, n, dtype: np.round(rng.uniform(lo, hi, n))


def by_dtype(f32, f64):
    return lambda rng, n, dtype: (f32 if dtype is F32 else f64)(rng, n, dtype)


def logistic_reference(x):
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1, e) / (1 + e)


def _vectorised_libm(fn):
    return lambda x: np.frompyfunc(fn, 1, 1)(x.astype(F64)).astype(F64)


@dataclass(frozen=True)
class Spec:
    """reference: numpy in the wider type; parts: samplers sharing the sample; max_ulps per
    dtype (the module docstring's table); libm_f64: the f64 version calls libm (no vectors)."""

    reference: object
    parts: tuple
    max_ulps: dict
    arity: int = 1
    libm_f64: bool = False
    f32_limit: float = np.inf  # |x| past which f32 results come from libm (a scalar branch)


def _near(values, dtype, steps=3):
    """Each value and its `steps` neighbours on each side, in dtype."""
    out = []
    for v in values:
        v = dtype(v)
        lo = hi = v
        out.append(v)
        for _ in range(steps):
            with np.errstate(over="ignore"):
                lo, hi = np.nextafter(lo, dtype(-np.inf)), np.nextafter(hi, dtype(np.inf))
            out += [lo, hi]
    return out


THRESHOLDS = {  # dtype -> name -> values around which results overflow, underflow or switch
    F32: {
        "exp": [88.72283, -87.33655, -103.27893, -103.97208, -104.0, 0.3466, -0.3466],
        "exp2": [128.0, -126.0, -149.0, -150.0, 0.5, -0.5],
        "expm1": [88.72283, 88.37626, -17.32868, 2.0**-25, -(2.0**-25), 0.3466],
        "log": [1.0, 0.70710677, 1.4142135, 1.1754944e-38],
        "log1p": [-1.0, -0.29289323, 0.41421357, 2.0**-24, -(2.0**-24)],
        "tanh": [9.010913, 10.0, 2.0**-12],
        "logistic": [-88.72283, -103.97208, 16.635532, 88.72283],
        "erf": [0.875, 3.9192059, 4.5, 2.0**-12],
        "erfc": [0.47, 0.875, 9.194, 10.0542, 10.5, -3.9],
        "sin": [np.pi / 4, np.pi / 2, np.pi, 1e5, 2.0**27, 3.0**17],
        "cos": [np.pi / 4, np.pi / 2, np.pi, 1e5, 2.0**27, 3.0**17],
        "tan": [np.pi / 4, np.pi / 2, np.pi, 1e5, 2.0**27, 3.0**17],
        "atan": [0.41421357, 1.0, 2.4142137, 1e37],
        "cbrt": [8.0, -8.0, 27.0, 1.1754944e-38],
        "rsqrt": [1.1754944e-38, 3.4e38, 4.0],
    },
    F64: {
        "exp": [709.782712893384, -708.3964185322641, -745.1332191019411, 0.3466],
        "exp2": [1024.0, -1022.0, -1074.0, -1075.0],
        "expm1": [709.782712893384, -37.42994775023705, 2.0**-54],
        "log": [1.0, 0.7071067811865476, 2.2250738585072014e-308],
        "log1p": [-1.0, -0.2928932188134524, 0.41421356237309515, 2.0**-54],
        "tanh": [19.06154746539849, 22.0, 2.0**-27],
        "logistic": [-709.782712893384, -745.1332191019411, 36.7368005696771],
        "atan": [0.66, 1.0, 2.414213562373095, 1e300],
        "cbrt": [8.0, -8.0, 27.0, 2.2250738585072014e-308],
        "rsqrt": [2.2250738585072014e-308, 1.7e308, 4.0],
    },
}

SPECS: dict[str, Spec] = {
    "exp": Spec(np.exp, (by_dtype(uniform(-104, 89), uniform(-746, 710)),
                         log_uniform(1e-30, 1.0)), {F32: 1, F64: 1}),
    "exp2": Spec(np.exp2, (by_dtype(uniform(-151, 129), uniform(-1076, 1025)),
                           log_uniform(1e-30, 1.0)), {F32: 1, F64: 1}),
    "expm1": Spec(np.expm1, (by_dtype(uniform(-20, 89), uniform(-40, 710)),
                             log_uniform(1e-30, 1.0)), {F32: 2, F64: 2}),
    "log": Spec(np.log, (any_finite(positive=True), uniform(0.5, 2.0)), {F32: 1, F64: 1}),
    "log1p": Spec(np.log1p, (uniform(-1.0, 0.0), any_finite(positive=True),
                             log_uniform(1e-30, 1.0)), {F32: 1, F64: 1}),
    "tanh": Spec(np.tanh, (uniform(-10, 10), log_uniform(1e-30, 1.0)), {F32: 2, F64: 3}),
    "logistic": Spec(logistic_reference, (by_dtype(uniform(-110, 20), uniform(-750, 40)),
                                          log_uniform(1e-30, 1.0)), {F32: 2, F64: 2}),
    "erf": Spec(_vectorised_libm(math.erf), (uniform(-5, 5), log_uniform(1e-30, 1.0)),
                {F32: 1, F64: 0}, libm_f64=True),
    "erfc": Spec(_vectorised_libm(math.erfc), (uniform(-5, 11), uniform(0.4, 1.2),
                                                log_uniform(1e-30, 1.0)),
                 {F32: 1, F64: 0}, libm_f64=True),
    "sin": Spec(np.sin, (uniform(-10, 10), uniform(-1e5, 1e5), log_uniform(1e-30, 2.0**28)),
                f32_limit=2.0**28, max_ulps={F32: 2, F64: 1}, libm_f64=True),
    "cos": Spec(np.cos, (uniform(-10, 10), uniform(-1e5, 1e5), log_uniform(1e-30, 2.0**28)),
                f32_limit=2.0**28, max_ulps={F32: 2, F64: 1}, libm_f64=True),
    "tan": Spec(np.tan, (uniform(-10, 10), uniform(-1e5, 1e5), log_uniform(1e-30, 2.0**28)),
                f32_limit=2.0**28, max_ulps={F32: 1, F64: 1}, libm_f64=True),
    "atan": Spec(np.arctan, (any_finite(), uniform(-5, 5)), {F32: 2, F64: 1}),
    "cbrt": Spec(np.cbrt, (any_finite(), uniform(-5, 5)), {F32: 1, F64: 1}),
    "rsqrt": Spec(lambda x: 1 / np.sqrt(x), (any_finite(positive=True),), {F32: 1, F64: 1}),
    "atan2": Spec(np.arctan2, ((any_finite(), any_finite()), (uniform(-10, 10), uniform(-10, 10))),
                  {F32: 2, F64: 1}, arity=2),
    "pow": Spec(np.power, ((log_uniform(1e-3, 1e3, signed=False), uniform(-12, 12)),
                           (uniform(0, 2), uniform(-200, 200)),
                           (log_uniform(1e-3, 1e3), integers(-12, 12)),
                           (by_dtype(log_uniform(0.5, 2.0, False), log_uniform(0.9, 1.1, False)),
                            by_dtype(uniform(-300, 300), uniform(-9000, 9000)))),
                {F32: 1, F64: 1}, arity=2, libm_f64=True),
}

CASES = [(name, suffix) for name in SPECS for suffix in DTYPES]


def sample(name: str, dtype) -> list[np.ndarray]:
    """SAMPLE random arguments for `name`, split evenly between the spec's parts."""
    rng = np.random.default_rng([SEED, list(SPECS).index(name), dtype is F64])
    parts = SPECS[name].parts
    n = SAMPLE // len(parts)
    columns = [[] for _ in range(SPECS[name].arity)]
    for part in parts:
        samplers = part if isinstance(part, tuple) else (part,)
        for column, draw in zip(columns, samplers):
            column.append(draw(rng, n, dtype))
    return [np.concatenate(c).astype(dtype) for c in columns]


def edge_values(name: str, dtype) -> np.ndarray:
    info = np.finfo(dtype)
    base = [0.0, 1.0, 2.0, 0.5, 3.0, info.tiny, info.smallest_subnormal, info.max, 1e-30,
            np.inf, np.nan]
    values = [dtype(v) for v in base] + [dtype(-v) for v in base]
    values += _near([info.tiny, info.smallest_subnormal * 3, info.max], dtype, 2)
    values += _near(THRESHOLDS[dtype].get(name, []), dtype)
    values += [-v for v in _near(THRESHOLDS[dtype].get(name, []), dtype)]
    return np.array(values, dtype=dtype)


# ------------------------------------------------------------------------------------ tests
@pytest.mark.parametrize("name, suffix", CASES)
def test_random_sample_within_documented_ulps(name, suffix):
    dtype = DTYPES[suffix]
    args = sample(name, dtype)
    got = evaluate(name, suffix, *args)
    assert_within(name, suffix, args, got, reference(name, suffix, *args),
                  SPECS[name].max_ulps[dtype])


@pytest.mark.parametrize("name, suffix", CASES)
def test_edge_values_within_documented_ulps(name, suffix):
    dtype = DTYPES[suffix]
    edges = edge_values(name, dtype)
    if dtype is F32:
        edges = edges[~(np.abs(edges) >= SPECS[name].f32_limit)]  # tested on their own
    if SPECS[name].arity == 2:  # every pair of edge values
        args = list(_grid(edges, dtype))
    else:
        args = [edges]
    got = evaluate(name, suffix, *args)
    assert_within(name, suffix, args, got, reference(name, suffix, *args),
                  SPECS[name].max_ulps[dtype])


NAN, INF, PI = np.nan, np.inf, np.pi
SPECIAL = {  # jax.lax's results, exactly (NaN matches NaN; zeros must have the right sign)
    "exp": [(NAN, NAN), (INF, INF), (-INF, 0.0), (0.0, 1.0), (-0.0, 1.0), (1000.0, INF),
            (-1000.0, 0.0)],
    "exp2": [(NAN, NAN), (INF, INF), (-INF, 0.0), (-0.0, 1.0), (10.0, 1024.0), (-2000.0, 0.0),
             (2000.0, INF)],
    "expm1": [(NAN, NAN), (INF, INF), (-INF, -1.0), (0.0, 0.0), (-0.0, -0.0), (1000.0, INF),
              (-1000.0, -1.0)],
    "log": [(NAN, NAN), (INF, INF), (-INF, NAN), (0.0, -INF), (-0.0, -INF), (-1.0, NAN),
            (1.0, 0.0), (-1e-40, NAN)],
    "log1p": [(NAN, NAN), (INF, INF), (-INF, NAN), (0.0, 0.0), (-0.0, -0.0), (-1.0, -INF),
              (-2.0, NAN), (1e-40, 1e-40), (-1e-40, -1e-40)],
    "tanh": [(NAN, NAN), (INF, 1.0), (-INF, -1.0), (0.0, 0.0), (-0.0, -0.0), (1e3, 1.0),
             (-1e3, -1.0), (-1e-40, -1e-40)],
    "logistic": [(NAN, NAN), (INF, 1.0), (-INF, 0.0), (0.0, 0.5), (-0.0, 0.5), (1e3, 1.0),
                 (-1e4, 0.0)],
    "erf": [(NAN, NAN), (INF, 1.0), (-INF, -1.0), (0.0, 0.0), (-0.0, -0.0), (30.0, 1.0),
            (-30.0, -1.0)],
    "erfc": [(NAN, NAN), (INF, 0.0), (-INF, 2.0), (0.0, 1.0), (-0.0, 1.0), (30.0, 0.0),
             (-30.0, 2.0)],
    "sin": [(NAN, NAN), (INF, NAN), (-INF, NAN), (0.0, 0.0), (-0.0, -0.0)],
    "cos": [(NAN, NAN), (INF, NAN), (-INF, NAN), (0.0, 1.0), (-0.0, 1.0)],
    "tan": [(NAN, NAN), (INF, NAN), (-INF, NAN), (0.0, 0.0), (-0.0, -0.0)],
    "atan": [(NAN, NAN), (INF, PI / 2), (-INF, -PI / 2), (0.0, 0.0), (-0.0, -0.0),
             (1.0, PI / 4)],
    "cbrt": [(NAN, NAN), (INF, INF), (-INF, -INF), (0.0, 0.0), (-0.0, -0.0), (-8.0, -2.0),
             (27.0, 3.0), (-1.0, -1.0)],
    "rsqrt": [(NAN, NAN), (INF, 0.0), (-INF, NAN), (0.0, INF), (-0.0, -INF), (-1.0, NAN),
              (4.0, 0.5)],
}
SPECIAL_CASES = [(name, suffix, x, want) for name, table in SPECIAL.items()
                 for x, want in table for suffix in DTYPES]


@pytest.mark.parametrize("name, suffix, x, want", SPECIAL_CASES)
def test_special_values_match_lax(name, suffix, x, want):
    dtype = DTYPES[suffix]
    got = evaluate(name, suffix, np.array([x], dtype))
    assert ulp_errors(got, np.array([want], dtype))[0] == 0, f"{name}_{suffix}({x}) = {got[0]!r}"


def _grid(values, dtype):
    v = np.array(values, dtype)
    return np.repeat(v, v.size), np.tile(v, v.size)


@pytest.mark.parametrize("suffix", DTYPES)
def test_atan2_special_cases_match_numpy(suffix):
    dtype = DTYPES[suffix]
    y, x = _grid([0.0, -0.0, 1.0, -1.0, 2.5, -2.5, INF, -INF, NAN, 1e-40, 3e38], dtype)
    got = evaluate("atan2", suffix, y, x)
    want = np.arctan2(y.astype(F64), x.astype(F64)).astype(dtype)
    exact = (want == 0) | np.isnan(want)  # the zero and NaN cases bit for bit
    assert_within("atan2", suffix, (y, x), got, want, 1)
    assert_within("atan2", suffix, (y[exact], x[exact]), got[exact], want[exact], 0)


@pytest.mark.parametrize("suffix", DTYPES)
def test_pow_special_cases_follow_c99(suffix):
    dtype = DTYPES[suffix]
    values = [0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 2.0, -2.0, 3.0, -3.0, -8.0, INF, -INF, NAN,
              1 / 3, 1e-40, 2.0**24 + 2, 2.0**24 - 1, -(2.0**23 + 1)]
    x, y = _grid(values, dtype)
    got = evaluate("pow", suffix, x, y)
    with np.errstate(all="ignore"):
        want = np.power(x.astype(F64), y.astype(F64)).astype(dtype)
    exact = np.isnan(want) | np.isinf(want) | (want == 0) | (np.abs(want) == 1)
    assert_within("pow", suffix, (x, y), got, want, 1)
    assert_within("pow", suffix, (x[exact], y[exact]), got[exact], want[exact], 0)
    spot = {(NAN, 0.0): 1.0, (NAN, -0.0): 1.0, (1.0, NAN): 1.0, (-1.0, INF): 1.0,
            (-8.0, 1 / 3): NAN, (-2.0, 3.0): -8.0, (-0.0, -3.0): -INF, (-0.0, 0.5): 0.0}
    for (a, b), c in spot.items():
        r = evaluate("pow", suffix, np.array([a], dtype), np.array([b], dtype))
        assert ulp_errors(r, np.array([c], dtype))[0] == 0, f"pow({a}, {b}) = {r[0]!r}"


@pytest.mark.parametrize("name", ["sin", "cos", "tan"])
def test_f32_trig_past_the_reduction_limit_is_exact(name):
    """Past 2**28 the f32 trig functions take libm's exact reduction: right to 1 ulp, even
    functions even, odd functions odd, up to the largest float."""
    rng = np.random.default_rng(SEED)
    big = np.exp(rng.uniform(math.log(2.0**28), math.log(3.4e38), 20_000)).astype(F32)
    x = np.concatenate([big, -big, np.array([2.0**28, 3.4028235e38, -3.4028235e38], F32)])
    assert_within(name, "f32", (x,), evaluate(name, "f32", x), reference(name, "f32", x), 1)


LIBM_CALL = re.compile(
    r"@(llvm\.(sin|cos|tan|exp|exp2|log|log2|log10|pow|atan|atan2|tanh)\.|"
    r"(sinf?|cosf?|tanf?|expf?|logf?|powf?|atan2?f?|tanhf?|erfc?f?|cbrtf?|expm1f?|log1pf?)\b)")


@pytest.mark.parametrize("name, suffix", [c for c in CASES if not (
    c[1] == "f64" and SPECS[c[0]].libm_f64 or c[1] == "f32" and SPECS[c[0]].f32_limit < np.inf)])
def test_loop_vectorises(name, suffix):
    k = kernel(name, suffix)
    llvm = k.inspect_llvm(k.signatures[0])
    element = "float" if suffix == "f32" else "double"
    widths = {int(w) for w in re.findall(rf"<(\d+) x {element}>", llvm)}
    assert widths and max(widths) >= 4, f"{name}_{suffix}: no vector of {element} in the IR"
    assert not LIBM_CALL.search(llvm), f"{name}_{suffix} calls {LIBM_CALL.search(llvm)[0]}"


@pytest.mark.parametrize("name", ["exp", "tanh", "logistic"])
def test_hot_f32_functions_vectorise_full_width(name):
    k = kernel(name, "f32")
    llvm = k.inspect_llvm(k.signatures[0])
    assert re.search(r"<(8|16) x float>", llvm), f"{name}_f32 is not vectorised 8 or 16 wide"


@pytest.mark.parametrize("name", ["exp", "exp2", "expm1", "log", "log1p", "tanh", "logistic", "erf"])
def test_f32_integer_steps_stay_32_bits_wide(name):
    """numba widens int32 arithmetic to int64; the exponent and bit steps cast back, so the
    vectorised loop has no int64 lanes (AVX2 converts no int64 vector to float: log's loop
    made scalar conversions)."""
    k = kernel(name, "f32")
    llvm = k.inspect_llvm(k.signatures[0])
    assert not re.search(r"<\d+ x i64>", llvm), f"{name}_f32 computes in int64 lanes"


# ------------------------------------------------------------------------------------ partial cores
# tanh and logistic call cores that skip clamps their argument never reaches; each must equal
# the full function bit for bit over its stated range (NaN included).
@pytest.mark.parametrize("core, full, suffix, low, high", [
    ("_expm1_nonneg_f32", "expm1_f32", "f32", 0.0, 20.0),
    ("_exp_upto90_f32", "exp_f32", "f32", -200.0, 90.0),
    ("exp_nonpositive_f32", "exp_f32", "f32", -200.0, 0.0),
    ("_expm1_nonneg_f64", "expm1_f64", "f64", 0.0, 44.0),
    ("_exp_upto710_f64", "exp_f64", "f64", -800.0, 710.0),
    ("_exp_neg_f64", "exp_f64", "f64", -800.0, 0.0),
])
def test_partial_cores_are_the_full_functions_bit_for_bit(core, full, suffix, low, high):
    from xfuse.backends.numba.mathlib import f32, f64

    module = f32 if suffix == "f32" else f64
    dtype = DTYPES[suffix]
    rng = np.random.default_rng(SEED)
    x = rng.uniform(low, high, SAMPLE // 4).astype(dtype)
    tiny = np.array([0.0, -0.0, np.nan, -np.nan, low, high, np.finfo(dtype).smallest_subnormal,
                     -np.finfo(dtype).smallest_subnormal, np.finfo(dtype).tiny, 2.0**-30, -(2.0**-30)],
                    dtype)
    x = np.concatenate([x, tiny, np.sign(x[:1000]) * np.exp2(rng.uniform(-60, 0, 1000)).astype(dtype)])
    if low == 0.0:  # a range from +0: -0.0 and the negatives lie outside it
        x = x[~np.signbit(x) | np.isnan(x)]
    got, want = np.empty_like(x), np.empty_like(x)
    _unary_kernel(getattr(module, core))(x, got)
    _unary_kernel(getattr(module, full))(x, want)
    same = (got.view(f"u{dtype().itemsize}") == want.view(f"u{dtype().itemsize}")) | (np.isnan(got) & np.isnan(want))
    assert same.all(), x[~same][:5]


# ------------------------------------------------------------------------------------ scaling
_SCALE_SCRIPT = """
import sys, numpy as np, numba
from xfuse.backends.numba import mathlib
from xfuse.backends.numba.mathlib import core
x32, x64 = np.load(sys.argv[1]), np.load(sys.argv[2])
out = {"scalef": np.array(core.SCALEF)}
for name in ("exp", "exp2", "expm1", "logistic", "tanh"):
    for suffix, x in (("f32", x32), ("f64", x64)):
        fn = getattr(mathlib, f"{name}_{suffix}")

        @numba.njit
        def loop(a, o):
            for i in range(a.size):
                o[i] = fn(a[i])

        o = np.empty_like(x)
        loop(x, o)
        out[f"{name}_{suffix}"] = o
np.savez(sys.argv[3], **out)
"""


def _scale_edges(dtype) -> np.ndarray:
    info = np.finfo(dtype)
    top = 89.0 if dtype == F32 else 709.0
    low = -104.0 if dtype == F32 else -745.0
    rng = np.random.default_rng(SEED)
    return np.concatenate([
        np.array([0.0, -0.0, np.nan, np.inf, -np.inf, top, top + 0.7, low, low - 1.0, 1.0, -1.0,
                  info.tiny, -info.tiny, info.smallest_subnormal], dtype),
        rng.uniform(low - 5, top + 2, 20_000).astype(dtype),  # subnormal results and overflow
        rng.uniform(-20, 20, 20_000).astype(dtype),
    ])


def test_scaling_by_vscalef_equals_scaling_by_two_factors(tmp_path):
    """Where the CPU has AVX-512, exp and exp2 scale by 2**k with llvm.ldexp (one vscalef);
    numba told the same CPU without AVX-512 (NUMBA_CPU_FEATURES) takes the two-factor scaling.
    Both round once, so the functions built on them agree bit for bit, subnormal results,
    overflow, NaN and infinities included."""
    import os
    import subprocess
    import sys

    from llvmlite import binding

    from xfuse.backends.numba.mathlib import core

    features = ",".join(("-" + f[1:]) if f.startswith("+avx512") else f
                        for f in binding.get_host_cpu_features().flatten().split(","))

    paths = [tmp_path / "x32.npy", tmp_path / "x64.npy"]
    np.save(paths[0], _scale_edges(F32))
    np.save(paths[1], _scale_edges(F64))
    results = {}
    for cpu in ("host", "no_avx512"):
        env = dict(os.environ)
        env.pop("NUMBA_CPU_NAME", None)
        env.pop("NUMBA_CPU_FEATURES", None)
        if cpu == "no_avx512":
            env["NUMBA_CPU_FEATURES"] = features
        out = tmp_path / f"{cpu}.npz"
        subprocess.run([sys.executable, "-c", _SCALE_SCRIPT, *map(str, paths), str(out)], env=env,
                       check=True, capture_output=True, text=True, timeout=600)
        results[cpu] = dict(np.load(out))
    assert bool(results["host"]["scalef"]) == core.SCALEF and not results["no_avx512"]["scalef"]
    for key, got in results["host"].items():
        if key == "scalef":
            continue
        want = results["no_avx512"][key]
        unsigned = f"u{got.dtype.itemsize}"
        same = (got.view(unsigned) == want.view(unsigned)) | (np.isnan(got) & np.isnan(want))
        assert same.all(), f"{key}: {np.flatnonzero(~same)[:5]}"


def test_exp_scales_with_ldexp_where_the_cpu_has_avx512():
    k = kernel("exp", "f32")
    llvm = k.inspect_llvm(k.signatures[0])
    from xfuse.backends.numba.mathlib import core

    assert ("llvm.ldexp" in llvm) == core.SCALEF
