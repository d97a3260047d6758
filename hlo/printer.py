"""The HLO text printer. `parser.py` reads exactly this grammar back; print -> parse -> print is
the identity.

    module       := 'HloModule' NAME computation+
    computation  := ['ENTRY'] NAME '(' [NAME ':' shape {',' NAME ':' shape}] ')' '->' shape
                    '{' instruction+ '}'
    instruction  := ['ROOT'] NAME '=' shape OP '(' arguments ')' {',' attribute}
    arguments    := [NAME {',' NAME}]         operands, for every op but these two:
                  | INT                        parameter: its index
                  | literal                    constant: its value
    attribute    := KEY '=' (INT | ints | '{' ints ';' ints '}' | WORD | NAME | names | STRING)
    names        := '{' NAME {',' NAME} '}'
    ints         := '{' [INT {',' INT}] '}'
    shape        := DTYPE '[' [INT {',' INT}] ']' | '(' [shape {',' shape}] ')'
    literal      := scalar | '{' [literal {',' literal}] '}'
    scalar       := INT | FLOAT | 'nan' | '-nan' | 'inf' | '-inf' | 'true' | 'false'

The header's parameters are the computation's `parameter` instructions, by index. Attributes
print in the op's schema order; an attribute equal to its default is left out. The source
location is the last attribute, `loc="file.py:12 (function)"` (a JSON string; file and function
may hold any character, but a function holding `:12 (` reads back wrong). `//` starts a comment.
NAME is `[A-Za-z_][A-Za-z0-9_.-]*` (`ROOT` and `ENTRY` included); DTYPE is one of `DType`'s
values.

Example:

    HloModule softmax_relu

    fused_exp (p0: f32[64,1024]) -> f32[64,1024] {
      p0 = f32[64,1024] parameter(0)
      ROOT exp.1 = f32[64,1024] exp(p0)
    }

    ENTRY main (x: f32[64,512], w: f32[512,1024]) -> f32[64,1024] {
      x = f32[64,512] parameter(0)
      w = f32[512,1024] parameter(1)
      dot.0 = f32[64,1024] dot_general(x, w), contracting={1;0}, loc="model.py:12 (f)"
      ROOT fusion.1 = f32[64,1024] fusion(dot.0), kind=loop, calls=fused_exp
    }
"""

from __future__ import annotations

import json

from .ir import Computation, Instruction, Module
from .literal import format_literal
from .ops import AttrKind, Op


def format_ints(values) -> str:
    return "{" + ",".join(str(v) for v in values) + "}"


def format_attr_value(kind: AttrKind, value: object) -> str:
    if kind is AttrKind.INTS:
        return format_ints(value)
    if kind is AttrKind.INTS_PAIR:
        lhs, rhs = value
        return "{" + ",".join(map(str, lhs)) + ";" + ",".join(map(str, rhs)) + "}"
    if kind is AttrKind.NAMES:
        return "{" + ",".join(value) + "}"
    return str(value)


def format_instruction(inst: Instruction, root: bool = False) -> str:
    if inst.op is Op.PARAMETER:
        arguments = str(inst.attr("index"))
    elif inst.op is Op.CONSTANT:
        arguments = format_literal(inst.attr("value"))
    else:
        arguments = ", ".join(inst.operands)
    parts = [f"{'ROOT ' if root else ''}{inst.name} = {inst.shape} {inst.op.value}({arguments})"]
    specs = inst.info.attr_index
    for key, value in inst.attrs:
        spec = specs[key]
        if spec.kind is AttrKind.LITERAL or key == "index" and inst.op is Op.PARAMETER:
            continue
        if value == spec.default:
            continue
        parts.append(f"{key}={format_attr_value(spec.kind, value)}")
    if inst.loc is not None:
        parts.append(f"loc={json.dumps(str(inst.loc))}")
    return ", ".join(parts)


def computation_header(comp: Computation, entry: bool = False) -> str:
    params = ", ".join(f"{p.name}: {p.shape}" for p in comp.parameters)
    result = comp.result_shape if comp.root in comp else "?"
    return f"{'ENTRY ' if entry else ''}{comp.name} ({params}) -> {result}"


def print_computation(comp: Computation, entry: bool = False) -> str:
    lines = [computation_header(comp, entry) + " {"]
    for inst in comp.instructions:
        lines.append("  " + format_instruction(inst, root=inst.name == comp.root))
    lines.append("}")
    return "\n".join(lines)


def print_module(module: Module) -> str:
    parts = [f"HloModule {module.name}"]
    for comp in module.computations:
        parts.append(print_computation(comp, entry=comp.name == module.entry))
    return "\n\n".join(parts) + "\n"
