"""The backend registry: discovery through entry points (lazy), failure isolation, selection
(`backend=`, `xfuse.default_backend`), capabilities with a fallback backend or a clear error,
kernels registered for ops and patterns, and placement across backends on the whole frontend
corpus against jax.jit."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import warnings
from importlib.metadata import entry_points

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import xfuse
from tests.frontend.test_corpus import CORPUS, _rng, check
from xfuse.backends import reference
from xfuse.backends.registry import (
    REGISTRY,
    Backend,
    Capabilities,
    PluginWarning,
    UnsupportedError,
    register_backend,
    register_kernel,
)
from xfuse.hlo import Op

ELEMENTWISE = frozenset({"add", "sub", "mul", "div", "max", "min", "neg", "exp", "tanh", "broadcast_in_dim"})


class Counting(Backend):
    """A backend of the test's own: the reference interpreter behind limited capabilities,
    counting the modules it compiles and the calls it runs."""

    options = ("tag",)

    def __init__(self, name: str, capabilities: Capabilities = Capabilities()) -> None:
        self.name = name
        self.capabilities = capabilities
        self.compiled: list = []
        self.calls = 0

    def compile(self, module, tag: str = ""):
        self.compiled.append((module, tag))
        inner = reference.compile(module)

        def run(arrays):
            self.calls += 1
            return inner(arrays)

        return run


@pytest.fixture
def registry():
    with REGISTRY.scoped() as r:
        yield r


def _dist_info(root, name: str, module: str, code: str, group_lines: str) -> None:
    """An installed distribution on `root` (what pip writes), without building anything."""
    info = root / f"{name}-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(group_lines)
    (root / f"{module}.py").write_text(textwrap.dedent(code))


# ---------------------------------------------------------------------- discovery
def test_builtins_register_through_entry_points():
    found = {ep.name: ep.value for ep in entry_points(group="xfuse.backends")}
    for name in ("numba", "c", "jax", "reference"):
        assert found[name].startswith("xfuse.backends.builtin:")
    assert REGISTRY.names()[:4] == ["numba", "c", "jax", "reference"]


def test_devices_lists_cpu_backends_and_jax_devices():
    devices = xfuse.devices()
    ids = [d.id for d in devices]
    assert "numba:cpu:0" in ids and "jax:cpu:0" in ids and "reference:cpu:0" in ids
    jax_ids = {f"jax:{d.platform}:{d.id}" for d in jax.devices()}
    assert jax_ids <= set(ids)
    assert [d.id for d in xfuse.devices("numba")] == ["numba:cpu:0"]


def test_discovery_imports_nothing_until_used(tmp_path):
    _dist_info(
        tmp_path, "lazyplug", "lazyplug",
        """
        import sys
        from xfuse.backends.registry import Backend
        class Lazy(Backend):
            name = "lazy"
        BACKEND = Lazy()
        """,
        "[xfuse.backends]\nlazy = lazyplug:BACKEND\n",
    )
    code = (
        "import sys, xfuse\n"
        "from xfuse.backends.registry import REGISTRY\n"
        "names = REGISTRY.names()\n"
        "print('lazy' in names, 'lazyplug' in sys.modules, 'numba' in sys.modules)\n"
        "print([d.id for d in xfuse.devices('lazy')], 'lazyplug' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True,
        env={**_env(), "PYTHONPATH": str(tmp_path)},
    )
    assert out.stdout.split() == ["True", "False", "False", "['lazy:cpu:0']", "True"]


def _env() -> dict:
    import os

    return dict(os.environ)


def test_a_broken_plugin_is_skipped_with_a_warning(tmp_path, registry, monkeypatch):
    _dist_info(
        tmp_path, "brokenplug", "brokenplug",
        "raise ImportError('the vendor library is missing')\n",
        "[xfuse.backends]\nbroken = brokenplug:BACKEND\n",
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    registry.discover(again=True)
    assert "broken" in registry.names()  # found, not yet imported
    with pytest.warns(PluginWarning, match=r"'broken'.*brokenplug:BACKEND from brokenplug.*vendor library"):
        devices = xfuse.devices()
    assert {"numba", "jax", "reference"} <= {d.backend for d in devices}
    assert "broken" not in registry.names()
    with pytest.raises(ValueError, match=r"backend='broken' failed to load: .*vendor library"):
        registry.get("broken")
    f = xfuse.jit(lambda x: x + 1)  # the rest works
    np.testing.assert_array_equal(f(np.arange(3.0, dtype=np.float32)), [1, 2, 3])


def test_an_object_that_is_not_a_backend_is_skipped(tmp_path, registry, monkeypatch):
    _dist_info(
        tmp_path, "oddplug", "oddplug", "BACKEND = 42\n", "[xfuse.backends]\nodd = oddplug:BACKEND\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    registry.discover(again=True)
    with pytest.warns(PluginWarning, match="not an xfuse backend"):
        with pytest.raises(ValueError, match="failed to load"):
            registry.get("odd")


def test_a_broken_kernel_plugin_is_skipped_with_a_warning(tmp_path, registry, monkeypatch):
    _dist_info(
        tmp_path, "badkernels", "badkernels", "def registrations():\n    return [1]\n",
        "[xfuse.kernels]\nbad = badkernels:registrations\n",
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    registry.discover(again=True)
    with pytest.warns(PluginWarning, match=r"kernel plugin 'bad'.*badkernels.*not a KernelRegistration"):
        assert registry.kernels_for("numba") == []
    x = np.arange(4, dtype=np.float32)
    np.testing.assert_array_equal(xfuse.jit(lambda x: x * 2)(x), x * 2)


# ---------------------------------------------------------------------- selection
def test_backend_by_name_and_options(registry):
    mine = Counting("mine")
    register_backend(mine)
    f = xfuse.jit(lambda x: jnp.exp(x) + 1, backend="mine", backend_options={"tag": "t1"})
    x = np.linspace(-1, 1, 5, dtype=np.float32)
    np.testing.assert_allclose(f(x), np.exp(x) + 1, rtol=1e-6)
    assert mine.calls == 1 and [tag for _, tag in mine.compiled] == ["t1"]
    assert f.lower(x).compile().lowered.backend == "mine"


def test_bad_backend_choices_name_the_option(registry):
    register_backend(Counting("mine"))
    with pytest.raises(ValueError, match=r"backend='nope' is not available; choose one of numba, c"):
        xfuse.jit(lambda x: x, backend="nope")
    with pytest.raises(ValueError, match=r"backend_options: 'speed' is not an option of backend 'mine'"):
        xfuse.jit(lambda x: x, backend="mine", backend_options={"speed": 3})
    with pytest.raises(ValueError, match=r"fallback='nope' is not available"):
        xfuse.jit(lambda x: x, backend="mine", fallback="nope")
    with pytest.raises(ValueError, match="fallback='mine' is the backend itself"):
        xfuse.jit(lambda x: x, backend="mine", fallback="mine")
    with pytest.raises(ValueError, match="need backend="):
        xfuse.jit(lambda x: x, fallback="numba")
    with pytest.raises(ValueError, match="already registered"):
        register_backend(Counting("mine"))


def test_default_backend_block(registry):
    first, second = Counting("first"), Counting("second")
    register_backend(first)
    register_backend(second)
    f = xfuse.jit(lambda x: x * 3)
    pinned = xfuse.jit(lambda x: x * 3, backend="first")
    x = np.ones(4, np.float32)
    with xfuse.default_backend("first"):
        assert f.backend == "first"
        f(x)
        with xfuse.default_backend("second"):
            f(x)
            pinned(x)
        f(x)
    f(x)  # numba again
    assert (first.calls, second.calls) == (3, 1)
    assert f._cache_size() == 3  # one executable per backend in effect
    assert f.backend == "numba"


def test_default_backend_is_per_thread(registry):
    mine = Counting("mine")
    register_backend(mine)
    f = xfuse.jit(lambda x: x - 1)
    x = np.ones(3, np.float32)
    inside, other = threading.Event(), threading.Event()

    def elsewhere():
        inside.wait()
        f(x)  # outside any block in this thread: numba
        other.set()

    thread = threading.Thread(target=elsewhere)
    thread.start()
    with xfuse.default_backend("mine"):
        inside.set()
        other.wait()
        f(x)
    thread.join()
    assert mine.calls == 1


# ---------------------------------------------------------------------- capabilities
def _mlp(x, w, b):
    y = jnp.tanh(x) * 2 + 1
    return jax.nn.softmax(jax.nn.relu(y @ w + b), axis=-1), y


def _mlp_args():
    rng = np.random.default_rng(0)
    return (
        rng.standard_normal((4, 8)).astype(np.float32),
        rng.standard_normal((8, 16)).astype(np.float32),
        rng.standard_normal(16).astype(np.float32),
    )


def test_unsupported_instruction_raises_naming_op_backend_and_line(registry):
    register_backend(Counting("tiny", Capabilities(ops=ELEMENTWISE, fusion_kinds=frozenset({"loop"}))))
    f = xfuse.jit(_mlp, backend="tiny")
    line = _mlp.__code__.co_firstlineno + 2
    with pytest.raises(UnsupportedError) as error:
        f(*_mlp_args())
    message = str(error.value)
    assert "backend 'tiny' cannot run" in message and "output fusion of dot_general" in message
    assert f"test_registry.py:{line} (_mlp)" in message
    assert "no output fusions" in message and "fallback=" in message


@pytest.mark.parametrize("fallback", ["numba", "jax", "reference"])
def test_fallback_runs_what_the_backend_cannot(registry, fallback):
    tiny = Counting("tiny", Capabilities(ops=ELEMENTWISE, fusion_kinds=frozenset({"loop"})))
    register_backend(tiny)
    f = xfuse.jit(_mlp, backend="tiny", fallback=fallback)
    args = _mlp_args()
    got = f(*args)
    want = jax.jit(_mlp)(*args)
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=2e-6, atol=1e-6)
    assert tiny.calls == 1  # the loop fusion ran on tiny
    report = f.lower(*args).compile().fusion_report()
    (placed,) = report.placements
    assert placed.target == fallback and "tiny refused: it emits no output fusions" in placed.reason
    assert "Placement" in str(report) and report.as_dict()["placements"][0]["target"] == fallback


def test_dtype_capability(registry):
    register_backend(Counting("f32only", Capabilities(dtypes=frozenset({"f32"}))))
    f = xfuse.jit(lambda x, y: (x * 2, y * 2), backend="f32only", fallback="reference")
    x, y = np.ones(3, np.float32), np.ones(3, np.float16)
    a, b = f(x, y)
    assert a.dtype == np.float32 and b.dtype == np.float16
    (placed,) = f.lower(x, y).compile().fusion_report().placements
    assert "no f16 arrays" in placed.reason
    with pytest.raises(UnsupportedError, match="no f16 arrays"):
        xfuse.jit(lambda y: y + 1, backend="f32only")(y)


def test_tuples_cross_segment_boundaries(registry):
    """A multi-output fusion on one backend whose elements feed instructions on another, and a
    tuple result assembled from both."""
    register_backend(Counting("noreduce", Capabilities(ops=ELEMENTWISE | {"reduce_sum", "reduce_max"},
                                                       fusion_kinds=frozenset({"multi_output", "loop"}))))

    def f(x, w):
        e = jnp.exp(x)
        s, m = e.sum(axis=1), e.max(axis=1)
        return (e @ w) * s[:, None], m + 1, s

    x = np.random.default_rng(1).standard_normal((6, 5)).astype(np.float32)
    w = np.random.default_rng(2).standard_normal((5, 3)).astype(np.float32)
    got = xfuse.jit(f, backend="noreduce", fallback="numba")(x, w)
    want = jax.jit(f)(x, w)
    for g, v in zip(got, want):
        np.testing.assert_allclose(g, np.asarray(v), rtol=1e-5)


@pytest.fixture(scope="module")
def split_backend():
    """`split`: elementwise loop fusions only, on the interpreter; the rest falls back."""
    with REGISTRY.scoped():
        register_backend(Counting("split", Capabilities(ops=ELEMENTWISE, fusion_kinds=frozenset({"loop"}))))
        yield


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_placed_corpus_matches_jax_jit(name, split_backend):
    """Every corpus function split across two backends (through a default_backend block)
    agrees with jax.jit on random and edge inputs."""
    c = CORPUS[name]
    with xfuse.default_backend("split", fallback="reference"):
        for kind in ("random", "edge"):
            check(c, c.inputs(_rng(name, kind), kind == "edge"))


# ---------------------------------------------------------------------- kernels
def test_kernel_for_an_op_on_the_numba_backend(registry):
    calls = []

    def my_tanh(x):
        calls.append(x.shape)
        return np.tanh(x)

    register_kernel("numba", "test.tanh", my_tanh, op="tanh", dtypes=["f32"], source="tests")

    def f(x):
        return jnp.tanh(x * 2) + 1

    x = np.array([-np.inf, -1, -0.0, 0.0, 0.5, np.inf, np.nan], np.float32)
    compiled = xfuse.jit(f).lower(x).compile()
    assert "kind=custom, calls=custom.test.tanh" in compiled.as_text()
    got = compiled(x)
    np.testing.assert_allclose(got, jax.jit(f)(x), rtol=1e-6)
    assert calls == [(7,)]
    (placed,) = compiled.fusion_report().placements
    assert placed.target == "kernel test.tanh" and placed.reason == "registered by tests"
    y = x.astype(np.float16)  # not claimed for f16: compiled by numba as usual
    np.testing.assert_allclose(xfuse.jit(f)(y), np.asarray(jax.jit(f)(y)), rtol=1e-2, atol=1e-3)  # f16
    assert len(calls) == 1


def test_kernel_for_a_pattern(registry):
    def square_plus_one(comp, inst):  # add(mul(x, x), broadcast(1))
        if inst.op is not Op.ADD:
            return None
        a, b = (comp[o] for o in inst.operands)
        if a.op is Op.MUL and a.operands[0] == a.operands[1] and b.op is Op.BROADCAST_IN_DIM:
            one = comp[b.operands[0]]
            if one.op is Op.CONSTANT and one.attr("value").array == 1:
                return [inst.name, a.name, b.name, one.name]
        return None

    register_kernel("numba", "test.sq1", lambda x: x * x + 1, match=square_plus_one)

    def f(x, y):
        return jnp.sin(x * x + 1) * y

    x, y = np.linspace(-2, 2, 9, dtype=np.float32), np.full(9, 3, np.float32)
    compiled = xfuse.jit(f).lower(x, y).compile()
    assert compiled.as_text().count("kind=custom") == 1
    np.testing.assert_allclose(compiled(x, y), jax.jit(f)(x, y), rtol=2e-6)


def test_a_kernel_returning_the_wrong_shape_is_an_error_naming_it(registry):
    register_kernel("numba", "test.badexp", lambda x: x[:1], op="exp")
    with pytest.raises(RuntimeError, match=r"kernel test.badexp for exp.* returned float32\[1\]"):
        xfuse.jit(jnp.exp)(np.ones(4, np.float32))


def test_kernel_registration_is_checked():
    with pytest.raises(ValueError, match="exactly one of op= and match="):
        register_kernel("numba", "bad", np.exp)
    with pytest.raises(ValueError, match="'exponential' is not an xfuse op"):
        register_kernel("numba", "bad", np.exp, op="exponential")


def test_kernels_apply_only_to_their_backend(registry):
    register_kernel("jax", "test.neg", lambda x: -x, op="neg")
    text = xfuse.jit(lambda x: -x).lower(np.ones(2, np.float32)).compile().as_text()
    assert "custom" not in text


def test_warnings_are_not_raised_for_healthy_plugins():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        REGISTRY.backends()
        REGISTRY.kernels_for("numba")
