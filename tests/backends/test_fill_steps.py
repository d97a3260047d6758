"""A broadcast standing alone (an unfused broadcast_in_dim, or a fusion of nothing else) is a
numpy library step on the numba and C backends: no kernel is compiled for it, and it gives
jax.jit's values bit for bit (an operand dimension kept, expanded from 1, or new; scalars;
ints, bools, bfloat16). Inside a loop (its body, or a branch there) it stays a kernel, so the
loop still runs natively."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax import lax

import xfuse
from tests.backends.test_native_loop import drivers_of, traced
from xfuse.backends.numba.backend import compile_module
from xfuse.backends.numba.lowering import lower
from xfuse.runtime.program import walk

M34 = np.arange(12, dtype=np.float32).reshape(3, 4) - 5.5
CASES = {
    "leading_axis": (lambda x: jnp.broadcast_to(x, (5, 3, 4)), M34),
    "middle_axis": (lambda x: lax.broadcast_in_dim(x, (3, 6, 4), (0, 2)), M34),
    "expanded_from_one": (lambda x: lax.broadcast_in_dim(x, (3, 6, 4), (0, 1, 2)), M34.reshape(3, 1, 4)),
    "scalar": (lambda x: jnp.full((2, 3), x), np.float32(-0.0)),
    "specials": (lambda x: jnp.broadcast_to(x, (2, 4)), np.array([np.nan, -np.inf, -0.0, 1e-45], np.float32)),
    "int32": (lambda x: jnp.broadcast_to(x, (4, 3)), np.array([-(2**31), 7, 2**31 - 1], np.int32)),
    "bool": (lambda x: jnp.broadcast_to(x, (2, 3)), np.array([True, False, True])),
    "bfloat16": (lambda x: jnp.broadcast_to(x, (3, 2)), np.array([1.5, -np.inf], ml_dtypes.bfloat16)),
}


@pytest.mark.parametrize("backend", ["numba", "c"])
@pytest.mark.parametrize("name", list(CASES))
def test_a_lone_broadcast_is_a_numpy_step_with_jaxs_values(name, backend):
    fn, x = CASES[name]
    compiled = xfuse.jit(fn, backend=backend).lower(x).compile()
    steps = lower(compiled.module).program["steps"]
    assert [s.get("fn") for s in steps if s["op"] == "library"] == ["broadcast"]
    assert not any(s["op"] == "kernel" for s in steps), "a kernel was compiled for the broadcast"
    got, want = np.asarray(compiled(x)), np.asarray(jax.jit(fn)(x))
    assert got.dtype == want.dtype and got.shape == want.shape
    assert got.tobytes() == want.tobytes()


def test_the_result_is_a_buffer_of_its_own():
    x = M34.copy()
    got = xfuse.jit(CASES["leading_axis"][0])(x)
    assert np.asarray(got).flags.writeable and not np.shares_memory(np.asarray(got), x)
    x[0, 0] = 100.0
    assert np.asarray(got)[0, 0, 0] == M34[0, 0]


def test_in_a_loop_body_it_stays_a_kernel_and_the_loop_runs_natively():
    def fill_in_loop(s):
        body = lambda i, c: (c[0] + 1, jnp.broadcast_to(c[0], (8,)))  # noqa: E731
        return lax.fori_loop(0, 3, body, (s, jnp.zeros((8,), jnp.float32)))

    module = traced(fill_in_loop, np.float32(1))
    lowered, drivers = drivers_of(module)
    loops = [s for s in walk(lowered.program) if s["op"] == "while"]
    assert loops and all(s.get("native") in drivers for s in loops)
    body = loops[0]["body"]["steps"]
    assert any(s["op"] == "kernel" and s["label"] == "broadcast_in_dim" for s in body)
    assert not any(s["op"] == "library" for s in body)
    s, filled = compile_module(module)([np.float32(1)])
    assert s == 4 and np.array_equal(filled, np.full(8, 3, np.float32))


def test_in_a_branch_inside_a_loop_it_stays_a_kernel_and_the_loop_runs_natively():
    def branch_fill_in_loop(s):
        def body(i, c):
            v = lax.cond(c[0] > 2, lambda t: jnp.broadcast_to(t, (8,)), lambda t: jnp.broadcast_to(-t, (8,)), c[0])
            return c[0] + 1, v

        return lax.fori_loop(0, 5, body, (s, jnp.zeros((8,), jnp.float32)))

    module = traced(branch_fill_in_loop, np.float32(1))
    lowered, drivers = drivers_of(module)
    loops = [s for s in walk(lowered.program) if s["op"] == "while"]
    assert loops and all(s.get("native") in drivers for s in loops)
    assert not any(s["op"] == "library" for s in walk(lowered.program))
    s, filled = compile_module(module)([np.float32(1)])
    want_s, want = jax.jit(branch_fill_in_loop)(np.float32(1))
    assert s == want_s and np.array_equal(filled, np.asarray(want))
