"""Slices and concatenations standing alone (unfused, or a fusion of nothing else: the rowsplit's
parts of a loop's state and their results put back together) are numpy library steps on the
numba and C backends: no kernel is compiled for them, and they give jax.jit's values bit for
bit (strides, several operands, an operand repeated, scalars' dtypes, bfloat16 and bools).
Inside a loop they stay kernels, so the loop still runs natively; the C entry of an AOT
library (no library calls) keeps them as kernels too."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax import lax

import xfuse
from tests.backends.test_native_loop import drivers_of, traced
from xfuse.backends.numba.backend import compile_module
from xfuse.backends.numba.lowering import lower
from xfuse.hlo import parse
from xfuse.runtime.program import walk

rng = np.random.default_rng(5)
A = rng.standard_normal((6, 10)).astype(np.float32)
A[0, :4] = [np.nan, -np.inf, -0.0, 1e-45]
B = rng.standard_normal((6, 3)).astype(np.float32)
CASES = {
    "slice": (lambda x: x[1:5, 2:9], (A,), ["slice"]),
    "strided_slice": (lambda x: lax.slice(x, (0, 1), (6, 10), (2, 3)), (A,), ["slice"]),
    "two_slices_of_one_operand": (lambda x: (x[:3], x[3:]), (A,), ["slice"]),
    "concatenate": (lambda x, y: jnp.concatenate([x, y], axis=1), (A, B), ["concatenate"]),
    "an_operand_repeated": (lambda x, y: jnp.concatenate([y, x, x, y], axis=1), (A, B), ["concatenate"]),
    "leading_axis": (lambda x, y: jnp.concatenate([x, y, x]), (A, A[:2] * 2), ["concatenate"]),
    "int32": (lambda x: jnp.concatenate([x[::-1][:2], x]),
              (np.array([-(2**31), 7, 2**31 - 1], np.int32),), None),
    "bool": (lambda x, y: jnp.concatenate([x, y]), (np.array([True, False]), np.array([False])), ["concatenate"]),
    "bfloat16": (lambda x: (x[:, 1:], x[:, :1]), (np.array([[1.5, -np.inf], [0.25, np.nan]], ml_dtypes.bfloat16),),
                 ["slice"]),
}


@pytest.mark.parametrize("backend", ["numba", "c"])
@pytest.mark.parametrize("name", list(CASES))
def test_a_lone_copy_is_a_numpy_step_with_jaxs_values(name, backend):
    fn, args, library = CASES[name]
    compiled = xfuse.jit(fn, backend=backend).lower(*args).compile()
    steps = list(walk(lower(compiled.module).program))
    if library is not None:  # (a reversal fuses with its slice into a kernel: only the values)
        assert [s.get("fn") for s in steps if s["op"] == "library"] == library
        assert not any(s["op"] == "kernel" for s in steps), "a kernel was compiled for the copy"
    got, want = jax.tree.leaves(compiled(*args)), jax.tree.leaves(jax.jit(fn)(*args))
    assert len(got) == len(want)
    for g, w in zip(got, want):
        g, w = np.asarray(g), np.asarray(w)
        assert g.dtype == w.dtype and g.shape == w.shape
        assert g.tobytes() == w.tobytes()


def test_results_are_buffers_of_their_own():
    x = A.copy()
    head, tail = xfuse.jit(lambda v: (v[:3], v[3:]))(x)
    for part in (head, tail):
        assert part.flags.writeable and not np.shares_memory(part, x)
    x[0, 0] = 100.0
    assert np.isnan(head[0, 0])


def test_the_split_rnn_copies_its_parts_with_numpy_and_its_loops_stay_native():
    def rnn(xs, wx, wh, b):
        return lax.scan(lambda h, x: (jnp.tanh(x @ wx + h @ wh + b),) * 2, jnp.zeros((16, 256), jnp.float32), xs)[1]

    args = (rng.standard_normal((6, 16, 256)).astype(np.float32),
            (rng.standard_normal((256, 256)) / 16).astype(np.float32),
            (rng.standard_normal((256, 256)) / 16).astype(np.float32),
            rng.standard_normal(256).astype(np.float32))
    compiled = xfuse.jit(rnn).lower(*args).compile()
    steps = lower(compiled.module).program["steps"]
    loops = [s for s in steps if s["op"] == "while"]
    assert len(loops) == 2, "the loop was not split"  # the copies below exist for the split
    assert sorted(s["fn"] for s in steps if s["op"] == "library" and s["fn"] in ("slice", "concatenate")) \
        == ["concatenate", "slice"]
    module = traced(rnn, *args)
    lowered, drivers = drivers_of(module)
    assert all(s.get("native") in drivers for s in walk(lowered.program) if s["op"] == "while")
    got, want = np.asarray(compiled(*args)), np.asarray(jax.jit(rnn)(*args))
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)


def test_in_a_loop_body_a_slice_stays_a_kernel_and_the_loop_runs_natively():
    def slices_in_loop(x):
        return lax.fori_loop(0, 3, lambda i, c: jnp.concatenate([c[1:], c[:1]]) * 2.0, x)

    module = traced(slices_in_loop, A[0, 4:])
    lowered, drivers = drivers_of(module)
    loops = [s for s in walk(lowered.program) if s["op"] == "while"]
    assert loops and all(s.get("native") in drivers for s in loops)
    assert not any(s["op"] == "library" for s in walk(loops[0]["body"]))
    got = xfuse.jit(slices_in_loop)(A[0, 4:])
    assert got.tobytes() == np.asarray(jax.jit(slices_in_loop)(A[0, 4:])).tobytes()


def test_the_c_entry_keeps_copies_as_kernels():
    compiled = xfuse.jit(CASES["concatenate"][0]).lower(A, B).compile()
    steps = list(walk(lower(compiled.module, fills=False).program))
    assert not any(s["op"] == "library" for s in steps)
    assert any(s["op"] == "kernel" for s in steps)


ONE_TUPLE = """
HloModule one_tuple

fused_slice (p0: f32[6,10]) -> (f32[2,10]) {
  p0 = f32[6,10] parameter(0)
  slice.0 = f32[2,10] slice(p0), start={1,0}, limit={3,10}, strides={1,1}
  ROOT tuple.1 = (f32[2,10]) tuple(slice.0)
}

ENTRY main (x: f32[6,10]) -> f32[2,10] {
  x = f32[6,10] parameter(0)
  fusion.0 = (f32[2,10]) fusion(x), kind=loop, calls=fused_slice
  ROOT element.0 = f32[2,10] get_tuple_element(fusion.0), index=0
}
"""


def test_a_slice_in_a_one_element_tuple_stays_a_kernel():
    # a value in a 1-tuple is a kernel's output wrapped by a tuple step: the element read
    # from it is the slice, not the slice's first row
    module = parse(ONE_TUPLE)
    assert not any(s["op"] == "library" for s in walk(lower(module).program))
    (got,) = compile_module(module)([A])
    assert got.tobytes() == A[1:3].tobytes()
