"""The verifier: operand counts, attributes, shape and dtype rules, unique names, topological
order, roots, parameter numbering, and the signature of every called computation (fusion and
call bodies, while conditions and bodies, conditional branches) against the instruction.

`verify(module)` returns None or raises `HloVerifyError` naming the failing instruction, showing
it marked among its neighbours, with the user's source line. Imports this package only.
"""

from __future__ import annotations

from .dtypes import DType, Shape, TupleShape
from .errors import HloVerifyError
from .ir import NAME_RE, Computation, Instruction, Loc, Module
from .literal import Literal
from .ops import OPS, AttrKind, Op
from .printer import format_instruction
from .shape_rules import ShapeError

CONTEXT_LINES = 2


def _format(inst: Instruction, root: bool) -> str:
    """The instruction's text, or its repr when it is too malformed to print."""
    try:
        return format_instruction(inst, root=root)
    except Exception:  # the module being verified may hold anything
        return repr(inst)


def _context(comp: Computation, name: str | None) -> str:
    names = [i.name for i in comp.instructions]
    if name not in names:
        return f"  in computation {comp.name}"
    at = names.index(name)
    lines = []
    inst = comp.instructions[at]
    if inst.loc is not None:
        lines.append(f"  at {inst.loc}")
    lines.append(f"  in computation {comp.name}:")
    for i in range(max(0, at - CONTEXT_LINES), min(len(names), at + CONTEXT_LINES + 1)):
        other = comp.instructions[i]
        mark = ">" if i == at else " "
        lines.append(f"    {mark} {_format(other, other.name == comp.root)}")
    return "\n".join(lines)


class _Checker:
    def __init__(self, module: Module) -> None:
        self.module = module

    def fail(self, comp: Computation, inst: Instruction | None, message: str) -> HloVerifyError:
        name = inst.name if inst is not None else None
        prefix = f"{name}: " if name else f"{comp.name}: "
        return HloVerifyError(prefix + message, name, _context(comp, name))

    # ------------------------------------------------------------------ module
    def run(self) -> None:
        module = self.module
        names = [c.name for c in module.computations]
        for name in names:
            if names.count(name) > 1:
                raise HloVerifyError(f"module {module.name}: computation {name!r} is defined twice")
        if module.entry not in names:
            raise HloVerifyError(f"module {module.name}: entry computation {module.entry!r} is missing")
        for comp in module.computations:
            if not NAME_RE.fullmatch(comp.name):
                raise HloVerifyError(f"computation name {comp.name!r} is not a valid name")
            self.computation(comp)
        self.acyclic_calls()

    def acyclic_calls(self) -> None:
        state: dict[str, int] = {}  # 1: on the stack, 2: done

        def visit(name: str, path: list[str]) -> None:
            if state.get(name) == 2:
                return
            if state.get(name) == 1:
                cycle = " -> ".join(path[path.index(name):] + [name])
                raise HloVerifyError(f"module {self.module.name}: computations call themselves: {cycle}")
            state[name] = 1
            for inst in self.module[name].instructions:
                for callee in inst.callees:
                    if callee in self.module:
                        visit(callee, path + [name])
            state[name] = 2

        for comp in self.module.computations:
            visit(comp.name, [])

    # ------------------------------------------------------------------ computation
    def computation(self, comp: Computation) -> None:
        if not comp.instructions:
            raise HloVerifyError(f"computation {comp.name} has no instructions")
        seen: set[str] = set()
        for inst in comp.instructions:
            if inst.name in seen:
                raise self.fail(comp, inst, f"the name {inst.name!r} is defined twice")
            if not isinstance(inst.name, str) or not NAME_RE.fullmatch(inst.name):
                raise self.fail(comp, inst, f"{inst.name!r} is not a valid instruction name")
            for operand in inst.operands:
                if operand not in seen:
                    where = "later" if operand in comp else "nowhere"
                    raise self.fail(
                        comp, inst, f"operand {operand!r} is not defined before use (defined {where})"
                    )
            self.instruction(comp, inst)
            seen.add(inst.name)
        if comp.root not in seen:
            raise HloVerifyError(f"computation {comp.name}: root {comp.root!r} is not an instruction")
        indices = sorted(p.attr("index") for p in comp.parameters)
        if indices != list(range(len(indices))):
            first = comp.parameters[0] if comp.parameters else None
            raise self.fail(comp, first, f"parameter indices {indices} are not 0..{len(indices) - 1}")

    # ------------------------------------------------------------------ instruction
    def instruction(self, comp: Computation, inst: Instruction) -> None:
        if not isinstance(inst.op, Op):
            raise self.fail(comp, inst, f"unknown op {inst.op!r}")
        info = OPS[inst.op]
        n = len(inst.operands)
        if info.arity is not None and n != info.arity:
            raise self.fail(comp, inst, f"{inst.op} takes {info.arity} operands, got {n}")
        if info.arity is None and n < info.min_arity:
            raise self.fail(comp, inst, f"{inst.op} takes at least {info.min_arity} operands, got {n}")
        if not isinstance(inst.shape, (Shape, TupleShape)):
            raise self.fail(comp, inst, f"shape {inst.shape!r} is not a Shape")
        if inst.loc is not None and not isinstance(inst.loc, Loc):
            raise self.fail(comp, inst, f"location {inst.loc!r} is not a Loc")
        self.attributes(comp, inst)
        operand_shapes = [comp[o].shape for o in inst.operands]
        declared = inst.shape if info.result_given or inst.op in (Op.CONSTANT, Op.DOT_GENERAL) else None
        try:
            inferred = info.shape(operand_shapes, inst.attributes, declared)
        except ShapeError as e:
            raise self.fail(comp, inst, str(e)) from None
        if inferred != inst.shape:
            raise self.fail(comp, inst, f"declared shape {inst.shape} but {inst.op} gives {inferred}")
        if inst.callees or inst.op in CALLING:
            self.call_sites(comp, inst, operand_shapes)

    def attributes(self, comp: Computation, inst: Instruction) -> None:
        specs = inst.info.attrs
        keys = [k for k, _ in inst.attrs]
        if keys != [s.name for s in specs]:
            raise self.fail(
                comp, inst, f"attributes {keys} do not match {inst.op}'s {[s.name for s in specs]}"
            )
        for spec, (_, value) in zip(specs, inst.attrs):
            ok = {
                AttrKind.INT: lambda v: isinstance(v, int) and not isinstance(v, bool),
                AttrKind.INTS: lambda v: isinstance(v, tuple) and all(type(x) is int for x in v),
                AttrKind.INTS_PAIR: lambda v: isinstance(v, tuple)
                and len(v) == 2
                and all(isinstance(s, tuple) and all(type(x) is int for x in s) for s in v),
                AttrKind.ENUM: lambda v: v in spec.choices,
                AttrKind.NAME: lambda v: isinstance(v, str) and bool(v),
                AttrKind.NAMES: lambda v: isinstance(v, tuple)
                and bool(v)
                and all(isinstance(x, str) and x for x in v),
                AttrKind.LITERAL: lambda v: isinstance(v, Literal),
            }[spec.kind](value)
            if not ok:
                raise self.fail(comp, inst, f"attribute {spec.name}={value!r} is not a valid {spec.kind.value}")

    def call_sites(self, comp: Computation, inst: Instruction, operand_shapes: list) -> None:
        for callee_name, role, params_wanted, result_wanted in signatures(inst, operand_shapes):
            what = f" ({role})" if role else ""
            callee = self.module.get(callee_name)
            if callee is None:
                raise self.fail(comp, inst, f"calls {callee_name!r}{what}, which is not in the module")
            if callee_name == self.module.entry:
                raise self.fail(comp, inst, f"calls the entry computation {callee_name!r}{what}")
            params = callee.parameter_shapes
            if len(params) != len(params_wanted):
                raise self.fail(
                    comp,
                    inst,
                    f"passes {len(params_wanted)} operands to {callee_name}{what}, which takes "
                    f"{len(params)}",
                )
            for i, (given, wanted) in enumerate(zip(params_wanted, params)):
                if given != wanted:
                    raise self.fail(
                        comp, inst, f"operand {i} of {callee_name}{what} should be {wanted}, got {given}"
                    )
            if callee.root not in callee or callee.result_shape == result_wanted:
                continue
            if role:
                message = f"{callee_name}{what} returns {callee.result_shape}, expected {result_wanted}"
            else:
                message = f"{callee_name} returns {callee.result_shape}, declared {inst.shape}"
            raise self.fail(comp, inst, message)


CALLING = (Op.FUSION, Op.CALL, Op.WHILE, Op.CONDITIONAL)


def signatures(inst: Instruction, operand_shapes: list) -> list[tuple[str, str, list, object]]:
    """What each computation `inst` calls must look like: (its name, its role ("" for a fusion's
    or call's body), the parameter shapes it must take, the shape it must return)."""
    if inst.op is Op.WHILE:
        state = list(operand_shapes)
        return [
            (inst.attr("condition"), "condition", state, Shape(DType.PRED, ())),
            (inst.attr("body"), "body", state, TupleShape(tuple(state))),
        ]
    if inst.op is Op.CONDITIONAL:
        branches = inst.attr("branches")
        operands = list(operand_shapes[1:])
        return [(name, f"branch {k}", operands, inst.shape) for k, name in enumerate(branches)]
    return [(name, "", list(operand_shapes), inst.shape) for name in inst.callees]


def verify(module: Module) -> None:
    """Raises HloVerifyError if `module` is not well formed."""
    if not isinstance(module, Module):
        raise HloVerifyError(f"expected a Module, got {type(module).__name__}")
    _Checker(module).run()

