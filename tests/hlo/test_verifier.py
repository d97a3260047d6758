"""The verifier: each kind of malformed module gives HloVerifyError naming the instruction, with
the failing line marked in context and the user's source line."""

import pytest

from xfuse.hlo import (
    Computation,
    DType,
    HloVerifyError,
    Instruction,
    Module,
    Op,
    Shape,
    parse,
    verify,
)

F32_8 = Shape(DType.F32, (8,))


def entry(body: str, params: str = "x: f32[8]", result: str = "f32[8]", before: str = "") -> str:
    return f"HloModule m\n\n{before}ENTRY main ({params}) -> {result} {{\n{body}\n}}\n"


BAD_MODULES = {
    "operand shapes differ": (
        entry(
            "  x = f32[8] parameter(0)\n  y = f32[4] parameter(1)\n"
            "  ROOT add.3 = f32[8] add(x, y)",
            params="x: f32[8], y: f32[4]",
        ),
        "add.3: operand shapes f32[8] and f32[4] do not match",
    ),
    "declared shape wrong": (
        entry("  x = f32[8] parameter(0)\n  ROOT neg.1 = f32[4] neg(x)", result="f32[4]"),
        "neg.1: declared shape f32[4] but neg gives f32[8]",
    ),
    "undefined operand": (
        entry("  x = f32[8] parameter(0)\n  ROOT neg.1 = f32[8] neg(z)"),
        "neg.1: operand 'z' is not defined before use (defined nowhere)",
    ),
    "use before definition": (
        entry("  x = f32[8] parameter(0)\n  a = f32[8] neg(b)\n  ROOT b = f32[8] neg(x)"),
        "a: operand 'b' is not defined before use (defined later)",
    ),
    "duplicate name": (
        entry("  x = f32[8] parameter(0)\n  a = f32[8] neg(x)\n  ROOT a = f32[8] abs(x)"),
        "a: the name 'a' is defined twice",
    ),
    "wrong operand count": (
        entry("  x = f32[8] parameter(0)\n  ROOT n = f32[8] neg(x, x)"),
        "n: neg takes 1 operands, got 2",
    ),
    "float op on integers": (
        entry("  x = s32[8] parameter(0)\n  ROOT e = s32[8] exp(x)", "x: s32[8]", "s32[8]"),
        "e: the operand has dtype s32, expected a float type",
    ),
    "bad permutation": (
        entry(
            "  x = f32[2,3] parameter(0)\n  ROOT t = f32[2,3] transpose(x), permutation={0,0}",
            "x: f32[2,3]",
            "f32[2,3]",
        ),
        "t: permutation (0, 0) is not a permutation of the 2 dimensions of f32[2,3]",
    ),
    "bad broadcast": (
        entry(
            "  x = f32[8] parameter(0)\n  ROOT b = f32[3,4] broadcast_in_dim(x), dims={1}",
            result="f32[3,4]",
        ),
        "b: cannot broadcast f32[8] to f32[3,4] along dims (1,)",
    ),
    "reduction axis out of range": (
        entry("  x = f32[8] parameter(0)\n  ROOT r = f32[] reduce_sum(x), axes={1}", result="f32[]"),
        "r: axes (1,) out of range for rank 1",
    ),
    "dot dimensions differ": (
        entry(
            "  x = f32[2,3] parameter(0)\n  w = f32[4,5] parameter(1)\n"
            "  ROOT d = f32[2,5] dot_general(x, w), contracting={1;0}",
            "x: f32[2,3], w: f32[4,5]",
            "f32[2,5]",
        ),
        "d: lhs dimension 1 of f32[2,3] and rhs dimension 0 of f32[4,5] differ",
    ),
    "slice out of range": (
        entry(
            "  x = f32[8] parameter(0)\n"
            "  ROOT s = f32[4] slice(x), start={6}, limit={10}, strides={1}",
            result="f32[4]",
        ),
        "s: slice start=(6,) limit=(10,) strides=(1,) out of range for f32[8]",
    ),
    "tuple index out of range": (
        entry(
            "  x = f32[8] parameter(0)\n  t = (f32[8]) tuple(x)\n"
            "  ROOT g = f32[8] get_tuple_element(t), index=1"
        ),
        "g: index 1 out of range for (f32[8])",
    ),
    "pred selector with three cases": (
        entry(
            "  p = pred[8] parameter(0)\n  x = f32[8] parameter(1)\n"
            "  ROOT s = f32[8] select_n(p, x, x, x)",
            "p: pred[8], x: f32[8]",
        ),
        "s: a pred selector picks from at most 2 cases, got 3",
    ),
    "parameter numbers have a gap": (
        entry(
            "  x = f32[8] parameter(0)\n  y = f32[8] parameter(2)\n  ROOT a = f32[8] add(x, y)",
            "x: f32[8], y: f32[8]",
        ),
        "x: parameter indices [0, 2] are not 0..1",
    ),
    "fusion of a missing computation": (
        entry("  x = f32[8] parameter(0)\n  ROOT f = f32[8] fusion(x), kind=loop, calls=nothere"),
        "f: calls 'nothere', which is not in the module",
    ),
    "fusion operand does not match the callee": (
        entry(
            "  x = f32[8] parameter(0)\n  ROOT f = f32[8] fusion(x), kind=loop, calls=fused_neg",
            before="fused_neg (p0: f32[4]) -> f32[4] {\n  p0 = f32[4] parameter(0)\n"
            "  ROOT n = f32[4] neg(p0)\n}\n\n",
        ),
        "f: operand 0 of fused_neg should be f32[4], got f32[8]",
    ),
    "fusion result does not match the callee": (
        entry(
            "  x = f32[8] parameter(0)\n  ROOT f = f32[8] fusion(x), kind=loop, calls=fused_eq",
            before="fused_eq (p0: f32[8]) -> pred[8] {\n  p0 = f32[8] parameter(0)\n"
            "  ROOT e = pred[8] eq(p0, p0)\n}\n\n",
        ),
        "f: fused_eq returns pred[8], declared f32[8]",
    ),
    "computations call each other": (
        "HloModule m\n\n"
        "a (p: f32[8]) -> f32[8] {\n  p = f32[8] parameter(0)\n  ROOT c = f32[8] call(p), calls=b\n}\n\n"
        "b (p: f32[8]) -> f32[8] {\n  p = f32[8] parameter(0)\n  ROOT c = f32[8] call(p), calls=a\n}\n\n"
        "ENTRY main (x: f32[8]) -> f32[8] {\n  x = f32[8] parameter(0)\n"
        "  ROOT c = f32[8] call(x), calls=a\n}\n",
        "computations call themselves: a -> b -> a",
    ),
    "calling the entry": (
        entry("  x = f32[8] parameter(0)\n  ROOT c = f32[8] call(x), calls=main"),
        "c: calls the entry computation 'main'",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_MODULES))
def test_malformed_module_is_rejected_with_its_reason(case):
    text, message = BAD_MODULES[case]
    module = parse(text)  # syntactically fine: the verifier must catch it
    with pytest.raises(HloVerifyError) as info:
        verify(module)
    assert message in str(info.value)


def test_error_shows_the_instruction_in_context_with_its_source_line():
    text = entry(
        '  x = f32[8] parameter(0)\n  y = f32[4] parameter(1)\n'
        '  add.3 = f32[8] add(x, y), loc="model.py:14 (layer_norm)"\n'
        "  ROOT mul.4 = f32[8] mul(add.3, x)",
        params="x: f32[8], y: f32[4]",
    )
    with pytest.raises(HloVerifyError) as info:
        verify(parse(text))
    error = info.value
    assert error.instruction == "add.3"
    lines = str(error).splitlines()
    assert lines[0] == "add.3: operand shapes f32[8] and f32[4] do not match"
    assert "  at model.py:14 (layer_norm)" in lines
    marked = [line for line in lines if line.lstrip().startswith(">")]
    assert len(marked) == 1 and "add.3 = f32[8] add(x, y)" in marked[0]
    assert any("ROOT mul.4" in line for line in lines)  # a neighbour for context


def _module(*instructions, root, computations=(), entry_name="main"):
    return Module("m", (*computations, Computation("main", instructions, root)), entry_name)


X = Instruction("x", Op.PARAMETER, F32_8, (), (("index", 0),))


def test_missing_root_and_entry_are_rejected():
    with pytest.raises(HloVerifyError, match="root 'nope' is not an instruction"):
        verify(_module(X, root="nope"))
    with pytest.raises(HloVerifyError, match="entry computation 'other' is missing"):
        verify(_module(X, root="x", entry_name="other"))


def test_empty_computation_is_rejected():
    with pytest.raises(HloVerifyError, match="has no instructions"):
        verify(Module("m", (Computation("main", (), "x"),), "main"))


@pytest.mark.parametrize(
    "attrs, message",
    [
        ((("axes", (1.5,)),), r"attribute axes=\(1.5,\) is not a valid ints"),
        ((), r"attributes \[\] do not match reduce_sum's \['axes'\]"),
        ((("axes", (0,)), ("extra", 1)), "do not match reduce_sum's"),
    ],
)
def test_attributes_of_the_wrong_kind_are_rejected(attrs, message):
    r = Instruction("r", Op.REDUCE_SUM, Shape(DType.F32, ()), ("x",), attrs)
    with pytest.raises(HloVerifyError, match=message):
        verify(_module(X, r, root="r"))


def test_enum_attribute_outside_its_choices_is_rejected():
    r = Instruction("r", Op.ROUND, F32_8, ("x",), (("rounding_method", "up"),))
    with pytest.raises(HloVerifyError, match="rounding_method='up' is not a valid enum"):
        verify(_module(X, r, root="r"))


def test_a_well_formed_module_verifies():
    text = entry(
        "  x = f32[8] parameter(0)\n  ROOT f = f32[8] fusion(x), kind=loop, calls=fused_neg",
        before="fused_neg (p0: f32[8]) -> f32[8] {\n  p0 = f32[8] parameter(0)\n"
        "  ROOT n = f32[8] neg(p0)\n}\n\n",
    )
    assert verify(parse(text)) is None
