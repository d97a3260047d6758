"""Kernels split their rows over the runtime's threads when their estimated work reaches
PARALLEL_MIN_WORK, over threads already watching for work from WATCHING_MIN_WORK, and run on
the calling thread below it; the split changes no result; the thread count is configurable."""

from __future__ import annotations

import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import xfuse
from xfuse.backends.numba import handoff
from xfuse.backends.numba.analysis import PARALLEL_MIN_WORK
from xfuse.backends.numba.lowering import lower
from xfuse.runtime import parallel


def mlp_softmax(x, w, b):
    return jax.nn.softmax(jax.nn.relu(x @ w + b), axis=-1)


def row_softmax(x):
    return jax.nn.softmax(x, axis=-1)


def layer_norm(x, gamma, beta):
    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean((x - mean) ** 2, axis=-1, keepdims=True)
    return (x - mean) / jnp.sqrt(var + 1e-5) * gamma + beta


def chain(x):
    return jnp.tanh(x) * jax.nn.sigmoid(1.5 * x) + 0.5 * x


def inputs(name: str, rows: int, cols: int):
    rng = np.random.default_rng(7)
    f = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    if name == "mlp_softmax":
        return mlp_softmax, (f(rows, 64), f(64, cols) * 0.1, f(cols))
    if name == "row_softmax":
        return row_softmax, (f(rows, cols),)
    if name == "layer_norm":
        return layer_norm, (f(rows, cols), f(cols), f(cols))
    return chain, (f(rows, cols),)


class Spy:
    """Records the splits: chunks handed to the pool (the real pool runs them) and their
    threads, and splits through the watching workers (`handoff.Splitter`, real too), with the
    chunks those workers ran."""

    def __init__(self, real):
        self.real = real
        self.submitted = 0  # pool chunks and hand-off splits
        self.threads: set[int] = set()
        self.served = 0  # chunks the hand-off's workers ran

    def __call__(self, workers):
        pool = self.real(workers)
        spy = self

        class Recording:
            def submit(self, fn, *args):
                spy.submitted += 1

                def run():
                    spy.threads.add(threading.get_ident())
                    return fn(*args)

                return pool.submit(run)

        return Recording()

    def splitter(self, real):
        spy = self

        def call(splitter, *args, **kwargs):
            before = handoff.served()
            done = real(splitter, *args, **kwargs)
            if done:
                spy.submitted += 1
                spy.served += handoff.served() - before
            return done

        return call


@pytest.fixture
def two_threads(monkeypatch):
    parallel.set_num_threads(2)
    spy = Spy(parallel._get_pool)
    monkeypatch.setattr(parallel, "_get_pool", spy)
    monkeypatch.setattr(handoff.Splitter, "__call__", spy.splitter(handoff.Splitter.__call__))
    yield spy
    parallel.set_num_threads(None)


def kernel_steps(compiled) -> list[dict]:
    """The kernel steps of a compiled function's program, as the numba backend lowers it."""
    return [s for s in lower(compiled.module).program["steps"] if s["op"] == "kernel"]


WORKLOADS = ["mlp_softmax", "row_softmax", "layer_norm", "chain"]


@pytest.mark.parametrize("name", WORKLOADS)
def test_large_kernels_run_on_several_threads(two_threads, name):
    fn, args = inputs(name, 4096, 512)
    assert 4096 * 512 >= PARALLEL_MIN_WORK
    compiled = xfuse.jit(fn).lower(*args).compile()
    got = compiled(*args)
    assert two_threads.submitted >= 1, f"{name}: no kernel was split"
    assert threading.get_ident() not in two_threads.threads
    assert two_threads.served >= 1 or two_threads.threads, f"{name}: no chunk ran on another thread"
    np.testing.assert_allclose(got, jax.jit(fn)(*args), rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("name", WORKLOADS)
def test_small_kernels_stay_on_the_calling_thread(two_threads, name):
    fn, args = inputs(name, 64, 128)
    assert 64 * 128 * 9 < PARALLEL_MIN_WORK  # at most two transcendentals per element here
    got = xfuse.jit(fn)(*args)
    assert two_threads.submitted == 0, f"{name}: a small kernel went to the pool"
    np.testing.assert_allclose(got, jax.jit(fn)(*args), rtol=2e-5, atol=2e-6)


MEMORY_BOUND = {  # name: (function, shape, mode): work counts the bytes moved and the passes made
    "scale_2^19": (lambda x: x * 2.0 + 1.0, (512, 1024), "split"),  # few operations, 4 MiB moved
    "scale_2^18": (lambda x: x * 2.0 + 1.0, (256, 1024), "watching"),
    "scale_2^17": (lambda x: x * 2.0 + 1.0, (128, 1024), "one"),
    "layer_norm_2^18": (lambda x: layer_norm(x, 1.0, 0.0), (21845, 12), "split"),  # three passes
    "row_sums_2^17": (lambda x: jnp.sum(x, axis=-1), (512, 256), "one"),  # one pass, no output to speak of
    "row_sums_2^18": (lambda x: jnp.sum(x, axis=-1), (1024, 256), "one"),  # light: never split where threads watch
    "row_sums_2^20": (lambda x: jnp.sum(x, axis=-1), (4096, 256), "split"),
}


@pytest.mark.parametrize("name", list(MEMORY_BOUND))
def test_work_counts_memory_and_passes(two_threads, name):
    """A kernel splits always ("split"), where threads watch for work ("watching", see
    test_handoff), or never ("one")."""
    fn, shape, mode = MEMORY_BOUND[name]
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    compiled = xfuse.jit(fn).lower(x).compile()
    (step,) = kernel_steps(compiled)
    assert (step["parallel"], step["watching"]) == (mode == "split", mode == "watching"), name
    got = compiled(x)
    if mode == "split":
        assert two_threads.submitted >= 1, f"{name}: not split"
    if mode == "one":
        assert two_threads.submitted == 0, f"{name}: split {two_threads.submitted} times"
    np.testing.assert_allclose(got, jax.jit(fn)(x), rtol=2e-5, atol=2e-5)


def test_an_epilogues_work_leaves_out_the_products_operands(two_threads):
    """softmax(relu(x @ w + b)) at 64x512 @ 512x1024: BLAS reads w's 2 MiB, the epilogue over
    64x1024 does not, and stays on the calling thread (the product goes to BLAS as it is)."""
    rng = np.random.default_rng(1)
    x, w, b = (rng.standard_normal(s).astype(np.float32) * 0.1 for s in [(64, 512), (512, 1024), (1024,)])
    compiled = xfuse.jit(mlp_softmax).lower(x, w, b).compile()
    got = compiled(x, w, b)
    (step,) = kernel_steps(compiled)
    assert not step["parallel"]  # split only where threads watch for work (test_handoff)
    np.testing.assert_allclose(got, jax.jit(mlp_softmax)(x, w, b), rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("name", WORKLOADS)
def test_splitting_changes_no_result(name):
    fn, args = inputs(name, 300, 200)  # rows that do not divide evenly
    compiled = xfuse.jit(fn).lower(*args).compile()
    try:
        parallel.set_num_threads(1)
        serial = compiled(*args)
        parallel.set_num_threads(3)
        split = compiled(*args)
    finally:
        parallel.set_num_threads(None)
    np.testing.assert_array_equal(serial, split)


def test_thread_count_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv("XFUSE_NUM_THREADS", "3")
    assert parallel.num_threads() == 3
    parallel.set_num_threads(1)
    try:
        assert parallel.num_threads() == 1
    finally:
        parallel.set_num_threads(None)
    assert parallel.num_threads() == 3
    monkeypatch.setenv("XFUSE_NUM_THREADS", "many")
    with pytest.raises(ValueError, match="XFUSE_NUM_THREADS"):
        parallel.num_threads()
    for bad in (0, -1, 2.0, True):
        with pytest.raises(ValueError, match="thread count"):
            parallel.set_num_threads(bad)


@pytest.mark.parametrize("block_bytes", [1, 4096 * 3 + 8, 1 << 30])
def test_output_fusion_in_row_blocks_matches_jax(monkeypatch, block_bytes):
    """The dot of an output fusion computed a block of rows at a time (one row, several rows
    with a ragged last block, all rows) gives the same numbers."""
    from xfuse.runtime import program

    monkeypatch.setattr(program, "BLOCK_BYTES", block_bytes)
    fn, args = inputs("mlp_softmax", 37, 1024)
    compiled = xfuse.jit(fn).lower(*args).compile()
    assert compiled.kernel_count() == 1
    np.testing.assert_allclose(compiled(*args), jax.jit(fn)(*args), rtol=2e-5, atol=2e-6)
