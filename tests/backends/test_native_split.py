"""Kernels too small for the pool's threads but with NATIVE_SPLIT_MIN_WORK or more split over
numba's own threads (a `prange` twin of the kernel), in programs of kernels alone: the split
changes no result, a forked child, a pool thread and one thread run the kernel whole, and a
second process loads the twin from the disk cache."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import xfuse
from xfuse.backends.numba.analysis import NATIVE_SPLIT_MIN_WORK, PARALLEL_MIN_WORK
from xfuse.runtime import parallel


def chain(x):
    return jnp.tanh(x) * jax.nn.sigmoid(1.5 * x) + 0.5 * x


def edge_inputs(n: int, seed: int = 3) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal(n).astype(np.float32) * 4
    x[:8] = [np.nan, np.inf, -np.inf, -0.0, 0.0, 3e38, -3e38, 1e-45]
    return x


def the_step(compiled):
    (step,) = compiled.executable.steps
    return step


def test_a_mid_sized_kernel_splits_over_numbas_threads_and_agrees_with_jax():
    x = edge_inputs(1 << 16)
    work = x.size * 9  # 1 + 4 per transcendental (tanh, logistic)
    assert NATIVE_SPLIT_MIN_WORK <= work < PARALLEL_MIN_WORK
    compiled = xfuse.jit(chain).lower(x).compile()
    step = the_step(compiled)
    assert step.run.__name__ == "natively"
    twin = step.run.dispatcher.split
    assert twin is not None and not twin.overloads
    first, second = compiled(x), compiled(x + 1)
    assert twin.overloads, "the twin never ran"
    for given, got in ((x, first), (x + 1, second)):
        want = jax.jit(chain)(given)
        np.testing.assert_allclose(got, want, rtol=2e-6, atol=2e-7)
        np.testing.assert_array_equal(np.signbit(got[np.asarray(want) == 0]), np.signbit(want[want == 0]))


@pytest.mark.parametrize("threads", [1, 2, 3, 7])
def test_the_split_changes_no_bit(threads):
    x = edge_inputs(100_003)  # rows that do not divide evenly
    compiled = xfuse.jit(chain).lower(x).compile()
    whole = np.empty_like(x)
    the_step(compiled).run.dispatcher(0, x.size, x, whole)
    try:
        parallel.set_num_threads(threads)
        got = compiled(x)
    finally:
        parallel.set_num_threads(None)
    np.testing.assert_array_equal(got.view(np.int32), whole.view(np.int32))


def test_small_kernels_and_programs_with_products_have_no_twin():
    small = np.ones(1 << 10, np.float32)
    step = the_step(xfuse.jit(chain).lower(small).compile())
    assert step.run.__name__ != "natively" and step.run.dispatcher.split is None
    x, w = edge_inputs(1 << 16).reshape(256, 256), np.full((256, 64), 0.01, np.float32)

    def chain_and_product(x, w):  # the chain's kernel is mid-sized, the program has a product
        return chain(x), x @ w

    compiled = xfuse.jit(chain_and_product).lower(x, w).compile()
    kernels = [s for s in compiled.executable.steps if s.kind == "kernel"]
    assert kernels and all(s.run.__name__ != "natively" and s.run.dispatcher.split is None for s in kernels)
    for got, want in zip(compiled(x, w), jax.jit(chain_and_product)(x, w)):
        np.testing.assert_allclose(got, want, rtol=2e-6, atol=2e-6)


def test_pool_threads_and_one_thread_run_it_whole(monkeypatch):
    calls = []  # (the calling thread, the parts it may split into)
    real = parallel.native_parts

    def spy():
        calls.append((threading.get_ident(), real()))
        return calls[-1][1]

    from xfuse.runtime import program

    monkeypatch.setattr(program, "native_parts", spy)
    x = edge_inputs(1 << 16)
    compiled = xfuse.jit(chain).lower(x).compile()
    want = np.asarray(jax.jit(chain)(x))
    results = [compiled(x)]
    try:
        parallel.set_num_threads(2)
        parallel.run_rows(lambda s, e: results.append(compiled(x)), 2)  # one call per chunk
        pool = [parts for thread, parts in calls if thread != threading.get_ident()]
        parallel.set_num_threads(1)
        results.append(compiled(x))
    finally:
        parallel.set_num_threads(None)
    assert pool == [1], calls  # the pool thread's call
    assert calls[-1][1] == 1
    for got in results:
        np.testing.assert_allclose(got, want, rtol=2e-6, atol=2e-7)


def test_calls_from_several_threads_at_once_are_right():
    x = [edge_inputs(1 << 16, seed) for seed in range(4)]
    jitted = xfuse.jit(chain)
    wants = [np.asarray(jax.jit(chain)(v)) for v in x]
    jitted(x[0])
    errors = []

    def work(k):
        for _ in range(20):
            got = jitted(x[k])
            if not np.allclose(got, wants[k], rtol=2e-6, atol=2e-7, equal_nan=True):
                errors.append(k)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads) and not errors


FORK = """
import os, sys
import numpy as np
import jax, jax.numpy as jnp
import xfuse

def chain(x):
    return jnp.tanh(x) * jax.nn.sigmoid(1.5 * x) + 0.5 * x

jitted = xfuse.jit(chain)
x = np.linspace(-5, 5, 1 << 16, dtype=np.float32)
jitted(x)
jitted(x)  # numba's OpenMP threads have run the split
want = np.asarray(jax.jit(chain)(x + 1))
read, write = os.pipe()
pid = os.fork()
if pid == 0:  # the child hangs if it splits over numba's threads again (GNU OpenMP)
    got = jitted(x + 1)
    os.write(write, b"ok" if np.allclose(got, want, rtol=2e-6, atol=2e-7) else b"wrong")
    os._exit(0)
_, status = os.waitpid(pid, 0)
print(os.read(read, 16).decode(), os.waitstatus_to_exitcode(status))
"""


def test_a_forked_child_runs_the_kernel_whole():
    run = subprocess.run([sys.executable, "-W", "ignore", "-c", FORK], timeout=90, capture_output=True,
                         text=True, env={**os.environ, "XFUSE_NUM_THREADS": "2"})
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["ok", "0"], (run.stdout, run.stderr[-2000:])


SECOND = """
import warnings
warnings.simplefilter("error")  # a rejected cache entry warns
import numpy as np
import jax, jax.numpy as jnp
import xfuse
from xfuse.backends.numba import cache

def chain(x):
    return jnp.tanh(x) * jax.nn.sigmoid(1.5 * x) + 0.5 * x

x = np.linspace(-5, 5, 1 << 16, dtype=np.float32)
compiled = xfuse.jit(chain).lower(x).compile()
got = compiled(x)
(step,) = compiled.executable.steps
twin = step.run.dispatcher.split
print(cache.stats.hits, cache.stats.misses, cache.stats.rejected, sum(twin.stats.cache_hits.values()),
      sum(twin.stats.cache_misses.values()), bool(np.allclose(got, jax.jit(chain)(x), rtol=2e-6, atol=2e-7)))
"""


def test_a_second_process_loads_the_twin_from_the_cache(tmp_path):
    env = {**os.environ, "XFUSE_CACHE_DIR": str(tmp_path), "XFUSE_NUM_THREADS": "2"}
    first = subprocess.run([sys.executable, "-c", SECOND], timeout=300, capture_output=True, text=True, env=env)
    second = subprocess.run([sys.executable, "-c", SECOND], timeout=300, capture_output=True, text=True, env=env)
    assert first.returncode == 0 and second.returncode == 0, first.stderr[-2000:] + second.stderr[-2000:]
    assert first.stdout.split() == ["0", "1", "0", "0", "1", "True"], first.stdout
    assert second.stdout.split() == ["1", "0", "0", "1", "0", "True"], second.stdout


def test_a_program_with_a_loop_and_a_product_never_splits_natively():
    """build's own decision, with every kernel given a twin regardless of lowering's: a loop
    step before a mid-sized kernel once made build forget the program's product."""
    from xfuse.backends.numba.compile import compile_kernel, settle
    from xfuse.backends.numba.lowering import lower
    from xfuse.backends.numba.native_loop import native_loops
    from xfuse.runtime.program import Kernel, build, splits_natively

    def scan_then_chain(xs, w):  # a recurrent loop (a while step), then a mid-sized kernel
        h, hs = jax.lax.scan(lambda h, x: (jnp.tanh(x + h @ w), h), jnp.zeros((8, 128), jnp.float32), xs)
        return chain(hs) + h

    xs, w = edge_inputs(32 * 8 * 128).reshape(32, 8, 128) * 0.01, np.eye(128, dtype=np.float32) * 0.5
    module = xfuse.jit(scan_then_chain).lower(xs, w).compile().module
    lowered = lower(module)
    assert [s["op"] for s in lowered.program["steps"]].count("while") == 1
    assert not splits_natively(lowered.program)
    for source in lowered.kernels.values():
        source.native_split = source.dot is None and source.rows > 1
    kernels = {}
    for name, source in lowered.kernels.items():
        fn = compile_kernel(source)
        kernels[name] = Kernel(fn, settle, split=fn.split)
    assert any(k.split is not None for k in kernels.values())
    kernels.update(native_loops(lowered.program, kernels, lowered.constants, lowered.bodies))
    executable = build(lowered.program, kernels, lowered.constants)
    assert [s.name for s in executable.steps if getattr(s.run, "__name__", "") == "natively"] == []
    (got,) = executable([xs, w])
    np.testing.assert_allclose(got, jax.jit(scan_then_chain)(xs, w), rtol=2e-5, atol=2e-6)


WORKQUEUE = """
import numpy as np
import jax, jax.numpy as jnp
import xfuse

def chain(x):
    return jnp.tanh(x) * jax.nn.sigmoid(1.5 * x) + 0.5 * x

x = np.linspace(-5, 5, 1 << 16, dtype=np.float32)
compiled = xfuse.jit(chain).lower(x).compile()
(step,) = compiled.executable.steps
print(step.run.dispatcher.split is None, bool(np.allclose(compiled(x), jax.jit(chain)(x), rtol=2e-6, atol=2e-7)))
"""


@pytest.mark.parametrize("setting", [{"NUMBA_THREADING_LAYER": "workqueue"}, {"NUMBA_NUM_THREADS": "1"}])
def test_no_twin_where_numbas_threads_cannot_take_it(setting):
    """workqueue stops the process when two threads enter it at once; one thread splits
    nothing."""
    run = subprocess.run([sys.executable, "-c", WORKQUEUE], timeout=300, capture_output=True, text=True,
                         env={**os.environ, "XFUSE_CACHE_DIR": "off", **setting})
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split() == ["True", "True"], run.stdout
