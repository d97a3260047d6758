"""The HLO text parser: the grammar is in `printer.py`'s docstring.

`parse(text)` returns a `Module` or raises `HloParseError` with line, column and a caret, for
any input whatsoever. `parse_x` methods raise; `accept` returns None when the next token does
not fit. The parser checks syntax and each op's attribute schema; meaning (operand names,
shapes) is the verifier's job. Imports this package only.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from .dtypes import AnyShape, DType, Shape, TupleShape
from .errors import HloParseError
from .ir import Computation, Instruction, Loc, Module
from .literal import Literal, parse_scalar
from .ops import OPS_BY_NAME, REQUIRED, AttrKind, AttrSpec, Op

MAX_DEPTH = 64

_TOKEN_RE = re.compile(
    r"""
    (?P<space>[ \t\r\n]+|//[^\n]*)
  | (?P<arrow>->)
  | (?P<number>-?(?:\d+\.?\d*(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?)|-inf|-nan)
  | (?P<string>"(?:[^"\\\n]|\\.)*")
  | (?P<name>[A-Za-z_][A-Za-z0-9_.\-]*)
  | (?P<punct>[=(){}\[\],;:])
    """,
    re.VERBOSE | re.ASCII,  # ASCII: \d is 0-9 only, not every script's digits
)
# The text of `loc="..."`, `str(Loc)`. Wider than `Loc.parse`: the file and function may hold any
# character (newlines too), the line a sign. The file ends at the last ':LINE' that can end it,
# so only a function holding ':LINE (' itself reads back differently.


@dataclass(frozen=True, slots=True)
class Token:
    kind: str  # number, string, name, punct, arrow, eof
    text: str
    line: int
    column: int


def tokenize(text: str) -> list[Token]:
    tokens: list[Token] = []
    lines = text.split("\n")
    pos, line, line_start = 0, 1, 0
    while pos < len(text):
        match = _TOKEN_RE.match(text, pos)
        if match is None:
            raise HloParseError(
                f"unexpected character {text[pos]!r}", line, pos - line_start + 1, lines[line - 1]
            )
        kind = match.lastgroup
        if kind != "space":
            tokens.append(Token(kind, match.group(), line, pos - line_start + 1))
        newlines = match.group().count("\n")
        if newlines:
            line += newlines
            line_start = match.start() + match.group().rindex("\n") + 1
        pos = match.end()
    tokens.append(Token("eof", "", line, pos - line_start + 1))
    return tokens


class Parser:
    def __init__(self, text: str) -> None:
        self.lines = text.split("\n")
        self.tokens = tokenize(text)
        self.pos = 0

    # ------------------------------------------------------------------ token helpers
    @property
    def peek(self) -> Token:
        return self.tokens[self.pos]

    def error(self, message: str, token: Token | None = None) -> HloParseError:
        token = token or self.peek
        source = self.lines[token.line - 1] if token.line - 1 < len(self.lines) else ""
        return HloParseError(message, token.line, token.column, source)

    def next(self) -> Token:
        token = self.tokens[self.pos]
        if token.kind != "eof":
            self.pos += 1
        return token

    def accept(self, text: str) -> Token | None:
        if self.peek.text == text and self.peek.kind in ("punct", "arrow", "name"):
            return self.next()
        return None

    def accept_keyword(self, word: str, unless_followed_by: str) -> Token | None:
        """`word` as a keyword, unless the next token shows it is a name (`ROOT = ...`)."""
        if self.peek.text == word and self.peek.kind == "name":
            following = self.tokens[min(self.pos + 1, len(self.tokens) - 1)]
            if following.text != unless_followed_by:
                return self.next()
        return None

    def expect(self, text: str) -> Token:
        token = self.accept(text)
        if token is None:
            raise self.error(f"expected {text!r}, found {self.describe(self.peek)}")
        return token

    def expect_kind(self, kind: str, what: str) -> Token:
        if self.peek.kind != kind:
            raise self.error(f"expected {what}, found {self.describe(self.peek)}")
        return self.next()

    @staticmethod
    def describe(token: Token) -> str:
        return "end of input" if token.kind == "eof" else repr(token.text)

    def parse_int(self, what: str = "an integer") -> int:
        token = self.expect_kind("number", what)
        if not re.fullmatch(r"-?\d+", token.text):
            raise self.error(f"expected {what}, found {token.text!r}", token)
        try:
            return int(token.text)
        except ValueError as e:  # more digits than int() takes (4300)
            raise self.error(f"expected {what}: {e}", token) from None

    # ------------------------------------------------------------------ module
    def parse_module(self) -> Module:
        self.expect("HloModule")
        name = self.expect_kind("name", "a module name").text
        computations: list[Computation] = []
        seen: set[str] = set()
        entry: str | None = None
        while self.peek.kind != "eof":
            is_entry = self.accept_keyword("ENTRY", unless_followed_by="(") is not None
            name_token = self.peek
            comp = self.parse_computation()
            if comp.name in seen:
                raise self.error(f"computation {comp.name!r} is defined twice", name_token)
            seen.add(comp.name)
            if is_entry:
                if entry is not None:
                    raise self.error("a module has one ENTRY computation", name_token)
                entry = comp.name
            computations.append(comp)
        if entry is None:
            raise self.error("the module has no ENTRY computation")
        return Module(name, tuple(computations), entry)

    def parse_computation(self) -> Computation:
        name = self.expect_kind("name", "a computation name").text
        header_token = self.expect("(")
        header: list[tuple[str, AnyShape]] = []
        if not self.accept(")"):
            while True:
                param = self.expect_kind("name", "a parameter name").text
                self.expect(":")
                header.append((param, self.parse_shape()))
                if self.accept(")"):
                    break
                self.expect(",")
        self.expect("->")
        result_token = self.peek
        result = self.parse_shape()
        self.expect("{")
        instructions: list[Instruction] = []
        root: str | None = None
        while not self.accept("}"):
            if self.peek.kind == "eof":
                raise self.error(f"computation {name!r} is not closed with '}}'")
            root_token = self.accept_keyword("ROOT", unless_followed_by="=")
            inst = self.parse_instruction()
            if root_token is not None:
                if root is not None:
                    raise self.error(f"computation {name!r} has two ROOT instructions", root_token)
                root = inst.name
            instructions.append(inst)
        if root is None:
            raise self.error(f"computation {name!r} has no ROOT instruction", self.tokens[self.pos - 1])
        comp = Computation(name, tuple(instructions), root)
        body = [(p.name, p.shape) for p in comp.parameters]
        if body != header:
            raise self.error(
                f"header parameters of {name!r} do not match its parameter instructions", header_token
            )
        if comp.result_shape != result:
            raise self.error(
                f"header result {result} of {name!r} does not match its ROOT {comp.result_shape}",
                result_token,
            )
        return comp

    # ------------------------------------------------------------------ instruction
    def parse_instruction(self) -> Instruction:
        name = self.expect_kind("name", "an instruction name").text
        self.expect("=")
        shape = self.parse_shape()
        op_token = self.expect_kind("name", "an op name")
        op = OPS_BY_NAME.get(op_token.text)
        if op is None:
            raise self.error(f"unknown op {op_token.text!r}", op_token)
        info = op.info
        self.expect("(")
        values: dict[str, object] = {}
        operands: list[str] = []
        if op is Op.PARAMETER:
            values["index"] = self.parse_int("a parameter index")
            self.expect(")")
        elif op is Op.CONSTANT:
            if not isinstance(shape, Shape):
                raise self.error("a constant must have an array shape", op_token)
            values["value"] = self.parse_literal(shape)
            self.expect(")")
        elif not self.accept(")"):
            while True:
                operands.append(self.expect_kind("name", "an operand name").text)
                if self.accept(")"):
                    break
                self.expect(",")
        loc = None
        while self.accept(","):
            key_token = self.expect_kind("name", "an attribute name")
            self.expect("=")
            if key_token.text == "loc":
                if loc is not None:
                    raise self.error("attribute 'loc' is given twice", key_token)
                loc = self.parse_loc()
                continue
            spec = info.attr_index.get(key_token.text)
            if spec is None or spec.kind is AttrKind.LITERAL or (op is Op.PARAMETER):
                raise self.error(f"{op} has no attribute {key_token.text!r}", key_token)
            if key_token.text in values:
                raise self.error(f"attribute {key_token.text!r} is given twice", key_token)
            values[key_token.text] = self.parse_attr_value(spec)
        attrs = []
        for spec in info.attrs:
            if spec.name in values:
                attrs.append((spec.name, values[spec.name]))
            elif spec.default is REQUIRED:
                raise self.error(f"{op} needs attribute {spec.name!r}", op_token)
            else:
                attrs.append((spec.name, spec.default))
        return Instruction(name, op, shape, tuple(operands), tuple(attrs), loc)

    def parse_loc(self) -> Loc:
        token = self.expect_kind("string", "a quoted location")
        try:
            return Loc.parse(json.loads(token.text))
        except ValueError as e:  # JSONDecodeError is one, as is int() of 5000 digits
            raise self.error(f"bad location: {e}", token) from None

    def parse_attr_value(self, spec: AttrSpec) -> object:
        if spec.kind is AttrKind.INT:
            return self.parse_int()
        if spec.kind is AttrKind.INTS:
            self.expect("{")
            return self.parse_int_list("}")
        if spec.kind is AttrKind.INTS_PAIR:
            self.expect("{")
            lhs = self.parse_int_list(";")
            return (lhs, self.parse_int_list("}"))
        if spec.kind is AttrKind.NAMES:
            return self.parse_name_list(spec.name)
        token = self.expect_kind("name", f"a value for {spec.name!r}")
        if spec.kind is AttrKind.ENUM and token.text not in spec.choices:
            raise self.error(f"{spec.name} must be one of {', '.join(spec.choices)}", token)
        return token.text

    def parse_name_list(self, what: str) -> tuple[str, ...]:
        """`{a,b,c}`: one name at least."""
        self.expect("{")
        names = [self.expect_kind("name", f"a computation name in {what!r}").text]
        while not self.accept("}"):
            self.expect(",")
            names.append(self.expect_kind("name", f"a computation name in {what!r}").text)
        return tuple(names)

    def parse_int_list(self, close: str) -> tuple[int, ...]:
        """Integers separated by ',' up to and including `close` (the '{' already read)."""
        values: list[int] = []
        if self.accept(close):
            return ()
        while True:
            values.append(self.parse_int())
            if self.accept(close):
                return tuple(values)
            self.expect(",")

    # ------------------------------------------------------------------ shapes and literals
    def parse_shape(self, depth: int = 0) -> AnyShape:
        if depth > MAX_DEPTH:
            raise self.error("shape nested too deeply")
        if self.accept("("):
            elements: list[AnyShape] = []
            if not self.accept(")"):
                while True:
                    elements.append(self.parse_shape(depth + 1))
                    if self.accept(")"):
                        break
                    self.expect(",")
            return TupleShape(tuple(elements))
        token = self.expect_kind("name", "a shape")
        try:
            dtype = DType.parse(token.text)
        except ValueError:
            raise self.error(f"unknown dtype {token.text!r}", token) from None
        self.expect("[")
        dims = self.parse_int_list("]")
        if any(d < 0 for d in dims):
            raise self.error(f"negative dimension in {token.text}{list(dims)}", token)
        return Shape(dtype, dims)

    def parse_literal(self, shape: Shape) -> Literal:
        if shape.rank > MAX_DEPTH:  # numpy's limit is 64 too; this bounds the recursion below
            raise self.error(
                f"a constant has at most {MAX_DEPTH} dimensions, {shape} has {shape.rank}"
            )
        flat: list[object] = []
        self.parse_literal_level(shape, 0, flat)
        try:
            import numpy as np

            array = np.array(flat, dtype=shape.dtype.numpy).reshape(shape.dims)
        except (ValueError, OverflowError, TypeError) as e:
            raise self.error(f"bad literal for {shape}: {e}") from None
        return Literal(array, shape.dtype)

    def parse_literal_level(self, shape: Shape, depth: int, flat: list[object]) -> None:
        if depth == shape.rank:
            token = self.next()
            if token.kind not in ("number", "name"):
                raise self.error(f"expected a {shape.dtype} value, found {self.describe(token)}", token)
            try:
                flat.append(parse_scalar(token.text, shape.dtype))
            except ValueError as e:
                raise self.error(str(e), token) from None
            return
        open_token = self.expect("{")
        count = 0
        if not self.accept("}"):
            while True:
                self.parse_literal_level(shape, depth + 1, flat)
                count += 1
                if self.accept("}"):
                    break
                self.expect(",")
        if count != shape.dims[depth] and not (count == 0 and shape.size == 0):
            raise self.error(
                f"literal has {count} elements along dimension {depth}, {shape} needs "
                f"{shape.dims[depth]}",
                open_token,
            )


def parse(text: str | bytes) -> Module:
    """Parses HLO text into a Module; raises HloParseError and nothing else."""
    if isinstance(text, (bytes, bytearray)):
        try:
            text = bytes(text).decode("utf-8")
        except UnicodeDecodeError as e:
            raise _not_utf8(bytes(text), e) from None
    if not isinstance(text, str):
        raise HloParseError(f"expected text, got {type(text).__name__}", 1, 1, "")
    parser = Parser(text)
    try:
        return parser.parse_module()
    except HloParseError:
        raise
    except (ValueError, TypeError, OverflowError, MemoryError, RecursionError) as e:
        # A value the grammar admits but the IR rejects (a dimension too large, ...).
        raise parser.error(f"invalid module: {e}") from None


def _not_utf8(data: bytes, e: UnicodeDecodeError) -> HloParseError:
    """The error at the first byte that is not UTF-8, its line shown with U+FFFD for bad bytes."""
    before = data[: e.start].decode("utf-8")  # valid: decoding stopped at e.start
    line_start = before.rfind("\n") + 1
    line_end = data.find(b"\n", e.start)
    rest = data[e.start : None if line_end < 0 else line_end].decode("utf-8", "replace")
    line, column = before.count("\n") + 1, len(before) - line_start + 1
    source = before[line_start:] + rest
    return HloParseError(f"the text is not UTF-8: {e.reason}", line, column, source)
