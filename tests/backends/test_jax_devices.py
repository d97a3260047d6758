"""The jax backend on every device jax has here (the CPU always; each GPU or TPU when present,
so a machine with one checks it without any change): results stay on the chosen device and
agree with jax.jit, in both modes, chosen through `backend_options` and `xfuse.devices()`.

The backend multiplies f32 in f32 (`Precision.HIGHEST`), where a GPU's jax.jit would default to
tf32 products, so jax.jit runs at that precision too, on the same device."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import xfuse

DEVICES = list(xfuse.devices("jax"))


def mlp(x, w1, b1, w2):
    h = jax.nn.gelu(x @ w1 + b1)
    return jax.nn.softmax(jax.nn.relu(h @ w2), axis=-1), jnp.tanh(h).sum(axis=0)


def layer_norm(x, g):
    m = x.mean(axis=-1, keepdims=True)
    v = ((x - m) ** 2).mean(axis=-1, keepdims=True)
    return (x - m) * jax.lax.rsqrt(v + 1e-5) * g


def _args(seed: int = 0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((32, 64)).astype(np.float32)
    x[0, :3] = [np.inf, -np.inf, -0.0]
    return (
        x,
        (rng.standard_normal((64, 128)) / 8).astype(np.float32),
        rng.standard_normal(128).astype(np.float32),
        (rng.standard_normal((128, 16)) / 11).astype(np.float32),
    )


def _jax_jit(f, device, *args):
    """`jax.jit(f)` on `device`, f32 products in f32."""
    with jax.default_matmul_precision("highest"):
        return jax.jit(f)(*jax.device_put(args, device))


def test_every_platform_jax_has_is_listed():
    platforms = {d.platform for d in jax.devices()} | {"cpu"}
    assert platforms <= {d.platform for d in DEVICES}


@pytest.mark.parametrize("mode", ["fusions", "module"])
@pytest.mark.parametrize("device", DEVICES, ids=[d.id for d in DEVICES])
def test_runs_on_the_device_and_matches_jax_jit(device, mode):
    where = f"{device.platform}:{device.index}"
    target = jax.devices(device.platform)[device.index]
    args = _args()
    f = xfuse.jit(mlp, backend="jax", backend_options={"mode": mode, "device": where})
    got = f(*args)
    want = _jax_jit(mlp, target, *args)
    for g, w in zip(got, want):
        assert g.devices() == {target}
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=2e-5, atol=2e-6, equal_nan=True)
    x, g = args[0][:, :32], np.linspace(0.5, 1.5, 32, dtype=np.float32)
    with xfuse.default_backend("jax", options={"mode": mode, "device": where}):
        normed = xfuse.jit(layer_norm)(x, g)
    assert normed.devices() == {target}
    want = _jax_jit(layer_norm, target, x, g)
    np.testing.assert_allclose(np.asarray(normed), np.asarray(want), rtol=1e-5, atol=1e-5)


def test_jax_arrays_stay_on_their_device_for_the_jax_backend():
    x = jax.device_put(np.linspace(-1, 1, 8, dtype=np.float32))
    on_jax = xfuse.jit(jnp.sin, backend="jax").lower(x).compile()
    on_numba = xfuse.jit(jnp.sin).lower(x).compile()
    assert on_jax._checked_arrays((x,), {})[0] is x  # no trip through the host
    assert type(on_numba._checked_arrays((x,), {})[0]) is np.ndarray
    np.testing.assert_allclose(np.asarray(on_jax(x)), np.sin(np.asarray(x)), rtol=1e-6)


def test_jax_arrays_take_the_fast_path_on_the_jax_backend():
    f = xfuse.jit(lambda x, y: x * y + 1, backend="jax")
    x, y = jnp.arange(6.0, dtype=jnp.float32), jnp.full(6, 2.0, jnp.float32)
    for k in range(3):
        np.testing.assert_array_equal(np.asarray(f(x + k, y)), (np.arange(6.0) + k) * 2 + 1)
    assert [key for key in f._fast if "device" in key] != []
    assert f._cache_size() == 1
    np.testing.assert_array_equal(np.asarray(f(x[:3], y[:3])), np.arange(3.0) * 2 + 1)  # another shape
    assert f._cache_size() == 2
    on_numba = xfuse.jit(lambda x, y: x * y + 1)
    on_numba(x, y)
    on_numba(x, y)
    assert not any("device" in key for key in on_numba._fast)  # converted: no fast path for them
