"""ns per element of xfuse's numba mathlib against numba's np.* calls and numpy, on 2**24 float32.

Run: python benchmarks/mathlib_speed.py [--n LOG2] [--repeat R]. Single-threaded throughout;
every kernel writes into one preallocated output (fresh pages fault slowly on these machines).
Not a test: it prints a table and checks nothing. Imports numba, numpy and the mathlib only.
"""

from __future__ import annotations

import argparse
import math
import time

import numba
import numpy as np

from xfuse.backends.numba import mathlib


def loop(fn):
    @numba.njit
    def kernel(x, out):
        for i in range(x.size):
            out[i] = fn(x[i])

    return kernel


baseline = numba.njit(inline="always")


@baseline
def numba_exp(x):
    return np.exp(x)


@baseline
def numba_tanh(x):
    return np.tanh(x)


@baseline
def numba_logistic(x):
    return np.float32(1.0) / (np.float32(1.0) + np.exp(-x))


@baseline
def numba_log(x):
    return np.log(x)


@baseline
def numba_sin(x):
    return np.sin(x)


@baseline
def numba_erf(x):
    return np.float32(math.erf(x))


def numpy_logistic(x, out):
    np.negative(x, out=out)
    np.exp(out, out=out)
    out += np.float32(1.0)
    np.reciprocal(out, out=out)


# name -> (input range, mathlib function, numba baseline, numpy baseline or None)
CASES = {
    "exp": ((-80.0, 80.0), mathlib.exp_f32, numba_exp, lambda x, out: np.exp(x, out=out)),
    "tanh": ((-10.0, 10.0), mathlib.tanh_f32, numba_tanh, lambda x, out: np.tanh(x, out=out)),
    "logistic": ((-20.0, 20.0), mathlib.logistic_f32, numba_logistic, numpy_logistic),
    "log": ((1e-3, 1e3), mathlib.log_f32, numba_log, lambda x, out: np.log(x, out=out)),
    "sin": ((-100.0, 100.0), mathlib.sin_f32, numba_sin, lambda x, out: np.sin(x, out=out)),
    "erf": ((-4.0, 4.0), mathlib.erf_f32, numba_erf, None),  # numpy has no erf
}


def best_ns(run, x, out, repeat: int) -> float:
    run(x, out)  # compile, touch the pages
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        run(x, out)
        best = min(best, time.perf_counter() - start)
    return best / x.size * 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=24, help="log2 of the element count")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    numba.set_num_threads(1)
    rng = np.random.default_rng(0)
    out = np.empty(1 << args.n, np.float32)
    print(f"{1 << args.n} float32 elements, best of {args.repeat}, ns/element, 1 thread")
    print(f"{'fn':10s} {'mathlib':>9s} {'numba np':>9s} {'numpy':>9s} {'vs numba':>9s}")
    for name, (bounds, ours, theirs, numpy_fn) in CASES.items():
        x = rng.uniform(*bounds, out.size).astype(np.float32)
        mine = best_ns(loop(ours), x, out, args.repeat)
        base = best_ns(loop(theirs), x, out, args.repeat)
        ref = best_ns(numpy_fn, x, out, args.repeat) if numpy_fn else float("nan")
        print(f"{name:10s} {mine:9.2f} {base:9.2f} {ref:9.2f} {base / mine:8.1f}x")


if __name__ == "__main__":
    main()
