"""Threads racing one jitted function: first compiles and calls with mixed signatures (shapes,
dtypes, pytrees, weak scalars, backends chosen by `default_backend` blocks), through `__call__`
and `call_async`, all started together at a barrier, give right results from one trace and
one `Compiled` per signature; a failing signature caches nothing; separate jitted copies of one
function share the kernel caches; one artifact saved from many threads at once is whole; C
kernels render from many threads at once."""

from __future__ import annotations

import gc
import sys
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import xfuse
from xfuse.backends.c.backend import kernel_texts
from xfuse.backends.numba.cache import Entry
from xfuse.backends.numba.lowering import lower
from xfuse.frontend import UnsupportedPrimitiveError

THREADS = 8
RNG = np.random.default_rng(5)


def race(work, threads: int = THREADS) -> list:
    """Runs work(i) on `threads` threads released together by a barrier; their results, or
    the first error raised (re-raised here)."""
    barrier = threading.Barrier(threads, timeout=60)

    def start(i):
        barrier.wait()
        return work(i)

    with ThreadPoolExecutor(threads) as pool:
        return list(pool.map(start, range(threads)))


def block(params, x):
    return {"y": jax.nn.softmax(x * params["scale"], axis=-1) + params["shift"], "m": jnp.max(x, axis=0)}


def signatures() -> list[tuple]:
    """(params, x): shapes, dtypes, a weak Python scalar and a strong numpy one, each a signature."""
    def f32(*shape):
        return RNG.standard_normal(shape).astype(np.float32)

    return [
        ({"scale": 2.0, "shift": f32(8)}, f32(4, 8)),
        ({"scale": 2.0, "shift": f32(16)}, f32(3, 16)),
        ({"scale": np.float32(0.5), "shift": f32(8)}, f32(4, 8)),
        ({"scale": 3.0, "shift": f32(5)}, f32(64, 5)),
        ({"scale": 1.5, "shift": f32(6)}, RNG.integers(-4, 4, (2, 6)).astype(np.int32)),
        ({"scale": 1.0, "shift": f32(1)}, f32(7, 1)),
    ]


def key_of(params, x) -> tuple:
    scale = params["scale"]  # a tracer while tracing: its weak type tells the two apart
    weak = scale.aval.weak_type if hasattr(scale, "aval") else isinstance(scale, float)
    return x.shape, str(x.dtype), weak, params["shift"].shape


def assert_close(got, want) -> None:
    for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("backend", ["numba", "c", "jax"])
def test_threads_racing_first_compiles_trace_and_compile_each_signature_once(backend):
    traces = Counter()

    def counted(params, x):
        traces[key_of(params, x)] += 1  # runs once per trace
        return block(params, x)

    cases = signatures()
    wants = [jax.jit(block)(*case) for case in cases]
    jitted = xfuse.jit(counted, backend=backend)

    def work(i):
        for round_ in range(3):
            for k in np.random.default_rng(i * 10 + round_).permutation(len(cases)):
                got = jitted(*cases[k]) if (i + k) % 2 else jitted.call_async(*cases[k]).result(timeout=120)
                assert_close(got, wants[k])

    race(work)
    assert traces == Counter({key_of(*case): 1 for case in cases})
    assert jitted._cache_size() == len(cases)
    assert len({id(c) for c in jitted._cache.values()}) == len(cases)
    assert jitted._compiling == {}


def test_threads_in_default_backend_blocks_get_their_own_backend():
    traces = Counter()

    def counted(x, y):
        traces[x.shape] += 1
        return jnp.tanh(x) * y + jnp.exp(-x)

    jitted = xfuse.jit(counted)
    x, y = RNG.standard_normal((2, 32, 16)).astype(np.float32)
    want = np.tanh(x) * y + np.exp(-x)
    backends = ["numba", "c", "reference", "jax"]

    def work(i):
        with xfuse.default_backend(backends[i % len(backends)]):
            assert jitted.backend == backends[i % len(backends)]
            for _ in range(5):
                np.testing.assert_allclose(np.asarray(jitted(x, y)), want, rtol=2e-6, atol=2e-6)
                np.testing.assert_allclose(np.asarray(jitted.call_async(x, y).result(timeout=60)), want,
                                           rtol=2e-6, atol=2e-6)
        return type(jitted(x, y)).__name__

    kinds = race(work)
    assert traces == Counter({(32, 16): len(backends)})  # one trace per backend, whatever the race
    assert sorted({c.lowered.backend for c in jitted._cache.values()}) == sorted(backends)
    assert kinds.count("ndarray") == THREADS  # outside the blocks: the default, numba


def test_a_failing_signature_raced_by_threads_caches_nothing():
    traces = Counter()

    def rows(x):
        traces[x.ndim] += 1
        return jax.lax.cumlogsumexp(x, axis=1) if x.ndim == 2 else jnp.cos(x) * 3.0

    jitted = xfuse.jit(rows)
    good, bad = RNG.standard_normal(9).astype(np.float32), np.ones((2, 3), np.float32)

    def work(i):
        outcomes = []
        for k in range(4):
            if (i + k) % 2:
                np.testing.assert_allclose(jitted(good), np.cos(good) * 3, rtol=2e-6, atol=2e-6)
                outcomes.append("ok")
            else:
                with pytest.raises(UnsupportedPrimitiveError, match="'cumlogsumexp'"):
                    jitted(bad)
                outcomes.append("refused")
        return outcomes

    outcomes = race(work)
    assert sum(o.count("refused") for o in outcomes) == THREADS * 2
    assert traces[1] == 1 and 1 <= traces[2] <= THREADS * 2  # failures are not cached: retraced
    assert jitted._cache_size() == 1 and jitted._compiling == {}


@pytest.mark.parametrize("backend", ["numba", "c"])
def test_separate_jitted_copies_of_one_function_share_the_kernel_cache(backend, tmp_path, monkeypatch):
    """Each thread compiles the same kernels at once through a jitted function of its own, into
    one fresh disk cache: all succeed, and the cache ends up with one whole entry per kernel."""
    monkeypatch.setenv("XFUSE_CACHE_DIR", str(tmp_path))

    def fn(x, y):
        return jnp.tanh(x) * 1.375 + jnp.exp(-y), jnp.sum(x * y, axis=1)

    x = np.linspace(-3, 3, 48 * 32, dtype=np.float32).reshape(48, 32)
    y = np.cos(x)
    want = jax.jit(fn)(x, y)
    race(lambda i: assert_close(xfuse.jit(fn, backend=backend)(x, y), want))
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert not [p for p in files if ".tmp" in p.name], files
    if backend == "c":
        entries = [p for p in files if p.suffix == ".entry"]
        assert len(entries) == 1 and (tmp_path / "c" / entries[0].read_text()).is_file()
    else:  # every entry whole: its manifest vouches for each file numba left in it
        entries = [m.parent for m in tmp_path.glob("kernels/*/*/manifest.json")]
        assert entries and len(entries) == len(list(tmp_path.glob("kernels/*/*")))
        for path in entries:
            assert Entry(path, "kernel", (path / "kernel.py").read_text())._problem() is None, path
    assert_close(xfuse.jit(fn, backend=backend)(x, y), want)  # the entries load


def test_one_artifact_saved_from_many_threads_at_once_is_whole(tmp_path):
    def chain(x):
        return jnp.tanh(x) * jax.nn.sigmoid(x) + 0.5

    def other(x):
        return jnp.exp(-x * x) - 0.25

    x = RNG.standard_normal((16, 64)).astype(np.float32)
    compiled = [xfuse.jit(fn).lower(x).compile() for fn in (chain, other)]
    wants = [c(x) for c in compiled]
    path = tmp_path / "shared.xfa"
    race(lambda i: compiled[i % 2].save(path))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shared.xfa"]  # no temporary left
    loaded = xfuse.aot.load(path)
    got = loaded(x)
    assert any(np.allclose(got, w, rtol=2e-6, atol=2e-6) for w in wants)
    want = next(w for w in wants if np.allclose(got, w, rtol=2e-6, atol=2e-6))

    def call(i):  # and the artifact itself is called from threads at once
        for k in range(10):
            result = loaded(x) if (i + k) % 2 else loaded.call_async(x).result(timeout=60)
            np.testing.assert_allclose(result, want, rtol=2e-6, atol=2e-6)

    race(call)


class Cyclic:
    """Garbage that runs Python code when collected, as many libraries' objects do."""

    def __init__(self) -> None:
        self.me = self

    def __del__(self) -> None:
        sum(range(200))


def test_kernels_render_as_c_from_many_threads_while_garbage_is_collected():
    """CPython 3.11's `ast.parse` shares its recursion count between threads; a collection
    running Python code in the middle of one parse let another change it (a SystemError)."""
    def fn(x, y):
        return jax.nn.softmax(jnp.tanh(x) * y, axis=-1), jnp.sum(jnp.exp(-x) * y, axis=0)

    x = np.ones((8, 16), np.float32)
    lowered = lower(xfuse.jit(fn).lower(x, x).compile().module)
    want = kernel_texts(lowered)
    thresholds, interval = gc.get_threshold(), sys.getswitchinterval()
    gc.set_threshold(50, 1, 1)
    sys.setswitchinterval(1e-6)
    try:
        def work(i):
            for _ in range(25):
                for _ in range(50):
                    Cyclic()
                assert kernel_texts(lowered) == want

        race(work)
    finally:
        gc.set_threshold(*thresholds)
        sys.setswitchinterval(interval)
