"""Common subexpression elimination: before/expected modules in HLO text, and constants compared
bit for bit."""

import numpy as np

from xfuse.fusion.cse import CommonSubexpressionElimination
from xfuse.fusion.pipeline import REGISTRY
from xfuse.hlo import Builder, DType, Module, Op, Shape, verify

from .helpers import assert_pass, assert_same_results, assert_unchanged, input_sets

CSE = CommonSubexpressionElimination()


def test_registered():
    assert REGISTRY["cse"] is CommonSubexpressionElimination
    assert CSE.name == "cse"


def test_merges_duplicates_and_their_users_in_turn():
    assert_pass(
        CSE,
        """
HloModule m

ENTRY main (x: f32[4], y: f32[4]) -> f32[4] {
  x = f32[4] parameter(0)
  y = f32[4] parameter(1)
  a.0 = f32[4] add(x, y), loc="model.py:1"
  a.1 = f32[4] add(x, y), loc="model.py:2"
  e.0 = f32[4] exp(a.0)
  e.1 = f32[4] exp(a.1)
  ROOT m = f32[4] mul(e.0, e.1)
}
""",
        """
HloModule m

ENTRY main (x: f32[4], y: f32[4]) -> f32[4] {
  x = f32[4] parameter(0)
  y = f32[4] parameter(1)
  a.0 = f32[4] add(x, y), loc="model.py:1"
  e.0 = f32[4] exp(a.0)
  ROOT m = f32[4] mul(e.0, e.0)
}
""",
    )


def test_a_merged_root_becomes_the_survivor():
    assert_pass(
        CSE,
        """
HloModule m

ENTRY main (x: f32[4]) -> f32[4] {
  x = f32[4] parameter(0)
  n.0 = f32[4] neg(x)
  ROOT n.1 = f32[4] neg(x)
}
""",
        """
HloModule m

ENTRY main (x: f32[4]) -> f32[4] {
  x = f32[4] parameter(0)
  ROOT n.0 = f32[4] neg(x)
}
""",
    )


def test_commutative_operands_are_normalised_but_others_are_not():
    assert_pass(
        CSE,
        """
HloModule m

ENTRY main (x: s32[3], y: s32[3]) -> (s32[3], s32[3], s32[3], s32[3], pred[3], pred[3]) {
  x = s32[3] parameter(0)
  y = s32[3] parameter(1)
  m.0 = s32[3] mul(x, y)
  m.1 = s32[3] mul(y, x)
  s.0 = s32[3] sub(x, y)
  s.1 = s32[3] sub(y, x)
  lt.0 = pred[3] lt(x, y)
  lt.1 = pred[3] lt(y, x)
  ROOT t = (s32[3], s32[3], s32[3], s32[3], pred[3], pred[3]) tuple(m.0, m.1, s.0, s.1, lt.0, lt.1)
}
""",
        """
HloModule m

ENTRY main (x: s32[3], y: s32[3]) -> (s32[3], s32[3], s32[3], s32[3], pred[3], pred[3]) {
  x = s32[3] parameter(0)
  y = s32[3] parameter(1)
  m.0 = s32[3] mul(x, y)
  s.0 = s32[3] sub(x, y)
  s.1 = s32[3] sub(y, x)
  lt.0 = pred[3] lt(x, y)
  lt.1 = pred[3] lt(y, x)
  ROOT t = (s32[3], s32[3], s32[3], s32[3], pred[3], pred[3]) tuple(m.0, m.0, s.0, s.1, lt.0, lt.1)
}
""",
    )


def test_different_attributes_shapes_or_ops_stay_apart():
    assert_unchanged(
        CSE,
        """
HloModule m

ENTRY main (x: f32[2,2]) -> (f32[2,2], f32[2,2], f32[4], f32[1,4], f32[2,2], f32[2,2]) {
  x = f32[2,2] parameter(0)
  t.0 = f32[2,2] transpose(x), permutation={1,0}
  t.1 = f32[2,2] transpose(x), permutation={0,1}
  r.0 = f32[4] reshape(x)
  r.1 = f32[1,4] reshape(x)
  e = f32[2,2] exp(x)
  l = f32[2,2] log(x)
  ROOT t = (f32[2,2], f32[2,2], f32[4], f32[1,4], f32[2,2], f32[2,2]) tuple(t.0, t.1, r.0, r.1, e, l)
}
""",
    )


def test_constants_merge_bitwise_nan_included_but_not_signed_zeros():
    assert_pass(
        CSE,
        """
HloModule m

ENTRY main () -> (f32[], f32[], f32[], f32[], f32[], f32[], f64[], f32[2], f32[2]) {
  z.0 = f32[] constant(0.0)
  z.1 = f32[] constant(-0.0)
  z.2 = f32[] constant(0.0)
  n.0 = f32[] constant(nan)
  n.1 = f32[] constant(nan)
  n.2 = f32[] constant(-nan)
  d = f64[] constant(0.0)
  v.0 = f32[2] constant({1.0, 2.0})
  v.1 = f32[2] constant({1.0, 2.0})
  ROOT t = (f32[], f32[], f32[], f32[], f32[], f32[], f64[], f32[2], f32[2]) tuple(z.0, z.1, z.2, n.0, n.1, n.2, d, v.0, v.1)
}
""",
        """
HloModule m

ENTRY main () -> (f32[], f32[], f32[], f32[], f32[], f32[], f64[], f32[2], f32[2]) {
  z.0 = f32[] constant(0.0)
  z.1 = f32[] constant(-0.0)
  n.0 = f32[] constant(nan)
  n.2 = f32[] constant(-nan)
  d = f64[] constant(0.0)
  v.0 = f32[2] constant({1.0, 2.0})
  ROOT t = (f32[], f32[], f32[], f32[], f32[], f32[], f64[], f32[2], f32[2]) tuple(z.0, z.1, z.0, n.0, n.0, n.2, d, v.0, v.0)
}
""",
    )


def test_nans_with_different_payloads_stay_apart():
    b = Builder("main")
    payloads = np.array([0x7FC00000, 0x7FC00001, 0x7FC00001], np.uint32).view(np.float32)
    consts = [b.constant(np.float32(p)) for p in payloads]
    module = Module.of(b.build(consts))
    after = CSE.run(module)
    verify(after)
    assert [i.name for i in after.entry_computation if i.op is Op.CONSTANT] == [
        consts[0].name,
        consts[1].name,
    ]
    result = after.entry_computation.root_instruction
    assert result.operands == (consts[0].name, consts[1].name, consts[1].name)


def test_parameters_and_optimization_barriers_are_never_merged():
    assert_unchanged(
        CSE,
        """
HloModule m

ENTRY main (x: f32[2], y: f32[2]) -> ((f32[2]), (f32[2]), f32[2]) {
  x = f32[2] parameter(0)
  y = f32[2] parameter(1)
  b.0 = (f32[2]) optimization_barrier(x)
  b.1 = (f32[2]) optimization_barrier(x)
  ROOT t = ((f32[2]), (f32[2]), f32[2]) tuple(b.0, b.1, y)
}
""",
    )


def test_merges_inside_called_computations_and_identical_calls():
    assert_pass(
        CSE,
        """
HloModule m

fused (p: f32[3]) -> f32[3] {
  p = f32[3] parameter(0)
  e.0 = f32[3] exp(p)
  e.1 = f32[3] exp(p)
  ROOT s = f32[3] sub(e.0, e.1)
}

ENTRY main (x: f32[3]) -> f32[3] {
  x = f32[3] parameter(0)
  f.0 = f32[3] fusion(x), kind=loop, calls=fused
  f.1 = f32[3] fusion(x), kind=loop, calls=fused
  f.2 = f32[3] fusion(x), kind=input, calls=fused
  a = f32[3] add(f.0, f.1)
  ROOT r = f32[3] add(a, f.2)
}
""",
        """
HloModule m

fused (p: f32[3]) -> f32[3] {
  p = f32[3] parameter(0)
  e.0 = f32[3] exp(p)
  ROOT s = f32[3] sub(e.0, e.0)
}

ENTRY main (x: f32[3]) -> f32[3] {
  x = f32[3] parameter(0)
  f.0 = f32[3] fusion(x), kind=loop, calls=fused
  f.2 = f32[3] fusion(x), kind=input, calls=fused
  a = f32[3] add(f.0, f.0)
  ROOT r = f32[3] add(a, f.2)
}
""",
    )


def test_merging_x_minus_x_operands_keeps_nan_and_inf():
    """cse turns sub(e.0, e.1) into sub(e.0, e.0); that must still give NaN for inf inputs."""
    b = Builder("main")
    x = b.parameter(Shape(DType.F32, (4,)), name="x")
    d = b.sub(b.exp(x), b.exp(x))
    module = Module.of(b.build(d))
    after = CSE.run(module)
    assert len(after.entry_computation) == len(module.entry_computation) - 1
    assert_same_results(module, after, input_sets(module))


def test_nothing_to_merge_returns_the_same_module():
    assert_unchanged(
        CSE,
        """
HloModule m

ENTRY main (x: f32[4], y: f32[4]) -> f32[4] {
  x = f32[4] parameter(0)
  y = f32[4] parameter(1)
  a = f32[4] add(x, y)
  ROOT b = f32[4] sub(a, y)
}
""",
    )
