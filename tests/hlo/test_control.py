"""Control flow in the IR: while and conditional build, print and parse back, verify (and fail
to verify with errors naming the instruction and the called computation), and interpret to the
values worked out by hand."""

from __future__ import annotations

import numpy as np
import pytest

from xfuse.hlo import (
    Builder,
    DType,
    HloParseError,
    HloVerifyError,
    Loc,
    Module,
    Op,
    Shape,
    TupleShape,
    interpret,
    parse,
    print_module,
    verify,
)

F32 = Shape(DType.F32, (3,))
S32 = Shape(DType.S32, ())


def counting_loop(limit: int = 4) -> Module:
    """i, x = 0, x; while i < limit: i, x = i + 1, x * 2."""
    cond = Builder("loop.cond")
    i, _ = cond.parameter(S32, "i"), cond.parameter(F32, "x")
    cond_comp = cond.build(cond.lt(i, cond.constant(np.int32(limit))))
    body = Builder("loop.body")
    i, x = body.parameter(S32, "i"), body.parameter(F32, "x")
    body_comp = body.build([body.add(i, body.constant(np.int32(1))), body.add(x, x)])
    entry = Builder("main", Loc("model.py", 7, "f"))
    x = entry.parameter(F32, "x")
    zero = entry.constant(np.int32(0))
    loop = entry.emit(Op.WHILE, zero, x, condition="loop.cond", body="loop.body")
    root = entry.get_tuple_element(loop, index=1)
    return Module.of(entry.build(root), body_comp, cond_comp, name="counting")


def three_way() -> Module:
    """conditional(k, x, y): branch 0 x + y, branch 1 x * y, branch 2 x - y."""
    branches = []
    for k, op in enumerate((Op.ADD, Op.MUL, Op.SUB)):
        b = Builder(f"switch.branch{k}")
        x, y = b.parameter(F32, "x"), b.parameter(F32, "y")
        branches.append(b.build(b.emit(op, x, y)))
    entry = Builder("main")
    k, x, y = entry.parameter(S32, "k"), entry.parameter(F32, "x"), entry.parameter(F32, "y")
    names = tuple(c.name for c in branches)
    root = entry.emit(Op.CONDITIONAL, k, x, y, branches=names, shape=F32)
    return Module.of(entry.build(root), *branches, name="three_way")


def test_while_result_is_a_tuple_of_the_state():
    module = counting_loop()
    verify(module)
    loop = next(i for i in module.entry_computation if i.op is Op.WHILE)
    assert loop.shape == TupleShape((S32, F32))
    assert loop.callees == ("loop.cond", "loop.body")
    assert [c.name for c in module.computations][-1] == "main"


@pytest.mark.parametrize("build", [counting_loop, three_way])
def test_round_trip(build):
    module = build()
    text = print_module(module)
    parsed = parse(text)
    assert parsed == module
    assert print_module(parsed) == text


def test_printed_attributes():
    text = print_module(counting_loop()) + print_module(three_way())
    assert "condition=loop.cond, body=loop.body" in text
    assert "branches={switch.branch0,switch.branch1,switch.branch2}" in text


def test_branches_must_be_names():
    text = print_module(three_way()).replace("branches={", "branches={1,")
    with pytest.raises(HloParseError, match="a computation name in 'branches'"):
        parse(text)


def test_callees_order_before_callers_in_module_of():
    module = counting_loop()
    shuffled = Module.of(module.entry_computation, module["loop.cond"], module["loop.body"])
    names = [c.name for c in shuffled.computations]
    assert names.index("loop.body") < names.index("main")


def test_interpreter_runs_the_loop():
    x = np.array([1.0, -2.0, 0.5], np.float32)
    np.testing.assert_array_equal(interpret(counting_loop(4), x), x * 16)


def test_interpreter_runs_zero_iterations():
    x = np.array([1.0, -2.0, 0.5], np.float32)
    np.testing.assert_array_equal(interpret(counting_loop(0), x), x)


@pytest.mark.parametrize("index, expected", [(0, [4, 6, 8]), (1, [3, 8, 15]), (2, [-2, -2, -2]),
                                             (7, [-2, -2, -2]), (-1, [-2, -2, -2])])
def test_interpreter_picks_the_branch_and_clamps_to_the_last(index, expected):
    x = np.array([1, 2, 3], np.float32)
    y = np.array([3, 4, 5], np.float32)
    got = interpret(three_way(), np.int32(index), x, y)
    np.testing.assert_array_equal(got, np.array(expected, np.float32))


# ---------------------------------------------------------------------------- verifier errors
def test_condition_must_return_pred():
    module = counting_loop()
    cond = Builder("loop.cond")
    cond.parameter(S32, "i")
    x = cond.parameter(F32, "x")
    module = module.with_computation(cond.build(x))
    with pytest.raises(HloVerifyError, match=r"while\.\d+: loop.cond \(condition\) returns f32\[3\], "
                                             r"expected pred\[\]"):
        verify(module)


def test_body_must_return_the_state():
    module = counting_loop()
    body = Builder("loop.body")
    i, x = body.parameter(S32, "i"), body.parameter(F32, "x")
    module = module.with_computation(body.build([x, i]))
    with pytest.raises(HloVerifyError, match=r"loop.body \(body\) returns \(f32\[3\], s32\[\]\)") as info:
        verify(module)
    assert "model.py:7" in str(info.value)


def test_body_must_take_the_state():
    module = counting_loop()
    body = Builder("loop.body")
    i = body.parameter(S32, "i")
    module = module.with_computation(body.build([i, i]))
    with pytest.raises(HloVerifyError, match=r"passes 2 operands to loop.body \(body\), which takes 1"):
        verify(module)


def test_missing_condition_is_named():
    module = counting_loop()
    module = module.replace(computations=tuple(c for c in module.computations if c.name != "loop.cond"))
    with pytest.raises(HloVerifyError, match=r"calls 'loop.cond' \(condition\), which is not in the module"):
        verify(module)


def test_branch_must_return_the_declared_shape():
    module = three_way()
    b = Builder("switch.branch1")
    x, y = b.parameter(F32, "x"), b.parameter(F32, "y")
    module = module.with_computation(b.build(b.eq(x, y)))
    with pytest.raises(HloVerifyError, match=r"switch.branch1 \(branch 1\) returns pred\[3\], expected f32\[3\]"):
        verify(module)


def test_branch_parameter_shapes_are_checked():
    module = three_way()
    b = Builder("switch.branch2")
    x, _ = b.parameter(F32, "x"), b.parameter(Shape(DType.F32, (4,)), "y")
    module = module.with_computation(b.build(x))
    with pytest.raises(HloVerifyError, match=r"operand 1 of switch.branch2 \(branch 2\) should be f32\[4\]"):
        verify(module)


def test_index_must_be_s32():
    entry = Builder("main")
    k = entry.parameter(Shape(DType.PRED, ()), "k")
    with pytest.raises(Exception, match="branch index of a conditional must be s32"):
        entry.emit(Op.CONDITIONAL, k, branches=("a",), shape=F32)


def test_a_loop_calling_itself_is_a_cycle():
    module = counting_loop()
    body = Builder("loop.body")
    i, x = body.parameter(S32, "i"), body.parameter(F32, "x")
    again = body.emit(Op.WHILE, i, x, condition="loop.cond", body="loop.body")
    module = module.with_computation(body.build(again))
    with pytest.raises(HloVerifyError, match="computations call themselves: loop.body -> loop.body"):
        verify(module)
