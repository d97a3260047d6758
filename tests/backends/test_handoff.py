"""Split kernels through workers that watch for work without the GIL (backends/numba/handoff.py):
the same results as on one thread, chunks really run by the workers, kernels split only where
workers watch when their work is middling, arguments not as compiled and chunks that raise
handled by the caller, several callers at once, a forked child, a new thread count, and BLAS's
own threads left alone."""

from __future__ import annotations

import threading
import time

import jax
import jax.numpy as jnp
import numba
import numpy as np
import pytest

import xfuse
from xfuse.backends.numba import backend as numba_backend
from xfuse.backends.numba import handoff
from xfuse.runtime import parallel, products

from .test_parallel import chain, kernel_steps, layer_norm, mlp_softmax
from .test_parallel import row_softmax as softmax


def layer_norm_plain(x):
    return layer_norm(x, 1.0, 0.0)


def row_sums(x):
    return jnp.sum(x, axis=-1)


CASES = {  # name: (function, shape); each splits always ("parallel")
    "chain": (chain, (1001, 1024)),
    "softmax": (softmax, (1001, 1024)),
    "layer_norm": (layer_norm_plain, (1001, 1024)),
    "row_sums": (row_sums, (4099, 256)),
    "softmax_rows_of_12": (softmax, (43691, 12)),
}


def data(shape, seed=0) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    x.flat[:4] = [np.nan, np.inf, -np.inf, -0.0]
    return x


@pytest.fixture
def threads():
    """set(n): n threads for kernels; the workers are made afresh for the test and retired
    after it."""
    retire_workers()
    yield parallel.set_num_threads
    parallel.set_num_threads(None)
    retire_workers()


def retire_workers() -> None:
    if handoff._workers is not None:
        handoff._workers.close()
        handoff._workers = None


@pytest.fixture
def watching_forever(monkeypatch, threads):
    """Workers that, once woken, watch until told to stop, never give way, and always get to
    run their chunks (the test then decides when they are at hand)."""
    monkeypatch.setattr(handoff, "_rate", [1e18])  # ticks a second: 100 us is some 10^14 ticks
    real = handoff._Workers.__init__

    def patient(pool, count):
        real(pool, count)
        pool.patience = 1 << 62

    monkeypatch.setattr(handoff._Workers, "__init__", patient)
    return threads


def wait_for(condition, seconds=20.0) -> None:
    end = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.001)


def worker_state(w: int = 0) -> int:
    return int(handoff._workers.state[w * handoff.ROW + handoff.STATE])


@pytest.mark.parametrize("count", [2, 3])
@pytest.mark.parametrize("name", list(CASES))
def test_splits_through_the_workers_match_one_thread(watching_forever, name, count):
    threads = watching_forever
    fn, shape = CASES[name]
    x = data(shape)
    compiled = xfuse.jit(fn).lower(x).compile()
    assert all(s["parallel"] for s in kernel_steps(compiled))
    threads(1)
    serial = np.asarray(compiled(x))
    threads(count)
    compiled(x)  # the first call compiles (or loads) the kernel: the runtime's pool splits it
    before = handoff.served()
    for _ in range(3):
        np.testing.assert_array_equal(np.asarray(compiled(x)), serial)
    assert handoff.served() - before >= 3 * (count - 1), "the workers ran no chunk"
    # sums of 256 elements near zero differ from XLA's order in their last bits
    np.testing.assert_allclose(serial, jax.jit(fn)(x), rtol=2e-5, atol=1e-4 if name == "row_sums" else 2e-6)


def test_middling_kernels_split_only_where_workers_watch(watching_forever):
    x = data(1 << 16)
    compiled = xfuse.jit(chain).lower(x).compile()
    (step,) = kernel_steps(compiled)
    assert step["watching"] and not step["parallel"]
    watching_forever(2)
    want = np.asarray(compiled(x))  # compiled on this call, on this thread
    handoff._get_workers(1).last = 0.0  # long ago: a lone call
    before = handoff.served()
    got = compiled(x)
    assert handoff.served() == before and worker_state() == handoff.AWAY  # nobody woken
    np.testing.assert_array_equal(got, want)
    compiled(x), compiled(x)  # a run of calls: the second wakes the worker
    wait_for(lambda: worker_state() == handoff.WATCHING)
    before = handoff.served()
    got = compiled(x)
    assert handoff.served() == before + 1
    np.testing.assert_array_equal(got, want)
    np.testing.assert_allclose(want, jax.jit(chain)(x), rtol=2e-5, atol=2e-6)


def test_blas_on_its_own_threads_quiets_the_workers(watching_forever):
    x = data(1 << 16)
    compiled = xfuse.jit(chain).lower(x).compile()
    watching_forever(2)
    compiled(x)  # compiled on this call
    compiled(x), compiled(x)  # a run of calls wakes the worker
    wait_for(lambda: worker_state() == handoff.WATCHING)
    parallel.quiet()
    wait_for(lambda: worker_state() == handoff.AWAY)
    # a product on numpy's BLAS threads through xfuse does the same (one below the size that
    # the numba backend splits itself, `products._splits`)
    compiled(x), compiled(x)
    wait_for(lambda: worker_state() == handoff.WATCHING)
    a = np.ones((128, 128), np.float32)
    assert a.size * 128 < products.SPLIT_PRODUCT_MIN
    np.testing.assert_allclose(xfuse.jit(lambda p, q: p @ q)(a, a), a @ a)
    wait_for(lambda: worker_state() == handoff.AWAY)


def test_no_watching_split_beside_blas_threads(monkeypatch, watching_forever):
    """softmax(relu(x @ w + b)) at 64x512 @ 512x1024 with its product on BLAS's own threads
    (the numba backend not splitting it itself, as where oneDNN is not preferred), which spin
    after it, so the middling epilogue never splits."""
    monkeypatch.setattr(numba_backend, "split_enabled", lambda: False)
    rng = np.random.default_rng(1)
    x, w, b = (rng.standard_normal(s).astype(np.float32) * 0.1 for s in [(64, 512), (512, 1024), (1024,)])
    fn = mlp_softmax
    compiled = xfuse.jit(fn).lower(x, w, b).compile()
    (step,) = kernel_steps(compiled)
    assert step["watching"]
    calls = []
    real = handoff.Splitter.__call__
    monkeypatch.setattr(handoff.Splitter, "__call__", lambda s, *a, **k: calls.append(a) or real(s, *a, **k))
    watching_forever(2)
    for _ in range(3):
        got = compiled(x, w, b)
    assert calls == []
    np.testing.assert_allclose(got, jax.jit(fn)(x, w, b), rtol=2e-5, atol=2e-6)


@numba.njit(nogil=True)
def _scale_rows(start, end, x, out):
    for i in range(start, end):
        for j in range(x.shape[1]):
            out[i, j] = x[i, j] * 2.0


@numba.njit(nogil=True, error_model="numpy")
def _refuses_negative(start, end, x, out):
    for i in range(start, end):
        if x[i] < 0:
            raise ValueError("a negative row")
        out[i] = x[i]


@numba.njit(nogil=True)
def _with_a_float(start, end, x, scale):
    for i in range(start, end):
        x[i] *= scale


@numba.njit(nogil=True)
def _ten_arrays(start, end, a, b, c, d, e, f, g, h, i, j):
    for k in range(start, end):
        a[k, 0] = b[k, 0] + c[k, 0] + d[k, 0] + e[k, 0] + f[k, 0] + g[k, 0] + h[k, 0] + i[k, 0] + j[k, 0]


def test_a_chunk_the_worker_has_not_begun_is_taken_back(threads):
    """The caller runs a worker's chunk itself when the worker has not begun it by the time the
    caller's own is done (here: never woken); the worker hears of it later and serves on."""
    threads(2)
    x = np.arange(64.0, dtype=np.float32).reshape(16, 4)
    out = np.zeros_like(x)
    _scale_rows(0, 16, x, out)
    pool = handoff._get_workers(1)

    class Lost:  # a wake that never arrives
        def put(self, token):
            pass

    wake, pool.wake = pool.wake, [Lost()]
    before = handoff.served()
    assert handoff.Splitter(_scale_rows)((x, out), 16)
    np.testing.assert_array_equal(out, x * 2)
    assert handoff.served() == before and worker_state() == handoff.CLAIMED
    pool.wake = wake
    wake[0].put(True)  # the wake it missed: it finds its chunk taken, and watches
    wait_for(lambda: worker_state() in (handoff.WATCHING, handoff.AWAY))
    out[:] = 0
    assert handoff.Splitter(_scale_rows)((x, out), 16)
    np.testing.assert_array_equal(out, x * 2)


def test_many_small_splits_then_the_workers_rest(threads):
    """Thousands of splits of a tiny kernel, back to back: chunks run by the worker and chunks
    taken back from it (each posted to a worker still answering the last) all give the right
    rows, and once the calls stop the worker stops watching."""
    threads(2)
    x = np.arange(64.0)
    out = np.zeros(64)
    _doubled(0, 64, x, out)
    split = handoff.Splitter(_doubled)
    for _ in range(5000):
        out[:] = 0
        assert split((x, out), 64)
        np.testing.assert_array_equal(out, 2 * x)
    wait_for(lambda: worker_state() == handoff.AWAY, seconds=5)


@numba.njit(nogil=True)
def _doubled(start, end, x, out):
    for i in range(start, end):
        out[i] = 2 * x[i]


def test_arguments_not_as_compiled_leave_the_split_to_the_runtime(threads):
    threads(2)
    x = np.arange(64.0, dtype=np.float32).reshape(16, 4)
    out = np.zeros_like(x)
    _scale_rows(0, 16, x, out)  # compiled for C-contiguous arrays
    split = handoff.Splitter(_scale_rows)
    out[:] = 0
    assert split((x, out), 16)
    np.testing.assert_array_equal(out, x * 2)
    out[:] = 0
    assert not split((np.asfortranarray(x), out), 16)  # another layout: numba would compile again
    assert not split((x.astype(np.float64), out), 16)
    assert not split((x, out[:, ::2]), 8)
    assert not split((x, 3), 16)
    np.testing.assert_array_equal(out, 0)  # nothing ran
    y = np.ones(8, np.float32)
    _with_a_float(0, 8, y, 2.0)
    assert not handoff.Splitter(_with_a_float)((y, 2.0), 8)  # a float travels in another register
    arrays = tuple(np.zeros((2, 2)) for _ in range(10))  # 90 words
    _ten_arrays(0, 2, *arrays)
    assert not handoff.Splitter(_ten_arrays)(arrays, 2)


@pytest.mark.parametrize("bad_row", [1, 90])  # in the caller's chunk, in the worker's
def test_a_chunk_that_raises_raises_in_the_caller(threads, bad_row):
    threads(2)
    x = np.ones(100)
    out = np.zeros(100)
    _refuses_negative(0, 100, x, out)
    x[bad_row] = -1
    with pytest.raises(ValueError, match="a negative row"):
        handoff.Splitter(_refuses_negative)((x, out), 100)
    x[bad_row] = 1
    out[:] = 0
    assert handoff.Splitter(_refuses_negative)((x, out), 100)  # the workers serve on
    np.testing.assert_array_equal(out, 1)


def test_callers_in_several_threads(threads):
    threads(2)
    x = data((1001, 1024))
    compiled = xfuse.jit(softmax).lower(x).compile()
    want = np.asarray(compiled(x))
    errors = []

    def work():
        try:
            for _ in range(30):
                np.testing.assert_array_equal(np.asarray(compiled(x)), want)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    team = [threading.Thread(target=work) for _ in range(4)]
    for t in team:
        t.start()
    for t in team:
        t.join(120)
    assert not errors and not any(t.is_alive() for t in team)


FORK = """
import os, sys
import numba, numpy as np
from xfuse.backends.numba import handoff
from xfuse.runtime import parallel

@numba.njit(nogil=True)
def double(start, end, x, out):
    for i in range(start, end):
        out[i] = 2 * x[i]

parallel.set_num_threads(2)
x = np.arange(1000.0)
out = np.zeros(1000)
double(0, 1000, x, out)
split = handoff.Splitter(double)
for _ in range(3):  # the parent's workers exist, and watch
    assert split((x, out), 1000)
pid = os.fork()
if pid == 0:
    out[:] = 0
    done = split((x, out), 1000) and (out == 2 * x).all()  # a worker of its own, or the chunk taken back
    os._exit(0 if done else 3)
assert split((x, out), 1000)
_, status = os.waitpid(pid, 0)
sys.exit(os.waitstatus_to_exitcode(status))
"""


def test_a_forked_child_splits_with_workers_of_its_own():
    import os
    import subprocess
    import sys

    run = subprocess.run([sys.executable, "-c", FORK], timeout=120, capture_output=True, text=True,
                         env=os.environ)
    assert run.returncode == 0, run.stderr


def test_a_new_thread_count_makes_new_workers(threads):
    x = data((1001, 1024))
    compiled = xfuse.jit(layer_norm_plain).lower(x).compile()
    threads(1)
    want = np.asarray(compiled(x))
    for count in (3, 2, 3):
        threads(count)
        compiled(x)
        np.testing.assert_array_equal(np.asarray(compiled(x)), want)
        assert handoff._workers.count == count - 1
