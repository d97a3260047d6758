"""Tiered compiles (`xfuse.tiers`): a first call whose native compile is not ready runs on
jax.jit's executable, later calls switch to the native program; both give numpy arrays that
agree with jax.jit, from several threads calling while the switch happens; tiers=False, the
jax backend and a quick native compile never tier; a native compile that fails leaves the calls
on the quick tier with a warning."""

from __future__ import annotations

import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import xfuse
from tests.tolerances import ACCUMULATION, assert_close
from xfuse import tiers
from xfuse.hlo import DType
from xfuse.stages import Lowered


def layer(x, w, b, *, scale):
    h = jax.nn.relu(x @ w + b) * scale
    return {"softmax": jax.nn.softmax(h, axis=-1), "total": jnp.sum(jnp.tanh(h))}


def arguments():
    rng = np.random.default_rng(11)
    x = rng.standard_normal((32, 24)).astype(np.float32)
    x[3, 4], x[5, :] = np.inf, -0.0
    return x, (rng.standard_normal((24, 16)) / 4).astype(np.float32), rng.standard_normal(16).astype(np.float32)


def check(got, want, what, host=True):
    """`host`: the results are writable numpy arrays (the jax backend's are jax arrays)."""
    assert set(got) == set(want)
    for name in got:
        assert not host or type(got[name]) is np.ndarray and got[name].flags.writeable, (what, name)
        got[name] = np.asarray(got[name])
        assert got[name].dtype == want[name].dtype and got[name].shape == want[name].shape
        assert np.array_equal(np.isnan(got[name]), np.isnan(np.asarray(want[name])))
        assert_close(got[name], np.asarray(want[name]), DType.F32, f"{what}: {name}", ACCUMULATION,
                     scale=np.full(got[name].shape, 8.0))


def test_a_first_call_runs_on_the_quick_tier_then_switches_to_native_code():
    args = arguments()
    fn = xfuse.jit(layer, static_argnames="scale", tiers=True)
    want = jax.jit(layer, static_argnames="scale")(*args, scale=0.5)
    first = fn(*args, scale=0.5)
    check(first, want, "first call on " + fn.tier_of(*args, scale=0.5))
    assert fn.wait_native(timeout=300)
    assert fn.tier_of(*args, scale=0.5) == "native"
    native = fn(*args, scale=0.5)
    check(native, want, "native call")
    check(first, {k: np.asarray(v) for k, v in native.items()}, "the tiers agree")
    assert fn(*args, scale=2.0)["softmax"].shape == (32, 16)  # another signature, its own tiers


def slowed_native_compile(monkeypatch, gate: threading.Event, fail: bool = False) -> None:
    """The numba backend's compile waits for `gate` (then fails where `fail`): the quick tier
    takes over, and the switch happens when the test says."""
    compile_native = Lowered.compile

    def slowed(self):
        if self.backend == "numba":
            gate.wait(60)
            if fail:
                raise RuntimeError("no native code today")
        return compile_native(self)

    monkeypatch.setattr(Lowered, "compile", slowed)


def test_threads_calling_while_the_switch_happens_all_get_the_right_result(monkeypatch):
    gate = threading.Event()
    slowed_native_compile(monkeypatch, gate)
    args = arguments()
    fn = xfuse.jit(layer, static_argnames="scale", tiers=True)
    want = jax.jit(layer, static_argnames="scale")(*args, scale=1.5)
    fn(*args, scale=1.5)
    assert fn.tier_of(*args, scale=1.5) == "jax"
    seen, errors = [], []

    def calls():
        try:
            for k in range(60):
                if k == 10:
                    gate.set()  # the native compile goes on while the threads call
                tier = fn.tier_of(*args, scale=1.5)
                check(fn(*args, scale=1.5), want, f"threaded call on {tier}")
                seen.append(tier)
        except Exception as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=calls) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]
    assert fn.wait_native(timeout=300) and fn.tier_of(*args, scale=1.5) == "native"
    check(fn(*args, scale=1.5), want, "after the threads")
    assert len(seen) == 240 and "jax" in seen


def test_the_quick_tier_says_so_in_its_fusion_report_and_keeps_weak_types(monkeypatch):
    def scaled(x, s):
        return x * s  # s a weak float: the result keeps x's float16

    gate = threading.Event()
    slowed_native_compile(monkeypatch, gate)
    x = np.linspace(-2, 2, 12, dtype=np.float16)
    fn = xfuse.jit(scaled, tiers=True)
    got = fn(x, 3.0)
    assert got.dtype == np.float16 and fn.tier_of(x, 3.0) == "jax"
    np.testing.assert_array_equal(got, np.asarray(jax.jit(scaled)(x, 3.0)))
    (quick,) = fn._cache.values()
    assert "jax.jit's executable" in str(quick.fusion_report()) and quick.kernel_count() == 0
    gate.set()
    assert fn.wait_native(timeout=300) and fn.tier_of(x, 3.0) == "native"
    np.testing.assert_array_equal(fn(x, 3.0), np.asarray(jax.jit(scaled)(x, 3.0)))


@pytest.mark.parametrize("how", ["tiers=False", "jax backend", "environment"])
def test_calls_that_do_not_tier_run_native_code_from_the_first(how, monkeypatch):
    args = arguments()
    if how == "tiers=False":
        fn = xfuse.jit(layer, static_argnames="scale", tiers=False)
    elif how == "jax backend":
        fn = xfuse.jit(layer, static_argnames="scale", backend="jax")
    else:
        monkeypatch.setenv("XFUSE_TIERS", "0")
        fn = xfuse.jit(layer, static_argnames="scale")
    check(fn(*args, scale=0.5), jax.jit(layer, static_argnames="scale")(*args, scale=0.5), how, how != "jax backend")
    assert fn.tier_of(*args, scale=0.5) == "native"
    assert fn.wait_native(timeout=0)


def test_a_native_compile_that_fails_leaves_the_quick_tier_running_with_a_warning(monkeypatch):
    gate = threading.Event()
    slowed_native_compile(monkeypatch, gate, fail=True)
    args = arguments()
    fn = xfuse.jit(layer, static_argnames="scale", tiers=True)
    want = jax.jit(layer, static_argnames="scale")(*args, scale=0.5)
    check(fn(*args, scale=0.5), want, "quick tier")
    assert fn.tier_of(*args, scale=0.5) == "jax"
    with pytest.warns(RuntimeWarning, match="no native code today"):
        gate.set()
        assert fn.wait_native(timeout=60)
        for t in threading.enumerate():
            if t.name.startswith("xfuse native compile"):
                t.join(10)
    assert fn.tier_of(*args, scale=0.5) == "jax"
    check(fn(*args, scale=0.5), want, "still the quick tier")


def test_tiers_must_be_a_bool_or_none():
    with pytest.raises(ValueError, match="tiers"):
        xfuse.jit(layer, tiers="yes")
    assert tiers.enabled(None, "numba") == (tiers.os.environ.get("XFUSE_TIERS", "1") != "0")
    assert tiers.enabled(True, "numba") and not tiers.enabled(True, "jax") and not tiers.enabled(False, "c")


def test_a_function_jax_jit_cannot_compile_waits_for_native_code(monkeypatch):
    """Where the quick tier cannot be built, the first call waits for the native program."""
    def refused(self, lowered, fun):
        raise RuntimeError("no quick tier")

    monkeypatch.setattr(tiers.QuickCompiled, "__init__", refused)
    args = arguments()
    fn = xfuse.jit(layer, static_argnames="scale", tiers=True)
    check(fn(*args, scale=0.5), jax.jit(layer, static_argnames="scale")(*args, scale=0.5), "waited")
    assert fn.tier_of(*args, scale=0.5) == "native" and fn.wait_native(timeout=0)


def test_the_quick_tier_traces_in_the_callers_x64_mode(monkeypatch):
    """The quick tier compiles on a thread of its own: it takes the caller's x64 mode (a
    thread-local setting), so float64 stays float64 as on the native tier."""
    def poly(x):
        return x * x * 3.0 + 1e-300  # 1e-300 is 0 in float32

    gate = threading.Event()
    slowed_native_compile(monkeypatch, gate)
    x = np.linspace(-1, 1, 9)
    with jax.enable_x64(True):
        fn = xfuse.jit(poly, tiers=True)
        got = fn(x)
        assert fn.tier_of(x) == "jax"
        want = np.asarray(jax.jit(poly)(x))
        gate.set()
        assert fn.wait_native(timeout=300)
        native = fn(x)
    assert got.dtype == want.dtype == native.dtype == np.float64
    np.testing.assert_array_equal(got, want)
    np.testing.assert_allclose(native, want, rtol=1e-15, atol=0)
