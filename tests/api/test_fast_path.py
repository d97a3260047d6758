"""The dispatch fast path of `xfuse.jit`: positional numpy arrays seen before go straight to
the executable, and everything the slow path would treat differently still takes it."""

from __future__ import annotations

import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import xfuse


def counted(fn):
    calls = []

    def wrapper(*args, **kwargs):
        calls.append(1)
        return fn(*args, **kwargs)

    wrapper.calls = calls
    return wrapper


class Marked(np.ndarray):
    """An ndarray subclass of the same shape and dtype as the arrays the fast path has seen."""


def test_repeated_calls_take_the_fast_path_and_stay_right():
    f = counted(lambda x, y: x * y + 1.0)
    jitted = xfuse.jit(f)
    x, y = np.arange(6, dtype=np.float32).reshape(2, 3), np.full((2, 3), 2, np.float32)
    first = jitted(x, y)
    assert len(jitted._fast) == 1
    for k in range(3):
        np.testing.assert_array_equal(jitted(x + k, y), (x + k) * y + 1)
    assert len(f.calls) == 1
    assert first is not jitted(x, y)


@pytest.mark.parametrize("other", [
    lambda x: jnp.asarray(x),  # a jax array: not a numpy array
    lambda x: x.astype(np.float64),  # canonicalised to float32 by the slow path
    lambda x: x.astype(">f4"),  # big-endian
    lambda x: np.asfortranarray(x),  # same shape and dtype, another layout
    lambda x: np.repeat(x, 2, axis=1)[:, ::2],  # same shape and dtype, strided
    lambda x: x.view(Marked),  # an ndarray subclass: its class is part of the key
])
def test_other_arguments_are_right_too(other):
    jitted = xfuse.jit(lambda x: jnp.sin(x) * 2.0)
    x = np.linspace(-3, 3, 12, dtype=np.float32).reshape(3, 4)
    jitted(x)
    given = other(x)
    got = jitted(given)
    native = given.astype(given.dtype.newbyteorder("=")) if isinstance(given, np.ndarray) else given
    want = jax.jit(lambda x: jnp.sin(x) * 2.0)(native)  # jax refuses big-endian; xfuse reads it
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6, atol=1e-6)
    assert np.asarray(got).dtype == np.asarray(want).dtype


def test_x64_is_part_of_the_key():
    jitted = xfuse.jit(lambda x: x + 1)
    x = np.ones(3, np.float64)
    assert jitted(x).dtype == np.float32
    with jax.enable_x64(True):
        assert jitted(x).dtype == np.float64
    assert jitted(x).dtype == np.float32


def test_static_arguments_never_take_the_fast_path():
    f = counted(lambda x, n: x * n)
    jitted = xfuse.jit(f, static_argnums=1)
    x = np.ones(3, np.float32)
    assert jitted(x, 2)[0] == 2 and jitted(x, 3)[0] == 3 and jitted(x, 2)[0] == 2
    assert len(f.calls) == 2 and not jitted._fast


def test_wrong_arguments_after_a_fast_call_still_raise():
    jitted = xfuse.jit(lambda x: x + 1)
    jitted(np.ones(3, np.float32))
    with pytest.raises(TypeError):
        jitted("text")
    np.testing.assert_array_equal(jitted(np.ones(3, np.float32)), 2)


class ArrayLike:
    """Not an array, though it has a shape (an unhashable one) and a dtype."""

    shape = [3]
    dtype = np.float32


def test_an_object_with_an_unhashable_shape_gets_the_slow_paths_error():
    fresh = xfuse.jit(lambda x: x + 1)
    with pytest.raises(TypeError) as first:
        fresh(ArrayLike())
    assert str(first.value).startswith("argument x: ArrayLike is not an array")
    jitted = xfuse.jit(lambda x: x + 1)
    jitted(np.ones(3, np.float32))
    with pytest.raises(TypeError) as later:
        jitted(ArrayLike())
    assert str(later.value) == str(first.value)


def test_large_outputs_are_never_shared_between_calls():
    jitted = xfuse.jit(lambda x: x * 2.0)
    x = np.ones(1 << 20, np.float32)  # 4 MiB: pooled
    a = jitted(x)
    b = jitted(x + 1)
    assert not np.shares_memory(a, b)
    np.testing.assert_array_equal(a, 2)
    np.testing.assert_array_equal(b, 4)
    view = a[5:9]
    del a
    c = jitted(x + 2)
    assert not np.shares_memory(view, c)
    np.testing.assert_array_equal(view, 2)


def python_calls(fn) -> list[str]:
    """The Python functions that run during fn()."""
    names = []
    sys.setprofile(lambda frame, event, arg: names.append(frame.f_code.co_name) if event == "call" else None)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return names


def test_a_one_kernel_call_goes_straight_to_its_kernel_once_settled():
    """The fast path is chosen after the first call, which compiled (or loaded) the kernel and
    settled it, so later calls skip the step wrapper that only the first call needed: the
    entry point calls one generated function, which checks the arguments, allocates the
    output and calls the kernel's compiled entry (not its dispatcher, a Python-level call on
    3.11). The `__call__` of a Compiled, and of a jitted function while the signature is the
    one it was called with last, is that generated function."""
    x = np.arange(4, dtype=np.float32)
    jitted = xfuse.jit(lambda x: x + 1)
    compiled = jitted.lower(x).compile()
    for call in (lambda: jitted(x), lambda: compiled(x)):
        np.testing.assert_array_equal(call(), x + 1)  # the first call: compiles, settles
        names = python_calls(call)
        assert names == ["<lambda>", "run"], names
        np.testing.assert_array_equal(call(), x + 1)
    assert isinstance(compiled, xfuse.stages.Compiled) and type(compiled).__name__ == "Compiled"
    assert isinstance(jitted, xfuse.api.Jitted) and type(jitted).__name__ == "Jitted"
    y = np.arange(3, dtype=np.float32)
    np.testing.assert_array_equal(jitted(y), y + 1)  # another signature: through Jitted.__call__
    assert "__call__" in python_calls(lambda: jitted(x))  # back to the first: its class again
    assert python_calls(lambda: jitted(x)) == ["<lambda>", "run"]


def test_arrays_of_another_layout_never_reach_the_kernels_exact_entry():
    """The settled call goes to the kernel's entry compiled for C-ordered, aligned, writable
    arrays, which reads whatever it is passed as such: arrays of the right shape and dtype but
    strided, in Fortran order, misaligned or read-only go through the dispatcher instead, and
    every result agrees with numpy. So do calls by keyword, with too few or too many
    arguments (the checked path's errors)."""
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    f = lambda a, b: a * 2 + b  # noqa: E731
    jitted = xfuse.jit(f)
    compiled = jitted.lower(x, x).compile()
    raw = np.zeros(x.nbytes + 1, np.uint8)
    misaligned = np.frombuffer(raw.data, np.float32, 12, offset=1).reshape(3, 4)
    assert not misaligned.flags.aligned
    readonly = x.copy()
    readonly.flags.writeable = False
    others = [np.arange(24, dtype=np.float32).reshape(3, 8)[:, ::2], np.asfortranarray(x), misaligned,
              readonly, np.arange(24, dtype=np.float32).reshape(6, 4)[::2]]
    for fn in (jitted, compiled):
        np.testing.assert_array_equal(fn(x, x), 3 * x)  # settles
        for other in others:
            np.testing.assert_array_equal(fn(other, x), f(other, x))
            np.testing.assert_array_equal(fn(x, other), f(x, other))
            np.testing.assert_array_equal(fn(x, x), 3 * x)
        with pytest.raises(TypeError):
            fn(x)
        with pytest.raises(TypeError):
            fn()
        with pytest.raises(TypeError):
            fn(x, x, x)
    with pytest.raises(TypeError, match="takes 2 array arguments"):  # the checked path's error
        compiled(x, b=x)


def test_the_guarded_call_takes_only_the_signature_it_was_made_for():
    """Each argument is checked by its class, shape and dtype before the kernel runs; anything
    else falls through to the checked path (which compiles another signature or says what is
    wrong) and gives the same values as jax.jit."""
    x = np.arange(4, dtype=np.float32)
    jitted = xfuse.jit(lambda x, y: x * 2 + y)
    compiled = jitted.lower(x, x).compile()
    for fn in (jitted, compiled):
        np.testing.assert_array_equal(fn(x, x), 3 * x)  # settles the guarded call
        np.testing.assert_array_equal(fn(x, x), 3 * x)
        assert fn(x, x) is not fn(x, x)  # a fresh output each call
        strided = np.arange(8, dtype=np.float32)[::2]
        np.testing.assert_array_equal(fn(strided, x), strided * 2 + x)
        np.testing.assert_array_equal(fn(x, x.reshape(1, 4)[0]), 3 * x)
        with pytest.raises(TypeError):
            fn(x)
        with pytest.raises(TypeError):
            fn(x, x, x)
        np.testing.assert_array_equal(fn(x, x), 3 * x)
    with pytest.raises(TypeError, match="should be"):
        compiled(x, np.arange(5, dtype=np.float32))
    converted = compiled(x, x.astype(np.float64))  # canonicalised as jax does without x64
    assert converted.dtype == np.float32
    np.testing.assert_array_equal(converted, 3 * x)
    np.testing.assert_array_equal(jitted(x.astype(np.int32), x), x * 2 + x)  # a new signature
    np.testing.assert_array_equal(jitted(np.arange(6, dtype=np.float32), np.ones(6, np.float32)),
                                  np.arange(6) * 2 + 1)
    np.testing.assert_array_equal(jitted(x, x), 3 * x)  # and back to the first
    assert jitted._cache_size() == 3


def test_jitted_tries_the_signature_it_called_last_first():
    """Alternating signatures each take the guarded call of the last one or the dictionary of
    signatures: every result is right, and x64 or another backend block is never served by a
    guarded call made outside it."""
    jitted = xfuse.jit(lambda x: x + 1)
    a, b = np.arange(4, dtype=np.float32), np.arange(3, dtype=np.float32)
    for _ in range(3):
        np.testing.assert_array_equal(jitted(a), a + 1)
        np.testing.assert_array_equal(jitted(b), b + 1)
    with xfuse.default_backend("reference"):
        out = jitted(a)
        assert jitted._last[1] is not None
        np.testing.assert_array_equal(out, a + 1)
    np.testing.assert_array_equal(jitted(a), a + 1)
    assert jitted._cache_size() == 3


def test_a_settled_product_with_its_epilogue_in_place_skips_the_general_path():
    """softmax(relu(x @ w + b)) for one row: the product is written into the output and the
    epilogue works there; once the first call has settled the kernel, calls take that path
    alone (no row split, no buffer pool) and agree with jax.jit."""
    def f(x, w, b):
        return jax.nn.softmax(jax.nn.relu(x @ w + b), axis=-1)

    g = np.random.default_rng(0)
    x, w = g.standard_normal((1, 64)).astype(np.float32), g.standard_normal((64, 48)).astype(np.float32)
    b = g.standard_normal(48).astype(np.float32)
    special = x.copy()
    special[0, 3] = np.inf  # inf - inf makes NaN in the softmax, in both
    jitted, got = xfuse.jit(f), []
    first = python_calls(lambda: got.append(jitted(x, w, b)))
    assert "in_place" not in first
    later = python_calls(lambda: got.append(jitted(special, w, b)))
    assert "in_place" in later and "run_rows" not in later, later
    for given, result in zip((x, special), got):
        np.testing.assert_allclose(result, jax.jit(f)(given, w, b), rtol=2e-6, atol=1e-7)
    assert np.isnan(got[1]).any()
