"""Asynchronous calls, errors inside kernels, many threads calling one jitted function, and the
runtime's imports."""

from __future__ import annotations

import concurrent.futures
import subprocess
import sys
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import xfuse
from xfuse.runtime import BufferSpec, Executable, KernelError, Step
from xfuse.runtime.asynchronous import call_async

F32 = np.dtype(np.float32)


def test_call_async_returns_a_future_with_the_same_result():
    fn = lambda x, y: (jnp.tanh(x) @ y, jnp.sum(jnp.exp(y), axis=0))  # noqa: E731
    x, y = np.random.default_rng(0).standard_normal((2, 32, 32)).astype(np.float32)
    jitted = xfuse.jit(fn)
    future = jitted.call_async(x, y)
    assert isinstance(future, concurrent.futures.Future)
    got = future.result(timeout=60)
    want = jitted(x, y)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    compiled = jitted.lower(x, y).compile()
    for g, w in zip(compiled.call_async(x, y).result(timeout=60), want):
        np.testing.assert_array_equal(g, w)


def test_call_async_checks_arguments_at_once():
    compiled = xfuse.jit(lambda x: x + 1).lower(np.ones(3, np.float32)).compile()
    with pytest.raises(TypeError, match="argument x"):
        compiled.call_async(np.ones(4, np.float32))


def test_independent_steps_run_at_the_same_time():
    """Two steps with no path between them must both be running at once: each waits at a
    two-party barrier, which breaks (failing the future) if they ran one after the other."""
    barrier = threading.Barrier(2, timeout=10)

    def meet(inputs, outputs):
        barrier.wait()
        outputs[0][...] = inputs[0] + 1

    def join(inputs, outputs):
        outputs[0][...] = inputs[0] + inputs[1]

    spec = (BufferSpec((4,), F32),)
    steps = [Step("left", "kernel", meet, (0,), (1,), spec), Step("right", "kernel", meet, (0,), (2,), spec),
             Step("join", "kernel", join, (1, 2), (3,), spec)]
    executable = Executable([0], [3], steps, {}, 4, {}, [BufferSpec((4,), F32)])
    result = call_async(executable, [np.ones(4, np.float32)]).result(timeout=30)
    np.testing.assert_array_equal(result[0], 4)


def test_an_error_in_a_kernel_reaches_the_future_naming_it():
    def boom(inputs, outputs):
        raise FloatingPointError("bad value")

    spec = (BufferSpec((4,), F32),)
    steps = [Step("fusion.3", "kernel", boom, (0,), (1,), spec, "loop fusion fused_exp_add")]
    executable = Executable([0], [1], steps, {}, 2, {}, [BufferSpec((4,), F32)])
    future = call_async(executable, [np.ones(4, np.float32)])
    error = future.exception(timeout=30)
    assert isinstance(error, KernelError)
    assert "fusion.3" in str(error) and "fused_exp_add" in str(error) and "bad value" in str(error)
    with pytest.raises(KernelError, match="fusion.3"):
        executable([np.ones(4, np.float32)])


def test_many_threads_with_mixed_signatures_compile_each_once():
    traces = []

    def fn(x, y):
        traces.append(x.shape)
        return jax.nn.softmax(x * y, axis=-1), jnp.max(x, axis=0)

    jitted = xfuse.jit(fn)
    shapes = [(4, 8), (16, 32), (3, 5), (64, 64)]
    rng = np.random.default_rng(1)
    cases = [(rng.standard_normal(s).astype(np.float32), np.float32(rng.uniform(0.5, 2))) for s in shapes]
    wants = [jax.jit(fn)(x, y) for x, y in cases]
    traces.clear()
    errors = []

    def work(seed):
        order = np.random.default_rng(seed).integers(0, len(cases), 60)
        for k in order:
            x, y = cases[k]
            got = jitted(x, y) if k % 2 else jitted.call_async(x, y).result(timeout=60)
            for g, w in zip(got, wants[k]):
                if not np.allclose(g, w, rtol=1e-5, atol=1e-6):
                    errors.append((seed, k))

    threads = [threading.Thread(target=work, args=(s,)) for s in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert sorted(traces) == sorted(shapes), "a signature was traced more than once"


def test_importing_the_runtime_imports_neither_jax_nor_numba():
    code = ("import sys; import xfuse.runtime, xfuse.runtime.asynchronous, xfuse.runtime.plan; "
            "bad = [m for m in ('jax', 'jaxlib', 'numba', 'llvmlite') if m in sys.modules]; "
            "print(bad); sys.exit(1 if bad else 0)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
