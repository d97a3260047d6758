"""Scan fusion: a scan whose body is elementwise over its carries becomes one kernel
(`fusion(kind=scan)`) with the time loop inside, on the numba, C and JAX backends, with the
results of jax.jit and of the interpreter (forward and reverse, several carries, integer
wraparound, NaN and infinities, scalars, consts and the counter read by the body, blocks
split over threads); a loop that is not such a scan stays a while, and the report says why."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import xfuse
from xfuse.backends.numba.lowering import lower
from xfuse.backends.numba.scan import BLOCK
from xfuse.hlo import Op, interpret, parse, print_module, verify
from xfuse.runtime.program import walk

BACKENDS = ("numba", "c", "jax")


def ema(h0, xs):
    def cell(h, x):
        h = jnp.tanh(h * 0.9 + x)
        return h, h * 2.0
    return lax.scan(cell, h0, xs)


def reverse_sum(h0, xs):
    return lax.scan(lambda h, x: (h + x, h - x), h0, xs, reverse=True)


def fibonacci(a, b, xs):
    """Integer carries that swap, and wrap around int32."""
    def cell(carry, x):
        a, b = carry
        return (b, a + b + x), a * 3
    return lax.scan(cell, (a, b), xs)


def with_consts(h0, xs, w, alpha):
    """An invariant of the carry's shape, an invariant scalar and the step counter."""
    def cell(carry, x):
        h, t = carry
        h = jnp.where(x > 0, h * alpha + w * x, h - t.astype(jnp.float32))
        return (h, t + 1), jnp.maximum(h, x)
    (h, _), ys = lax.scan(cell, (h0, jnp.int32(0)), xs)
    return h, ys


def fori(x):
    return lax.fori_loop(0, 7, lambda i, v: v * 0.5 + jnp.float32(i), x)


def only_ys(xs):
    return lax.scan(lambda c, x: (c, jnp.sin(x) * 2.0), 0.0, xs)[1]


def rng(seed=0):
    return np.random.default_rng(seed)


def fused(fn, *args, backend="numba"):
    compiled = xfuse.jit(fn, backend=backend).lower(*args).compile()
    return compiled, compiled.as_text()


def assert_matches(fn, args, rtol=0.0, exact_reference=False):
    """Against jax.jit (within `rtol`: XLA contracts a * b + c into one fused multiply-add),
    and, with `exact_reference`, the numba and C kernels bit for bit against the interpreter,
    which rounds every op as they do."""
    want = jax.tree.leaves(jax.jit(fn)(*args))
    unfused = parse(xfuse.jit(fn, passes="none").lower(*args).as_text())
    reference = jax.tree.leaves(interpret(unfused, *args))
    for backend in BACKENDS:
        compiled, text = fused(fn, *args, backend=backend)
        assert "kind=scan" in text, backend
        got = jax.tree.leaves(compiled(*args))
        if exact_reference and backend != "jax":
            for g, r in zip(got, reference):
                np.testing.assert_array_equal(np.asarray(g), r, err_msg=f"{backend} against the interpreter")
        for g, w in zip(got, want):
            g, w = np.asarray(g), np.asarray(w)
            assert g.dtype == w.dtype and g.shape == w.shape, backend
            if rtol:
                np.testing.assert_allclose(g, w, rtol=rtol, atol=1e-6, err_msg=backend)
            else:
                np.testing.assert_array_equal(g, w, err_msg=backend)


def test_an_elementwise_scan_is_one_kernel_with_its_reasons():
    h0, xs = np.zeros((4, 256), np.float32), rng().standard_normal((16, 4, 256)).astype(np.float32)
    compiled, text = fused(ema, h0, xs)
    assert compiled.kernel_count() == 1
    report = str(compiled.fusion_report())
    assert "kind=scan" in report and "16 steps elementwise over [4, 256]" in report
    module = compiled.module
    verify(parse(print_module(module)))
    (step,) = [s for s in walk(lower(module).program) if s["op"] == "kernel"]
    assert step["label"].startswith("scan fusion")
    assert "for t in range(16):" in compiled.kernel_source()
    assert compiled.cost_analysis()["flops"] >= 16 * 4 * 256 * 3  # the body's, once a step


def test_forward_scan_with_a_transcendental_matches_jax():
    args = np.zeros((3, 37), np.float32), rng(1).standard_normal((9, 3, 37)).astype(np.float32)
    assert_matches(ema, args, rtol=2e-6)


def test_reverse_scan_with_special_values_matches_jax_exactly():
    xs = rng(2).standard_normal((6, 11)).astype(np.float32)
    xs[1, :4] = [np.nan, np.inf, -np.inf, -0.0]
    xs[4, 4:7] = [np.inf, -0.0, 3e38]
    h0 = np.full(11, -0.0, np.float32)
    assert_matches(reverse_sum, (h0, xs), exact_reference=True)


def test_swapping_integer_carries_wrap_as_in_jax():
    a = np.array([0, 1, 2**31 - 1, -2**31], np.int32)
    b = np.array([1, 1, 1, -1], np.int32)
    xs = rng(3).integers(-5, 5, (50, 4)).astype(np.int32)
    assert_matches(fibonacci, (a, b, xs), exact_reference=True)


def test_consts_a_scalar_and_the_counter_read_by_the_body():
    g = rng(4)
    h0 = g.standard_normal((5, 6)).astype(np.float32)
    xs = g.standard_normal((12, 5, 6)).astype(np.float32)
    w = g.standard_normal((5, 6)).astype(np.float32)
    assert_matches(with_consts, (h0, xs, w, np.float32(0.75)), rtol=1e-6, exact_reference=True)


def empty_and_scalar(v, s):
    return lax.fori_loop(0, 5, lambda i, c: (c[0] * 2.0, c[1] * 1.5 + 1.0), (v, s))


def test_fori_loop_and_a_scalar_carry():
    assert_matches(fori, (rng(5).standard_normal(10).astype(np.float32),))
    assert_matches(fori, (np.float32(3.0),))
    assert_matches(empty_and_scalar, (np.zeros(0, np.float32), np.float32(2.0)), exact_reference=True)


def scalar_space(a, b, c):
    """Scalar carries (S = ()) whose stacked rows come from a carry and from one the body
    passes on unchanged, a step scalar."""
    def cell(carry, _):
        c0, c1, c2, t = carry
        return (c0 - t.astype(jnp.float32), c2, c2, t + 1), (jnp.tanh(c2), c0 * 2.0)
    return lax.scan(cell, (a, b, c, jnp.int32(0)), None, length=5)


@pytest.mark.parametrize("a, c", [(1.5, 0.3), (-0.0, np.nan), (np.inf, -np.inf), (3e38, -0.0)])
def test_a_scan_over_scalars_stacks_rows_of_step_scalars(a, c):
    args = (np.float32(a), np.float32(-2.0), np.float32(c))
    assert_matches(scalar_space, args, rtol=2e-6)
    report = str(fused(scalar_space, *args)[0].fusion_report())
    assert "5 steps elementwise over []" in report


def test_a_scan_with_no_carry_writes_its_rows():
    assert_matches(only_ys, (rng(6).standard_normal((20, 3)).astype(np.float32),), rtol=2e-6)


def test_a_large_scan_is_split_over_threads_in_blocks():
    n = 2 * BLOCK + 3  # a last block that is not full
    h0 = rng(7).standard_normal(n).astype(np.float32)
    xs = rng(8).standard_normal((700, n)).astype(np.float32)
    compiled, _ = fused(ema, h0, xs)
    (step,) = [s for s in walk(lower(compiled.module).program) if s["op"] == "kernel"]
    assert step["parallel"] and step["rows"] == 3
    got, want = compiled(h0, xs), jax.jit(ema)(h0, xs)
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=2e-6, atol=1e-6)


PARTIAL = """
HloModule partial

loop.cond (p0: s32[], p1: f32[3], p2: f32[5,3]) -> pred[] {
  p0 = s32[] parameter(0)
  p1 = f32[3] parameter(1)
  p2 = f32[5,3] parameter(2)
  bound = s32[] constant(%d)
  ROOT lt = pred[] lt(p0, bound)
}

loop.body (p0: s32[], p1: f32[3], p2: f32[5,3]) -> (s32[], f32[3], f32[5,3]) {
  p0 = s32[] parameter(0)
  p1 = f32[3] parameter(1)
  p2 = f32[5,3] parameter(2)
  two = s32[] constant(2)
  row = s32[] mul(p0, two)
  half = f32[] constant(0.5)
  halves = f32[3] broadcast_in_dim(half), dims={}
  h = f32[3] add(p1, halves)
  r = f32[1,3] reshape(h)
  zero = s32[] constant(0)
  ys = f32[5,3] dynamic_update_slice(p2, r, row, zero)
  one = s32[] constant(1)
  next = s32[] add(p0, one)
  ROOT out = (s32[], f32[3], f32[5,3]) tuple(next, h, ys)
}

ENTRY main (h: f32[3], ys: f32[5,3]) -> (f32[3], f32[5,3]) {
  h = f32[3] parameter(0)
  ys = f32[5,3] parameter(1)
  start = s32[] constant(%d)
  loop = (s32[], f32[3], f32[5,3]) while(start, h, ys), condition=loop.cond, body=loop.body
  a = f32[3] get_tuple_element(loop), index=1
  b = f32[5,3] get_tuple_element(loop), index=2
  ROOT out = (f32[3], f32[5,3]) tuple(a, b)
}
"""


@pytest.mark.parametrize("start, bound", [(0, 2), (-1, 4), (0, 5)])
def test_rows_no_step_writes_keep_their_initial_values(start, bound):
    """Steps at rows 0, 2, 4 (clamped past the end): the other rows come from the initial
    stack, which the kernel copies only when some row is left unwritten."""
    from xfuse.backends.numba.backend import compile_module
    from xfuse.fusion import parse_pipeline, run_pipeline

    module = run_pipeline(parse(PARTIAL % (bound, start)), parse_pipeline(None)).module
    assert any(i.op is Op.FUSION and i.attr("kind") == "scan" for i in module.entry_computation.instructions)
    h = np.array([1.0, -2.0, np.nan], np.float32)
    ys = np.arange(15, dtype=np.float32).reshape(5, 3)
    got = compile_module(module)([h, ys])
    want = interpret(module, h, ys)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    np.testing.assert_array_equal(ys, np.arange(15, dtype=np.float32).reshape(5, 3))  # not written over


def centred(h0, xs):
    return lax.scan(lambda h, x: (h - jnp.mean(h) + x, h), h0, xs)


def rnn(h0, xs, w):
    return lax.scan(lambda h, x: (jnp.tanh(h @ w + x), h), h0, xs)


def newton(x):
    return lax.while_loop(lambda v: jnp.abs(v * v - 2.0).max() > 1e-6, lambda v: v - (v * v - 2.0) / (2 * v), x)


def half(h0, xs):
    return lax.scan(lambda h, x: (h * 0.5 + x, h), h0, xs)


@pytest.mark.parametrize("fn, args, reason", [
    (centred, [np.zeros(8, np.float32), np.ones((4, 8), np.float32)], "reduce_sum"),
    (rnn, [np.zeros((2, 8), np.float32), np.ones((4, 2, 8), np.float32), np.eye(8, dtype=np.float32)], "dot_general"),
    (newton, [np.ones(3, np.float32)], "not `counter < constant`"),
    (half, [np.zeros(8, np.float16), np.ones((4, 8), np.float16)], "is f16"),
])
def test_other_loops_stay_loops_and_say_why(fn, args, reason):
    compiled, text = fused(fn, *args)
    assert "kind=scan" not in text and " while(" in text
    refused = [d for d in compiled.fusion_report().refused() if d.op == "while"]
    assert refused and reason in refused[0].reason and refused[0].reason.startswith("not a scan fusion")
    want = jax.tree.leaves(jax.jit(fn)(*args))
    for g, w in zip(jax.tree.leaves(compiled(*args)), want):
        np.testing.assert_allclose(np.asarray(g, np.float64), np.asarray(w, np.float64), rtol=1e-3, atol=1e-6)


def test_the_fused_module_interprets_as_the_loop_did():
    h0, xs = np.ones(5, np.float32), rng(9).standard_normal((7, 5)).astype(np.float32)
    before = xfuse.jit(reverse_sum, passes="none").lower(h0, xs).compile().as_text()
    after = fused(reverse_sum, h0, xs)[1]
    for a, b in zip(interpret(parse(before), h0, xs), interpret(parse(after), h0, xs)):
        np.testing.assert_array_equal(a, b)


def test_an_artifact_holds_the_scan_kernel(tmp_path):
    import xfuse.aot

    h0, xs = np.zeros(300, np.float32), rng(10).standard_normal((40, 300)).astype(np.float32)
    compiled, _ = fused(ema, h0, xs)
    path = compiled.save(tmp_path / "ema.xfa")
    assert "while" not in xfuse.aot.inspect(path)
    loaded = xfuse.aot.load(path)
    for g, w in zip(loaded(h0, xs), compiled(h0, xs)):
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-7)


def per_feature(h0, xs, decay, gain):
    """Coefficients per feature and per row, broadcast into the carries' [4, 6, 5]."""
    def cell(h, x):
        h = h * decay + x * gain[:, None, None]
        return h, h + 1.0
    return lax.scan(cell, h0, xs)


def test_invariants_broadcast_into_the_carry_are_read_at_their_own_index():
    g = rng(11)
    h0 = g.standard_normal((4, 6, 5)).astype(np.float32)
    xs = g.standard_normal((9, 4, 6, 5)).astype(np.float32)
    decay = g.uniform(0.5, 1.0, (6, 5)).astype(np.float32)
    gain = g.standard_normal(4).astype(np.float32)
    assert_matches(per_feature, (h0, xs, decay, gain), rtol=1e-6, exact_reference=True)
