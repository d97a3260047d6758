"""The pytree fast path of `xfuse.jit` (a training step's parameters and optimizer state: dicts
and tuples of arrays) and the count of steps a call runs in Python (`steps_per_call`)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import xfuse

from .test_fast_path import counted as traced


def step(params, state, x):
    h = jnp.tanh(x @ params["w"] + params["b"])
    grads = {"w": x.T @ h, "b": h.sum(0)}
    new = jax.tree_util.tree_map(lambda p, g: p - 0.1 * g, params, grads)
    return new, (state[0] + 1, state[1] * 0.5), h.mean()


def arguments(seed: int = 0):
    rng = np.random.default_rng(seed)
    params = {"w": rng.standard_normal((6, 4), np.float32), "b": rng.standard_normal(4, np.float32)}
    return params, (np.array(3, np.int32), np.ones(4, np.float32)), \
        rng.standard_normal((5, 6), np.float32)


def assert_same(got, want) -> None:
    assert jax.tree_util.tree_structure(got) == jax.tree_util.tree_structure(want)
    for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        assert np.asarray(g).dtype == np.asarray(w).dtype
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=2e-6, atol=2e-6)


def test_pytrees_of_numpy_arrays_take_the_tree_fast_path_and_stay_right():
    f = traced(step)
    jitted = xfuse.jit(f)
    for seed in range(3):
        args = arguments(seed)
        assert_same(jitted(*args), jax.jit(step)(*args))
    assert len(f.calls) == 1 and len(jitted._tree_fast) == 1
    entry = next(iter(jitted._tree_fast.values()))
    assert entry[1] is None  # every leaf passed as it is


def test_jax_arrays_and_non_canonical_dtypes_are_converted_on_the_fast_path():
    params, state, x = arguments()
    params = jax.tree_util.tree_map(jnp.asarray, params)  # as a library's init returns them
    x64 = x.astype(np.float64)  # canonicalised to float32, as jax.jit does
    jitted = xfuse.jit(traced(step))
    for k in range(3):
        shifted = jax.tree_util.tree_map(lambda p: p + k, params)
        assert_same(jitted(shifted, state, x64), jax.jit(step)(shifted, state, x64))
    assert len(jitted.fun.calls) == 1
    (run, converts), = jitted._tree_fast.values()
    assert converts is not None and np.dtype(np.float32) in converts


def test_numpy_scalars_take_the_fast_path_as_arrays():
    jitted = xfuse.jit(traced(lambda tree: tree["x"] * tree["n"]))
    for n in (2, 3):
        tree = {"x": np.arange(3, dtype=np.float32), "n": np.float32(n)}
        np.testing.assert_array_equal(jitted(tree), tree["x"] * n)
    assert len(jitted.fun.calls) == 1 and len(jitted._tree_fast) == 1


def test_a_weak_jax_array_misses_the_entry_of_a_strong_one():
    def f(tree):
        return tree["x"] + jnp.float16(1)  # a weak x takes float16, a strong one float32

    jitted = xfuse.jit(f)
    strong = {"x": jnp.asarray(np.float32(2.0))}
    weak = {"x": jnp.asarray(2.0)}
    assert not strong["x"].weak_type and weak["x"].weak_type
    assert jitted(strong).dtype == jax.jit(f)(strong).dtype == np.float32
    assert jitted(weak).dtype == jax.jit(f)(weak).dtype == np.float16
    assert jitted(strong).dtype == np.float32


def test_another_structure_or_shape_takes_the_slow_path():
    jitted = xfuse.jit(traced(step))
    params, state, x = arguments()
    jitted(params, state, x)
    bigger = np.ones((7, 6), np.float32)
    assert_same(jitted(params, state, bigger), jax.jit(step)(params, state, bigger))
    assert len(jitted.fun.calls) == 2
    with pytest.raises(TypeError, match=r"argument args\[2\]: str is not an array"):
        jitted(params, state, "text")


def test_another_structure_is_traced_again():
    def total(tree):
        return sum(jnp.sum(leaf) for leaf in jax.tree_util.tree_leaves(tree))

    jitted = xfuse.jit(traced(total))
    small = {"a": np.ones(3, np.float32)}
    more = dict(small, b=np.full(2, 2, np.float32))
    for tree in (small, more, small, more):
        np.testing.assert_allclose(jitted(tree), jax.jit(total)(tree))
    assert len(jitted.fun.calls) == 2 and len(jitted._tree_fast) == 2


def test_static_values_are_part_of_the_tree_key():
    jitted = xfuse.jit(lambda tree, n: tree["a"] * n, static_argnums=1)
    tree = {"a": np.arange(3, dtype=np.float32)}
    for n in (2, 3, 2):
        np.testing.assert_array_equal(jitted(tree, n), tree["a"] * n)
    assert len(jitted._tree_fast) == 2


def test_steps_per_call_counts_loop_iterations_run_in_python():
    def loop(x, n):
        def body(carry):
            i, v = carry
            return i + 1, jnp.sort(v) * 0.5 + 1.0  # a sort: the runtime runs this loop itself

        return lax.while_loop(lambda carry: carry[0] < n, body, (0, x))

    x = np.arange(8, dtype=np.float32)[::-1].copy()
    compiled = xfuse.jit(loop).lower(x, np.int32(3)).compile()
    three, six = compiled.steps_per_call(x, np.int32(3)), compiled.steps_per_call(x, np.int32(6))
    assert six > three > 0
    per_iteration = (six - three) // 3
    assert per_iteration >= 2 and three == (six - 3 * per_iteration)


def test_steps_per_call_of_a_loop_run_natively_does_not_grow():
    def loop(x, n):
        return lax.fori_loop(0, n, lambda i, v: jnp.sin(v) * 1.01 + 0.5, x)

    x = np.ones(8, np.float32)
    compiled = xfuse.jit(loop).lower(x, np.int32(3)).compile()
    assert compiled.steps_per_call(x, np.int32(3)) == compiled.steps_per_call(x, np.int32(30))
    np.testing.assert_allclose(compiled(x, np.int32(30)), jax.jit(loop)(x, 30), rtol=1e-5)
