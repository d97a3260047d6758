"""Random elementwise scans, differentially: the scan kernel (numba, and C) against the same
program run step by step (`Fuse(scan=False)`), whose kernels compute every value with the same
emitter, so the two must agree bit for bit; NaN, infinities, -0.0 and integer wraparound
included. Shapes run from no element through scalars to several blocks; cells have one to
three carries (the first recurrent), zero to two xs and ys, forward or reverse, and read the
step counter."""

from __future__ import annotations

import random

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jax import lax

import xfuse
from xfuse.backends.numba.compile import compile_kernel, settle
from xfuse.backends.numba.lowering import lower
from xfuse.fusion import Fuse, parse_pipeline, run_pipeline
from xfuse.hlo import parse
from xfuse.runtime.program import Kernel, build

STEP_BY_STEP = [*parse_pipeline("simplify,fold,cse,licm,dce"), Fuse(scan=False)]
SPACES = [(), (0,), (3,), (2, 5), (1030,)]
FLOAT_OPS = ["({a} + {b})", "({a} - {b})", "({a} * {b})", "jnp.maximum({a}, {b})", "jnp.minimum({a}, {b})",
             "jnp.where({a} > {b}, {a}, {b} * 0.5)", "jnp.tanh({a})", "jnp.abs({a})", "(-{a})",
             "jnp.exp(jnp.minimum({a}, 5.0))", "({a} * 0.75)"]
INT_OPS = ["({a} + {b})", "({a} - {b})", "({a} * {b})", "jnp.maximum({a}, {b})", "({a} ^ {b})",
           "jnp.where({a} > {b}, {a}, {b} // 3)", "(-{a})", "({a} * 7)"]


def expression(r: random.Random, leaves: list[str], ops: list[str], depth: int) -> str:
    if depth == 0 or r.random() < 0.3:
        return r.choice(leaves)
    a = expression(r, leaves, ops, depth - 1)
    b = expression(r, leaves, ops, depth - 1)
    return r.choice(ops).format(a=a, b=b)


def scan_source(r: random.Random, dtype: str, carries: int, xs: int, ys: int, reverse: bool) -> str:
    ops = FLOAT_OPS if dtype == "float32" else INT_OPS
    counter = f"t.astype(jnp.{dtype})"
    leaves = [f"c{k}" for k in range(carries)] + [f"x{k}" for k in range(xs)] + [counter]
    new = [expression(r, leaves, ops, 3) for _ in range(carries)]
    # Carry 0 recurs: an op of itself and of values without it (so nothing cancels). A scan
    # whose carries all pass through or take loop-invariant values leaves licm nothing to keep
    # in the loop, and so no scan to fuse.
    new[0] = r.choice(ops).format(a="c0", b=expression(r, [x for x in leaves if x != "c0"], ops, 2))
    out = [expression(r, leaves, ops, 2) for _ in range(ys)]
    args = ", ".join([f"h{k}" for k in range(carries)] + [f"xs{k}" for k in range(xs)])
    lines = [
        f"def cast(v):\n    return jnp.broadcast_to(jnp.asarray(v, jnp.{dtype}), SPACE)\n",
        f"def program({args}):",
        "    def cell(carry, x):",
        f"        ({''.join(f'c{k}, ' for k in range(carries))}t), ({''.join(f'x{k}, ' for k in range(xs))}) = carry, x",
        f"        return ({''.join(f'cast({e}), ' for e in new)}t + 1), ({''.join(f'cast({e}), ' for e in out)})",
        f"    init = ({''.join(f'h{k}, ' for k in range(carries))}jnp.int32(0))",
        f"    return lax.scan(cell, init, ({''.join(f'xs{k}, ' for k in range(xs))}), length=LENGTH, reverse={reverse})",
    ]
    return "\n".join(lines) + "\n"


def values(r: np.random.Generator, shape: tuple, dtype: str) -> np.ndarray:
    if dtype == "int32":
        pool = np.array([0, 1, -1, 2, 3, -7, 2**31 - 1, -2**31], np.int32)
        return np.where(r.random(shape) < 0.3, r.choice(pool, shape), r.integers(-50, 50, shape)).astype(np.int32)
    pool = np.array([0.0, -0.0, np.nan, np.inf, -np.inf, 1e-40, 3e38, 1.0], np.float32)
    return np.where(r.random(shape) < 0.1, r.choice(pool, shape), r.standard_normal(shape)).astype(np.float32)


def stepped(fn, args: list) -> list:
    """`fn` run step by step: numba kernels in the runtime's loop (no driver to compile)."""
    traced = parse(xfuse.jit(fn, passes="none").lower(*args).as_text())
    lowered = lower(run_pipeline(traced, STEP_BY_STEP).module)
    kernels = {name: Kernel(compile_kernel(source), settle) for name, source in lowered.kernels.items()}
    return build(lowered.program, kernels, lowered.constants)(list(args))


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), dtype=st.sampled_from(["float32", "int32"]),
       space=st.sampled_from(SPACES), length=st.sampled_from([1, 2, 5, 17]),
       carries=st.integers(1, 3), xs=st.integers(0, 2), ys=st.integers(0, 2), reverse=st.booleans(),
       backend=st.sampled_from(["numba", "c"]))
def test_scan_kernels_match_the_steps_bit_for_bit(seed, dtype, space, length, carries, xs, ys, reverse, backend):
    source = scan_source(random.Random(seed), dtype, carries, xs, ys, reverse)
    namespace = {"jnp": jnp, "lax": lax, "LENGTH": length, "SPACE": space}
    exec(compile(source, "<scan program>", "exec"), namespace)
    fn = namespace["program"]
    g = np.random.default_rng(seed)
    args = [values(g, space, dtype) for _ in range(carries)] + [values(g, (length, *space), dtype) for _ in range(xs)]
    fused = xfuse.jit(fn, backend=backend).lower(*args).compile()
    assert "kind=scan" in fused.as_text(), source
    got, want = jax.tree.leaves(fused(*args)), stepped(fn, args)
    assert len(got) == len(want) == carries + 1 + ys
    for g_, w_ in zip(got, want):
        np.testing.assert_array_equal(np.asarray(g_), np.asarray(w_), err_msg=source)
