"""float32 products through oneDNN (`runtime.onednn`): the library loads where the package is
installed, its products equal numpy's on every layout it takes (special values included), it
refuses the layouts it cannot take without writing, it never starts an OpenMP team, and
`products.matmul` sends exactly the large float32 matrix products to it, split over xfuse's
threads."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import textwrap
import threading
from importlib import metadata

import numpy as np
import pytest

from tests.tolerances import ACCUMULATION, assert_close
from xfuse.hlo import DType
from xfuse.runtime import onednn, parallel
from xfuse.runtime import products as prog


def installed() -> bool:
    try:
        metadata.distribution("onednn-cpu-gomp")
    except metadata.PackageNotFoundError:
        return False
    return True


@pytest.fixture
def sgemm():
    fn = onednn.sgemm()
    assert fn is not None, "oneDNN did not load (installed: %s)" % installed()
    return fn


@pytest.fixture
def two_threads():
    parallel.set_num_threads(2)
    yield
    parallel.set_num_threads(None)


def test_loads_where_the_dependency_installs_it():
    # pyproject installs onednn-cpu-gomp on Linux x86_64, where it must load (with the
    # system's libgomp, which the C compiler the C backend needs brings)
    linux_x86 = sys.platform == "linux" and platform.machine() == "x86_64"
    assert installed() == linux_x86
    assert (onednn.sgemm() is not None) == installed()


def test_xfuse_onednn_0_turns_it_off():
    code = "from xfuse.runtime import onednn; print(onednn.sgemm() is None)"
    env = dict(os.environ, XFUSE_ONEDNN="0")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "True"


def _layouts(x: np.ndarray) -> dict[str, np.ndarray]:
    """x as C-contiguous, as the transpose of a C-contiguous array, and as a block of a larger
    C-contiguous array (rows of contiguous elements further apart than its width)."""
    big = np.full((x.shape[0] + 3, x.shape[1] + 5), np.nan, np.float32)
    big[2:2 + x.shape[0], 1:1 + x.shape[1]] = x
    return {"c": x.copy(), "t": np.ascontiguousarray(x.T).T, "block": big[2:2 + x.shape[0], 1:1 + x.shape[1]]}


@pytest.mark.parametrize("m, k, n", [(3, 5, 7), (64, 96, 130), (1, 300, 17), (17, 1, 9), (129, 257, 1)])
def test_products_equal_numpys_on_every_layout(sgemm, m, k, n):
    rng = np.random.default_rng(m * k * n)
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    want = a.astype(np.float64) @ b.astype(np.float64)
    scale = np.abs(a).sum(-1, keepdims=True) * np.abs(b).max()
    for la, a_ in _layouts(a).items():
        for lb, b_ in _layouts(b).items():
            for lo, out in _layouts(np.zeros((m, n), np.float32)).items():
                if lo == "t":
                    continue  # refused: see test_refuses_what_it_cannot_take
                out[...] = np.nan
                assert sgemm(a_, b_, out), (la, lb, lo)
                assert_close(out, want.astype(np.float32), DType.F32, f"{la} @ {lb} -> {lo}",
                             ACCUMULATION, scale=np.broadcast_to(scale, out.shape))


def test_special_values_as_numpy(sgemm):
    a = np.array([[np.inf, 0, 1], [np.nan, 1, 1], [-0.0, -0.0, 0.0], [1e-40, 1e-40, 0],
                  [-np.inf, 1, 0], [3e38, 3e38, 3e38]], np.float32)
    b = np.array([[0, 1], [1, 0], [2, 3]], np.float32)
    out = np.full((6, 2), 7.0, np.float32)
    assert sgemm(a, b, out)
    with np.errstate(all="ignore"):
        want = a @ b
    # inf * 0 is NaN, NaN propagates, subnormals are kept (no flush to zero), overflow is inf
    np.testing.assert_array_equal(out, want)
    assert np.isnan(out[0, 0]) and out[0, 1] == np.inf and np.isnan(out[1]).all()
    assert out[3, 0] == np.float32(1e-40) and out[4, 1] == -np.inf and out[5, 1] == np.inf


@pytest.mark.parametrize("m, k, n", [(0, 3, 4), (5, 0, 4), (5, 3, 0)])
def test_empty_products(sgemm, m, k, n):
    out = np.full((m, n), np.nan, np.float32)
    assert sgemm(np.ones((m, k), np.float32), np.ones((k, n), np.float32), out)
    np.testing.assert_array_equal(out, np.zeros((m, n), np.float32))


def test_refuses_what_it_cannot_take(sgemm):
    a = np.ones((4, 3), np.float32)
    b = np.ones((3, 5), np.float32)
    refused = {
        "float64 operand": (a.astype(np.float64), b, np.zeros((4, 5), np.float32)),
        "float64 output": (a, b, np.zeros((4, 5))),
        "broadcast operand": (np.broadcast_to(np.ones(3, np.float32), (4, 3)), b, np.zeros((4, 5), np.float32)),
        "reversed operand": (a[::-1], b, np.zeros((4, 5), np.float32)),
        "strided columns": (np.ones((4, 6), np.float32)[:, ::2], b, np.zeros((4, 5), np.float32)),
        "transposed output": (a, b, np.zeros((5, 4), np.float32).T),
        "read-only output": (a, b, np.broadcast_to(np.zeros(5, np.float32), (4, 5))),
        "unaligned operand": (np.zeros(12 * 4 + 1, np.uint8)[1:].view(np.float32).reshape(4, 3), b,
                              np.zeros((4, 5), np.float32)),
    }
    square = np.ones((4, 4), np.float32)
    refused["output over an operand"] = (square, square[:, :4].copy(), square)
    for what, (x, y, out) in refused.items():
        before = np.array(out, copy=True)
        assert not sgemm(x, y, out), what
        np.testing.assert_array_equal(out, before, err_msg=what)


def test_never_starts_an_openmp_team():
    # a team's threads would spin after each product against the kernels and numpy's BLAS:
    # products on the main thread and on another thread leave the thread count as it was, and
    # the calling thread's OpenMP setting is put back
    code = textwrap.dedent("""
        import ctypes, os, threading
        import numpy as np
        from xfuse.runtime import onednn
        sgemm = onednn.sgemm()
        omp = ctypes.CDLL("libgomp.so.1")
        before = omp.omp_get_max_threads()
        a = np.ones((512, 512), np.float32)
        out = np.empty_like(a)
        tasks = len(os.listdir("/proc/self/task"))
        for _ in range(3):
            assert sgemm(a, a, out)
        main = len(os.listdir("/proc/self/task"))
        seen = []

        def other():
            for _ in range(3):
                assert sgemm(a, a, np.empty_like(a))
            seen.append(len(os.listdir("/proc/self/task")))  # this thread's own task added

        t = threading.Thread(target=other)
        t.start(); t.join()
        print(before, omp.omp_get_max_threads(), tasks, main, seen[0] - 1, out[0, 0])
    """)
    env = dict(os.environ, OMP_NUM_THREADS="2")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    before, after, tasks, main, other, value = out.stdout.split()
    assert before == after == "2"
    assert main == other == tasks
    assert float(value) == 512.0


def _spy(monkeypatch, sgemm) -> list:
    calls = []

    def spy(a, b, out):
        calls.append((threading.get_ident(), a.shape, b.shape))
        return sgemm(a, b, out)

    monkeypatch.setattr(onednn, "_loaded", [(spy, onednn.addresses())])
    return calls


@pytest.mark.parametrize("a_shape, b_shape, via_onednn", [
    ((512, 128), (128, 256), True),  # rows split, each half through oneDNN
    ((128, 256), (256, 512), True),  # wider than tall: columns split
    ((1, 256, 128), (1, 128, 512), True),  # a batch of one
    ((4, 128, 128), (4, 128, 128), False),  # a batch: numpy loops over it in C
    ((1, 1024), (1024, 4096), False),  # a vector: BLAS's GEMV
    ((32, 128), (128, 256), False),  # small: OpenBLAS's threads
])
def test_large_float32_products_go_to_onednn_in_xfuses_threads(monkeypatch, two_threads, sgemm,
                                                                a_shape, b_shape, via_onednn):
    monkeypatch.setattr(prog, "ONEDNN_MIN", prog.SPLIT_PRODUCT_MIN)  # small shapes stand in
    monkeypatch.setattr(onednn, "preferred", lambda: True)  # as on an AVX-512 CPU
    rng = np.random.default_rng(3)
    a = rng.standard_normal(a_shape).astype(np.float32)
    b = rng.standard_normal(b_shape).astype(np.float32)
    a.reshape(-1)[::101] = np.inf
    b.reshape(-1)[::89] = 0.0
    with np.errstate(invalid="ignore"):
        want = np.matmul(a.astype(np.float64), b.astype(np.float64)).astype(np.float32)
    calls = _spy(monkeypatch, sgemm)
    out = np.empty(want.shape, np.float32)
    prog.matmul(a, b, out, np.dtype(np.float32), own=False)
    assert (a.size * b.shape[-1] >= prog.ONEDNN_MIN) == (a_shape != (32, 128))
    if via_onednn:  # one block in each thread
        assert len(calls) == 2 and len({ident for ident, _, _ in calls}) == 2
    else:
        assert calls == []
    scale = np.abs(a).clip(max=1e3).sum(-1, keepdims=True) * np.abs(b).max()
    assert_close(out, want, DType.F32, "product", ACCUMULATION, scale=np.broadcast_to(scale, out.shape))


def test_without_avx512_large_products_split_over_xfuses_threads_through_openblas(monkeypatch, two_threads,
                                                                                   sgemm):
    # where oneDNN is not preferred (no AVX-512), the same products still run in xfuse's
    # threads, a block in each, through numpy's BLAS on one thread: no oneDNN call
    from xfuse.runtime import blas

    monkeypatch.setattr(prog, "ONEDNN_MIN", prog.SPLIT_PRODUCT_MIN)
    monkeypatch.setattr(onednn, "preferred", lambda: False)
    calls = _spy(monkeypatch, sgemm)
    seen = []
    numpy_product = prog.numpy_product

    def spy(a, b, out):
        seen.append((threading.get_ident(), blas.threads(), a.shape, b.shape))
        numpy_product(a, b, out)

    monkeypatch.setattr(prog, "numpy_product", spy)
    rng = np.random.default_rng(4)
    a = rng.standard_normal((512, 128)).astype(np.float32)
    b = rng.standard_normal((128, 256)).astype(np.float32)
    a[3, 5], b[7, 1] = np.nan, -np.inf
    out = np.empty((512, 256), np.float32)
    prog.matmul(a, b, out, np.dtype(np.float32), own=False)
    assert calls == []
    assert len(seen) == 2 and len({ident for ident, _, _, _ in seen}) == 2
    assert all(counts == [1] * len(counts) for _, counts, _, _ in seen)  # BLAS on one thread
    with np.errstate(invalid="ignore"):
        want = np.matmul(a.astype(np.float64), b.astype(np.float64)).astype(np.float32)
    scale = np.abs(a).clip(max=1e3).sum(-1, keepdims=True) * np.abs(b).clip(max=1e3).max()
    assert_close(out, want, DType.F32, "product", ACCUMULATION, scale=np.broadcast_to(scale, out.shape))


@pytest.mark.parametrize("setting, expected", [("0", False), ("1", True), ("/no/such/libdnnl.so.3", True),
                                               ("", None)])
def test_preferred_follows_the_setting_then_the_cpu(setting, expected):
    code = "from xfuse.runtime import onednn; print(onednn.preferred())"
    env = {k: v for k, v in os.environ.items() if k != "XFUSE_ONEDNN"}
    if setting:
        env["XFUSE_ONEDNN"] = setting
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    if expected is None:  # unset: whether the CPU has AVX-512
        with open("/proc/cpuinfo") as f:
            flags = next(line for line in f if line.startswith("flags")).split(":", 1)[1].split()
        expected = "avx512f" in flags
    assert out.stdout.strip() == str(expected)


def test_float64_products_stay_with_numpy(monkeypatch, two_threads, sgemm):
    calls = _spy(monkeypatch, sgemm)
    a = np.ones((1024, 256))
    b = np.ones((256, 512))
    out = np.empty((1024, 512))
    prog.matmul(a, b, out, np.dtype(np.float64))
    assert calls == [] and (out == 256.0).all()


def test_xfuse_split_products_0_keeps_openblas(monkeypatch, two_threads, sgemm):
    from xfuse.runtime import blas

    monkeypatch.setattr(blas, "ENABLED", False)
    monkeypatch.setattr(prog, "ONEDNN_MIN", prog.SPLIT_PRODUCT_MIN)
    calls = _spy(monkeypatch, sgemm)
    a = np.ones((512, 128), np.float32)
    out = np.empty((512, 128), np.float32)
    prog.matmul(a, a[:128], out, np.dtype(np.float32))
    assert calls == [] and (out == 128.0).all()


def test_a_child_forked_while_the_library_loads_can_load_it():
    # the parent's lock, held by a thread loading the library at the fork, is not the child's
    code = textwrap.dedent("""
        import os
        from xfuse.runtime import onednn
        onednn._lock.acquire()  # as a loading thread holds it
        pid = os.fork()
        if pid == 0:
            os._exit(0 if onednn.sgemm() is not None else 3)
        _, status = os.waitpid(pid, 0)
        print(os.waitstatus_to_exitcode(status))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "0"
