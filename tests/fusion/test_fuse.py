"""The fuse pass: kernel counts on the canonical workloads, the shape of what it makes (before
and expected HLO), the reasons it records, and that meaning never changes."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import xfuse
from xfuse.fusion import Fuse, cost_analysis, kernel_count
from xfuse.hlo import Op, interpret, parse, verify

RNG = np.random.default_rng(0)


def f32(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def mlp_softmax(x, w, b):
    return jax.nn.softmax(jax.nn.relu(x @ w + b), axis=-1)


def row_softmax(x):
    return jax.nn.softmax(x, axis=-1)


def layer_norm(x, gamma, beta):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + 1e-5) * gamma + beta


def chain20(x):
    ops = [jnp.tanh, jnp.exp, jnp.sin, jnp.abs, jax.nn.sigmoid] * 4
    for op in ops:
        x = op(x) * 0.5
    return x


def gelu_mlp(x, w1, b1, w2, b2):
    return jax.nn.gelu(x @ w1 + b1) @ w2 + b2


def adam(p, g, m, v, t):
    b1, b2, lr, eps = 0.9, 0.999, 1e-3, 1e-8
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    m_hat = m / (1 - b1**t)
    v_hat = v / (1 - b2**t)
    return p - lr * m_hat / (jnp.sqrt(v_hat) + eps), m, v


CANONICAL = {
    # name: (function, arguments, kernels at most, what XLA-style fusion should make)
    "softmax(relu(x @ w + b))": (mlp_softmax, (f32(16, 32), f32(32, 64), f32(64)), 1),
    "row softmax": (row_softmax, (f32(16, 64),), 1),
    "layer norm": (layer_norm, (f32(16, 64), f32(64), f32(64)), 1),
    "chain of 20 elementwise ops": (chain20, (f32(256),), 1),
    "gelu(x @ w1 + b1) @ w2 + b2": (gelu_mlp, (f32(8, 16), f32(16, 32), f32(32), f32(32, 16), f32(16)), 2),
    "adam update": (adam, (f32(64), f32(64), f32(64), np.abs(f32(64)), np.float32(3)), 1),
}


def compile_with(fun, args, passes=None):
    return xfuse.jit(fun, passes=passes).lower(*args).compile()


@pytest.mark.parametrize("name", list(CANONICAL))
def test_canonical_workloads_become_few_kernels(name):
    fun, args, most = CANONICAL[name]
    compiled = compile_with(fun, args)
    assert compiled.kernel_count() <= most, str(compiled.fusion_report())
    got = compiled(*args)
    want = jax.jit(fun)(*args)
    for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        scale = max(1.0, float(np.abs(w).max()))  # dots sum in another order than XLA
        np.testing.assert_allclose(g, w, rtol=2e-5, atol=2e-6 * scale)


def test_dots_keep_their_epilogues():
    compiled = compile_with(*CANONICAL["gelu(x @ w1 + b1) @ w2 + b2"][:2])
    kinds = [f.kind for f in compiled.fusion_report().fusions]
    assert kinds == ["output", "output"]
    dots_per_fusion = [f.ops.count("dot_general") for f in compiled.fusion_report().fusions]
    assert dots_per_fusion == [1, 1]


def test_adam_is_one_multi_output_kernel():
    compiled = compile_with(*CANONICAL["adam update"][:2])
    (fusion,) = compiled.fusion_report().fusions
    assert fusion.kind == "multi_output" and len(fusion.outputs) == 3


def test_row_softmax_is_one_input_fusion_with_both_reductions():
    compiled = compile_with(*CANONICAL["row softmax"][:2])
    (fusion,) = compiled.fusion_report().fusions
    assert fusion.kind == "input"
    assert {"reduce_max", "reduce_sum", "exp", "div"} <= set(fusion.ops)


BEFORE = """
HloModule loop

ENTRY main (x: f32[8], y: f32[8]) -> f32[8] {
  x = f32[8] parameter(0)
  y = f32[8] parameter(1)
  a = f32[8] add(x, y)
  e = f32[8] exp(a)
  ROOT m = f32[8] mul(e, y)
}
"""

EXPECTED = """
HloModule loop

fused_add_exp_mul (p0: f32[8], p1: f32[8]) -> f32[8] {
  p0 = f32[8] parameter(0)
  p1 = f32[8] parameter(1)
  a = f32[8] add(p0, p1)
  e = f32[8] exp(a)
  ROOT m = f32[8] mul(e, p1)
}

ENTRY main (x: f32[8], y: f32[8]) -> f32[8] {
  x = f32[8] parameter(0)
  y = f32[8] parameter(1)
  ROOT fusion.0 = f32[8] fusion(x, y), kind=loop, calls=fused_add_exp_mul
}
"""


def test_loop_fusion_before_and_expected():
    after = Fuse().run(parse(BEFORE))
    assert str(after) == str(parse(EXPECTED))


def test_nothing_to_fuse_returns_the_same_module():
    module = parse(
        "HloModule one\n\nENTRY main (x: f32[8]) -> f32[8] {\n"
        "  x = f32[8] parameter(0)\n  ROOT e = f32[8] exp(x)\n}\n"
    )
    assert Fuse().run(module) is module


BARRIER = """
HloModule barrier

ENTRY main (x: f32[8]) -> f32[8] {
  x = f32[8] parameter(0)
  a = f32[8] exp(x)
  t = (f32[8]) optimization_barrier(a)
  b = f32[8] get_tuple_element(t), index=0
  ROOT c = f32[8] neg(b)
}
"""


def test_optimization_barrier_is_never_fused_across():
    after = Fuse().run(parse(BARRIER))
    assert kernel_count(after) == 2
    entry = after.entry_computation
    assert [i.op for i in entry.instructions].count(Op.OPTIMIZATION_BARRIER) == 1


def test_optimization_barrier_from_jax_separates_kernels():
    def f(x):
        y = jnp.exp(x)
        (y,) = jax.lax.optimization_barrier((y,))
        return jnp.sin(y) * 2

    compiled = compile_with(f, (f32(32),))
    assert compiled.kernel_count() == 2
    np.testing.assert_allclose(compiled(f32(32) * 0 + 1), np.sin(np.exp(np.ones(32))) * 2, rtol=1e-6)


SPACES = """
HloModule spaces

ENTRY main (x: f32[4,8]) -> (f32[4], f32[8]) {
  x = f32[4,8] parameter(0)
  e = f32[4,8] exp(x)
  rows = f32[4] reduce_sum(e), axes={1}
  cols = f32[8] reduce_sum(e), axes={0}
  ROOT t = (f32[4], f32[8]) tuple(rows, cols)
}
"""


def test_reductions_over_different_axes_stay_apart_with_a_reason():
    fuse = Fuse()
    after = fuse.run(parse(SPACES))
    report = fuse.reports[-1]
    reasons = " | ".join(d.reason for d in report.refused() + report.decisions)
    assert "iteration spaces differ" in reasons
    assert kernel_count(after) >= 2
    x = f32(4, 8)
    for got, want in zip(interpret(after, x), interpret(parse(SPACES), x)):
        np.testing.assert_array_equal(got, want)


EXPENSIVE = """
HloModule expensive

ENTRY main (x: f32[64,64], w: f32[64,64]) -> (f32[64,64], f32[64,64]) {
  x = f32[64,64] parameter(0)
  w = f32[64,64] parameter(1)
  e = f32[64,64] exp(x)
  d = f32[64,64] dot_general(e, w), contracting={1;0}
  s = f32[64] reduce_sum(e), axes={0}
  b = f32[64,64] broadcast_in_dim(s), dims={1}
  r = f32[64,64] add(d, b)
  ROOT t = (f32[64,64], f32[64,64]) tuple(r, e)
}
"""


def test_refusals_are_explained():
    fuse = Fuse()
    fuse.run(parse(EXPENSIVE))
    report = fuse.reports[-1]
    text = str(report)
    assert "Decisions:" in text and "refused" in text
    assert any("operands go to BLAS" in d.reason for d in report.refused())
    data = report.as_dict()
    assert {"fusions", "decisions", "kernels"} <= set(data)


def test_report_names_source_lines_and_bytes_saved():
    compiled = compile_with(*CANONICAL["softmax(relu(x @ w + b))"][:2])
    report = compiled.fusion_report()
    (fusion,) = report.fusions
    assert any("test_fuse.py" in loc and "mlp_softmax" in loc for loc in fusion.locs)
    assert fusion.bytes_saved > 0
    assert "fusion.0  kind=output" in str(report)


def test_cost_analysis_counts_dot_flops():
    x, w, b = CANONICAL["softmax(relu(x @ w + b))"][1]
    compiled = compile_with(mlp_softmax, (x, w, b))
    analysis = compiled.cost_analysis()
    assert analysis["flops"] >= 2 * 16 * 32 * 64
    assert analysis["bytes accessed"] >= x.nbytes + w.nbytes + b.nbytes + 16 * 64 * 4
    assert len(analysis["kernels"]) == compiled.kernel_count()
    assert cost_analysis(compiled.module) == analysis


def test_passes_none_turns_optimisation_off():
    x = f32(16, 64)
    compiled = compile_with(row_softmax, (x,), passes="none")
    assert compiled.as_text() == compiled.lowered.as_text()
    assert compiled.kernel_count() > 1
    np.testing.assert_allclose(compiled(x), jax.jit(row_softmax)(x), rtol=1e-6)


def test_bad_passes_option_is_named():
    with pytest.raises(ValueError, match="passes= names unknown pass"):
        xfuse.jit(row_softmax, passes="fuse,frobnicate")


@pytest.mark.parametrize("name", list(CANONICAL))
def test_fusion_preserves_meaning_on_the_interpreter(name):
    fun, args, _ = CANONICAL[name]
    module = xfuse.jit(fun).lower(*args).module
    fused = Fuse().run(module)
    verify(fused)
    before, after = interpret(module, *args), interpret(fused, *args)
    for b, a in zip(jax.tree_util.tree_leaves(before), jax.tree_util.tree_leaves(after)):
        np.testing.assert_array_equal(a, b)


CYCLE = """
HloModule cycle

ENTRY main (x: f32[8]) -> f32[8] {
  x = f32[8] parameter(0)
  e = f32[8] exp(x)
  a = f32[8] neg(e)
  t = (f32[8]) optimization_barrier(a)
  g = f32[8] get_tuple_element(t), index=0
  ROOT b = f32[8] add(e, g)
}
"""


def test_merges_that_would_create_a_cycle_are_refused():
    fuse = Fuse()
    after = fuse.run(parse(CYCLE))
    verify(after)
    decision = next(d for d in fuse.reports[-1].decisions if d.producer == "e")
    assert "would create a cycle" in decision.reason
    x = f32(8)
    np.testing.assert_array_equal(interpret(after, x), interpret(parse(CYCLE), x))


def test_dump_to_writes_each_pass(tmp_path, monkeypatch):
    monkeypatch.setenv("XFUSE_DUMP_TO", str(tmp_path))
    compile_with(row_softmax, (f32(4, 8),))
    names = sorted(p.name for p in tmp_path.iterdir())
    assert any(n.endswith("01_simplify.hlo") for n in names)
    assert any(n.endswith("_fuse.hlo") for n in names)
    assert any(n.endswith("final.hlo") for n in names)
    for path in tmp_path.iterdir():
        verify(parse(path.read_text()))


def batch_norm_keeping_its_input(x, w):
    y = (x @ w).reshape(4, 8, 8, 16)
    mean = y.mean((0, 1, 2))
    var = ((y - mean) ** 2).mean((0, 1, 2))
    return (y - mean) / jnp.sqrt(var + 1e-5), y.max((1, 2, 3)), y


def test_a_reshape_needed_outside_the_kernels_stays_a_view():
    """The reshaped product is a result and read by two kernels that cannot be one: it is not
    written again by one of them as an extra output (a copy of the product), it stays a view."""
    x, w = f32(256, 32), f32(32, 16)
    x[7, :] = -0.0  # no NaN: XLA:CPU's reduce_max drops it (its fast min/max)
    compiled = xfuse.jit(batch_norm_keeping_its_input).lower(x, w).compile()
    module = compiled.module
    for comp in module.computations:
        if comp.name == module.entry_computation.name:
            continue
        root = comp.root_instruction
        for out in root.operands if root.op is Op.TUPLE else (root.name,):
            assert comp[out].op is not Op.RESHAPE, f"{comp.name} writes {out}, a reshape, as an output"
    assert "a reshape: a view of its stored operand" in str(compiled.fusion_report())
    got, want = compiled(x, w), jax.jit(batch_norm_keeping_its_input)(x, w)
    for g, v in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), np.asarray(v), rtol=2e-5, atol=2e-5)
