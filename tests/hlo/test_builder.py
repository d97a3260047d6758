"""The builder applies shape rules at the call and names results after their op."""

import numpy as np
import pytest

from xfuse.hlo import Builder, BuilderError, DType, Loc, Module, Shape, TupleShape, verify

F32 = DType.F32


def test_results_are_named_after_their_op_and_carry_the_location():
    b = Builder("main", loc=Loc("model.py", 3, "f"))
    x = b.parameter(Shape(F32, (2, 3)), "x")
    y = b.exp(b.neg(x))
    assert y.name == "exp.1" and y.shape == Shape(F32, (2, 3))
    assert y.loc == Loc("model.py", 3, "f")
    t = b.transpose(y, permutation=(1, 0), loc=Loc("other.py", 9))
    assert t.shape.dims == (3, 2) and t.loc == Loc("other.py", 9)
    verify(Module.of(b.build(t)))


def test_declared_results_and_tuple_roots():
    b = Builder("main")
    x = b.parameter(Shape(F32, (4,)), "x")
    c = b.convert_element_type(x, dtype=DType.S32)
    r = b.reshape(x, shape=(2, 2))
    d = b.dot_general(r, r, contracting=((1,), (0,)), dtype=F32)
    comp = b.build([c, d])
    assert comp.result_shape == TupleShape((Shape(DType.S32, (4,)), Shape(F32, (2, 2))))
    verify(Module.of(comp))


def test_constants_keep_their_bits():
    b = Builder("main")
    c = b.constant(np.array([-0.0, np.nan, 1e-45], np.float32))
    assert c.shape == Shape(F32, (3,))
    assert np.signbit(c.attr("value").array[0])


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda b, x, y: b.add(x, y), r"add\(f32\[2,3\], f32\[3\]\): operand shapes .* do not match"),
        (lambda b, x, y: b.neg(x, y), r"neg\(f32\[2,3\], f32\[3\]\): neg takes 1 operands, got 2"),
        (lambda b, x, y: b.reduce_sum(x), r"reduce_sum\(f32\[2,3\]\): missing attribute 'axes'"),
        (lambda b, x, y: b.reduce_sum(x, axes=(0,), bogus=1), r"unknown attribute\(s\) \['bogus'\]"),
        (lambda b, x, y: b.reshape(x, shape=(7,)), r"reshape\(f32\[2,3\]\): cannot reshape f32\[2,3\] to f32\[7\]"),
        (lambda b, x, y: b.round(y, rounding_method="up"), r"rounding_method must be one of"),
        (lambda b, x, y: b.exp("nope"), r"'nope' is not an instruction of this computation"),
        (lambda b, x, y: b.parameter(Shape(F32, ()), "x"), r"the name 'x' is already used"),
    ],
)
def test_invalid_calls_raise_at_the_call_naming_op_and_shapes(call, message):
    b = Builder("main")
    x = b.parameter(Shape(F32, (2, 3)), "x")
    y = b.parameter(Shape(F32, (3,)), "y")
    with pytest.raises(BuilderError, match=message):
        call(b, x, y)


def test_values_from_another_builder_are_rejected():
    other = Builder("other")
    z = other.parameter(Shape(F32, ()), "z")
    b = Builder("main")
    with pytest.raises(BuilderError, match="'z' is not an instruction of this computation"):
        b.neg(z)
