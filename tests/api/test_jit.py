"""xfuse.jit and its stages: one trace per signature, static arguments, pytrees, Python
scalars, transformed functions, and the errors a user meets, each named."""

import dataclasses
import inspect
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import xfuse
from xfuse.frontend import UnsupportedPrimitiveError

RNG = np.random.default_rng(0)


def f32(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def test_decorator_with_and_without_arguments():
    @xfuse.jit
    def plain(x):
        return x * 2

    @xfuse.jit(static_argnums=1)
    def scaled(x, k):
        return x * k

    x = f32(3)
    np.testing.assert_array_equal(plain(x), x * 2)
    np.testing.assert_array_equal(scaled(x, 3), x * 3)


def test_one_trace_per_signature():
    traces = []

    @xfuse.jit
    def f(x, y):
        traces.append(1)
        return x + y

    x, y = f32(4), f32(4)
    f(x, y)
    f(x + 1, y)
    assert len(traces) == 1 and f._cache_size() == 1
    f(f32(5), f32(5))  # new shape
    f(x.astype(np.int32), y.astype(np.int32))  # new dtype
    f(x, 1.0)  # a Python scalar: weakly typed f32[]
    f(x, 2.0)  # same signature as the previous call
    assert len(traces) == 4
    f(x, np.float32(2.0))  # a numpy scalar is strongly typed: a new signature
    assert len(traces) == 5


def test_static_arguments_are_part_of_the_signature():
    traces = []

    def f(x, n, *, mode):
        traces.append((n, mode))
        return x * n if mode == "mul" else x + n

    g = xfuse.jit(f, static_argnums=1, static_argnames="mode")
    x = f32(3)
    np.testing.assert_allclose(g(x, 2, mode="mul"), x * 2)
    np.testing.assert_allclose(g(x, 2, mode="mul"), x * 2)
    np.testing.assert_allclose(g(x, 3, mode="add"), x + 3)
    assert traces == [(2, "mul"), (3, "add")]


def test_static_argnames_given_by_position():
    g = xfuse.jit(lambda x, axis: jnp.sum(x, axis=axis), static_argnames="axis")
    x = f32(2, 3)
    np.testing.assert_allclose(g(x, 1), x.sum(1), rtol=1e-6)
    np.testing.assert_allclose(g(x, axis=0), x.sum(0), rtol=1e-6)


class Pair(NamedTuple):
    a: jax.Array
    b: jax.Array


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Params:
    w: jax.Array
    b: jax.Array


def test_pytrees_in_and_out():
    @xfuse.jit
    def f(params, pair, extras):
        y = pair.a @ params.w + params.b
        return {"y": y, "parts": [pair.b * 2, extras["scale"] * y], "pair": Pair(y, pair.b)}

    params = Params(f32(3, 2), f32(2))
    pair = Pair(f32(4, 3), f32(5))
    out = f(params, pair, {"scale": 0.5})
    want = jax.jit(f.fun)(params, pair, {"scale": 0.5})
    assert jax.tree_util.tree_structure(out) == jax.tree_util.tree_structure(want)
    for got, ref in zip(jax.tree_util.tree_leaves(out), jax.tree_util.tree_leaves(want)):
        assert isinstance(got, np.ndarray)
        np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-6)


def test_jax_arrays_and_python_scalars_as_arguments():
    f = xfuse.jit(lambda x, s, i, flag: jnp.where(flag, x * s + i, x))
    x = jnp.arange(4.0)
    got = f(x, 2.5, 3, True)
    np.testing.assert_allclose(got, np.arange(4.0) * 2.5 + 3)
    assert got.dtype == np.float32


def test_float64_arguments_are_canonicalised_as_jax_does():
    f = xfuse.jit(lambda x: x + 1)
    out = f(np.arange(3.0))  # float64 in, float32 out without x64, as with jax.jit
    assert out.dtype == jax.jit(lambda x: x + 1)(np.arange(3.0)).dtype


def cross_entropy(w, x, labels):
    logits = x @ w
    return -jnp.mean(jnp.sum(jax.nn.log_softmax(logits) * jax.nn.one_hot(labels, 3), axis=-1))


@pytest.mark.parametrize(
    "transform",
    [jax.grad, jax.value_and_grad, lambda f: jax.vmap(f, in_axes=(None, 0, 0))],
    ids=["grad", "value_and_grad", "vmap"],
)
def test_functions_transformed_by_jax(transform):
    w, x, labels = f32(5, 3), f32(4, 5), np.array([0, 2, 1, 0], np.int32)
    if "vmap" in repr(transform):
        x, labels = x[:, None, :], labels[:, None]
    f = transform(cross_entropy)
    got, want = xfuse.jit(f)(w, x, labels), jax.jit(f)(w, x, labels)
    for g, r in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        np.testing.assert_allclose(g, r, rtol=2e-5, atol=2e-6)


def test_stages_lowered_and_compiled():
    def mlp(x, w, b):
        return jax.nn.softmax(jax.nn.relu(x @ w + b), axis=-1)

    f = xfuse.jit(mlp)
    x, w, b = f32(4, 8), f32(8, 3), f32(3)
    lowered = f.lower(x, w, b)
    assert isinstance(lowered, xfuse.Lowered)
    text = lowered.as_text()
    assert text.startswith("HloModule mlp")
    assert "ENTRY main (x: f32[4,8], w: f32[8,3], b: f32[3]) -> f32[4,3]" in text
    line = inspect.getsourcelines(mlp)[1] + 1
    assert f'test_jit.py:{line} (test_stages_lowered_and_compiled.<locals>.mlp)"' in text
    compiled = lowered.compile()
    assert isinstance(compiled, xfuse.Compiled)
    assert "ROOT" in compiled.as_text()
    np.testing.assert_allclose(compiled(x, w, b), jax.jit(mlp)(x, w, b), rtol=1e-6, atol=1e-7)


def test_compiled_rejects_another_signature_naming_the_argument():
    compiled = xfuse.jit(lambda x, w: x @ w).lower(f32(4, 8), f32(8, 3)).compile()
    with pytest.raises(TypeError, match=r"argument w should be f32\[8,3\], got f32\[8,4\]"):
        compiled(f32(4, 8), f32(8, 4))
    with pytest.raises(TypeError, match=r"argument x should be f32\[4,8\], got s32\[4,8\]"):
        compiled(np.zeros((4, 8), np.int32), f32(8, 3))
    with pytest.raises(TypeError, match=r"takes 2 array arguments \(x, w\), got 1"):
        compiled(f32(4, 8))


def test_compiled_takes_only_the_dynamic_arguments():
    g = xfuse.jit(lambda x, n: x * n, static_argnums=1)
    compiled = g.lower(f32(3), 4).compile()
    x = f32(3)
    np.testing.assert_allclose(compiled(x), x * 4)


def test_unsupported_primitive_names_itself_its_params_and_the_user_line():
    def uses_bessel_i1e(x):
        return jax.lax.bessel_i1e(x)

    line = inspect.getsourcelines(uses_bessel_i1e)[1] + 1
    with pytest.raises(UnsupportedPrimitiveError) as info:
        xfuse.jit(uses_bessel_i1e)(np.arange(4, dtype=np.float32))
    message = str(info.value)
    assert "'bessel_i1e'" in message
    assert f"test_jit.py:{line} (" in message and "uses_bessel_i1e)" in message
    assert "params: {" in message
    assert info.value.primitive == "bessel_i1e"


def test_unsupported_primitive_lists_its_parameters():
    with pytest.raises(UnsupportedPrimitiveError, match=r"'cumlogsumexp'.*params: \{axis=0, reverse=False\}"):
        xfuse.jit(lambda x: jax.lax.cumlogsumexp(x, axis=0))(f32(4))


def test_bad_options_raise_value_errors_naming_the_option():
    with pytest.raises(ValueError, match="backend='nope' is not available"):
        xfuse.jit(lambda x: x, backend="nope")
    with pytest.raises(ValueError, match="static_argnums must hold ints"):
        xfuse.jit(lambda x: x, static_argnums=("x",))
    with pytest.raises(ValueError, match="static_argnames must hold strs"):
        xfuse.jit(lambda x: x, static_argnames=(1.5,))
    with pytest.raises(TypeError, match="expects a function"):
        xfuse.jit(3)


def test_unhashable_static_argument_is_named():
    g = xfuse.jit(lambda x, opts: x, static_argnums=1)
    with pytest.raises(ValueError, match=r"static argument args\[1\] must be hashable, got list"):
        g(f32(2), [1, 2])


def test_unsupported_argument_types_are_named():
    g = xfuse.jit(lambda x, y: x + y)
    with pytest.raises(TypeError, match="argument y: complex numbers are not supported"):
        g(f32(2), 1j)
    with pytest.raises(TypeError, match="argument y: str is not an array"):
        g(f32(2), "text")


def test_outputs_are_numpy_arrays_even_for_passthrough_and_constants():
    f = xfuse.jit(lambda x: (x, jnp.float32(3.0), jnp.zeros(2)))
    outs = f(f32(2))
    assert all(isinstance(o, np.ndarray) for o in outs)
    np.testing.assert_array_equal(outs[2], np.zeros(2, np.float32))
