"""HLO text: every generated module verifies and round-trips (print -> parse gives an equal module,
print -> parse -> print the same text); the golden files round-trip exactly; malformed text
(random bytes, random text, mutated modules) gives a Module or HloParseError and nothing else;
and each kind of error names its line and column and draws its caret there."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from xfuse.hlo import (
    DType,
    HloParseError,
    HloVerifyError,
    Literal,
    Loc,
    Module,
    Op,
    parse,
    print_module,
    verify,
)
from xfuse.hlo.literal import format_literal, parse_scalar

from .strategies import (
    ALL_DTYPES,
    BINARY,
    RECIPES,
    REDUCTIONS,
    TEXT_VOCABULARY,
    UNARY,
    modules,
    modules_with_inputs,
    mutated,
    scalars,
)

GOLDEN_DIR = Path(__file__).parent / "golden"
GOLDEN = sorted(GOLDEN_DIR.glob("*.hlo"))
GOLDEN_TEXTS = [path.read_text(encoding="utf-8") for path in GOLDEN]

few = settings(max_examples=30, deadline=None)
some = settings(max_examples=100, deadline=None)
many = settings(max_examples=400, deadline=None)


def parse_or_error(text: str | bytes) -> Module | None:
    """`parse(text)`: a Module, or None for an HloParseError that points into `text`.
    Any other exception fails the test."""
    try:
        module = parse(text)
    except HloParseError as e:
        check_points_into(e, text)
        return None
    except Exception as e:  # the parser raises HloParseError and nothing else
        pytest.fail(f"parse raised {type(e).__name__}, not HloParseError: {e}\ninput: {text!r}")
    assert isinstance(module, Module)
    return module


def check_points_into(e: HloParseError, text: str | bytes) -> None:
    """The error's line, column, source line and caret agree with each other and with `text`."""
    if isinstance(text, bytes):  # bytes that are not UTF-8 show as U+FFFD in the source line
        text = text.decode("utf-8", "replace")
    lines = text.split("\n")
    assert 1 <= e.line <= len(lines)
    assert e.source_line == lines[e.line - 1]
    assert 1 <= e.column <= len(e.source_line) + 1
    caret = " " * (e.column - 1) + "^"
    assert str(e) == f"{e.line}:{e.column}: {e.message}\n  {e.source_line}\n  {caret}"


def assert_round_trips(module: Module) -> str:
    """print -> parse gives an equal module, and printing that gives the same text."""
    text = print_module(module)
    parsed = parse(text)
    assert parsed == module, text
    assert print_module(parsed) == text
    return text


# ---------------------------------------------------------------------------- generated modules
def test_every_op_has_a_recipe():
    assert set(RECIPES) == set(Op)
    for table in (UNARY, BINARY, REDUCTIONS):
        for op, dtypes in table.items():
            assert dtypes and set(dtypes) <= set(ALL_DTYPES), op


@some
@given(modules())
def test_generated_modules_verify_and_round_trip(module):
    verify(module)
    assert_round_trips(module)


@few
@given(modules_with_inputs())
def test_generated_inputs_match_the_entry_parameters(module_and_inputs):
    module, inputs = module_and_inputs
    params = module.entry_computation.parameters
    assert len(inputs) == len(params)
    for value, param in zip(inputs, params):
        assert value.shape == param.shape.dims and value.dtype == param.shape.dtype.numpy


@many
@given(st.sampled_from(ALL_DTYPES).flatmap(lambda d: st.tuples(st.just(d), scalars(d))))
def test_every_scalar_prints_and_reads_back_to_the_same_bits(dtype_and_value):
    """NaN keeps its sign, -0.0 stays -0.0, subnormals and extremes stay exact."""
    dtype, value = dtype_and_value
    literal = Literal(value, dtype)
    back = Literal(parse_scalar(format_literal(literal), dtype), dtype)
    assert back == literal, (format_literal(literal), literal.array.tobytes())


# ---------------------------------------------------------------------------- golden files
def test_there_are_golden_files():
    assert len(GOLDEN) >= 4


@pytest.mark.parametrize("path", GOLDEN, ids=lambda p: p.name)
def test_golden_file_round_trips_exactly_and_verifies(path):
    text = path.read_text(encoding="utf-8")
    module = parse(text)
    verify(module)
    assert print_module(module) == text
    assert parse(text.encode("utf-8")) == module


def golden(name: str) -> Module:
    return parse((GOLDEN_DIR / name).read_text(encoding="utf-8"))


def test_golden_constants_keep_their_bits():
    main = golden("constants.hlo").entry_computation
    f32s = main["f32s"].attr("value").array
    assert np.isnan(f32s[0]) and not np.signbit(f32s[0])
    assert np.isnan(f32s[1]) and np.signbit(f32s[1])
    assert f32s[4] == 0 and np.signbit(f32s[4])
    assert f32s[5] == np.finfo(np.float32).smallest_subnormal
    f64s = main["f64s"].attr("value").array
    assert f64s[0] == np.finfo(np.float64).smallest_subnormal
    assert main["u64s"].attr("value").array[1] == np.iinfo(np.uint64).max
    assert main["s64s"].attr("value").array[0] == np.iinfo(np.int64).min
    assert main["empty2"].attr("value").array.shape == (2, 0)


def test_golden_locations_and_keyword_names():
    main = golden("locations.hlo").entry_computation
    assert main["x"].loc == Loc("model.py", 12, "layer_norm")
    assert main["ROOT"].loc == Loc('/home/some user/my "project"/model.py', 1)
    assert main["nan"].loc == Loc("C:\\Users\\me\\model.py", 7, "<lambda>")
    assert main["add.0"].loc == Loc("café/中文/😀.py", 99, "jit(f)")
    assert main["neg.1"].loc == Loc("two\nlines.py", 0)
    assert main["select_n.2"].loc == Loc("a.py", 3, "f (x)")
    assert main["round.3"].loc == Loc("odd:name:42.py", 5, "ns:f")
    assert main.root == "round.3"
    assert [p.name for p in main.parameters] == ["x", "ROOT", "nan"]


def test_golden_fusion_and_call():
    module = golden("fusion_call.hlo")
    main = module.entry_computation
    assert [c.name for c in module.computations][-1] == module.entry == "main"
    assert main["fusion.2"].attributes == {"kind": "multi_output", "calls": "fused_exp_sum"}
    assert main["call.5"].called == "normalize"


# ---------------------------------------------------------------------------- malformed text
@many
@given(st.binary(max_size=300))
def test_random_bytes_give_a_module_or_a_parse_error(data):
    parse_or_error(data)


HLO_CHARACTERS = ' \n{}()[],;:="-.0123456789e'


@many
@given(st.text(st.one_of(st.sampled_from(HLO_CHARACTERS), st.characters()), max_size=300))
def test_random_text_gives_a_module_or_a_parse_error(text):
    parse_or_error(text)


@many
@given(st.lists(st.sampled_from(TEXT_VOCABULARY + ("x", "y", "p0", "add.1")), max_size=60))
def test_random_token_sequences_give_a_module_or_a_parse_error(tokens):
    parse_or_error(" ".join(tokens))


@some
@given(mutated(modules(max_ops=5).map(print_module)))
def test_mutated_modules_give_a_module_or_a_parse_error(text):
    module = parse_or_error(text)
    if module is not None:  # whatever parses prints and parses back to the same module
        assert_round_trips(module)


@many
@given(mutated(st.sampled_from(GOLDEN_TEXTS), max_mutations=6))
def test_mutated_golden_files_give_a_module_or_a_parse_error(text):
    module = parse_or_error(text)
    if module is not None:
        assert_round_trips(module)
        try:  # the verifier, too, raises its own error and nothing else
            verify(module)
        except HloVerifyError:
            pass


@some
@given(mutated(st.sampled_from(GOLDEN_TEXTS)).map(lambda t: t.encode("utf-8", "surrogatepass")),
       st.data())
def test_mutated_bytes_give_a_module_or_a_parse_error(data, draw):
    """Golden files with a byte broken: invalid UTF-8 is reported where it is. A mutation may
    have inserted a lone surrogate; it is encoded as is, one more invalid sequence."""
    i = draw.draw(st.integers(0, len(data)))
    parse_or_error(data[:i] + bytes([draw.draw(st.integers(0x80, 0xFF))]) + data[i:])


# ---------------------------------------------------------------------------- targeted errors
def entry(body: str, params: str = "x: f32[8]", result: str = "f32[8]", before: str = "") -> str:
    """A module whose entry computation has `body` (instruction lines) from line 4 on."""
    return f"HloModule m\n\n{before}ENTRY main ({params}) -> {result} {{\n{body}\n}}\n"


def constant(shape: str, literal: str) -> str:
    """A module whose only instruction, on line 4, is `ROOT c = shape constant(literal)`."""
    return entry(f"  ROOT c = {shape} constant({literal})", params="", result=shape)


X = "  x = f32[8] parameter(0)\n"
CALLEE = "f (p: f32[8]) -> f32[8] {\n  ROOT p = f32[8] parameter(0)\n}\n\n"
OTHER_ENTRY = "\nENTRY other () -> f32[] {\n  ROOT c = f32[] constant(0)\n}\n"
RANK_100 = "f32[" + ",".join("1" * 100) + "]"

# name: (text, line, column, the message's start). Columns count characters from 1; line 4 is
# the entry's first instruction, with two spaces of indent.
ERRORS = {
    "empty": ("", 1, 1, "expected 'HloModule', found end of input"),
    "unknown op": (entry(X + "  ROOT y = f32[8] frobnicate(x)"), 5, 19, "unknown op 'frobnicate'"),
    "unknown dtype": (entry("  ROOT x = f31[8] parameter(0)"), 4, 12, "unknown dtype 'f31'"),
    "unknown dtype in header": (entry(X, params="x: g8[8]"), 3, 16, "unknown dtype 'g8'"),
    "missing =": (entry("  ROOT x f32[8] parameter(0)"), 4, 10, "expected '=', found 'f32'"),
    "unclosed {": (
        "HloModule m\nENTRY main () -> f32[] {\n  ROOT c = f32[] constant(1.0)\n",
        4,
        1,
        "computation 'main' is not closed with '}'",
    ),
    "unclosed ( in shape": (entry(X, params="x: (f32[8]"), 3, 25, "expected ',', found '->'"),
    "unclosed literal": (constant("f32[2]", "{1, 2"), 4, 33, "expected ',', found ')'"),
    "too few literal elements": (
        constant("f32[3]", "{1, 2}"),
        4,
        28,
        "literal has 2 elements along dimension 0, f32[3] needs 3",
    ),
    "too many inner literal elements": (
        constant("s8[2,1]", "{{1}, {2, 3}}"),
        4,
        35,
        "literal has 2 elements along dimension 1, s8[2,1] needs 1",
    ),
    "scalar where an array is due": (constant("f32[2]", "1"), 4, 28, "expected '{', found '1'"),
    "integer out of range": (constant("s8[]", "128"), 4, 26, "128 is out of range for s8"),
    "negative unsigned": (constant("u32[2]", "{0, -1}"), 4, 32, "-1 is out of range for u32"),
    "float for an integer": (
        constant("s32[]", "1.5"), 4, 27, "expected an integer for s32, got '1.5'"
    ),
    "number for pred": (
        constant("pred[]", "1"), 4, 28, "expected true or false for pred, got '1'"
    ),
    "float overflow": (constant("f16[]", "65520"), 4, 27, "65520 overflows f16"),
    "decimal overflow of f64": (constant("f64[]", "-1e999"), 4, 27, "-1e999 overflows f64"),
    "float spelled another way": (
        constant("f32[]", "Infinity"), 4, 27, "expected a number for f32, got 'Infinity'"
    ),
    "missing ROOT": (entry(X), 6, 1, "computation 'main' has no ROOT instruction"),
    "two ROOTs": (
        entry("  ROOT x = f32[8] parameter(0)\n  ROOT y = f32[8] neg(x)"),
        5,
        3,
        "computation 'main' has two ROOT instructions",
    ),
    "two ENTRYs": (
        entry(X + "  ROOT y = f32[8] neg(x)") + OTHER_ENTRY,
        8,
        7,
        "a module has one ENTRY computation",
    ),
    "no ENTRY": ("HloModule m\n\n" + CALLEE, 7, 1, "the module has no ENTRY computation"),
    "computation defined twice": (
        entry(X + "  ROOT y = f32[8] call(x), calls=f", before=CALLEE + CALLEE),
        7,
        1,
        "computation 'f' is defined twice",
    ),
    "header parameter shape differs": (
        entry(X + "  ROOT y = f32[8] neg(x)", params="x: f32[4]"),
        3,
        12,
        "header parameters of 'main' do not match its parameter instructions",
    ),
    "header parameter missing": (
        entry(X + "  ROOT y = f32[8] neg(x)", params=""),
        3,
        12,
        "header parameters of 'main' do not match its parameter instructions",
    ),
    "header result differs": (
        entry(X + "  ROOT y = f32[8] neg(x)", result="f32[4]"),
        3,
        27,
        "header result f32[4] of 'main' does not match its ROOT f32[8]",
    ),
    "unknown attribute": (
        entry(X + "  ROOT y = f32[8] neg(x), axes={0}"), 5, 27, "neg has no attribute 'axes'"
    ),
    "attribute on a parameter": (
        entry("  ROOT x = f32[8] parameter(0), index=0"),
        4,
        33,
        "parameter has no attribute 'index'",
    ),
    "bad enum value": (
        entry(X + "  ROOT y = f32[8] fusion(x), kind=sideways, calls=f", before=CALLEE),
        9,
        35,
        "kind must be one of loop, input, output, multi_output",
    ),
    "duplicate attribute": (
        entry(X + "  ROOT y = f32[] reduce_sum(x), axes={0}, axes={0}", result="f32[]"),
        5,
        43,
        "attribute 'axes' is given twice",
    ),
    "duplicate loc": (
        entry('  ROOT x = f32[8] parameter(0), loc="a.py:1", loc="a.py:2"'),
        4,
        47,
        "attribute 'loc' is given twice",
    ),
    "missing attribute": (
        entry(X + "  ROOT y = f32[] reduce_sum(x)", result="f32[]"),
        5,
        18,
        "reduce_sum needs attribute 'axes'",
    ),
    "float in an int list": (
        entry(X + "  ROOT y = f32[8] rev(x), dimensions={0.5}"),
        5,
        39,
        "expected an integer, found '0.5'",
    ),
    "negative dimension": (
        entry("  ROOT x = f32[-1] parameter(0)"), 4, 12, "negative dimension in f32[-1]"
    ),
    "tuple-shaped constant": (
        constant("(f32[])", "1"), 4, 20, "a constant must have an array shape"
    ),
    "bad location": (
        entry('  ROOT x = f32[8] parameter(0), loc="nowhere"'),
        4,
        37,
        "bad location: expected file:line or file:line (function), got 'nowhere'",
    ),
    "bad escape in a location": (
        entry('  ROOT x = f32[8] parameter(0), loc="a\\q.py:1"'),
        4,
        37,
        "bad location: Invalid \\escape",
    ),
    "unterminated string": (
        entry('  ROOT x = f32[8] parameter(0), loc="a.py:1'), 4, 37, "unexpected character '\"'"
    ),
    "unexpected character": (
        entry("  ROOT x = f32[8] parameter(0) @"), 4, 32, "unexpected character '@'"
    ),
    "digit of another script": (
        entry("  ROOT x = f32[٣] parameter(0)"), 4, 16, "unexpected character '٣'"
    ),
    "too many digits": (
        entry("  ROOT x = f32[" + "9" * 5000 + "] parameter(0)"),
        4,
        16,
        "expected an integer: Exceeds the limit (4300 digits) for integer string conversion",
    ),
    "deeply nested literal braces": (
        constant("f32[1]", "{" * 10_000), 4, 29, "expected a f32 value, found '{'"
    ),
    "deeply nested tuple shape": (
        entry("  ROOT t = " + "(" * 10_000 + ") tuple()", params="", result="()"),
        4,
        77,
        "shape nested too deeply",
    ),
    "constant of too high a rank": (
        constant(RANK_100, "{" * 100),
        4,
        226,
        f"a constant has at most 64 dimensions, {RANK_100} has 100",
    ),
    "deeply nested braces in a body": (
        entry("{" * 10_000), 4, 1, "expected an instruction name, found '{'"
    ),
}


@pytest.mark.parametrize("name", list(ERRORS))
def test_parse_error_names_line_and_column(name):
    text, line, column, message = ERRORS[name]
    with pytest.raises(HloParseError) as info:
        parse(text)
    e = info.value
    assert (e.line, e.column) == (line, column), str(e)
    assert e.message.startswith(message), str(e)
    source = text.split("\n")[line - 1]
    assert e.source_line == source
    caret = " " * (column - 1) + "^"
    assert str(e).split("\n") == [f"{line}:{column}: {e.message}", f"  {source}", f"  {caret}"]


def test_bytes_that_are_not_utf8_are_reported_where_they_are():
    data = entry(X + "  ROOT y = f32[8] neg(x)").encode("utf-8").replace(b"neg", b"n\xffg")
    with pytest.raises(HloParseError) as info:
        parse(data)
    e = info.value
    assert (e.line, e.column) == (5, 20)
    assert e.message == "the text is not UTF-8: invalid start byte"
    assert e.source_line == "  ROOT y = f32[8] n\ufffdg(x)"
    assert str(e).endswith("\n  " + " " * 19 + "^")


def test_non_text_input_is_a_parse_error():
    with pytest.raises(HloParseError, match="expected text, got int"):
        parse(3)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "body",
    [
        "  ROOT ROOT = f32[8] parameter(0)",  # the ROOT keyword, then ROOT as a name
        "  ROOT = f32[8] parameter(0)\n  ROOT y = f32[8] neg(ROOT)",
    ],
    ids=["root named ROOT", "non-root named ROOT"],
)
def test_keywords_as_names(body):
    module = parse(entry(body, params="ROOT: f32[8]"))
    verify(module)
    assert_round_trips(module)


def test_computation_named_entry():
    callee = CALLEE.replace("f (", "ENTRY (")
    text = entry(X + "  ROOT y = f32[8] call(x), calls=ENTRY", before=callee)
    module = parse(text)
    verify(module)
    assert [c.name for c in module.computations] == ["ENTRY", "main"]
    assert print_module(module) == text


@pytest.mark.parametrize("dtype", [d for d in DType if d.is_float], ids=str)
def test_negative_nan_keeps_its_sign(dtype):
    text = entry(f"  ROOT c = {dtype}[2] constant({{-nan, nan}})", params="", result=f"{dtype}[2]")
    value = parse(text).entry_computation["c"].attr("value").array
    assert np.isnan(value).all()
    assert np.signbit(value).tolist() == [True, False]
    assert print_module(parse(text)) == text
