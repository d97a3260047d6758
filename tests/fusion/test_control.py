"""Passes inside control flow: the default pipeline fuses inside while bodies and branches and
keeps the interpreter's results; `licm` hoists what a loop body computes from values it passes
along unchanged, and leaves alone what is not worth a state element."""

from __future__ import annotations

import numpy as np
import pytest

from xfuse.fusion import Fuse, LoopInvariantCodeMotion, parse_pipeline, run_pipeline
from xfuse.hlo import Builder, DType, Module, Op, Shape, interpret, verify

F32 = Shape(DType.F32, (4, 8))
W = Shape(DType.F32, (8,))
S32 = Shape(DType.S32, ())


def loop_module(steps: int = 3, shared_body: bool = False) -> Module:
    """x, w: for i < steps: x = tanh(x * exp(w)) + broadcast(w) + 1."""
    cond = Builder("loop.cond")
    i = cond.parameter(S32, "i")
    cond.parameter(W, "w")
    cond.parameter(F32, "x")
    cond_comp = cond.build(cond.lt(i, cond.constant(np.int32(steps))))
    body = Builder("loop.body")
    i, w, x = body.parameter(S32, "i"), body.parameter(W, "w"), body.parameter(F32, "x")
    scale = body.broadcast_in_dim(body.exp(w), shape=F32, dims=(1,))
    shift = body.broadcast_in_dim(w, shape=F32, dims=(1,))
    one = body.broadcast_in_dim(body.constant(np.float32(1)), shape=F32, dims=())
    x = body.add(body.add(body.tanh(body.mul(x, scale)), shift), one)
    body_comp = body.build([body.add(i, body.constant(np.int32(1))), w, x])
    entry = Builder("main")
    x, w = entry.parameter(F32, "x"), entry.parameter(W, "w")
    loop = entry.emit(Op.WHILE, entry.constant(np.int32(0)), w, x, condition="loop.cond", body="loop.body")
    root = entry.get_tuple_element(loop, index=2)
    if shared_body:
        again = entry.emit(Op.WHILE, entry.constant(np.int32(1)), w, root, condition="loop.cond", body="loop.body")
        root = entry.get_tuple_element(again, index=2)
    return Module.of(entry.build(root), cond_comp, body_comp, name="loop")


def arguments():
    rng = np.random.default_rng(1)
    return rng.standard_normal(F32.dims).astype(np.float32), rng.standard_normal(W.dims).astype(np.float32) * 0.1


def test_licm_hoists_the_invariant_exp_and_keeps_results():
    module = loop_module()
    licm = LoopInvariantCodeMotion()
    after = licm.run(module)
    verify(after)
    body, entry = after["loop.body"], after.entry_computation
    assert [i.op for i in body.instructions].count(Op.EXP) == 0
    assert [i.op for i in entry.instructions].count(Op.EXP) == 1
    loop = next(i for i in entry.instructions if i.op is Op.WHILE)
    assert loop.name == "while.1" and len(loop.operands) == 4  # keeps its name, one more element
    assert len(after["loop.cond"].parameters) == 4
    # broadcasts are not worth a state element (larger than what they read): exp(w) enters
    assert [i.op for i in body.instructions].count(Op.BROADCAST_IN_DIM) == 3
    assert body.parameters[-1].shape == W
    assert "loop.body" in str(licm.hoisted[0]) and "exp" in str(licm.hoisted[0])
    x, w = arguments()
    np.testing.assert_array_equal(interpret(after, x, w), interpret(module, x, w))


def test_licm_leaves_a_module_without_invariants_as_it_is():
    module = loop_module()
    once = LoopInvariantCodeMotion().run(module)
    assert LoopInvariantCodeMotion().run(once) is once


def test_licm_skips_a_body_two_loops_share():
    module = loop_module(shared_body=True)
    verify(module)
    assert LoopInvariantCodeMotion().run(module) is module


def test_licm_keeps_the_tuple_for_a_loop_returned_whole():
    module = loop_module()
    entry = module.entry_computation
    loop = next(i for i in entry.instructions if i.op is Op.WHILE)
    module = module.with_computation(entry.replace(root=loop.name))
    after = LoopInvariantCodeMotion().run(module)
    verify(after)
    assert after.entry_computation.root_instruction.op is Op.TUPLE
    x, w = arguments()
    for got, want in zip(interpret(after, x, w), interpret(module, x, w)):
        np.testing.assert_array_equal(got, want)


def test_pipeline_fuses_inside_the_body():
    """Without scan fusion (which makes this elementwise loop one kernel, below)."""
    module = loop_module()
    passes = [*parse_pipeline("simplify,fold,cse,licm,dce"), Fuse(scan=False)]
    result = run_pipeline(module, passes, verify_passes=True)
    assert "licm" in [r.name for r in result.history]
    after = result.module
    body = after["loop.body"]
    fusions = [i for i in body.instructions if i.op is Op.FUSION]
    assert len(fusions) >= 1
    elementwise = {Op.TANH, Op.MUL, Op.ADD}
    assert not any(i.op in elementwise and i.shape == F32 for i in body.instructions)
    x, w = arguments()
    np.testing.assert_allclose(interpret(after, x, w), interpret(module, x, w), rtol=1e-6)


def test_default_pipeline_makes_the_elementwise_loop_a_scan_fusion():
    module = loop_module()
    after = run_pipeline(module, parse_pipeline(None), verify_passes=True).module
    (fusion,) = [i for i in after.entry_computation.instructions if i.op is Op.FUSION]
    assert fusion.attr("kind") == "scan"
    x, w = arguments()
    np.testing.assert_allclose(interpret(after, x, w), interpret(module, x, w), rtol=1e-6)


def test_default_pipeline_fuses_inside_branches():
    branches = []
    for k in range(2):
        b = Builder(f"pick.branch{k}")
        x = b.parameter(F32, "x")
        y = b.exp(x) if k == 0 else b.neg(x)
        branches.append(b.build(b.mul(b.add(y, x), x)))
    entry = Builder("main")
    k, x = entry.parameter(S32, "k"), entry.parameter(F32, "x")
    root = entry.emit(Op.CONDITIONAL, k, x, branches=("pick.branch0", "pick.branch1"), shape=F32)
    module = Module.of(entry.build(root), *branches, name="pick")
    after = run_pipeline(module, parse_pipeline(None), verify_passes=True).module
    for name in ("pick.branch0", "pick.branch1"):
        ops = [i.op for i in after[name].instructions]
        assert ops.count(Op.FUSION) == 1, after[name]
    x, _ = arguments()
    for index in (0, 1, 5):
        want = interpret(module, np.int32(index), x)
        np.testing.assert_allclose(interpret(after, np.int32(index), x), want, rtol=1e-6)


@pytest.mark.parametrize("steps", [0, 1, 4])
def test_pipeline_keeps_results_for_any_trip_count(steps):
    module = loop_module(steps)
    after = run_pipeline(module, parse_pipeline(None), verify_passes=True).module
    x, w = arguments()
    np.testing.assert_allclose(interpret(after, x, w), interpret(module, x, w), rtol=1e-6)


# ---------------------------------------------------------------------------- products of slices
def _rnn_module(steps: int, batch: int, features: int, hidden: int):
    import jax
    import jax.numpy as jnp
    from jax import lax

    from xfuse.frontend import trace

    def rnn(xs, wx, wh):
        def cell(h, x):
            h = jnp.tanh(x @ wx + h @ wh)
            return h, h

        return lax.scan(cell, jnp.zeros((batch, hidden), jnp.float32), xs)[1]

    shapes = [(steps, batch, features), (features, hidden), (hidden, hidden)]
    specs = [jax.ShapeDtypeStruct(s, np.float32) for s in shapes]
    rng = np.random.default_rng(3)
    args = [rng.standard_normal(s).astype(np.float32) / 4 for s in shapes]
    return trace(rnn, specs, ["xs", "wx", "wh"], "rnn"), args


def _dots(comp) -> list:
    return [i for i in comp.instructions if i.op is Op.DOT_GENERAL]


def test_licm_turns_the_product_of_each_step_into_one_product_before_the_loop():
    module, args = _rnn_module(steps=6, batch=3, features=5, hidden=4)
    licm = LoopInvariantCodeMotion()
    after = licm.run(module)
    verify(after)
    (hoisted,) = _dots(after.entry_computation)
    assert hoisted.array_shape.dims == (6, 3, 4)  # xs @ wx for every step at once
    (loop,) = [i for i in after.entry_computation.instructions if i.op is Op.WHILE]
    assert len(_dots(after[loop.attr("body")])) == 1  # h @ wh stays
    np.testing.assert_allclose(interpret(after, *args), interpret(module, *args), rtol=1e-5, atol=1e-6)


def test_licm_keeps_the_product_of_each_step_where_the_whole_product_is_larger():
    module, args = _rnn_module(steps=6, batch=3, features=2, hidden=64)  # xs @ wx: 32x xs's size
    after = LoopInvariantCodeMotion().run(module)
    assert not _dots(after.entry_computation)
    (loop,) = [i for i in after.entry_computation.instructions if i.op is Op.WHILE]
    assert len(_dots(after[loop.attr("body")])) == 2
    np.testing.assert_allclose(interpret(after, *args), interpret(module, *args), rtol=1e-5, atol=1e-6)
