"""Native loop drivers keep the values they compute in work buffers made for each call
(`native_loop._Writer.buffer`), not in numba's np.empty every iteration: a value that may
become state has two, used by turns. Each test fails if a buffer is reused while a value in it
is still read: results are compared with the reference interpreter, exactly, for several trip
counts, and with the outputs of an earlier call, which a later call must not overwrite. The
kernels and helpers a driver calls are compiled as callees, without machine code of their own."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from tests.backends.test_native_loop import drivers_of, rnn, rnn_inputs, traced
from xfuse.backends.numba.backend import compile_module
from xfuse.hlo import interpret


def run_and_compare(module, *args, rtol=0.0):
    """The compiled module's results, checked against the interpreter's (exactly, or to
    `rtol` where products are summed in another order or tanh and sin are xfuse's own); twice,
    the first call's outputs kept, so a second call writing into them shows."""
    run = compile_module(module)
    want = interpret(module, *args)
    want = list(want) if isinstance(want, (list, tuple)) else [want]
    first = run([np.copy(a) for a in args])
    kept = [np.copy(g) for g in first]
    second = run([np.copy(a) for a in args])
    for got in (first, second):
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=rtol, atol=rtol)
    for g, k in zip(first, kept):
        np.testing.assert_array_equal(g, k)
        assert g.base is None or g.base.size == g.size  # no other buffer kept alive


def driver_source(module) -> tuple[str, object]:
    _, drivers = drivers_of(module)
    (driver,) = drivers.values()
    return driver.fn.source, driver.fn.driver


def test_the_rnn_computes_into_work_buffers():
    args = rnn_inputs(steps=6)
    module = traced(rnn, *args)
    source, driver = driver_source(module)
    assert "np.empty" not in source
    assert "turn = 1 - turn" in source and " if turn else " in source  # h: two buffers by turns
    turns = [dims for dims, _, by_turns in driver.scratch if by_turns]
    assert (3, 8) in turns  # the new h (batch 3, hidden 8)
    run_and_compare(module, *args, rtol=1e-6)


def step(c):
    """Both values anew from both old ones, read in reverse order (an elementwise step would
    read each element before writing it, and hide a buffer written too early)."""
    a, b = c
    return b[::-1] * 2.0 - a, a[::-1] + b * 0.5


def fresh_pair(a, b):
    return lax.fori_loop(0, 5, lambda i, c: step(c), (a, b))


def rotation(a, b):
    """The new b is the old a: a state value outlives the next iteration in another slot."""
    return lax.fori_loop(0, 5, lambda i, c: (jnp.tanh(c[0] + c[1][::-1]), c[0]), (a, b))


def branchy(a):
    """A conditional in the body: its values come from np.empty inside the branches."""
    def body(i, x):
        return lax.cond(i % 2 == 0, lambda v: v * 2.0 - 1.0, lambda v: jnp.sin(v), x)

    return lax.fori_loop(0, 5, body, a)


def vectors(n=7):
    rng = np.random.default_rng(5)
    return [rng.standard_normal(n).astype(np.float32) for _ in range(2)]


def test_values_computed_from_both_old_values_use_two_buffers_by_turns():
    module = traced(fresh_pair, *vectors())
    source, driver = driver_source(module)
    assert "np.empty" not in source and " if turn else " in source
    run_and_compare(module, *vectors())


def test_a_state_moved_to_another_slot_gets_fresh_buffers():
    module = traced(rotation, *vectors())
    source, driver = driver_source(module)
    assert " if turn else " not in source and "np.empty" in source
    run_and_compare(module, *vectors(), rtol=1e-6)


def test_values_in_branches_get_fresh_buffers():
    (a, _) = vectors()
    module = traced(branchy, a)
    source, _ = driver_source(module)
    assert "if " in source and "np.empty" in source
    run_and_compare(module, a, rtol=1e-6)


@pytest.mark.parametrize("steps", [0, 1, 2, 7])
def test_any_trip_count(steps):
    def scaled(a, b):
        return lax.fori_loop(0, steps, lambda i, c: step(c), (a, b))

    module = traced(scaled, *vectors())
    run_and_compare(module, *vectors())


def test_a_driver_calls_callee_forms_of_its_kernels_and_helpers():
    from xfuse.backends.numba.pipeline import CalleeCompiler, KernelCompiler

    module = traced(rnn, *rnn_inputs())
    _, drivers = drivers_of(module)
    (driver,) = drivers.values()
    (fn,) = [c.cell_contents for c in driver.fn.__closure__ if hasattr(c.cell_contents, "py_func")]
    names = fn.py_func.__globals__
    called = [name for name in names if name.startswith("kernel_") or name.startswith("small_matmul")]
    assert "kernel_1" in called and "small_matmul_t" in called
    for name in called:
        callee = names[name]
        assert callee.targetoptions["no_cpython_wrapper"] and callee.targetoptions["no_cfunc_wrapper"]
        compiler = KernelCompiler if name.startswith("kernel_") else CalleeCompiler
        assert callee._compiler.pipeline_class is compiler
