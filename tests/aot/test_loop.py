"""C loop drivers (`aot/loop.py`): a while loop of an artifact, or of the C backend, runs as one
C function. Each loop here is checked to get a driver, and its results against the runtime
running the same loop step by step (the same kernels: bit for bit, except where a dot is
summed by another GEMM) and against jax.jit: any trip count (none at all too), data-dependent
ones, state elements swapped, passed along or written a window at a time with clamped starts,
NaN, infinities, -0.0 and integer wraparound. Results own their memory, arguments are never
written, and threads call one driver at once. Loops a driver does not take (a kernel split
over threads, a large dot) stay with the runtime."""

from __future__ import annotations

import copy
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import xfuse
from tests.tolerances import ACCUMULATION, EXACT, TRANSCENDENTAL, assert_close
from xfuse.aot.loop import loop_drivers
from xfuse.backends.c.backend import build_library, c_source, compile_modules
from xfuse.backends.numba.lowering import lower
from xfuse.fusion import Fuse, parse_pipeline
from xfuse.hlo import DType
from xfuse.runtime import native
from xfuse.runtime.program import build, walk

RNG = np.random.default_rng(11)
# Scan fusion off: it would make the elementwise loops here one kernel each, with no while left.
STEP_BY_STEP = [*parse_pipeline("simplify,fold,cse,licm,dce"), Fuse(scan=False)]
SPECIAL = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0, 1e-40, -3.5, 2.0], np.float32)


def counted(x, n):
    """n iterations, n an argument: no trip count known when compiling, none at all too."""
    return lax.fori_loop(0, n, lambda i, v: jnp.tanh(v * 1.5) + v * 0.25, x)


def newton(x):
    """sqrt(x) by Newton's method until converged: a data-dependent trip count."""
    def cond(s):
        k, y, last = s
        return (k < 50) & jnp.any(jnp.abs(y - last) > 1e-6 * jnp.abs(y))

    def body(s):
        k, y, _ = s
        return k + 1, 0.5 * (y + x / y), y

    return lax.while_loop(cond, body, (0, x, x * 4.0))


def swapping(a, b):
    """Fibonacci in int32, wrapping around: each element becomes the other's old value."""
    return lax.fori_loop(0, 60, lambda i, s: (s[1], s[0] + s[1]), (a, b))


def rnn(xs, wx, wh, b):
    def cell(h, x):
        h = jnp.tanh(x @ wx + h @ wh + b)
        return h, h
    return lax.scan(cell, jnp.zeros((xs.shape[1], wh.shape[0]), xs.dtype), xs)


def windows(x, ys):
    """Rows written at starts that run off both ends (jax wraps a negative start once, then
    clamps: -10 and -8 write row 0, 8 and 11 row 6), into a stack given as an argument (which
    must not be written)."""
    def body(i, ys):
        return lax.dynamic_update_slice(ys, (x * i.astype(x.dtype))[None], (i * 3 - 10, 0))
    return lax.fori_loop(0, 8, body, ys)


def f64_loop(x):
    return lax.fori_loop(0, 5, lambda i, v: jnp.sqrt(jnp.abs(v)) - v / (i + 1.0), x)


CASES = {
    "counted_0": (counted, lambda: (SPECIAL, np.int32(0)), TRANSCENDENTAL),
    "counted_1": (counted, lambda: (SPECIAL, np.int32(1)), TRANSCENDENTAL),
    "counted_7": (counted, lambda: (np.concatenate([SPECIAL, RNG.standard_normal(9).astype(np.float32)]),
                                    np.int32(7)), TRANSCENDENTAL),
    "newton": (newton, lambda: (np.array([2.0, 9.0, 0.25, 1e6, 3.0], np.float32),), TRANSCENDENTAL),
    "swapping": (swapping, lambda: (np.array([0, 1, -7, 2**30], np.int32), np.array([1, 1, 3, 2**30], np.int32)),
                 EXACT),
    "rnn": (rnn, lambda: (RNG.standard_normal((9, 4, 16)).astype(np.float32),
                          (RNG.standard_normal((16, 24)) * 0.3).astype(np.float32),
                          (RNG.standard_normal((24, 24)) * 0.3).astype(np.float32),
                          RNG.standard_normal(24).astype(np.float32)), ACCUMULATION),
    "windows": (windows, lambda: (np.array([np.nan, -np.inf, -0.0, 1.5, -2.0], np.float32), RNG.standard_normal((7, 5)).astype(np.float32)), EXACT),
    "f64": (f64_loop, lambda: (np.array([4.0, -0.0, np.inf, np.nan, 1e-300, -2.5]),), TRANSCENDENTAL),
}


def executables(fn, args):
    """(executable with C loop drivers, the same program run by the runtime, the program)."""
    with jax.enable_x64(any(np.asarray(a).dtype == np.float64 for a in args)):
        compiled = xfuse.jit(fn, backend="c", passes=STEP_BY_STEP).lower(*args).compile()
    lowered = lower(compiled.module)
    plain = copy.deepcopy(lowered.program)
    drivers = loop_drivers(lowered)
    library = native.open_library(build_library(c_source(lowered) + drivers))
    kernels = native.kernels(library, lowered.program)
    driven = build(lowered.program, kernels, lowered.constants)
    stepped = build(plain, kernels, lowered.constants)
    driven.library = stepped.library = library
    return driven, stepped, lowered.program


def flat(x):
    return [np.asarray(v) for v in jax.tree_util.tree_leaves(x)]


@pytest.mark.parametrize("name", list(CASES))
def test_a_loop_gets_a_driver_matching_the_runtime_and_jax(name):
    fn, make, tolerance = CASES[name]
    args = make()
    before = [np.copy(a) for a in args]
    driven, stepped, program = executables(fn, args)
    loops = [s for s in walk(program) if s["op"] == "while"]
    assert loops and all("native_state" in s for s in loops), [s["name"] for s in loops]
    got = driven(list(args))
    again = stepped(list(args))
    with jax.enable_x64(any(np.asarray(a).dtype == np.float64 for a in args)):
        want = flat(jax.jit(fn)(*args))
    assert len(got) == len(want)
    for g, a, w in zip(flat(got), flat(again), want):
        assert g.dtype == w.dtype and g.shape == w.shape
        dtype = DType.from_numpy(w.dtype)
        if tolerance is ACCUMULATION:  # the driver's C GEMM sums in another order than BLAS
            np.testing.assert_allclose(g, a, rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
        else:
            assert_close(g, a, dtype, name, EXACT)
            assert_close(g, w, dtype, name, tolerance)
    for a, b in zip(args, before):  # arguments are never written, windows included
        np.testing.assert_array_equal(a, b)


def test_state_kinds_are_recorded():
    _, _, program = executables(rnn, CASES["rnn"][1]())
    (loop,) = [s for s in walk(program) if s["op"] == "while"]
    kinds = loop["native_state"]
    assert kinds.count("owned") == 1 and "new" in kinds and "pass" in kinds  # the stack, h and the counter, xs


@pytest.mark.parametrize("trips", [0, 3])
def test_results_own_their_memory(trips):
    x, n = np.array([1.0, -2.0, 0.5], np.float32), np.int32(trips)
    driven, _, _ = executables(counted, (x, n))
    (first,) = driven([x, n])
    want = first.copy()
    first[...] = 99.0
    (second,) = driven([x, n])
    np.testing.assert_array_equal(second, want)
    assert_close(second, np.asarray(jax.jit(counted)(x, n)), DType.F32, "counted", TRANSCENDENTAL)
    np.testing.assert_array_equal(x, [1.0, -2.0, 0.5])


def test_threads_run_one_driver_at_once():
    fn, make, _ = CASES["rnn"]
    driven, _, _ = executables(fn, make())
    inputs = [make() for _ in range(4)]
    wants = [flat(jax.jit(fn)(*a)) for a in inputs]
    failures = []

    def work(k):
        for _ in range(30):
            for g, w in zip(flat(driven(list(inputs[k]))), wants[k]):
                if not np.allclose(g, w, rtol=1e-5, atol=1e-5):
                    failures.append(k)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures


@pytest.mark.parametrize("case", ["parallel kernel", "large dot"])
def test_loops_a_driver_does_not_take_stay_with_the_runtime(case):
    if case == "parallel kernel":
        fn = counted
        args = (RNG.standard_normal(1 << 20).astype(np.float32), np.int32(3))
    else:
        def fn(x, w):
            return lax.fori_loop(0, 2, lambda i, v: jnp.tanh(v @ w), x)
        args = (RNG.standard_normal((256, 256)).astype(np.float32),
                (RNG.standard_normal((256, 256)) * 0.05).astype(np.float32))
    driven, _, program = executables(fn, args)
    loops = [s for s in walk(program) if s["op"] == "while"]
    assert loops and not any("native_state" in s for s in loops)
    (got,) = driven(list(args))
    np.testing.assert_allclose(got, np.asarray(jax.jit(fn)(*args)), rtol=2e-5, atol=2e-5)


def test_an_artifact_runs_its_loop_in_c(tmp_path):
    fn, make, _ = CASES["rnn"]
    args = make()
    compiled = xfuse.jit(fn).lower(*args).compile()
    loaded = xfuse.aot.load(compiled.save(tmp_path / "rnn.xfa"))
    (loop,) = [s for s in walk(loaded.manifest["program"]) if s["op"] == "while"]
    assert loop["native"].startswith("xf_loop") and "native_state" in loop
    for g, w in zip(flat(loaded(*args)), flat(jax.jit(fn)(*args))):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


def test_two_modules_with_loops_share_one_library():
    """The C backend builds several modules into one C file: each module's drivers bring the
    entry prelude along, which the file holds once."""
    x, n = np.array([0.5, -1.0, np.inf], np.float32), np.int32(4)
    modules = [xfuse.jit(f, backend="c", passes=STEP_BY_STEP).lower(x, n).compile().module
               for f in (counted, lambda x, n: counted(x * 2.0, n))]
    for i, (executable, scale) in enumerate(zip(compile_modules(modules), (1.0, 2.0))):
        assert hasattr(executable.library, f"xf_m{i}_loop_0")  # each module's loop has its driver
        (got,) = executable([x, n])
        assert_close(got, np.asarray(jax.jit(counted)(x * scale, n)), DType.F32, "counted", TRANSCENDENTAL)
