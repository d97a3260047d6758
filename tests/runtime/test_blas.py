"""Products in xfuse's own threads (`runtime.blas`): numpy's OpenBLAS is found and set to one
thread while a product is split over the pool, the count comes back afterwards, the split
products equal numpy's, and a program takes this path exactly when it splits kernels."""

from __future__ import annotations

import threading
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import xfuse
from tests.tolerances import ACCUMULATION, assert_close
from xfuse.hlo import DType
from xfuse.runtime import blas, parallel
from xfuse.runtime import products as prog


@pytest.fixture
def two_threads():
    parallel.set_num_threads(2)
    yield
    parallel.set_num_threads(None)


def numpy_uses_openblas() -> bool:
    deps = np.show_config(mode="dicts")["Build Dependencies"]
    return "openblas" in str(deps.get("blas", {}).get("name", "")).lower()


def test_numpys_openblas_is_found():
    # numpy's wheels ship OpenBLAS: its thread count must be reachable, or nothing is split
    assert numpy_uses_openblas(), "this test expects numpy built with OpenBLAS"
    assert blas.controls(), "numpy's OpenBLAS was not found in /proc/self/maps"
    assert blas.available() == blas.ENABLED


def test_single_threaded_sets_one_thread_and_restores_the_count():
    before = blas.threads()
    with blas.single_threaded():
        assert blas.threads() == [1] * len(before)
        with blas.single_threaded():  # nested: still one, not restored early
            assert blas.threads() == [1] * len(before)
        assert blas.threads() == [1] * len(before)
    assert blas.threads() == before


def test_an_openblas_loaded_later_is_found_by_rescan_and_set_to_one_thread():
    """scipy's OpenBLAS (which numba's np.dot calls) loads after numpy's: `rescan` finds it,
    and inside an open block it runs on one thread at once, its count put back at the end."""
    import os
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent("""
        import numpy
        from xfuse.runtime import blas
        before = len(blas.controls())
        counts = blas.threads()
        with blas.single_threaded():
            import scipy.linalg.cython_blas
            assert len(blas._loaded_openblas()) == before + 1, blas._loaded_openblas()
            assert len(blas.controls()) == before  # not looked for yet
            blas.rescan()
            inside = blas.threads()
        assert len(blas.controls()) == before + 1
        assert inside == [1] * (before + 1), inside
        assert blas.threads()[:before] == counts and blas.threads()[before] > 1, blas.threads()
        print("ok")
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OPENBLAS_NUM_THREADS": "2"})
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


def test_concurrent_blocks_restore_once_the_last_leaves():
    before = blas.threads()
    inside, leave = threading.Event(), threading.Event()

    def other():
        with blas.single_threaded():
            inside.set()
            leave.wait(10)

    t = threading.Thread(target=other)
    t.start()
    assert inside.wait(10)
    with blas.single_threaded():
        pass
    assert blas.threads() == [1] * len(before), "restored while another block was still open"
    leave.set()
    t.join(10)
    assert blas.threads() == before


def _spy_gemm(monkeypatch) -> list:
    calls = []
    real = prog._gemm

    def gemm(a, b, out, *rest):
        calls.append((threading.get_ident(), blas.threads(), a.shape, b.shape))
        real(a, b, out, *rest)

    monkeypatch.setattr(prog, "_gemm", gemm)
    return calls


@pytest.mark.parametrize("a_shape, b_shape", [
    ((512, 384), (384, 256)),  # rows split
    ((8, 128, 96), (8, 96, 128)),  # the batch split
    ((1, 700, 160), (1, 160, 200)),  # one batch: its rows split
    ((64, 512), (512, 1024)),  # wider than tall: columns split
    ((1, 96, 160), (1, 160, 801)),  # one batch, wider than tall: columns split (odd count)
    ((1, 4096), (4096, 1200)),  # a vector: one thread
    ((40, 30), (30, 20)),  # small: one thread
    ((64, 0), (0, 96)),  # nothing to contract: zeros
])
def test_own_products_match_numpy_and_run_single_threaded(monkeypatch, two_threads, a_shape, b_shape):
    rng = np.random.default_rng(0)
    a = rng.standard_normal(a_shape).astype(np.float32)
    b = rng.standard_normal(b_shape).astype(np.float32)
    a.reshape(-1)[::97] = np.inf  # inf * 0 gives NaN without a warning, in every thread
    b.reshape(-1)[::89] = 0.0
    with np.errstate(invalid="ignore"):
        want = np.matmul(a.astype(np.float64), b.astype(np.float64)).astype(np.float32)
    out = np.empty(want.shape, np.float32)
    calls = _spy_gemm(monkeypatch)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # filters are process-wide: a pool thread's warning raises
        prog.matmul(a, b, out, np.dtype(np.float32), own=True)
    macs = a.size * b.shape[-1]
    big = macs >= prog.SPLIT_PRODUCT_MIN and a.shape[-2] > 1
    assert len({ident for ident, _, _, _ in calls}) == (2 if big else 1)
    assert all(counts == [1] * len(blas.controls()) for _, counts, _, _ in calls)
    if big and a.ndim == 2 or big and a.shape[0] < 2:  # the rows or the columns split
        wide = b.shape[-1] > a.shape[-2]
        assert all(part_a == a.shape for _, _, part_a, _ in calls) == wide  # each packs all of A
        assert all(part_b == b.shape for _, _, _, part_b in calls) == (not wide)  # or all of B
        assert sum((part_b if wide else part_a)[-1 if wide else -2] for _, _, part_a, part_b in calls) \
            == (b.shape[-1] if wide else a.shape[-2])
    scale = np.abs(a).clip(max=1e3).sum(-1, keepdims=True) * np.abs(b).max(initial=0.0)
    assert_close(out, want, DType.F32, "own product", ACCUMULATION, scale=np.broadcast_to(scale, out.shape))


def _own_flags(monkeypatch) -> list:
    flags = []
    real = prog.matmul

    def matmul(a3, b3, out, work, own=False, backend=None):
        flags.append(own)
        real(a3, b3, out, work, own, backend)

    monkeypatch.setattr(prog, "matmul", matmul)
    return flags


def attention(q, k, v):
    s = jnp.einsum("bqd,bkd->bqk", q, k) / 8.0
    return jnp.einsum("bqk,bkd->bqd", jax.nn.softmax(s, axis=-1), v)


def test_a_program_that_splits_kernels_runs_its_products_in_its_threads(monkeypatch, two_threads):
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((16, 256, 64)).astype(np.float32) for _ in range(3))
    flags = _own_flags(monkeypatch)
    got = xfuse.jit(attention)(q, k, v)
    assert flags and all(flags), flags
    want = jax.jit(attention)(q, k, v)
    assert_close(np.asarray(got), np.asarray(want), DType.F32, "attention", ACCUMULATION, scale=1.0)

    small = [x[:2, :8] for x in (q, k, v)]
    flags.clear()
    xfuse.jit(attention)(*small)
    assert flags and not any(flags), "a program with no kernel split kept BLAS's threads"

    monkeypatch.setattr(blas, "ENABLED", False)
    flags.clear()
    xfuse.jit(attention)(q, k, v)
    assert flags and not any(flags), "XFUSE_SPLIT_PRODUCTS=0 still split"


@pytest.mark.parametrize("lhs, rhs, contracting, batch, dtype", [
    ((1, 2048), (2048, 1000), ((1,), (0,)), ((), ()), "float32"),  # batch-1
    ((3, 5, 7), (3, 7, 4), ((2,), (1,)), ((0,), (0,)), "float32"),  # a batch
    ((6, 9), (9, 5), ((1,), (0,)), ((), ()), "float16"),  # computed in float32
    ((4, 8), (8, 3), ((1,), (0,)), ((), ()), "float64"),
])
def test_a_product_numpy_runs_as_it_is_skips_matmuls_choice(monkeypatch, lhs, rhs, contracting, batch, dtype):
    """Below oneDNN's bound and outside xfuse's threads, a dot made by `make_dot` calls numpy's
    matmul directly (the choice `matmul` would make, made once) and gives its result."""
    work = prog.compute_dtype(dtype)
    rng = np.random.default_rng(0)
    a = rng.standard_normal(lhs).astype(prog.dtype(dtype))
    b = rng.standard_normal(rhs).astype(prog.dtype(dtype))
    want = np.matmul(a.astype(work), b.astype(work))
    dot = prog.make_dot(lhs, rhs, contracting, batch, dtype)
    monkeypatch.setattr(prog, "matmul", lambda *args, **kw: pytest.fail("matmul's checks ran"))
    out = np.full(want.shape, np.nan, work)
    dot(a, b, out)
    np.testing.assert_array_equal(out, want)


def test_a_product_past_onednns_bound_still_goes_through_matmul(monkeypatch):
    # XFUSE_SPLIT_PRODUCTS (blas.ENABLED) is read at each call there, so the choice stays there
    called = []
    real = prog.matmul
    monkeypatch.setattr(prog, "matmul", lambda *args, **kw: called.append(1) or real(*args, **kw))
    m, k, n = 256, 512, 512  # 2**26 multiply-adds
    dot = prog.make_dot((m, k), (k, n), ((1,), (0,)), ((), ()), "float32")
    a, b = np.ones((m, k), np.float32), np.ones((k, n), np.float32)
    out = np.empty((m, n), np.float32)
    dot(a, b, out)
    assert called and (out == k).all()
