"""The reference interpreter: calls, fusions and tuples, argument checking, errors that name the
instruction, and the lax semantics written out by hand (independent of jax)."""

import numpy as np
import pytest

from xfuse.hlo import Builder, DType, InterpreterError, Loc, Module, Op, Shape, interpret, parse

F32, S32, U8 = DType.F32, DType.S32, DType.U8


def run_binary(op, x, y, **attrs):
    x, y = np.asarray(x), np.asarray(y)
    b = Builder("main")
    px = b.parameter(Shape.of(x), "x")
    py = b.parameter(Shape.of(y), "y")
    return interpret(Module.of(b.build(b.emit(op, px, py, **attrs))), x, y)


def run_unary(op, x, **kw):
    x = np.asarray(x)
    b = Builder("main")
    return interpret(Module.of(b.build(b.emit(op, b.parameter(Shape.of(x), "x"), **kw))), x)


def bits(a):
    return np.asarray(a).tobytes()


I32_MIN = np.iinfo(np.int32).min


def test_integer_division_rounds_toward_zero_with_lax_edge_cases():
    x = np.array([7, -7, 7, -7, I32_MIN, 5, 0], np.int32)
    y = np.array([2, 2, -2, -2, -1, 0, 0], np.int32)
    assert run_binary(Op.DIV, x, y).tolist() == [3, -3, -3, 3, I32_MIN, -1, -1]
    assert run_binary(Op.REM, x, y).tolist() == [1, -1, 1, -1, 0, 5, 0]
    u = np.array([7, 0], np.uint32)
    assert run_binary(Op.DIV, u, np.zeros(2, np.uint32)).tolist() == [2**32 - 1] * 2
    assert run_binary(Op.REM, u, np.zeros(2, np.uint32)).tolist() == [7, 0]


def test_shifts_past_the_bit_width():
    x = np.array([1, -8, 1, -8, 1], np.int32)
    s = np.array([31, 1, 32, 40, -1], np.int32)
    assert run_binary(Op.SHIFT_LEFT, x, s).tolist() == [I32_MIN, -16, 0, 0, 0]
    assert run_binary(Op.SHIFT_RIGHT_LOGICAL, x, s).tolist() == [0, 2147483644, 0, 0, 0]
    assert run_binary(Op.SHIFT_RIGHT_ARITHMETIC, x, s).tolist() == [0, -4, 0, -1, 0]


def test_float_to_integer_conversion_saturates_and_maps_nan_to_zero():
    f = np.array([np.nan, np.inf, -np.inf, 3e9, -3e9, 2.7, -2.7, -0.5], np.float32)
    i32 = run_unary(Op.CONVERT_ELEMENT_TYPE, f, dtype=S32)
    assert i32.tolist() == [0, 2**31 - 1, -(2**31), 2**31 - 1, -(2**31), 2, -2, 0]
    u8 = run_unary(Op.CONVERT_ELEMENT_TYPE, f, dtype=U8)
    assert u8.tolist() == [0, 255, 0, 255, 0, 2, 0, 0]
    as_pred = run_unary(Op.CONVERT_ELEMENT_TYPE, np.array([np.nan, 0.0, -0.0, 2], np.float32), dtype=DType.PRED)
    assert as_pred.tolist() == [True, False, False, True]


def test_max_and_min_propagate_nan_and_order_signed_zeros():
    a = np.array([-0.0, 0.0, np.nan, 1.0], np.float32)
    b = np.array([0.0, -0.0, 1.0, np.nan], np.float32)
    hi, lo = run_binary(Op.MAX, a, b), run_binary(Op.MIN, a, b)
    assert np.signbit(hi[:2]).tolist() == [False, False]
    assert np.signbit(lo[:2]).tolist() == [True, True]
    assert np.isnan(hi[2:]).all() and np.isnan(lo[2:]).all()


def test_reductions_of_empty_axes_give_the_identity():
    empty = np.zeros((3, 0), np.float32)
    assert run_unary(Op.REDUCE_SUM, empty, axes=(1,)).tolist() == [0, 0, 0]
    assert run_unary(Op.REDUCE_PROD, empty, axes=(1,)).tolist() == [1, 1, 1]
    assert run_unary(Op.REDUCE_MAX, empty, axes=(1,)).tolist() == [-np.inf] * 3
    ints = np.zeros((0,), np.int32)
    assert run_unary(Op.REDUCE_MIN, ints, axes=(0,)) == np.iinfo(np.int32).max
    assert run_unary(Op.REDUCE_AND, np.zeros((0,), bool), axes=(0,)) == np.True_


def test_reduce_max_of_signed_zeros_is_positive_zero():
    x = np.array([[-0.0, 0.0], [-0.0, -0.0]], np.float32)
    assert np.signbit(run_unary(Op.REDUCE_MAX, x, axes=(1,))).tolist() == [False, True]
    assert np.signbit(run_unary(Op.REDUCE_MIN, x, axes=(1,))).tolist() == [True, True]


def test_round_methods_and_sign_of_negative_zero():
    x = np.array([0.5, 1.5, 2.5, -0.5, -0.3], np.float32)
    away = run_unary(Op.ROUND, x)
    assert away.tolist() == [1, 2, 3, -1, 0] and np.signbit(away[4])
    even = run_unary(Op.ROUND, x, rounding_method="to_nearest_even")
    assert even.tolist() == [0, 2, 2, 0, 0] and np.signbit(even[3])
    signs = run_unary(Op.SIGN, np.array([-0.0, 0.0, -3.0, np.nan], np.float32))
    assert bits(signs[:3]) == bits(np.array([-0.0, 0.0, -1.0], np.float32)) and np.isnan(signs[3])


def test_integer_pow_is_binary_exponentiation():
    assert run_unary(Op.INTEGER_POW, np.array([2, 3, -2], np.int32), y=3).tolist() == [8, 27, -8]
    assert run_unary(Op.INTEGER_POW, np.array([2.0], np.float32), y=-2).tolist() == [0.25]
    assert run_unary(Op.INTEGER_POW, np.array([np.nan], np.float32), y=0).tolist() == [1.0]


def test_dynamic_slice_clamps_its_start():
    x = np.arange(10, dtype=np.int32)
    b = Builder("main")
    px = b.parameter(Shape.of(x), "x")
    start = b.parameter(Shape(S32, ()), "i")
    m = Module.of(b.build(b.dynamic_slice(px, start, shape=(3,))))
    assert interpret(m, x, np.int32(8)).tolist() == [7, 8, 9]
    assert interpret(m, x, np.int32(-5)).tolist() == [0, 1, 2]


FUSED = """
HloModule fused

fused_mul_add (p0: f32[3], p1: f32[3]) -> (f32[3], f32[3]) {
  p0 = f32[3] parameter(0)
  p1 = f32[3] parameter(1)
  mul.0 = f32[3] mul(p0, p1)
  add.1 = f32[3] add(mul.0, p1)
  ROOT tuple.2 = (f32[3], f32[3]) tuple(mul.0, add.1)
}

ENTRY main (x: f32[3], y: f32[3]) -> (f32[3], f32[3]) {
  x = f32[3] parameter(0)
  y = f32[3] parameter(1)
  fusion.0 = (f32[3], f32[3]) fusion(x, y), kind=multi_output, calls=fused_mul_add
  a = f32[3] get_tuple_element(fusion.0), index=0
  b = f32[3] get_tuple_element(fusion.0), index=1
  c = f32[3] call(a, b), calls=fused_mul_add_2
  ROOT t = (f32[3], f32[3]) tuple(c, b)
}

fused_mul_add_2 (q0: f32[3], q1: f32[3]) -> f32[3] {
  q0 = f32[3] parameter(0)
  q1 = f32[3] parameter(1)
  ROOT s = f32[3] sub(q0, q1)
}
"""


def test_fusions_calls_and_tuples():
    x = np.array([1, 2, 3], np.float32)
    y = np.array([4, 5, 6], np.float32)
    c, b = interpret(parse(FUSED), x, y)
    np.testing.assert_array_equal(b, x * y + y)
    np.testing.assert_array_equal(c, x * y - (x * y + y))


def test_arguments_are_checked_by_count_shape_and_dtype():
    m = parse(FUSED)
    x = np.zeros(3, np.float32)
    with pytest.raises(TypeError, match="main takes 2 arguments, got 1"):
        interpret(m, x)
    with pytest.raises(TypeError, match=r"argument 1 \(y\) should be f32\[3\].*got float64\[3\]"):
        interpret(m, x, np.zeros(3))
    with pytest.raises(TypeError, match=r"argument 0 \(x\) should be f32\[3\].*got float32\[4\]"):
        interpret(m, np.zeros(4, np.float32), x)


def test_a_failing_op_is_reported_with_its_instruction_and_source_line():
    # An unverified module whose reshape cannot work: the error names it and its location.
    b = Builder("main", loc=Loc("model.py", 7, "f"))
    x = b.parameter(Shape(F32, (6,)), "x")
    good = b.reshape(x, shape=(2, 3))
    comp = b.build(good)
    broken = comp.replace(
        instructions=(comp.instructions[0], good.replace(shape=Shape(F32, (4, 2))))
    )
    with pytest.raises(InterpreterError, match=r"reshape.0 \(reshape\) in main at model.py:7 \(f\)"):
        interpret(Module.of(broken), np.zeros(6, np.float32))
