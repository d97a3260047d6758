"""The algebraic simplifier: one before/expected pair (HLO text) per rule, the driver (fixpoint,
names and source lines, same object when nothing matches), and the rewrites that must NOT
happen because they would change a NaN, an infinity or a signed zero."""

import numpy as np
import pytest

from xfuse.fusion.algebraic import RULES, AlgebraicSimplifier, Rule, RuleError, forward
from xfuse.fusion.dce import DeadCodeElimination
from xfuse.fusion.pipeline import REGISTRY
from xfuse.hlo import Op, interpret, parse

from .helpers import assert_pass, assert_unchanged, input_sets, same_values

SIMPLIFY = AlgebraicSimplifier()
SIMPLIFY_DCE = [SIMPLIFY, DeadCodeElimination()]


def entry(signature: str, body: str) -> str:
    return f"HloModule m\n\nENTRY main {signature} {{\n{body.strip(chr(10))}\n}}\n"


def test_registered():
    assert REGISTRY["simplify"] is AlgebraicSimplifier
    assert SIMPLIFY.name == "simplify"


def test_rules_are_data_each_saying_why_it_is_exact():
    names = [rule.name for rule in RULES]
    assert len(names) == len(set(names))
    for rule in RULES:
        assert isinstance(rule, Rule) and rule.ops and len(rule.why) > 20, rule.name
    assert set(names) == {
        "add_zero",
        "sub_zero",
        "mul_one",
        "div_one",
        "div_power_of_two",
        "neg_neg",
        "not_not",
        "reshape_reshape",
        "reshape_same_shape",
        "transpose_transpose",
        "transpose_identity",
        "transpose_up_to_its_inverse",
        "dot_of_transpose",
        "scatter_one_window_per_cell",
        "transpose_of_dot",
        "transpose_of_sliced_dot",
        "dot_without_sums",
        "broadcast_broadcast",
        "broadcast_identity",
        "convert_same_type",
        "bitcast_same_type",
        "select_same_cases",
        "select_constant_selector",
        "slice_everything",
        "concatenate_one",
        "integer_pow_one",
        "integer_pow_zero",
        "reduce_no_axes",
        "idempotent",
        "max_lowest",
        "min_highest",
        "pad_nothing",
        "rev_nothing",
    }


# ---------------------------------------------------------------------------- one case per rule
# (signature, before body, expected body), run through simplify then dce.
X_F32 = "  x = f32[14] parameter(0)\n"
X_S32 = "  x = s32[8] parameter(0)\n"


def splat(dtype: str, value: str, dims: str = "14") -> str:
    return (
        f"  c = {dtype}[] constant({value})\n"
        f"  s = {dtype}[{dims}] broadcast_in_dim(c), dims={{}}\n"
    )


CASES = {
    "add_int_zero": (
        "(x: s32[8]) -> s32[8]",
        X_S32 + splat("s32", "0", "8") + "  ROOT a = s32[8] add(x, s)",
        "  ROOT x = s32[8] parameter(0)",
    ),
    "add_int_zero_on_the_left": (
        "(x: u8[14]) -> u8[14]",
        "  x = u8[14] parameter(0)\n" + splat("u8", "0") + "  ROOT a = u8[14] add(s, x)",
        "  ROOT x = u8[14] parameter(0)",
    ),
    "add_float_negative_zero": (
        "(x: f32[14]) -> f32[14]",
        X_F32 + splat("f32", "-0.0") + "  ROOT a = f32[14] add(x, s)",
        "  ROOT x = f32[14] parameter(0)",
    ),
    "add_float_negative_zero_on_the_left": (
        "(x: bf16[14]) -> bf16[14]",
        "  x = bf16[14] parameter(0)\n" + splat("bf16", "-0.0") + "  ROOT a = bf16[14] add(s, x)",
        "  ROOT x = bf16[14] parameter(0)",
    ),
    "sub_int_zero": (
        "(x: s32[8]) -> s32[8]",
        X_S32 + splat("s32", "0", "8") + "  ROOT d = s32[8] sub(x, s)",
        "  ROOT x = s32[8] parameter(0)",
    ),
    "sub_float_positive_zero": (
        "(x: f32[14]) -> f32[14]",
        X_F32 + splat("f32", "0.0") + "  ROOT d = f32[14] sub(x, s)",
        "  ROOT x = f32[14] parameter(0)",
    ),
    "mul_one": (
        "(x: f32[14]) -> f32[14]",
        X_F32 + splat("f32", "1.0") + "  m = f32[14] mul(x, s)\n  ROOT n = f32[14] mul(s, m)",
        "  ROOT x = f32[14] parameter(0)",
    ),
    "mul_one_int": (
        "(x: s32[8]) -> s32[8]",
        X_S32 + "  c = s32[8] constant({1, 1, 1, 1, 1, 1, 1, 1})\n  ROOT m = s32[8] mul(c, x)",
        "  ROOT x = s32[8] parameter(0)",
    ),
    "div_one": (
        "(x: f16[14]) -> f16[14]",
        "  x = f16[14] parameter(0)\n" + splat("f16", "1.0") + "  ROOT d = f16[14] div(x, s)",
        "  ROOT x = f16[14] parameter(0)",
    ),
    "div_power_of_two": (
        "(x: f32[14], y: bf16[14], z: f64[]) -> (f32[14], bf16[14], f64[])",
        "  x = f32[14] parameter(0)\n  y = bf16[14] parameter(1)\n  z = f64[] parameter(2)\n"
        "  c = f32[] constant(8.0)\n  s = f32[14] broadcast_in_dim(c), dims={}\n  a = f32[14] div(x, s)\n"
        "  d = bf16[] constant(-0.25)\n  t = bf16[14] broadcast_in_dim(d), dims={}\n  b = bf16[14] div(y, t)\n"
        "  e = f64[] constant(1.1754943508222875e-38)\n  w = f64[] div(z, e)\n"
        "  ROOT r = (f32[14], bf16[14], f64[]) tuple(a, b, w)",
        "  x = f32[14] parameter(0)\n  y = bf16[14] parameter(1)\n  z = f64[] parameter(2)\n"
        "  constant.0 = f32[] constant(0.125)\n"
        "  broadcast_in_dim.1 = f32[14] broadcast_in_dim(constant.0), dims={}\n"
        "  a = f32[14] mul(x, broadcast_in_dim.1)\n"
        "  constant.2 = bf16[] constant(-4.0)\n"
        "  broadcast_in_dim.3 = bf16[14] broadcast_in_dim(constant.2), dims={}\n"
        "  b = bf16[14] mul(y, broadcast_in_dim.3)\n"
        "  constant.4 = f64[] constant(8.507059173023462e+37)\n  w = f64[] mul(z, constant.4)\n"
        "  ROOT r = (f32[14], bf16[14], f64[]) tuple(a, b, w)",
    ),
    "div_one_int": (
        "(x: s32[8]) -> s32[8]",
        X_S32 + splat("s32", "1", "8") + "  ROOT d = s32[8] div(x, s)",
        "  ROOT x = s32[8] parameter(0)",
    ),
    "neg_neg": (
        "(x: f32[14]) -> f32[14]",
        X_F32 + "  n.0 = f32[14] neg(x)\n  ROOT n.1 = f32[14] neg(n.0)",
        "  ROOT x = f32[14] parameter(0)",
    ),
    "neg_neg_int_minimum": (
        "(x: s32[8]) -> s32[8]",
        X_S32 + "  n.0 = s32[8] neg(x)\n  ROOT n.1 = s32[8] neg(n.0)",
        "  ROOT x = s32[8] parameter(0)",
    ),
    "not_not": (
        "(x: pred[2], y: u16[6]) -> (pred[2], u16[6])",
        "  x = pred[2] parameter(0)\n  y = u16[6] parameter(1)\n"
        "  a = pred[2] not(x)\n  b = pred[2] not(a)\n  c = u16[6] not(y)\n  d = u16[6] not(c)\n"
        "  ROOT t = (pred[2], u16[6]) tuple(b, d)",
        "  x = pred[2] parameter(0)\n  y = u16[6] parameter(1)\n"
        "  ROOT t = (pred[2], u16[6]) tuple(x, y)",
    ),
    "reshape_reshape": (
        "(x: f32[2,3]) -> f32[3,2]",
        "  x = f32[2,3] parameter(0)\n  r.0 = f32[6] reshape(x)\n"
        '  ROOT r.1 = f32[3,2] reshape(r.0), loc="model.py:5"',
        '  x = f32[2,3] parameter(0)\n  ROOT r.1 = f32[3,2] reshape(x), loc="model.py:5"',
    ),
    "reshape_reshape_back": (
        "(x: f32[2,3]) -> f32[2,3]",
        "  x = f32[2,3] parameter(0)\n  r.0 = f32[6,1] reshape(x)\n"
        "  ROOT r.1 = f32[2,3] reshape(r.0)",
        "  ROOT x = f32[2,3] parameter(0)",
    ),
    "reshape_same_shape": (
        "(x: s8[2,3]) -> s8[2,3]",
        "  x = s8[2,3] parameter(0)\n  ROOT r = s8[2,3] reshape(x)",
        "  ROOT x = s8[2,3] parameter(0)",
    ),
    "transpose_transpose": (
        "(x: f32[2,3,4]) -> f32[4,3,2]",
        "  x = f32[2,3,4] parameter(0)\n"
        "  t.0 = f32[3,4,2] transpose(x), permutation={1,2,0}\n"
        "  ROOT t.1 = f32[4,3,2] transpose(t.0), permutation={1,0,2}",
        "  x = f32[2,3,4] parameter(0)\n"
        "  ROOT t.1 = f32[4,3,2] transpose(x), permutation={2,1,0}",
    ),
    "transpose_inverse": (
        "(x: f32[2,3,4]) -> f32[2,3,4]",
        "  x = f32[2,3,4] parameter(0)\n"
        "  t.0 = f32[3,4,2] transpose(x), permutation={1,2,0}\n"
        "  ROOT t.1 = f32[2,3,4] transpose(t.0), permutation={2,0,1}",
        "  ROOT x = f32[2,3,4] parameter(0)",
    ),
    "dot_of_transposed_rhs": (  # x @ y.T reads y as it is
        "(x: f32[4,3], y: f32[5,3]) -> f32[4,5]",
        "  x = f32[4,3] parameter(0)\n  y = f32[5,3] parameter(1)\n"
        "  t = f32[3,5] transpose(y), permutation={1,0}\n"
        "  ROOT d = f32[4,5] dot_general(x, t), contracting={1;0}",
        "  x = f32[4,3] parameter(0)\n  y = f32[5,3] parameter(1)\n"
        "  ROOT d = f32[4,5] dot_general(x, y), contracting={1;1}",
    ),
    "dot_of_transposed_batched_lhs": (  # batch and contracting dims renumbered, free dim kept
        "(x: f32[3,2,4], y: f32[2,4,5]) -> f32[2,3,5]",
        "  x = f32[3,2,4] parameter(0)\n  y = f32[2,4,5] parameter(1)\n"
        "  t = f32[2,4,3] transpose(x), permutation={1,2,0}\n"
        "  ROOT d = f32[2,3,5] dot_general(t, y), contracting={1;1}, batch={0;0}",
        "  x = f32[3,2,4] parameter(0)\n  y = f32[2,4,5] parameter(1)\n"
        "  ROOT d = f32[2,3,5] dot_general(x, y), contracting={2;1}, batch={1;0}",
    ),
    "dot_without_sums": (  # a scalar times a vector (jnp.dot of a scalar): a multiply
        "(s: f32[], v: f32[6]) -> f32[6]",
        "  s = f32[] parameter(0)\n  v = f32[6] parameter(1)\n"
        "  ROOT d = f32[6] dot_general(s, v), contracting={;}",
        "  s = f32[] parameter(0)\n  v = f32[6] parameter(1)\n"
        "  broadcast_in_dim.0 = f32[6] broadcast_in_dim(s), dims={}\n"
        "  ROOT d = f32[6] mul(broadcast_in_dim.0, v)",
    ),
    "dot_without_sums_batched": (  # an outer product per batch index
        "(a: f32[2,3], b: f32[2,4]) -> f32[2,3,4]",
        "  a = f32[2,3] parameter(0)\n  b = f32[2,4] parameter(1)\n"
        "  ROOT d = f32[2,3,4] dot_general(a, b), contracting={;}, batch={0;0}",
        "  a = f32[2,3] parameter(0)\n  b = f32[2,4] parameter(1)\n"
        "  broadcast_in_dim.0 = f32[2,3,4] broadcast_in_dim(a), dims={0,1}\n"
        "  broadcast_in_dim.1 = f32[2,3,4] broadcast_in_dim(b), dims={0,2}\n"
        "  ROOT d = f32[2,3,4] mul(broadcast_in_dim.0, broadcast_in_dim.1)",
    ),
    "transpose_of_dot": (  # a weight gradient (dy.T @ x).T comes out as x.T @ dy
        "(dy: f32[8,5], x: f32[8,3]) -> f32[3,5]",
        "  dy = f32[8,5] parameter(0)\n  x = f32[8,3] parameter(1)\n"
        "  d = f32[5,3] dot_general(dy, x), contracting={0;0}\n"
        "  ROOT t = f32[3,5] transpose(d), permutation={1,0}",
        "  dy = f32[8,5] parameter(0)\n  x = f32[8,3] parameter(1)\n"
        "  ROOT t = f32[3,5] dot_general(x, dy), contracting={0;0}",
    ),
    "transpose_of_batched_dot": (  # batch first, then rhs's free dimensions, then lhs's
        "(a: f32[2,4,3,6], b: f32[2,6,5]) -> f32[2,5,4,3]",
        "  a = f32[2,4,3,6] parameter(0)\n  b = f32[2,6,5] parameter(1)\n"
        "  d = f32[2,4,3,5] dot_general(a, b), contracting={3;1}, batch={0;0}\n"
        "  ROOT t = f32[2,5,4,3] transpose(d), permutation={0,3,1,2}",
        "  a = f32[2,4,3,6] parameter(0)\n  b = f32[2,6,5] parameter(1)\n"
        "  ROOT t = f32[2,5,4,3] dot_general(b, a), contracting={1;3}, batch={0;0}",
    ),
    "transpose_of_sliced_dot": (  # a vmapped cell's gates: (W h^T) split, each read batch-first
        "(w: f32[6,4], h: f32[5,4]) -> (f32[5,3], f32[5,3])",
        "  w = f32[6,4] parameter(0)\n  h = f32[5,4] parameter(1)\n"
        "  d = f32[6,5] dot_general(w, h), contracting={1;1}\n"
        "  s0 = f32[3,5] slice(d), start={0,0}, limit={3,5}, strides={1,1}\n"
        "  s1 = f32[3,5] slice(d), start={3,0}, limit={6,5}, strides={1,1}\n"
        "  t0 = f32[5,3] transpose(s0), permutation={1,0}\n"
        "  t1 = f32[5,3] transpose(s1), permutation={1,0}\n"
        "  ROOT r = (f32[5,3], f32[5,3]) tuple(t0, t1)",
        "  w = f32[6,4] parameter(0)\n  h = f32[5,4] parameter(1)\n"
        "  dot_general.0 = f32[5,6] dot_general(h, w), contracting={1;1}\n"
        "  t0 = f32[5,3] slice(dot_general.0), start={0,0}, limit={5,3}, strides={1,1}\n"
        "  dot_general.1 = f32[5,6] dot_general(h, w), contracting={1;1}\n"
        "  t1 = f32[5,3] slice(dot_general.1), start={0,3}, limit={5,6}, strides={1,1}\n"
        "  ROOT r = (f32[5,3], f32[5,3]) tuple(t0, t1)",
    ),
    "transpose_up_to_its_inverse": (  # channels last for a pool, then first again
        "(x: f32[2,3,4,6]) -> f32[2,3,4,3]",
        "  x = f32[2,3,4,6] parameter(0)\n  z = f32[] constant(0)\n"
        "  zb = f32[2,4,6,3] broadcast_in_dim(z), dims={}\n"
        "  t = f32[2,4,6,3] transpose(x), permutation={0,2,3,1}\n"
        "  r = f32[2,4,6,3] max(t, zb)\n"
        "  b = f32[2,1,4,6,3] broadcast_in_dim(r), dims={0,2,3,4}\n"
        "  s0 = f32[2,1,4,3,3] slice(b), start={0,0,0,0,0}, limit={2,1,4,5,3}, strides={1,1,1,2,1}\n"
        "  s1 = f32[2,1,4,3,3] slice(b), start={0,0,0,1,0}, limit={2,1,4,6,3}, strides={1,1,1,2,1}\n"
        "  m = f32[2,1,4,3,3] max(s0, s1)\n"
        "  q = f32[2,4,3,3] reshape(m)\n"
        "  ROOT back = f32[2,3,4,3] transpose(q), permutation={0,3,1,2}",
        "  x = f32[2,3,4,6] parameter(0)\n  z = f32[] constant(0)\n"  # each path moved (cse merges them)
        "  broadcast_in_dim.8 = f32[2,3,4,6] broadcast_in_dim(z), dims={}\n"
        "  transpose.5 = f32[2,3,4,6] max(x, broadcast_in_dim.8)\n"
        "  transpose.3 = f32[2,1,3,4,6] broadcast_in_dim(transpose.5), dims={0,2,3,4}\n"
        "  transpose.1 = f32[2,1,3,4,3] slice(transpose.3), start={0,0,0,0,0}, limit={2,1,3,4,5}, strides={1,1,1,1,2}\n"
        "  broadcast_in_dim.10 = f32[2,3,4,6] broadcast_in_dim(z), dims={}\n"
        "  transpose.6 = f32[2,3,4,6] max(x, broadcast_in_dim.10)\n"
        "  transpose.4 = f32[2,1,3,4,6] broadcast_in_dim(transpose.6), dims={0,2,3,4}\n"
        "  transpose.2 = f32[2,1,3,4,3] slice(transpose.4), start={0,0,0,0,1}, limit={2,1,3,4,6}, strides={1,1,1,1,2}\n"
        "  transpose.0 = f32[2,1,3,4,3] max(transpose.1, transpose.2)\n"
        "  ROOT back = f32[2,3,4,3] reshape(transpose.0)",
    ),
    "transpose_identity": (
        "(x: f32[2,3]) -> f32[2,3]",
        "  x = f32[2,3] parameter(0)\n  ROOT t = f32[2,3] transpose(x), permutation={0,1}",
        "  ROOT x = f32[2,3] parameter(0)",
    ),
    "broadcast_broadcast": (
        "(x: f32[3]) -> f32[4,2,3]",
        "  x = f32[3] parameter(0)\n  b.0 = f32[2,3] broadcast_in_dim(x), dims={1}\n"
        "  ROOT b.1 = f32[4,2,3] broadcast_in_dim(b.0), dims={1,2}",
        "  x = f32[3] parameter(0)\n  ROOT b.1 = f32[4,2,3] broadcast_in_dim(x), dims={2}",
    ),
    "broadcast_broadcast_size_one": (
        "(x: f32[1,3]) -> f32[5,2,3]",
        "  x = f32[1,3] parameter(0)\n  b.0 = f32[1,2,3] broadcast_in_dim(x), dims={0,2}\n"
        "  ROOT b.1 = f32[5,2,3] broadcast_in_dim(b.0), dims={0,1,2}",
        "  x = f32[1,3] parameter(0)\n  ROOT b.1 = f32[5,2,3] broadcast_in_dim(x), dims={0,2}",
    ),
    "broadcast_identity": (
        "(x: f32[2,3]) -> f32[2,3]",
        "  x = f32[2,3] parameter(0)\n  ROOT b = f32[2,3] broadcast_in_dim(x), dims={0,1}",
        "  ROOT x = f32[2,3] parameter(0)",
    ),
    "convert_same_type": (
        "(x: bf16[14]) -> bf16[14]",
        "  x = bf16[14] parameter(0)\n  ROOT c = bf16[14] convert_element_type(x)",
        "  ROOT x = bf16[14] parameter(0)",
    ),
    "bitcast_same_type": (
        "(x: u32[14]) -> u32[14]",
        "  x = u32[14] parameter(0)\n  ROOT c = u32[14] bitcast_convert(x)",
        "  ROOT x = u32[14] parameter(0)",
    ),
    "select_same_cases": (
        "(p: pred[14], x: f32[14]) -> f32[14]",
        "  p = pred[14] parameter(0)\n  x = f32[14] parameter(1)\n"
        "  ROOT s = f32[14] select_n(p, x, x)",
        "  p = pred[14] parameter(0)\n  ROOT x = f32[14] parameter(1)",
    ),
    "select_constant_true": (
        "(x: f32[14], y: f32[14]) -> f32[14]",
        "  x = f32[14] parameter(0)\n  y = f32[14] parameter(1)\n  t = pred[] constant(true)\n"
        "  ROOT s = f32[14] select_n(t, x, y)",
        "  x = f32[14] parameter(0)\n  ROOT y = f32[14] parameter(1)",
    ),
    "select_constant_false_splat": (
        "(x: f32[14], y: f32[14]) -> f32[14]",
        "  x = f32[14] parameter(0)\n  y = f32[14] parameter(1)\n"
        + splat("pred", "false")
        + "  ROOT r = f32[14] select_n(s, x, y)",
        "  ROOT x = f32[14] parameter(0)\n  y = f32[14] parameter(1)",
    ),
    "select_constant_index": (
        "(x: s8[4], y: s8[4], z: s8[4]) -> s8[4]",
        "  x = s8[4] parameter(0)\n  y = s8[4] parameter(1)\n  z = s8[4] parameter(2)\n"
        "  i = s32[4] constant({2, 2, 2, 2})\n  ROOT r = s8[4] select_n(i, x, y, z)",
        "  x = s8[4] parameter(0)\n  y = s8[4] parameter(1)\n  ROOT z = s8[4] parameter(2)",
    ),
    "slice_everything": (
        "(x: f32[2,3]) -> f32[2,3]",
        "  x = f32[2,3] parameter(0)\n"
        "  ROOT s = f32[2,3] slice(x), start={0,0}, limit={2,3}, strides={1,1}",
        "  ROOT x = f32[2,3] parameter(0)",
    ),
    "concatenate_one": (
        "(x: f32[2,3]) -> f32[2,3]",
        "  x = f32[2,3] parameter(0)\n  ROOT c = f32[2,3] concatenate(x), dimension=1",
        "  ROOT x = f32[2,3] parameter(0)",
    ),
    "integer_pow_one": (
        "(x: f32[14]) -> f32[14]",
        X_F32 + "  ROOT p = f32[14] integer_pow(x), y=1",
        "  ROOT x = f32[14] parameter(0)",
    ),
    "integer_pow_zero_float": (
        "(x: f32[14]) -> f32[14]",
        X_F32 + '  ROOT p = f32[14] integer_pow(x), y=0, loc="model.py:9 (f)"',
        X_F32 + '  constant.0 = f32[] constant(1.0), loc="model.py:9 (f)"\n'
        '  ROOT p = f32[14] broadcast_in_dim(constant.0), dims={}, loc="model.py:9 (f)"',
    ),
    "integer_pow_zero_int_scalar": (
        "(x: s64[]) -> s64[]",
        "  x = s64[] parameter(0)\n  ROOT p = s64[] integer_pow(x), y=0",
        "  x = s64[] parameter(0)\n  ROOT p = s64[] constant(1)",
    ),
    "reduce_no_axes": (
        "(x: f32[14], y: s32[8], z: pred[2]) -> (f32[14], f32[14], f32[14], s32[8], pred[2])",
        "  x = f32[14] parameter(0)\n  y = s32[8] parameter(1)\n  z = pred[2] parameter(2)\n"
        "  a = f32[14] reduce_max(x), axes={}\n  b = f32[14] reduce_min(x), axes={}\n"
        "  c = f32[14] reduce_prod(x), axes={}\n  d = s32[8] reduce_sum(y), axes={}\n"
        "  e = pred[2] reduce_and(z), axes={}\n"
        "  ROOT t = (f32[14], f32[14], f32[14], s32[8], pred[2]) tuple(a, b, c, d, e)",
        "  x = f32[14] parameter(0)\n  y = s32[8] parameter(1)\n  z = pred[2] parameter(2)\n"
        "  ROOT t = (f32[14], f32[14], f32[14], s32[8], pred[2]) tuple(x, x, x, y, z)",
    ),
    "idempotent": (
        "(x: f32[14], y: s32[8]) -> (f32[14], f32[14], s32[8], s32[8])",
        "  x = f32[14] parameter(0)\n  y = s32[8] parameter(1)\n"
        "  a = f32[14] max(x, x)\n  b = f32[14] min(x, x)\n  c = s32[8] and(y, y)\n"
        "  d = s32[8] or(y, y)\n"
        "  ROOT t = (f32[14], f32[14], s32[8], s32[8]) tuple(a, b, c, d)",
        "  x = f32[14] parameter(0)\n  y = s32[8] parameter(1)\n"
        "  ROOT t = (f32[14], f32[14], s32[8], s32[8]) tuple(x, x, y, y)",
    ),
    "max_lowest": (
        "(x: bf16[14], y: s8[8], z: pred[2]) -> (bf16[14], s8[8], pred[2])",
        "  x = bf16[14] parameter(0)\n  y = s8[8] parameter(1)\n  z = pred[2] parameter(2)\n"
        "  l = bf16[] constant(-inf)\n  lb = bf16[14] broadcast_in_dim(l), dims={}\n"
        "  a = bf16[14] max(lb, x)\n"
        "  m = s8[8] constant({-128, -128, -128, -128, -128, -128, -128, -128})\n"
        "  b = s8[8] max(y, m)\n  f = pred[] constant(false)\n"
        "  fb = pred[2] broadcast_in_dim(f), dims={}\n  c = pred[2] max(z, fb)\n"
        "  ROOT t = (bf16[14], s8[8], pred[2]) tuple(a, b, c)",
        "  x = bf16[14] parameter(0)\n  y = s8[8] parameter(1)\n  z = pred[2] parameter(2)\n"
        "  ROOT t = (bf16[14], s8[8], pred[2]) tuple(x, y, z)",
    ),
    "min_highest": (
        "(x: f64[14], y: u32[8], z: pred[2]) -> (f64[14], u32[8], pred[2])",
        "  x = f64[14] parameter(0)\n  y = u32[8] parameter(1)\n  z = pred[2] parameter(2)\n"
        "  h = f64[] constant(inf)\n  hb = f64[14] broadcast_in_dim(h), dims={}\n"
        "  a = f64[14] min(x, hb)\n  m = u32[] constant(4294967295)\n"
        "  mb = u32[8] broadcast_in_dim(m), dims={}\n  b = u32[8] min(mb, y)\n"
        "  tr = pred[2] constant({true, true})\n  c = pred[2] min(z, tr)\n"
        "  ROOT t = (f64[14], u32[8], pred[2]) tuple(a, b, c)",
        "  x = f64[14] parameter(0)\n  y = u32[8] parameter(1)\n  z = pred[2] parameter(2)\n"
        "  ROOT t = (f64[14], u32[8], pred[2]) tuple(x, y, z)",
    ),
    "pad_nothing": (
        "(x: f32[2,3]) -> f32[2,3]",
        "  x = f32[2,3] parameter(0)\n  v = f32[] constant(7.0)\n"
        "  ROOT p = f32[2,3] pad(x, v), low={0,0}, high={0,0}, interior={0,0}",
        "  ROOT x = f32[2,3] parameter(0)",
    ),
    "rev_nothing": (
        "(x: f32[2,3]) -> f32[2,3]",
        "  x = f32[2,3] parameter(0)\n  ROOT r = f32[2,3] rev(x), dimensions={}",
        "  ROOT x = f32[2,3] parameter(0)",
    ),
}


KEPT = {
    "dot_without_sums_reordered": (  # the lhs's batch dimension after its free one: left alone
        "(a: f32[3,2], b: f32[2,4]) -> f32[2,3,4]",
        "  a = f32[3,2] parameter(0)\n  b = f32[2,4] parameter(1)\n"
        "  ROOT d = f32[2,3,4] dot_general(a, b), contracting={;}, batch={1;0}",
    ),
    "transpose_of_dot_read_twice": (  # the dot is read as it is too: one product, not two
        "(dy: f32[8,5], x: f32[8,3]) -> (f32[5,3], f32[3,5])",
        "  dy = f32[8,5] parameter(0)\n  x = f32[8,3] parameter(1)\n"
        "  d = f32[5,3] dot_general(dy, x), contracting={0;0}\n"
        "  t = f32[3,5] transpose(d), permutation={1,0}\n"
        "  ROOT r = (f32[5,3], f32[3,5]) tuple(d, t)",
    ),
    "transpose_of_sliced_dot_read_as_it_is": (  # one gate read as the dot gives it: one product
        "(w: f32[6,4], h: f32[5,4]) -> (f32[3,5], f32[5,3])",
        "  w = f32[6,4] parameter(0)\n  h = f32[5,4] parameter(1)\n"
        "  d = f32[6,5] dot_general(w, h), contracting={1;1}\n"
        "  s0 = f32[3,5] slice(d), start={0,0}, limit={3,5}, strides={1,1}\n"
        "  s1 = f32[3,5] slice(d), start={3,0}, limit={6,5}, strides={1,1}\n"
        "  t1 = f32[5,3] transpose(s1), permutation={1,0}\n"
        "  ROOT r = (f32[3,5], f32[5,3]) tuple(s0, t1)",
    ),
    "transpose_not_up_to_its_inverse": (  # no transpose above to undo: left where it is
        "(x: f32[2,3]) -> f32[3,2]",
        "  x = f32[2,3] parameter(0)\n  e = f32[2,3] exp(x)\n"
        "  ROOT t = f32[3,2] transpose(e), permutation={1,0}",
    ),
    "transpose_of_dot_not_a_swap": (  # the lhs's free dimensions reordered among themselves
        "(a: f32[4,3,6], b: f32[6,5]) -> f32[3,4,5]",
        "  a = f32[4,3,6] parameter(0)\n  b = f32[6,5] parameter(1)\n"
        "  d = f32[4,3,5] dot_general(a, b), contracting={2;0}\n"
        "  ROOT t = f32[3,4,5] transpose(d), permutation={1,0,2}",
    ),
}


@pytest.mark.parametrize("case", KEPT.values(), ids=KEPT.keys())
def test_rule_leaves_alone(case):
    signature, body = case
    assert_unchanged(SIMPLIFY, entry(signature, body))


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_rule(case):
    signature, before, expected = case
    assert_pass(SIMPLIFY_DCE, entry(signature, before), entry(signature, expected))


# ---------------------------------------------------------------------------- the driver
def test_simplify_alone_drops_what_it_replaced_and_leaves_dead_operands_to_dce():
    assert_pass(
        SIMPLIFY,
        entry(
            "(x: f32[14]) -> f32[14]",
            X_F32
            + splat("f32", "1.0")
            + '  m = f32[14] mul(x, s), loc="model.py:2"\n'
            + '  ROOT e = f32[14] exp(m), loc="model.py:3"',
        ),
        entry(
            "(x: f32[14]) -> f32[14]",
            X_F32 + splat("f32", "1.0") + '  ROOT e = f32[14] exp(x), loc="model.py:3"',
        ),
    )


def test_rules_reach_a_fixpoint_in_one_run():
    before = entry(
        "(x: f32[2,3], q: pred[3,2]) -> f32[3,2]",
        "  x = f32[2,3] parameter(0)\n  q = pred[3,2] parameter(1)\n"
        "  n.0 = f32[2,3] neg(x)\n  n.1 = f32[2,3] neg(n.0)\n  n.2 = f32[2,3] neg(n.1)\n"
        "  n.3 = f32[2,3] neg(n.2)\n"
        "  r.0 = f32[6] reshape(n.3)\n  r.1 = f32[2,3] reshape(r.0)\n"
        "  t.0 = f32[3,2] transpose(r.1), permutation={1,0}\n"
        "  t.1 = f32[2,3] transpose(t.0), permutation={1,0}\n"
        "  t.2 = f32[3,2] transpose(t.1), permutation={1,0}\n"
        "  c = f32[] constant(1.0)\n  b.0 = f32[3] broadcast_in_dim(c), dims={}\n"
        "  b.1 = f32[3,2] broadcast_in_dim(b.0), dims={0}\n"
        "  m = f32[3,2] mul(b.1, t.2)\n  p = f32[3,2] integer_pow(m), y=1\n"
        "  ROOT s = f32[3,2] select_n(q, p, p)",
    )
    expected = entry(
        "(x: f32[2,3], q: pred[3,2]) -> f32[3,2]",
        "  x = f32[2,3] parameter(0)\n  q = pred[3,2] parameter(1)\n"
        "  ROOT t.2 = f32[3,2] transpose(x), permutation={1,0}",
    )
    after = assert_pass(SIMPLIFY_DCE, before, expected)
    assert SIMPLIFY.run(after) is after


def test_splats_are_recognised_through_broadcasts_and_splat_literals_only():
    before = entry(
        "(x: f32[2,2]) -> (f32[2,2], f32[2,2], f32[2,2])",
        "  x = f32[2,2] parameter(0)\n"
        "  one = f32[1] constant({1.0})\n  b.0 = f32[2] broadcast_in_dim(one), dims={0}\n"
        "  b.1 = f32[2,2] broadcast_in_dim(b.0), dims={1}\n"
        "  ones = f32[2,2] constant({{1.0, 1.0}, {1.0, 1.0}})\n"
        "  mixed = f32[2,2] constant({{1.0, 1.0}, {1.0, 2.0}})\n"
        "  m.0 = f32[2,2] mul(x, b.1)\n  m.1 = f32[2,2] mul(ones, x)\n"
        "  m.2 = f32[2,2] mul(x, mixed)\n"
        "  ROOT t = (f32[2,2], f32[2,2], f32[2,2]) tuple(m.0, m.1, m.2)",
    )
    expected = entry(
        "(x: f32[2,2]) -> (f32[2,2], f32[2,2], f32[2,2])",
        "  x = f32[2,2] parameter(0)\n"
        "  mixed = f32[2,2] constant({{1.0, 1.0}, {1.0, 2.0}})\n"
        "  m.2 = f32[2,2] mul(x, mixed)\n"
        "  ROOT t = (f32[2,2], f32[2,2], f32[2,2]) tuple(x, x, m.2)",
    )
    assert_pass(SIMPLIFY_DCE, before, expected)


def test_simplifies_called_computations():
    assert_pass(
        SIMPLIFY,
        """
HloModule m

fused (p: f32[3]) -> f32[3] {
  p = f32[3] parameter(0)
  n.0 = f32[3] neg(p)
  ROOT n.1 = f32[3] neg(n.0)
}

ENTRY main (x: f32[3]) -> f32[3] {
  x = f32[3] parameter(0)
  ROOT f = f32[3] fusion(x), kind=loop, calls=fused
}
""",
        """
HloModule m

fused (p: f32[3]) -> f32[3] {
  ROOT p = f32[3] parameter(0)
  n.0 = f32[3] neg(p)
}

ENTRY main (x: f32[3]) -> f32[3] {
  x = f32[3] parameter(0)
  ROOT f = f32[3] fusion(x), kind=loop, calls=fused
}
""",
    )


def test_nothing_to_simplify_returns_the_same_module():
    assert_unchanged(
        SIMPLIFY,
        entry(
            "(x: f32[2,3], y: f32[2,3]) -> f32[3,2]",
            "  x = f32[2,3] parameter(0)\n  y = f32[2,3] parameter(1)\n"
            "  a = f32[2,3] add(x, y)\n  n = f32[2,3] neg(a)\n"
            "  ROOT t = f32[3,2] transpose(n), permutation={1,0}",
        ),
    )


def test_the_rule_list_is_an_option():
    only_neg = AlgebraicSimplifier(rules=[r for r in RULES if r.name == "neg_neg"])
    text = entry(
        "(x: f32[4]) -> f32[4]",
        "  x = f32[4] parameter(0)\n  c = f32[] constant(1.0)\n"
        "  b = f32[4] broadcast_in_dim(c), dims={}\n  m = f32[4] mul(x, b)\n"
        "  n.0 = f32[4] neg(m)\n  ROOT n.1 = f32[4] neg(n.0)",
    )
    after = only_neg.run(parse(text))
    assert after.entry_computation.root == "m"
    assert SIMPLIFY.run(after).entry_computation.root == "x"


def test_a_rule_replacing_with_the_wrong_shape_is_caught():
    bad = Rule("bad", (Op.TRANSPOSE,), lambda ctx, inst: inst.operands[0], forward, "wrong")
    text = entry(
        "(x: f32[2,3]) -> f32[3,2]",
        "  x = f32[2,3] parameter(0)\n  ROOT t = f32[3,2] transpose(x), permutation={1,0}",
    )
    with pytest.raises(RuleError, match="bad"):
        AlgebraicSimplifier(rules=[bad]).run(parse(text))


# ---------------------------------------------------------------------------- must not
def zeros(x):
    return np.zeros_like(x)


def ones(x):
    return np.ones_like(x)


def itself(x, *rest):
    return x


# (signature, before body that must stay, naive rewrite as a function of the arguments or
# None): the naive rewrite gives a different result on edge inputs (NaN, inf, -0.0, 0), which
# is why the simplifier leaves the before body alone.
MUST_NOT = {
    "x_times_zero": (
        "(x: f32[14]) -> f32[14]",
        X_F32 + splat("f32", "0.0") + "  ROOT r = f32[14] mul(x, s)",
        zeros,  # inf * 0 is NaN, -1 * 0 is -0.0
    ),
    "zero_times_x": (
        "(x: f32[14]) -> f32[14]",
        X_F32 + splat("f32", "0.0") + "  ROOT r = f32[14] mul(s, x)",
        zeros,
    ),
    "x_plus_positive_zero": (
        "(x: f32[14]) -> f32[14]",
        X_F32 + splat("f32", "0.0") + "  ROOT r = f32[14] add(x, s)",
        itself,  # -0.0 + 0.0 is +0.0
    ),
    "positive_zero_plus_x": (
        "(x: f32[14]) -> f32[14]",
        X_F32 + splat("f32", "0.0") + "  ROOT r = f32[14] add(s, x)",
        itself,
    ),
    "x_minus_negative_zero": (
        "(x: f32[14]) -> f32[14]",
        X_F32 + splat("f32", "-0.0") + "  ROOT r = f32[14] sub(x, s)",
        itself,  # -0.0 - -0.0 is +0.0
    ),
    "zero_minus_x": (
        "(x: f32[14]) -> f32[14]",
        X_F32 + splat("f32", "0.0") + "  ROOT r = f32[14] sub(s, x)",
        np.negative,  # 0.0 - 0.0 is +0.0, not -0.0
    ),
    "x_minus_x": (
        "(x: f32[14]) -> f32[14]",
        X_F32 + "  ROOT r = f32[14] sub(x, x)",
        zeros,  # inf - inf is NaN
    ),
    "x_over_x": (
        "(x: f32[14]) -> f32[14]",
        X_F32 + "  ROOT r = f32[14] div(x, x)",
        ones,  # 0 / 0 is NaN
    ),
    "int_x_over_x": (
        "(x: s32[8]) -> s32[8]",
        X_S32 + "  ROOT r = s32[8] div(x, x)",
        ones,  # 0 / 0 is -1 for integers
    ),
    "max_with_the_finite_lowest": (
        "(x: f32[14]) -> f32[14]",
        X_F32 + splat("f32", "-3.4028234663852886e+38") + "  ROOT r = f32[14] max(x, s)",
        itself,  # max(-inf, -FLT_MAX) is -FLT_MAX
    ),
    "select_index_out_of_range": (
        "(x: f32[14], y: f32[14]) -> f32[14]",
        "  x = f32[14] parameter(0)\n  y = f32[14] parameter(1)\n  i = s32[] constant(5)\n"
        "  ROOT r = f32[14] select_n(i, x, y)",
        None,  # out of range: left to the backend, not guessed
    ),
    "dot_of_a_transpose_reordering_free_dims": (
        "(x: f32[2,3,4], y: f32[4,5]) -> f32[3,2,5]",
        "  x = f32[2,3,4] parameter(0)\n  y = f32[4,5] parameter(1)\n"
        "  t = f32[3,2,4] transpose(x), permutation={1,0,2}\n"
        "  ROOT d = f32[3,2,5] dot_general(t, y), contracting={2;0}",
        None,  # without the transpose the result's first two dimensions would swap
    ),
    "x_over_three": (
        "(x: f32[14]) -> f32[14]",
        X_F32 + splat("f32", "3.0") + "  ROOT r = f32[14] div(x, s)",
        None,  # 1/3 is not a float: x * (1/3) rounds twice
    ),
    "x_over_a_power_of_two_whose_reciprocal_overflows": (
        "(x: f16[14]) -> f16[14]",
        "  x = f16[14] parameter(0)\n" + splat("f16", "5.960464477539063e-08") + "  ROOT r = f16[14] div(x, s)",
        None,  # 1 / 2**-24 is 2**24, past f16's largest finite value
    ),
    "int_over_two": (
        "(x: s32[8]) -> s32[8]",
        X_S32 + splat("s32", "2", "8") + "  ROOT r = s32[8] div(x, s)",
        None,  # integer division rounds toward zero: no reciprocal
    ),
    "bitcast_to_another_type": (
        "(x: f32[14]) -> s32[14]",
        X_F32 + "  ROOT r = s32[14] bitcast_convert(x)",
        None,  # the bits stay, the dtype does not
    ),
    "int_times_minus_one": (
        "(x: s32[8]) -> s32[8]",
        X_S32 + splat("s32", "-1", "8") + "  ROOT r = s32[8] mul(x, s)",
        None,  # no such rule
    ),
}


@pytest.mark.parametrize("case", MUST_NOT.values(), ids=MUST_NOT.keys())
def test_inexact_rewrites_do_not_happen(case):
    signature, before, naive = case
    module = parse(entry(signature, before))
    assert_unchanged(SIMPLIFY, entry(signature, before))
    assert SIMPLIFY.run(module) is module
    if naive is None:
        return
    differ = [
        not same_values(interpret(module, *args), naive(*args)) for args in input_sets(module)
    ]
    assert any(differ), "the naive rewrite is exact after all"
