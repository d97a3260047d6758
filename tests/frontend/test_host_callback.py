"""Host callbacks (`jax.pure_callback`, and so `equinox.error_if`): a `callback` instruction
that calls the traced Python function when the program runs, on every backend and in the
reference interpreter, inside loops and branches; its error reaches the caller; it prints and
parses back in the process that traced it; an AOT artifact refuses it by name."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import xfuse
from xfuse.hlo import DType, Op, Shape, TupleShape, interpret, parse, print_module, verify
from xfuse.hlo import callbacks

calls = []


def _host_cube(x):
    calls.append(x.shape)
    return np.asarray(x, np.float64) ** 3  # a wider dtype than declared: cast, as jax does


def _cubed(x):
    return jax.pure_callback(_host_cube, jax.ShapeDtypeStruct(x.shape, x.dtype), x)


def f_callback(x):
    return jnp.sin(_cubed(x * 2.0)) + 1.0


def _edge_values():
    x = np.linspace(-2, 2, 12, dtype=np.float32)
    x[:4] = [np.nan, np.inf, -np.inf, -0.0]
    return x


@pytest.mark.parametrize("backend", ["numba", "c", "jax", "reference"])
def test_a_pure_callback_runs_as_jax_jit_runs_it(backend):
    x = _edge_values()
    calls.clear()
    got = np.asarray(xfuse.jit(f_callback, backend=backend)(x))
    assert calls, "the host function was not called"
    want = np.asarray(jax.jit(f_callback)(x))
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_callbacks_of_several_results_inside_a_loop_and_a_branch():
    def host(x, n):
        return x + n, (n * 2).astype(np.int32)

    def f(x):
        def body(carry):
            x, n = carry
            shapes = (jax.ShapeDtypeStruct(x.shape, x.dtype), jax.ShapeDtypeStruct((), jnp.int32))
            y, m = lax.cond(n % 2 == 0, lambda: jax.pure_callback(host, shapes, x, n),
                            lambda: (x * 0.5, n + 1))
            return y, m

        return lax.while_loop(lambda c: c[1] < 40, body, (x, jnp.int32(1)))

    x = np.arange(5, dtype=np.float32)
    compiled = xfuse.jit(f).lower(x).compile()
    got, want = compiled(x), jax.jit(f)(x)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-6)
    assert int(got[1]) == int(want[1]) == 64  # 1, 2, 4, ..., 64: odd adds one, even doubles
    assert compiled.steps_per_call(x) == 4  # the native loop and views of its state: no step per iteration


def test_an_error_raised_by_the_host_function_reaches_the_caller():
    import equinox as eqx

    def f(x):
        return eqx.error_if(x, jnp.any(x < 0), "x must not be negative") * 2.0

    fn = xfuse.jit(f)
    np.testing.assert_array_equal(fn(np.ones(3, np.float32)), np.full(3, 2.0, np.float32))
    with pytest.raises(Exception, match="x must not be negative"):
        fn(np.array([1.0, -1.0, 2.0], np.float32))


def test_a_result_of_the_wrong_shape_names_the_callback():
    def f(x):
        return jax.pure_callback(lambda v: np.zeros(7, np.float32), jax.ShapeDtypeStruct((3,), jnp.float32), x)

    with pytest.raises(Exception, match=r"host callback \d+.*shape \(7,\)"):
        xfuse.jit(f)(np.ones(3, np.float32))


def test_the_instruction_prints_parses_back_and_interprets():
    number = callbacks.register(lambda x: (np.negative(x),))
    assert callbacks.register(callbacks.lookup(number)) == number  # the same function, the same number
    text = f"""HloModule m

ENTRY main (p0: f32[3]) -> f32[3] {{
  p0 = f32[3] parameter(0)
  cb = (f32[3]) callback(p0), callback={number}
  ROOT r = f32[3] get_tuple_element(cb), index=0
}}
"""
    module = parse(text)
    verify(module)
    assert parse(print_module(module)) == module
    inst = module.entry_computation["cb"]
    assert inst.op is Op.CALLBACK and inst.shape == TupleShape((Shape(DType.F32, (3,)),))
    np.testing.assert_array_equal(interpret(module, np.array([1, -2, 0], np.float32)), [-1, 2, -0.0])
    with pytest.raises(Exception, match="no host callback 99999"):
        interpret(parse(text.replace(f"callback={number}", "callback=99999")), np.ones(3, np.float32))


def test_an_artifact_refuses_a_callback_by_name(tmp_path):
    compiled = xfuse.jit(f_callback).lower(_edge_values()).compile()
    with pytest.raises(ValueError, match="calls a Python function"):
        xfuse.aot.save(compiled, tmp_path / "f.xfa")
    with pytest.raises(ValueError, match="emit_c: .*calls a Python function"):
        xfuse.aot.emit_c(compiled, tmp_path)
