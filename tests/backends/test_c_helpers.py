"""backends/c/xfuse_kernels.h against the numba helpers it ports: every math function and dtype
bit for bit (NaN matching NaN) over random points spread over the whole float range, the samples
and edge values of test_mathlib; the scalar helpers against numba and numpy/ml_dtypes; the row
reductions against numba and numpy; the header built for plain x86-64 (no FMA) within the
documented ulps; and loops calling the helpers compiled to vector instructions.

One shared library of wrappers (`map_<fn>(inputs..., out, n)`, `call_rows_<fn>(row, n)`) is
built once for the module with the C backend's toolchain (warnings are errors) and loaded with
ctypes. Needs a C compiler, like the C backend.
"""

from __future__ import annotations

import ctypes
import re
import subprocess
from pathlib import Path

import ml_dtypes
import numba
import numpy as np
import pytest

import xfuse.backends.c
from tests.backends.test_mathlib import (
    DTYPES, F32, F64, SPECS, _binary_kernel, _grid, _unary_kernel, any_finite, assert_within,
    edge_values, evaluate, reference, sample,
)
from xfuse.backends.c.toolchain import build_flags, compile_shared, compiler
from xfuse.backends.numba import rows, scalar

HEADER = Path(xfuse.backends.c.__file__).parent / "xfuse_kernels.h"
POINTS = 100_000  # random arguments per function and dtype
CTYPES = {F32: "float", F64: "double"}
MATH = [(name, suffix) for name in SPECS for suffix in DTYPES]
INTS = {  # numpy dtype -> C type the wrapper uses (scalar_imax dispatches on it)
    np.bool_: "bool", np.int8: "int8_t", np.uint8: "uint8_t", np.int16: "int16_t",
    np.uint16: "uint16_t", np.int32: "int32_t", np.uint32: "uint32_t", np.int64: "int64_t",
    np.uint64: "uint64_t",
}
WARNINGS = ("-Wall", "-Wextra", "-Werror")


# ------------------------------------------------------------------------------ the C library
def _map(name: str, call: str, ins: list[str], out: str) -> str:
    """An exported loop `out[i] = call(in0[i], ...)`."""
    params = ", ".join(f"const {t} *x{i}" for i, t in enumerate(ins))
    args = ", ".join(f"x{i}[i]" for i in range(len(ins)))
    return (f"EXPORT void map_{name}({params}, {out} *y, int64_t n) {{\n"
            f"    for (int64_t i = 0; i < n; i++) y[i] = {call}({args});\n}}\n")


def _math_wrappers(cases) -> str:
    parts = []
    for name, suffix in cases:
        ctype = CTYPES[DTYPES[suffix]]
        ins = [ctype] * SPECS[name].arity
        parts.append(_map(f"{name}_{suffix}", f"{name}_{suffix}", ins, ctype))
    return "".join(parts)


PRELUDE = '#include "xfuse_kernels.h"\n#define EXPORT __attribute__((visibility("default")))\n'

# scalar_imax/imin keep the type of their arguments, for every integer type by its C name.
TYPE_CHECKS = "".join(
    f"_Static_assert(_Generic(scalar_{op}(({t})1, ({t})2), {t}: 1, default: 0), \"{op} {t}\");\n"
    for op in ("imax", "imin")
    for t in ("bool", "char", "signed char", "unsigned char", "short", "unsigned short", "int",
              "unsigned", "long", "unsigned long", "long long", "unsigned long long")
) + ("_Static_assert(_Generic(scalar_float_bits(1.0f), uint32_t: 1, default: 0), \"bits\");\n"
     "_Static_assert(_Generic(scalar_float_bits(1.0), uint64_t: 1, default: 0), \"bits\");\n"
     "_Static_assert(_Generic(scalar_is_finite(1.0f), bool: 1, default: 0), \"is_finite\");\n"
     "_Static_assert(_Generic(scalar_round_away(1.0f), float: 1, default: 0), \"round\");\n")


def _scalar_wrappers() -> str:
    parts = []
    for suffix, ctype in (("f32", "float"), ("f64", "double")):
        for op in ("fmax", "fmin"):
            parts.append(_map(f"{op}_{suffix}", f"scalar_{op}", [ctype, ctype], ctype))
        parts.append(_map(f"round_away_{suffix}", "scalar_round_away", [ctype], ctype))
        parts.append(_map(f"is_finite_{suffix}", "scalar_is_finite", [ctype], "bool"))
        parts.append(_map(f"float_bits_{suffix}", "scalar_float_bits", [ctype],
                          "uint32_t" if suffix == "f32" else "uint64_t"))
    for dtype, ctype in INTS.items():
        for op in ("imax", "imin"):
            parts.append(_map(f"{op}_{np.dtype(dtype).name}", f"scalar_{op}", [ctype] * 2, ctype))
    parts.append(_map("round_bf16", "scalar_round_bf16", ["float"], "float"))
    parts.append(_map("round_f16", "scalar_round_f16", ["float"], "float"))
    parts.append(_map("f32_bits", "scalar_f32_bits", ["float"], "uint32_t"))
    parts.append(_map("bits_f32", "scalar_bits_f32", ["uint32_t"], "float"))
    for fn in rows.SUMS + rows.EXTREMES:
        ctype = "float" if fn.endswith("f32") else "double"
        parts.append(f"EXPORT {ctype} call_rows_{fn}(const {ctype} *a, int64_t n) "
                     f"{{ return rows_{fn}(a, n); }}\n")
    return "".join(parts)


def _build(directory: Path, name: str, source: str, target: str = "native") -> ctypes.CDLL:
    output = directory / f"{name}.so"
    compile_shared(source, output, target, extra=("-I", str(HEADER.parent), *WARNINGS),
                   name=name)
    return ctypes.CDLL(str(output))


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    source = PRELUDE + TYPE_CHECKS + _math_wrappers(MATH) + _scalar_wrappers()
    return _build(tmp_path_factory.mktemp("c_helpers"), "c_helpers", source)


def run_map(lib, name: str, *args: np.ndarray, out_dtype=None) -> np.ndarray:
    args = [np.ascontiguousarray(a) for a in args]
    out = np.empty(args[0].shape, out_dtype or args[0].dtype)
    fn = getattr(lib, f"map_{name}")
    fn(*(a.ctypes.data_as(ctypes.c_void_p) for a in args), out.ctypes.data_as(ctypes.c_void_p),
       ctypes.c_int64(out.size))
    return out


def assert_identical(what: str, args, got: np.ndarray, want: np.ndarray) -> None:
    """Bit for bit, except that any NaN matches any NaN (payloads are not part of the port)."""
    unsigned = {4: np.uint32, 8: np.uint64, 2: np.uint16, 1: np.uint8}[got.dtype.itemsize]
    same = got.view(unsigned) == want.view(unsigned)
    if got.dtype.kind == "f":
        same |= np.isnan(got) & np.isnan(want)
    bad = np.flatnonzero(~same)
    if bad.size:
        i = bad[0]
        at = ", ".join(repr(a[i]) for a in args)
        pytest.fail(f"{what}({at}) = {got[i]!r}, want {want[i]!r}; "
                    f"{bad.size} of {got.size} differ")


# ------------------------------------------------------------------------------ math functions
def whole_range_sample(name: str, dtype) -> list[np.ndarray]:
    """POINTS arguments: the parts of test_mathlib's sample, plus arguments drawn uniformly over
    the bit patterns of all finite floats (so far outside each function's domain too)."""
    rng = np.random.default_rng([7, list(SPECS).index(name), dtype is F64])
    spec = SPECS[name]
    parts = spec.parts + ((any_finite(),) * spec.arity,)
    n = POINTS // len(parts)
    columns = [[] for _ in range(spec.arity)]
    for part in parts:
        samplers = part if isinstance(part, tuple) else (part,)
        for column, draw in zip(columns, samplers):
            column.append(draw(rng, n, dtype))
    return [np.concatenate(c).astype(dtype) for c in columns]


@pytest.mark.parametrize("name, suffix", MATH)
def test_math_is_bitwise_the_numba_version(lib, name, suffix):
    dtype = DTYPES[suffix]
    edges = edge_values(name, dtype)
    if SPECS[name].arity == 2:  # every pair of edge values
        edge_args = list(_grid(edges, dtype))
    else:
        edge_args = [edges]
    args = [np.concatenate([e, s]) for e, s in zip(edge_args, whole_range_sample(name, dtype))]
    got = run_map(lib, f"{name}_{suffix}", *args)
    assert_identical(f"{name}_{suffix}", args, got, evaluate(name, suffix, *args))


@pytest.mark.parametrize("name", ["sin", "cos", "tan"])
def test_f32_trig_past_the_reduction_limit_is_bitwise_the_numba_version(lib, name):
    """Past 2**28 both take the same libm call."""
    rng = np.random.default_rng(3)
    big = np.exp(rng.uniform(np.log(2.0**28), np.log(3.4e38), 5_000)).astype(F32)
    x = np.concatenate([big, -big])
    assert_identical(f"{name}_f32", (x,), run_map(lib, f"{name}_f32", x),
                     evaluate(name, "f32", x))


NO_FMA = [(name, suffix) for name in ("exp", "log", "tanh", "expm1", "atan2") for suffix in DTYPES]


@pytest.fixture(scope="module")
def lib_no_fma(tmp_path_factory):
    source = PRELUDE + _math_wrappers(NO_FMA)
    return _build(tmp_path_factory.mktemp("c_helpers_x86_64"), "c_helpers_x86_64", source,
                  target="x86-64")


@pytest.mark.parametrize("name, suffix", NO_FMA)
def test_without_fma_within_documented_ulps(lib_no_fma, name, suffix):
    """Built for plain x86-64 the fused multiply-adds round twice; the results stay within the
    mathlib docstring's bounds (measured with FMA) on test_mathlib's sample and edge values."""
    dtype = DTYPES[suffix]
    edges = edge_values(name, dtype)
    edge_args = list(_grid(edges, dtype)) if SPECS[name].arity == 2 else [edges]
    args = [np.concatenate([e, s[::10]]) for e, s in zip(edge_args, sample(name, dtype))]
    got = run_map(lib_no_fma, f"{name}_{suffix}", *args)
    assert_within(name, suffix, args, got, reference(name, suffix, *args),
                  SPECS[name].max_ulps[dtype])
    if name != "log":  # the others fuse: built without FMA, some results differ by an ulp
        assert (got != evaluate(name, suffix, *args)).any(), "the x86-64 build fused anyway"


# The loops numba's versions vectorise too: all but libm calls (f64 erf, erfc, sin, cos, tan,
# pow; f32 sin, cos, tan, which branch to libm past 2**28) and bool max/min.
SCALAR_LOOPS = {"sin_f32", "cos_f32", "tan_f32", "erf_f64", "erfc_f64", "sin_f64", "cos_f64",
                "tan_f64", "pow_f64", "imax_bool", "imin_bool"}


@pytest.fixture(scope="module")
def loop_assembly(tmp_path_factory) -> dict[str, str]:
    """Function name -> its assembly, of every wrapper loop built for x86-64-v3 (AVX2 and FMA).
    Only compiled, never run: the machine running the test needs neither."""
    folder = tmp_path_factory.mktemp("assembly")
    source, assembly = folder / "loops.c", folder / "loops.s"
    source.write_text(PRELUDE + _math_wrappers(MATH) + _scalar_wrappers())
    subprocess.run([*compiler(), *build_flags("x86-64-v3"), "-I", str(HEADER.parent), *WARNINGS, "-S",
                    "-o", str(assembly), str(source)], check=True, capture_output=True)
    return dict(re.findall(r"^(\w+):\n(.*?)^\s*\.size\s+\1,", assembly.read_text(errors="replace"),
                           re.M | re.S))


def test_exp_f32_loop_vectorises(loop_assembly):
    """A loop calling exp_f32 runs on 256-bit vectors with packed fused multiply-adds and calls
    no libm function."""
    code = loop_assembly["map_exp_f32"]
    assert re.search(r"%ymm\d+", code), "the exp_f32 loop uses no ymm register"
    assert re.search(r"\bv(fmadd|fnmadd)\d+ps\b", code), "no packed fused multiply-add"
    assert not re.search(r"call.*\b(exp|expf)\b", code), "the exp_f32 loop calls libm"


def test_every_helper_loop_vectorises(loop_assembly):
    """Every wrapper loop uses 256-bit vectors and calls nothing, except the loops that call
    libm as the Python does."""
    names = [f"map_{n}_{s}" for n, s in MATH] + [
        n for n in loop_assembly if n.startswith(("map_", "call_rows_"))]
    scalar_loops, calling = [], []
    for name in dict.fromkeys(names):
        body = loop_assembly[name]
        if name.removeprefix("map_") in SCALAR_LOOPS:
            continue
        if "%ymm" not in body and "%zmm" not in body:
            scalar_loops.append(name)
        # A gcc that protects the stack by default (Ubuntu's) ends a function holding an array
        # (the row sums' partial sums) with a call of __stack_chk_fail, taken only if the
        # stack was overwritten: not a call the loop makes.
        if re.search(r"\bcall\b(?!.*__stack_chk_fail)", body):
            calling.append(name)
    assert not scalar_loops, f"these loops do not vectorise: {scalar_loops}"
    assert not calling, f"these loops call functions: {calling}"


# ------------------------------------------------------------------------------ scalar helpers
@pytest.fixture(scope="module")
def numba_scalar():
    """numba loops over the scalar helpers, compiled on first use."""
    compiled = {}

    def get(name: str, arity: int):
        if name not in compiled:
            fn = getattr(scalar, name)
            compiled[name] = (_binary_kernel if arity == 2 else _unary_kernel)(fn)
        return compiled[name]

    return get


FLOAT_SPECIALS = [np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 1.5, 2.5,
                  -2.5, 1e-45, -1e-45, 5e-324, 3.4e38, -3.4e38, 1.7e308, 2.0**23 + 1, 2.0**52 + 1]


def _floats(dtype, n=20_000, seed=0):
    rng = np.random.default_rng(seed)
    values = np.concatenate([FLOAT_SPECIALS, any_finite()(rng, n, dtype), rng.uniform(-4, 4, n),
                             np.round(rng.uniform(-40, 40, n)) / 2])
    with np.errstate(over="ignore"):
        return values.astype(dtype)


@pytest.mark.parametrize("suffix", DTYPES)
@pytest.mark.parametrize("op", ["fmax", "fmin"])
def test_fmax_fmin(lib, numba_scalar, op, suffix):
    dtype = DTYPES[suffix]
    v = _floats(dtype, 2_000)
    a, b = _grid(v[:len(FLOAT_SPECIALS)], dtype)
    rng = np.random.default_rng(1)
    a, b = np.concatenate([a, v]), np.concatenate([b, rng.permutation(v)])
    got = run_map(lib, f"{op}_{suffix}", a, b)
    want = np.empty_like(a)
    numba_scalar(op, 2)(a, b, want)
    assert_identical(f"scalar_{op}", (a, b), got, want)
    # jax's semantics, stated directly: NaN propagates, -0.0 is below +0.0.
    pick = np.maximum if op == "fmax" else np.minimum
    with np.errstate(invalid="ignore"):
        expect = pick(a, b)
    zeros = (a == 0) & (b == 0)
    expect[zeros] = dtype(0.0) if op == "fmax" else dtype(-0.0)
    expect[zeros & (np.signbit(a) & np.signbit(b))] = dtype(-0.0)
    expect[zeros & ~(np.signbit(a) | np.signbit(b))] = dtype(0.0)
    assert_identical(f"scalar_{op}", (a, b), got, expect)


@pytest.mark.parametrize("dtype", list(INTS), ids=lambda d: np.dtype(d).name)
def test_imax_imin_on_every_integer_type(lib, dtype):
    if dtype is np.bool_:
        values = np.array([False, True])
    else:
        info = np.iinfo(dtype)
        values = np.array(sorted({info.min, info.min + 1, -1 if info.min < 0 else 2, 0, 1,
                                  info.max - 1, info.max}), dtype)
    a, b = np.repeat(values, values.size), np.tile(values, values.size)
    name = np.dtype(dtype).name
    assert_identical(f"scalar_imax[{name}]", (a, b), run_map(lib, f"imax_{name}", a, b),
                     np.maximum(a, b))
    assert_identical(f"scalar_imin[{name}]", (a, b), run_map(lib, f"imin_{name}", a, b),
                     np.minimum(a, b))


@pytest.mark.parametrize("suffix", DTYPES)
def test_round_away_and_is_finite(lib, numba_scalar, suffix):
    dtype = DTYPES[suffix]
    x = _floats(dtype)
    got = run_map(lib, f"round_away_{suffix}", x)
    want = np.empty_like(x)
    numba_scalar("round_away", 1)(x, want)  # numba's f64 result stored as the dtype, as kernels do
    assert_identical("scalar_round_away", (x,), got, want)
    spot = np.array([0.5, -0.5, 1.5, 2.5, -2.5, 0.49999997, -0.0, 2.0**23 + 1], dtype)
    assert run_map(lib, f"round_away_{suffix}", spot).tolist() == \
        [1.0, -1.0, 2.0, 3.0, -3.0, 0.0, -0.0, 2.0**23 + 1]
    finite = run_map(lib, f"is_finite_{suffix}", x, out_dtype=np.bool_)
    np.testing.assert_array_equal(finite, np.isfinite(x))


def _all_f32_bits(n=200_000, seed=2):
    """Random float32 bit patterns (NaNs and infinities included), every exponent, plus the
    halfway points of bfloat16 and float16 rounding and the float16 range limits."""
    rng = np.random.default_rng(seed)
    bits = rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32)
    halfway = (bits & np.uint32(0xFFFF0000)) | np.uint32(0x8000)
    halfway16 = (bits & np.uint32(0xFFFFE000)) | np.uint32(0x1000)
    edges = np.array([65504.0, 65519.996, 65520.0, 6.1035156e-05, 6.097e-05, 5.96e-08, 2.98e-08,
                      2.9802322e-08, 2.9802326e-08, 3.4e38, np.inf, -np.inf, np.nan, 0.0, -0.0],
                     F32)
    small = rng.uniform(-1e-4, 1e-4, n // 4).astype(F32)  # float16 subnormals
    return np.concatenate([bits.view(F32), halfway.view(F32), halfway16.view(F32), edges, small,
                           -edges])


@pytest.mark.parametrize("fn, narrow", [("round_bf16", ml_dtypes.bfloat16),
                                        ("round_f16", np.float16)])
def test_round_to_narrow_floats_matches_conversion(lib, numba_scalar, fn, narrow):
    x = _all_f32_bits()
    got = run_map(lib, fn, x)
    with np.errstate(over="ignore", invalid="ignore"):
        expect = x.astype(narrow).astype(F32)
    assert_identical(f"scalar_{fn}", (x,), got, expect)
    want = np.empty_like(x)
    numba_scalar(fn, 1)(x, want)
    assert_identical(f"scalar_{fn}", (x,), got, want)


def test_bit_casts(lib):
    x = _all_f32_bits(10_000)
    bits = run_map(lib, "float_bits_f32", x, out_dtype=np.uint32)
    np.testing.assert_array_equal(bits, x.view(np.uint32))
    np.testing.assert_array_equal(run_map(lib, "f32_bits", x, out_dtype=np.uint32), bits)
    np.testing.assert_array_equal(run_map(lib, "bits_f32", bits, out_dtype=F32).view(np.uint32),
                                  bits)
    d = _floats(F64, 1_000)
    np.testing.assert_array_equal(run_map(lib, "float_bits_f64", d, out_dtype=np.uint64),
                                  d.view(np.uint64))


# ------------------------------------------------------------------------------ rows
def call_row(lib, fn: str, row: np.ndarray):
    row = np.ascontiguousarray(row)
    c = getattr(lib, f"call_rows_{fn}")
    c.restype = ctypes.c_float if row.dtype == F32 else ctypes.c_double
    result = c(row.ctypes.data_as(ctypes.c_void_p), ctypes.c_int64(row.size))
    return row.dtype.type(result)


@pytest.fixture(scope="module")
def numba_rows():
    return {fn: numba.njit(fastmath={"reassoc"} if fn in rows.SUMS else set())(getattr(rows, fn))
            for fn in rows.SUMS + rows.EXTREMES}


ROW_SPECIALS = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-45, -1e-45, 3.0e38, -3.0e38]


def _rows(dtype, seed=4):
    """Rows of many lengths (0 included), some with special values, some all one value."""
    rng = np.random.default_rng(seed)
    out = []
    for n in (0, 1, 2, 3, 7, 8, 9, 16, 31, 33, 64, 100, 1000, 4099):
        for k in range(4):
            row = rng.standard_normal(n).astype(dtype) * dtype(10.0 ** rng.integers(-3, 4))
            for _ in range(k if n else 0):
                row[rng.integers(n)] = rng.choice(ROW_SPECIALS)
            out.append(row)
    for v in ROW_SPECIALS:
        out.append(np.full(37, v, dtype))
    mixed_zeros = np.full(40, -0.0, dtype)
    mixed_zeros[13] = 0.0
    out.append(mixed_zeros)
    return out


@pytest.mark.parametrize("suffix", DTYPES)
def test_row_max_and_min_are_exact(lib, numba_rows, suffix):
    dtype = DTYPES[suffix]
    unsigned = np.uint32 if dtype is F32 else np.uint64
    for row in _rows(dtype):
        for op, pick in (("max", np.max), ("min", np.min)):
            fn = f"{op}_{suffix}"
            got = call_row(lib, fn, row)
            want = numba_rows[fn](row)  # empty rows too: a NaN, bit for bit
            assert np.array(got).view(unsigned) == np.array(want, dtype).view(unsigned) or \
                np.isnan(got) and np.isnan(want), f"rows_{fn}({row!r}) = {got!r}, want {want!r}"
            if row.size == 0:
                assert np.isnan(got)
            elif np.isnan(row).any():
                assert np.isnan(got), f"rows_{fn}: NaN in the row, got {got!r}"
            else:
                expect = pick(row)
                if expect == 0:  # -0.0 below +0.0
                    signs = np.signbit(row[row == 0])
                    expect = dtype(-0.0) if (signs.all() if op == "max" else signs.any()) else \
                        dtype(0.0)
                assert np.array(got).view(unsigned) == np.array(expect).view(unsigned), \
                    f"rows_{fn}({row!r}) = {got!r}, want {expect!r}"


@pytest.mark.parametrize("suffix", DTYPES)
def test_row_sums(lib, numba_rows, suffix):
    dtype = DTYPES[suffix]
    eps = np.finfo(dtype).eps
    for row in _rows(dtype):
        fn = f"sum_{suffix}"
        got = call_row(lib, fn, row)
        wide = row.astype(np.longdouble)
        with np.errstate(invalid="ignore", over="ignore"):
            exact = wide.sum()
            numba_sum = numba_rows[fn](row)
        if not np.isfinite(row).all():  # NaN/inf propagate as in any order of the sum
            assert np.isnan(got) == np.isnan(exact) and (np.isnan(got) or got == exact), \
                f"rows_{fn}: {got!r}, want {exact!r}"
            assert np.isnan(got) == np.isnan(numba_sum)
            continue
        if np.isinf(got):  # the +-3e38 rows overflow in f32 in some orders
            largest = max(wide[wide > 0].sum(), -wide[wide < 0].sum())
            assert largest >= np.finfo(dtype).max, f"rows_{fn}: {got!r}, want {exact!r}"
            continue
        bound = row.size * eps * float(np.abs(wide).sum()) + np.finfo(dtype).smallest_subnormal
        assert abs(float(got) - float(exact)) <= bound, f"rows_{fn}: {got!r}, want {exact!r}"
        assert abs(float(got) - float(numba_sum)) <= 2 * bound
    assert call_row(lib, f"sum_{suffix}", np.zeros(0, dtype)) == 0
    zeros = call_row(lib, f"sum_{suffix}", np.full(50, -0.0, dtype))
    assert zeros == 0 and np.signbit(zeros) == np.signbit(numba_rows[f"sum_{suffix}"](
        np.full(50, -0.0, dtype)))
