"""The example plugin (examples/plugins/xfuse-example-device), pip-installed as its own package
into a folder put on this test process's path: discovered, listed, selected, and used for the
ops it claims (its engine and its relu kernel run them), with results equal to the reference
interpreter and jax.jit; what it cannot run falls back or raises."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import xfuse
from xfuse.backends.registry import REGISTRY, UnsupportedError
from xfuse.hlo import interpret

ROOT = Path(__file__).resolve().parents[2]
PLUGIN = ROOT / "examples" / "plugins" / "xfuse-example-device"
EDGES = np.array([-0.0, 0.0, np.nan, np.inf, -np.inf, -1.5, 2.5, 1e-40, -3e38], np.float32)


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """pip-installs a copy of the plugin (the source tree stays clean) into a folder of its own
    and puts it first on sys.path for this module's tests."""
    source = tmp_path_factory.mktemp("src") / "plugin"
    shutil.copytree(PLUGIN, source)
    target = tmp_path_factory.mktemp("site")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
         "--target", str(target), str(source)],
        check=True,
        capture_output=True,
    )
    sys.path.insert(0, str(target))
    try:
        with REGISTRY.scoped():
            REGISTRY.discover(again=True)
            yield target
    finally:
        sys.path.remove(str(target))
        for name in [m for m in sys.modules if m.startswith("xfuse_example_device")]:
            del sys.modules[name]


def _counters():
    from xfuse_example_device import engine, kernels

    return engine.CALLS, kernels.CALLS


def test_discovered_and_listed(installed):
    assert "example" in REGISTRY.names()
    device = next(d for d in xfuse.devices() if d.backend == "example")
    assert device.id == "example:cpu:0" and "example device" in str(device)
    backend = REGISTRY.get("example")
    assert type(backend).__module__ == "xfuse_example_device"
    assert "max" in backend.capabilities.ops and backend.capabilities.fusion_kinds == {"loop"}


def test_listed_in_a_fresh_process_without_importing_it_first(installed):
    code = (
        "import sys, xfuse\n"
        "from xfuse.backends.registry import REGISTRY\n"
        "print('example' in REGISTRY.names(), 'xfuse_example_device' in sys.modules)\n"
        "print([d.id for d in xfuse.devices() if d.backend == 'example'])\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(installed), str(ROOT)])}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.split("\n")[:2] == ["True False", "['example:cpu:0']"]


def _chain(x, y):
    return jnp.tanh(x * y - 1.0) + jnp.maximum(x, y) / 2


def test_selected_runs_its_ops_on_the_device(installed):
    engine_calls, _ = _counters()
    f = xfuse.jit(_chain, backend="example")
    x = np.concatenate([EDGES, np.linspace(-3, 3, 23, dtype=np.float32)])
    y = np.roll(x, 5)
    compiled = f.lower(x, y).compile()
    before = sum(engine_calls.values())
    got = compiled(x, y)
    assert sum(engine_calls.values()) == before + 1  # the whole module ran on the device
    assert compiled.fusion_report().placements == []
    want = interpret(compiled.module, x, y)
    np.testing.assert_allclose(got, want, rtol=1e-6, equal_nan=True)
    assert np.array_equal(np.signbit(got), np.signbit(want))
    np.testing.assert_allclose(got, jax.jit(_chain)(x, y), rtol=2e-6, atol=1e-6, equal_nan=True)


def test_its_relu_kernel_runs_on_its_device_and_on_numba(installed):
    _, kernel_calls = _counters()

    def f(x):
        return jax.nn.relu(x) * 3 + 1

    x = np.concatenate([EDGES, np.linspace(-2, 2, 11, dtype=np.float32)])
    for backend in ("example", "numba"):
        before = kernel_calls["relu"]
        compiled = xfuse.jit(f, backend=backend).lower(x).compile()
        (placed,) = compiled.fusion_report().placements
        assert placed.target == "kernel example.relu" and "xfuse-example-device" in placed.reason
        got = compiled(x)
        assert kernel_calls["relu"] == before + 1
        want = np.asarray(jax.jit(f)(x))
        np.testing.assert_array_equal(got, want)
        assert np.array_equal(np.signbit(got), np.signbit(want))  # relu(-0.0) is +0.0


def test_what_it_cannot_run_falls_back_or_raises(installed):
    engine_calls, _ = _counters()

    def f(x, w):
        h = jnp.exp(x) * 2
        return (h @ w).sum(axis=0), h

    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((5, 4)).astype(np.float32), rng.standard_normal((4, 3)).astype(np.float32)
    with pytest.raises(UnsupportedError, match=r"backend 'example' cannot run .*dot_general.*test_plugin_example.py"):
        xfuse.jit(f, backend="example")(x, w)
    before = sum(engine_calls.values())
    with xfuse.default_backend("example", fallback="numba"):
        got = xfuse.jit(f)(x, w)
    assert sum(engine_calls.values()) == before + 1  # the exp chain ran on the device
    for g, v in zip(got, jax.jit(f)(x, w)):
        np.testing.assert_allclose(g, np.asarray(v), rtol=1e-5)


def test_integer_work_goes_to_the_fallback(installed):
    f = xfuse.jit(lambda x: x * 2 + 1, backend="example", fallback="numba")
    x = np.array([np.iinfo(np.int32).max, -3, 0], np.int32)
    np.testing.assert_array_equal(f(x), np.asarray(jax.jit(lambda x: x * 2 + 1)(x)))
    (placed,) = f.lower(x).compile().fusion_report().placements
    assert placed.target == "numba" and "no s32 arrays" in placed.reason


def test_its_option_is_checked(installed, capsys):
    f = xfuse.jit(jnp.negative, backend="example", backend_options={"trace": True})
    f(np.ones(2, np.float32))
    assert "example device: running" in capsys.readouterr().out
    with pytest.raises(ValueError, match="'fast' is not an option of backend 'example'"):
        xfuse.jit(jnp.negative, backend="example", backend_options={"fast": True})
