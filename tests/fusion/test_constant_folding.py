"""Constant folding: before/expected modules in HLO text; special values fold exactly as the
interpreter computes them; what must not fold stays."""

import numpy as np
import pytest

from xfuse.fusion.constant_folding import ConstantFolding
from xfuse.fusion.pipeline import REGISTRY
from xfuse.hlo import interpret, parse, verify

from .helpers import assert_pass, assert_same_results, assert_unchanged

FOLD = ConstantFolding()


def test_registered_with_its_option():
    assert REGISTRY["fold"] is ConstantFolding
    assert FOLD.name == "fold" and FOLD.max_elements == 1024
    assert ConstantFolding(max_elements=4).max_elements == 4


def test_folds_chains_keeping_names_and_locations():
    assert_pass(
        FOLD,
        """
HloModule m

ENTRY main (x: f32[2]) -> f32[2] {
  x = f32[2] parameter(0)
  a = f32[2] constant({1.5, -2.0})
  b = f32[2] constant({0.5, 4.0})
  s = f32[2] add(a, b), loc="model.py:7 (f)"
  p = f32[2] mul(s, b), loc="model.py:8 (f)"
  ROOT r = f32[2] add(x, p)
}
""",
        """
HloModule m

ENTRY main (x: f32[2]) -> f32[2] {
  x = f32[2] parameter(0)
  a = f32[2] constant({1.5, -2.0})
  b = f32[2] constant({0.5, 4.0})
  s = f32[2] constant({2.0, 2.0}), loc="model.py:7 (f)"
  p = f32[2] constant({1.0, 8.0}), loc="model.py:8 (f)"
  ROOT r = f32[2] add(x, p)
}
""",
    )


def test_special_values_fold_exactly():
    assert_pass(
        FOLD,
        """
HloModule m

ENTRY main () -> (f32[3], f32[3], s32[3], s32[3], u8[2]) {
  big = f32[3] constant({inf, 1.0, -0.0})
  other = f32[3] constant({2.0, -0.0, inf})
  num = s32[3] constant({7, -7, -2147483648})
  den = s32[3] constant({0, 2, -1})
  bytes = u8[2] constant({250, 3})
  sub = f32[3] sub(big, other)
  div = f32[3] div(big, other)
  quot = s32[3] div(num, den)
  rem = s32[3] rem(num, den)
  wrap = u8[2] add(bytes, bytes)
  ROOT t = (f32[3], f32[3], s32[3], s32[3], u8[2]) tuple(sub, div, quot, rem, wrap)
}
""",
        """
HloModule m

ENTRY main () -> (f32[3], f32[3], s32[3], s32[3], u8[2]) {
  big = f32[3] constant({inf, 1.0, -0.0})
  other = f32[3] constant({2.0, -0.0, inf})
  num = s32[3] constant({7, -7, -2147483648})
  den = s32[3] constant({0, 2, -1})
  bytes = u8[2] constant({250, 3})
  sub = f32[3] constant({inf, 1.0, -inf})
  div = f32[3] constant({inf, -inf, -0.0})
  quot = s32[3] constant({-1, -3, -2147483648})
  rem = s32[3] constant({7, -1, 0})
  wrap = u8[2] constant({244, 6})
  ROOT t = (f32[3], f32[3], s32[3], s32[3], u8[2]) tuple(sub, div, quot, rem, wrap)
}
""",
    )


def test_invalid_operations_fold_to_the_nan_the_interpreter_gives():
    """inf - inf and 0/0 give the machine's default NaN (its sign differs between x86 and
    ARM), so this compares values, not text."""
    before = parse(
        """
HloModule m

ENTRY main () -> (f32[2], f32[2]) {
  a = f32[2] constant({inf, 0.0})
  b = f32[2] constant({inf, -0.0})
  s = f32[2] sub(a, b)
  d = f32[2] div(b, a)
  ROOT t = (f32[2], f32[2]) tuple(s, d)
}
"""
    )
    after = FOLD.run(before)
    verify(after)
    assert [i.op.value for i in after.entry_computation] == ["constant"] * 4 + ["tuple"]
    sub, div = interpret(after)
    assert np.isnan(sub[0]) and sub[1] == 0 and not np.signbit(sub[1])
    assert np.isnan(div).all()
    assert_same_results(before, after, [()])


def test_folds_movement_reductions_and_conversions():
    assert_pass(
        FOLD,
        """
HloModule m

ENTRY main () -> (f32[3,2], f32[2], s8[2], pred[2]) {
  c = f32[2,3] constant({{1.0, 2.0, 3.0}, {nan, 300.0, -0.0}})
  t = f32[3,2] transpose(c), permutation={1,0}
  s = f32[2] reduce_sum(c), axes={1}
  v = f32[2] slice(s), start={0}, limit={2}, strides={1}
  k = s8[2] convert_element_type(v)
  f = pred[2] is_finite(v)
  ROOT r = (f32[3,2], f32[2], s8[2], pred[2]) tuple(t, s, k, f)
}
""",
        """
HloModule m

ENTRY main () -> (f32[3,2], f32[2], s8[2], pred[2]) {
  c = f32[2,3] constant({{1.0, 2.0, 3.0}, {nan, 300.0, -0.0}})
  t = f32[3,2] constant({{1.0, nan}, {2.0, 300.0}, {3.0, -0.0}})
  s = f32[2] constant({6.0, nan})
  v = f32[2] constant({6.0, nan})
  k = s8[2] constant({6, 0})
  f = pred[2] constant({true, false})
  ROOT r = (f32[3,2], f32[2], s8[2], pred[2]) tuple(t, s, k, f)
}
""",
    )


def test_folds_inside_called_computations():
    assert_pass(
        FOLD,
        """
HloModule m

fused (p: f32[]) -> f32[] {
  p = f32[] parameter(0)
  two = f32[] constant(2.0)
  four = f32[] mul(two, two)
  ROOT r = f32[] add(p, four)
}

ENTRY main (x: f32[]) -> f32[] {
  x = f32[] parameter(0)
  ROOT f = f32[] fusion(x), kind=loop, calls=fused
}
""",
        """
HloModule m

fused (p: f32[]) -> f32[] {
  p = f32[] parameter(0)
  two = f32[] constant(2.0)
  four = f32[] constant(4.0)
  ROOT r = f32[] add(p, four)
}

ENTRY main (x: f32[]) -> f32[] {
  x = f32[] parameter(0)
  ROOT f = f32[] fusion(x), kind=loop, calls=fused
}
""",
    )


NOT_FOLDED = {
    "broadcast_of_a_constant": """
  c = f32[] constant(1.0)
  ROOT b = f32[4] broadcast_in_dim(c), dims={}
""",
    "ops_of_broadcast_constants": """
  c = f32[] constant(1.0)
  b = f32[4] broadcast_in_dim(c), dims={}
  ROOT s = f32[4] add(b, b)
""",
    "iota": """
  ROOT i = f32[4] iota(), dimension=0
""",
    "ops_of_iota": """
  i = f32[4] iota(), dimension=0
  ROOT n = f32[4] neg(i)
""",
    "tuple_and_get_tuple_element": """
  c = f32[4] constant({1.0, 2.0, 3.0, 4.0})
  t = (f32[4]) tuple(c)
  ROOT g = f32[4] get_tuple_element(t), index=0
""",
    "optimization_barrier": """
  c = f32[4] constant({1.0, 2.0, 3.0, 4.0})
  b = (f32[4]) optimization_barrier(c)
  ROOT g = f32[4] get_tuple_element(b), index=0
""",
    "call_of_constants": """
  c = f32[4] constant({1.0, 2.0, 3.0, 4.0})
  ROOT f = f32[4] call(c), calls=negate
""",
    "operand_not_constant": """
  c = f32[4] constant({1.0, 2.0, 3.0, 4.0})
  ROOT a = f32[4] add(c, x)
""",
}


@pytest.mark.parametrize("body", NOT_FOLDED.values(), ids=NOT_FOLDED.keys())
def test_what_must_not_fold_stays(body):
    assert_unchanged(
        FOLD,
        f"""
HloModule m

negate (p: f32[4]) -> f32[4] {{
  p = f32[4] parameter(0)
  ROOT n = f32[4] neg(p)
}}

ENTRY main (x: f32[4]) -> f32[4] {{
  x = f32[4] parameter(0)
{body}}}
""",
    )


def test_results_larger_than_max_elements_stay():
    text = """
HloModule m

ENTRY main () -> f32[2,3] {
  c = f32[2,3] constant({{1.0, 2.0, 3.0}, {4.0, 5.0, 6.0}})
  ROOT e = f32[2,3] exp(c)
}
"""
    assert_unchanged(ConstantFolding(max_elements=5), text)
    folded = ConstantFolding(max_elements=6).run(parse(text))
    assert folded.entry_computation.root_instruction.op.value == "constant"


def test_nothing_to_fold_returns_the_same_module():
    assert_unchanged(
        FOLD,
        """
HloModule m

ENTRY main (x: f32[4]) -> f32[4] {
  x = f32[4] parameter(0)
  c = f32[4] constant({1.0, 2.0, 3.0, 4.0})
  ROOT a = f32[4] add(c, x)
}
""",
    )
