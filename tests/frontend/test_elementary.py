"""The elementary functions XLA expands into other ops (`xfuse.frontend.elementary`): asin, acos,
sinh, cosh, asinh, acosh and atanh against jax.jit in f16, bf16 (every value), f32 and f64 (a
grid through their edges and a random sample), their known values at the edges, population_count
and clz exactly on every integer dtype, a chain of them as one kernel, and their modules
printing, parsing back and verifying. The numba backend runs everything; the reference, C and
jax backends run every function once per dtype; the corpus runs them end to end as well.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax import lax

import xfuse
from xfuse.hlo import DType, parse, print_module, verify
from xfuse.hlo.dtypes import finfo
from tests.tolerances import smallest_normal

FUNCTIONS = {
    "asin": (jnp.arcsin, np.arcsin),
    "acos": (jnp.arccos, np.arccos),
    "sinh": (jnp.sinh, np.sinh),
    "cosh": (jnp.cosh, np.cosh),
    "asinh": (jnp.arcsinh, np.arcsinh),
    "acosh": (jnp.arccosh, np.arccosh),
    "atanh": (jnp.arctanh, np.arctanh),
}
FLOATS = [np.float16, ml_dtypes.bfloat16, np.float32, np.float64]
INTEGERS = [np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64, np.uint64]

# The most a finite result may be from jax.jit's, in ulps of jax.jit's. Measured: f16 and bf16
# within 2 (acosh; 1 or 0 for the others: xfuse computes them all in f32 and rounds once, where
# XLA rounds all but sinh and cosh to f16/bf16 after every op); f32 within 7 (sinh, where XLA's
# own f32 expm1 is up to 5 ulps off; cosh 5 near its overflow, atanh 3, the others 2); f64
# within 6 (sinh; the others 2), but atanh up to 128, where XLA's own f64 log1p is that far off
# (xfuse's within 1). An element may instead be within NUMPY_ULPS of numpy's float64 value.
ULPS = {DType.F16: 2, DType.BF16: 2, DType.F32: 8, DType.F64: 8}
NUMPY_ULPS = 2


def dtype_of(dtype) -> DType:
    return DType.from_numpy(np.dtype(dtype))


def grid(dtype) -> np.ndarray:
    """Every f16 and bf16; for f32 and f64, the edges (zeros, +-1 and their neighbours, the
    overflow thresholds of sinh and cosh and of the squares inside asinh and acosh, subnormals,
    the extremes, inf and NaN), a dense sample near the domain ends and a log-uniform one."""
    if np.dtype(dtype).itemsize == 2:
        return np.arange(1 << 16, dtype=np.uint16).view(dtype)
    info = finfo(dtype_of(dtype))
    top, tiny = dtype(info.max), dtype(info.smallest_normal)
    root, half = np.sqrt(top), top / dtype(2)
    near = [dtype(v) for v in (1.0, -1.0, 88.7, 89.0, 89.41, 709.0, 710.0)] + [root, half]
    points = [0.0, -0.0, 0.5, 1.5, 2.0, 10.0, 1e-8, 1e-20, 1e30, math.inf, math.nan, tiny, tiny / 4, top]
    points += [v for p in near for v in (p, np.nextafter(p, dtype(0)), np.nextafter(p, dtype(math.inf)))]
    rng = np.random.default_rng(11)
    magnitudes = 10.0 ** rng.uniform(math.log10(float(tiny)), math.log10(float(top)), 3000)
    with np.errstate(over="ignore"):
        x = np.concatenate([
            np.asarray(points, np.float64).astype(dtype),
            rng.uniform(-1.1, 1.1, 3000).astype(dtype),
            rng.uniform(-12.0, 12.0, 2000).astype(dtype),
            1.0 + rng.uniform(0.0, 1e-3, 500).astype(dtype),
            magnitudes.astype(dtype),
        ])
    return np.concatenate([x, -x])


def assert_matches_jax(got, want, x, dtype: DType, numpy_fn, what: str) -> None:
    """NaN and +-inf where jax.jit has them, a zero of jax.jit's sign where both are zero, and
    finite values within ULPS of jax.jit's (or NUMPY_ULPS of numpy's float64 value), plus four
    smallest normals: XLA flushes subnormal inputs and intermediates to zero."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype, f"{what}: {got.dtype}, jax gives {want.dtype}"
    with np.errstate(invalid="ignore"):
        g, w = got.astype(np.float64), want.astype(np.float64)
        wide = x.astype(np.float64)
    np.testing.assert_array_equal(np.isnan(g), np.isnan(w), err_msg=f"{what}: NaN")
    np.testing.assert_array_equal(g[np.isinf(w)], w[np.isinf(w)], err_msg=f"{what}: inf")
    assert not np.isinf(g[~np.isinf(w)]).any(), f"{what}: inf where jax.jit is finite"
    zeros = (g == 0) & (w == 0)
    np.testing.assert_array_equal(np.signbit(g[zeros]), np.signbit(w[zeros]), err_msg=f"{what}: zero sign")
    finite = np.isfinite(w)
    with np.errstate(all="ignore"):
        exact = numpy_fn(wide[finite]).astype(got.dtype).astype(np.float64)
    ulp = spacing(w[finite], dtype)
    error = np.abs(g[finite] - w[finite])
    slack = 4 * smallest_normal(dtype)
    ok = error <= ULPS[dtype] * ulp + slack
    ok |= np.abs(g[finite] - exact) <= NUMPY_ULPS * spacing(exact, dtype) + slack
    bad = np.flatnonzero(~ok)
    assert not bad.size, f"{what}: {bad.size} elements off, e.g. x={wide[finite][bad[:5]]}: got " \
                         f"{g[finite][bad[:5]]}, jax {w[finite][bad[:5]]}, numpy {exact[bad[:5]]}"


def spacing(values: np.ndarray, dtype: DType) -> np.ndarray:
    """The ulp of `dtype` at each finite value."""
    info = finfo(dtype)
    with np.errstate(invalid="ignore"):
        _, exponent = np.frexp(np.maximum(np.abs(values), float(info.smallest_normal)))
    return np.ldexp(1.0, exponent - 1 - int(info.nmant))


@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_matches_jax_jit(name: str, dtype) -> None:
    jax_fn, numpy_fn = FUNCTIONS[name]
    x = grid(dtype)
    with jax.enable_x64(dtype == np.float64):
        want = jax.jit(jax_fn)(x)
        got = xfuse.jit(jax_fn)(x)
    assert_matches_jax(got, want, x, dtype_of(dtype), numpy_fn, f"{name}({np.dtype(dtype).name})")


def all_functions(x):
    return {name: fns[0](x) for name, fns in FUNCTIONS.items()}


@pytest.mark.parametrize("backend", ["reference", "c", "jax"])
def test_other_backends_match_jax_jit(backend: str) -> None:
    for dtype in FLOATS:
        x = grid(dtype)[::7] if np.dtype(dtype).itemsize == 2 else grid(dtype)
        with jax.enable_x64(dtype == np.float64):
            want = jax.jit(all_functions)(x)
            got = xfuse.jit(all_functions, backend=backend)(x)
        for name, (_, numpy_fn) in FUNCTIONS.items():
            what = f"{name}({np.dtype(dtype).name}) on {backend}"
            assert_matches_jax(got[name], want[name], x, dtype_of(dtype), numpy_fn, what)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_known_values(dtype) -> None:
    """The values the functions are known to take at their edges, and no overflow or lost
    digits where a naive formula would have them."""
    inf, nan, top = math.inf, math.nan, float(finfo(dtype_of(dtype)).max)
    x = np.asarray([0.0, -0.0, 1.0, -1.0, inf, -inf, nan, 2.0, -2.0, 0.5, 1e-8, 1e-20, 1e30, top, 89.0],
                   dtype)
    with jax.enable_x64(dtype == np.float64):
        results = xfuse.jit(all_functions)(x)
    got = {name: np.asarray(value).astype(np.float64) for name, value in results.items()}
    for name in ("asin", "sinh", "asinh", "atanh"):  # -0.0 in, -0.0 out
        assert got[name][1] == 0 and np.signbit(got[name][1]), name
    assert list(got["sinh"][4:6]) == [inf, -inf] and list(got["cosh"][4:6]) == [inf, inf]
    assert list(got["asinh"][4:6]) == [inf, -inf] and got["acosh"][4] == inf
    assert list(got["atanh"][2:4]) == [inf, -inf] and np.isnan(got["atanh"][[4, 5, 7, 8]]).all()
    assert np.isnan(got["asin"][[4, 5, 7, 8]]).all() and np.isnan(got["acos"][[4, 5, 7, 8]]).all()
    assert np.isnan(got["acosh"][[1, 3, 5, 9]]).all() and got["acosh"][2] == 0
    assert all(np.isnan(values[6]) for values in got.values())
    assert got["acos"][3] == float(dtype(math.pi)) and got["asin"][2] == float(dtype(math.pi / 2))
    for name in ("asin", "sinh", "asinh", "atanh"):  # f(x) = x for tiny x: to the last digit in
        for index in (10, 11):  # f32, within its last digit in f64 (sinh's e + e / (e + 1))
            tiny = float(x[index])
            assert abs(got[name][index] - tiny) <= (0 if dtype == np.float32 else np.spacing(tiny)), name
    rtol = 2e-6 if dtype == np.float32 else 1e-14
    for name, index in [("asinh", 12), ("asinh", 13), ("acosh", 12), ("acosh", 13), ("sinh", 14), ("cosh", 14)]:
        want = FUNCTIONS[name][1](np.float64(x[index]))  # finite, to float64's precision
        np.testing.assert_allclose(got[name][index], want, rtol=rtol, err_msg=name)


def integer_inputs(dtype) -> np.ndarray:
    """Every value of 8 and 16 bits; for 32 and 64: 0, +-1, the extremes, every power of two
    and its neighbours (wrapped into the dtype's range), and random values."""
    info = np.iinfo(dtype)
    if info.bits <= 16:
        return np.arange(info.min, info.max + 1).astype(dtype)
    edges = {0, 1, -1, info.min, info.max}
    edges |= {(1 << k) + d for k in range(info.bits) for d in (-1, 0, 1)}
    wrapped = sorted(v % (1 << info.bits) for v in edges)
    values = [v - (1 << info.bits) if v > info.max else v for v in wrapped]
    random = np.random.default_rng(3).integers(info.min, info.max, 20000, dtype=dtype, endpoint=True)
    return np.concatenate([np.asarray(values, dtype), random])


def bit_counts(x):
    return lax.population_count(x), lax.clz(x), jnp.bitwise_count(x)


@pytest.mark.parametrize("dtype", INTEGERS, ids=lambda d: np.dtype(d).name)
def test_bit_counts_equal_jax_jit(dtype) -> None:
    x = integer_inputs(dtype)
    with jax.enable_x64(np.dtype(dtype).itemsize == 8):
        want = jax.jit(bit_counts)(x)
        got = xfuse.jit(bit_counts)(x)
    for g, w, name in zip(got, want, ("population_count", "clz", "bitwise_count")):
        g, w = np.asarray(g), np.asarray(w)
        assert g.dtype == w.dtype, name
        np.testing.assert_array_equal(g, w, err_msg=name)
    assert (np.asarray(got[1])[x == 0] == np.dtype(dtype).itemsize * 8).all()
    ones = ~np.zeros((), dtype)
    assert (np.asarray(got[0])[x == 0] == 0).all()
    assert (np.asarray(got[0])[x == ones] == np.dtype(dtype).itemsize * 8).all()


@pytest.mark.parametrize("backend", ["reference", "c", "jax"])
def test_bit_counts_on_other_backends(backend: str) -> None:
    inputs = [integer_inputs(dtype)[::5] for dtype in INTEGERS]
    with jax.enable_x64(True):
        want = jax.jit(lambda *xs: [bit_counts(x) for x in xs])(*inputs)
        got = xfuse.jit(lambda *xs: [bit_counts(x) for x in xs], backend=backend)(*inputs)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        assert np.asarray(g).dtype == np.asarray(w).dtype
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))


def chain(x, y, n):
    counts = (lax.population_count(n) - lax.clz(n)).astype(jnp.float32)
    return jnp.sinh(x) * jnp.arcsin(y) + jnp.arccosh(x) - jnp.arctanh(y) + counts


def chain_inputs():
    rng = np.random.default_rng(1)
    x = rng.uniform(1.0, 4.0, 4096).astype(np.float32)
    y = rng.uniform(-1.0, 1.0, 4096).astype(np.float32)
    return x, y, rng.integers(-(2**31), 2**31 - 1, 4096, dtype=np.int32)


def test_a_chain_is_one_kernel() -> None:
    args = chain_inputs()
    compiled = xfuse.jit(chain).lower(*args).compile()
    assert compiled.kernel_count() == 1
    want = jax.jit(chain)(*args)
    got = compiled(*args)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)


def test_modules_print_parse_back_and_verify() -> None:
    lowered = xfuse.jit(chain).lower(*chain_inputs())
    for module in (lowered.module, lowered.compile().module):
        text = print_module(module)
        parsed = parse(text)
        verify(parsed)
        assert print_module(parsed) == text
