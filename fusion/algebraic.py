"""The algebraic simplifier ("simplify"): rewrite rules as data (`RULES`), applied by one driver
to a fixpoint.

A `Rule` names the ops it looks at, a `pattern` that returns a match or None, and a `rewrite`
that turns the match into either an existing value (the instruction's uses then read it) or
new instructions, the last of which takes the replaced instruction's name and source line.
Every rule is exact for every input, NaN, infinities and -0.0 included; each says why in
`why`. So x*0 -> 0, x+0.0 -> x, x-x -> 0 and x/x -> 1 are deliberately absent for floats.
What a rewrite leaves dead is for `dce`. May import xfuse.hlo and numpy.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from xfuse.hlo import Computation, Instruction, Literal, Module, Op

from .algebraic_parts import (
    Pattern, Replacement, Rewrite, all_operands_same, any_of, attr_is, bypass_inner,
    compose_broadcasts, compose_transposes, constant_selector, either_is, exponent,
    fold_transpose_into_dot, forward, full_slice, highest, identity_broadcast,
    identity_permutation, integer_zero, lowest, multiply_by_reciprocal, negative_zero,
    no_contraction, no_dimensions, no_padding, one, operand_is, outer_product, positive_zero,
    power_of_two_divisor, reduce_no_axes, rhs_is, same_op_twice, same_shape_operand,
    single_operand, splat_of_one, swap_dot_operands, swap_sliced_dot, swapped_dot, swapped_dot_slices,
    transposed_dot_operand,
)
from .pipeline import register
from .rewrite import Namer, map_computations
from .scatter_cells import cell_select, one_window_per_cell
from .transposes import move_up, up_to_its_inverse


class Context:
    """What a rule sees of the computation being simplified: the current instruction of each
    name, splat values, and fresh names for the instructions a rewrite adds."""

    def __init__(self, comp: Computation) -> None:
        self.instructions: dict[str, Instruction] = {i.name: i for i in comp.instructions}
        self.fresh = Namer(self.instructions)
        self.comp = comp
        self._uses: dict[str, int] | None = None

    def uses(self, name: str) -> int:
        """How often the computation as the sweep began reads `name` (the root counts once).
        A rewrite within the sweep only passes a value on to instructions that already read
        what it replaces, so a value read once here is never read by more than that one."""
        if self._uses is None:
            counts: dict[str, int] = {self.comp.root: 1}
            for inst in self.comp.instructions:
                for operand in inst.operands:
                    counts[operand] = counts.get(operand, 0) + 1
            self._uses = counts
        return self._uses.get(name, 0)

    def __getitem__(self, name: str) -> Instruction:
        return self.instructions[name]

    def splat(self, name: str) -> int | float | bool | None:
        """The one value every element of `name` holds, if it is a constant splat or a
        broadcast_in_dim of one; else None. Floats come back as Python floats (-0.0 kept)."""
        inst = self.instructions[name]
        while inst.op is Op.BROADCAST_IN_DIM:
            inst = self.instructions[inst.operands[0]]
        if inst.op is not Op.CONSTANT:
            return None
        literal: Literal = inst.attr("value")
        if literal.array.size == 0 or not literal.is_splat():
            return None
        value = literal.array.reshape(-1)[0]
        if literal.dtype.is_float:
            return float(value)
        return bool(value) if literal.dtype.is_pred else int(value)


@dataclass(frozen=True, slots=True)
class Rule:
    """Where `inst.op` is in `ops` and `pattern(context, inst)` is not None, `rewrite` replaces
    `inst`. `why` says why the rewrite is exact."""

    name: str
    ops: tuple[Op, ...]
    pattern: Pattern
    rewrite: Rewrite
    why: str


# ---------------------------------------------------------------------------- the rules
RULES: tuple[Rule, ...] = (
    Rule(
        "add_zero",
        (Op.ADD,),
        either_is(any_of(integer_zero, negative_zero)),
        forward,
        "x + 0 = x for integers; for floats only x + (-0.0) = x for every x (-0.0 + -0.0 is "
        "-0.0, +0.0 + -0.0 is +0.0, NaN and inf pass through), while -0.0 + (+0.0) is +0.0.",
    ),
    Rule(
        "sub_zero",
        (Op.SUB,),
        rhs_is(any_of(integer_zero, positive_zero)),
        forward,
        "x - 0 = x for integers; for floats x - (+0.0) = x + (-0.0) = x for every x.",
    ),
    Rule(
        "mul_one",
        (Op.MUL,),
        either_is(one),
        forward,
        "x * 1 = x exactly for every integer and float, NaN, inf and -0.0 included.",
    ),
    Rule(
        "div_one",
        (Op.DIV,),
        rhs_is(one),
        forward,
        "x / 1 = x exactly: float division by 1 is exact; integer division rounds toward zero.",
    ),
    Rule(
        "div_power_of_two",
        (Op.DIV,),
        power_of_two_divisor,
        multiply_by_reciprocal,
        "x / 2**k and x * 2**-k are both the exact x * 2**-k rounded once, when 2**-k is a "
        "finite value of the dtype: the same bits for every x, NaN, inf, -0.0 and subnormal "
        "results included (XLA's simplifier does the same); a multiply is cheaper than a divide.",
    ),
    Rule(
        "neg_neg",
        (Op.NEG,),
        same_op_twice,
        forward,
        "neg flips the float sign bit (NaN and zeros included) and is an involution on "
        "two's complement integers, even at the minimum (-MIN wraps to MIN).",
    ),
    Rule(
        "not_not",
        (Op.NOT,),
        same_op_twice,
        forward,
        "logical not on pred and bitwise not on integers are involutions.",
    ),
    Rule(
        "reshape_reshape",
        (Op.RESHAPE,),
        operand_is(Op.RESHAPE),
        bypass_inner,
        "reshapes keep row-major element order, so two compose into one.",
    ),
    Rule(
        "reshape_same_shape",
        (Op.RESHAPE,),
        same_shape_operand,
        forward,
        "a reshape to the operand's own shape moves nothing.",
    ),
    Rule(
        "transpose_transpose",
        (Op.TRANSPOSE,),
        operand_is(Op.TRANSPOSE),
        compose_transposes,
        "two permutations of the dimensions compose into one; values are only moved.",
    ),
    Rule(
        "transpose_up_to_its_inverse",
        (Op.TRANSPOSE,),
        up_to_its_inverse,
        move_up,
        "a transpose of an elementwise op is the op of its transposed operands (a splat "
        "broadcast to the new shape), of a slice the permuted slice of its transposed operand, "
        "of a broadcast or of a reshape adding or dropping unit dimensions the same of its "
        "operand permuted to match: values are only moved; taken only where the transposes "
        "meet ones they undo, which then compose to the identity.",
    ),
    Rule(
        "transpose_identity",
        (Op.TRANSPOSE,),
        attr_is("permutation", identity_permutation),
        forward,
        "the identity permutation moves nothing.",
    ),
    Rule(
        "dot_of_transpose",
        (Op.DOT_GENERAL,),
        transposed_dot_operand,
        fold_transpose_into_dot,
        "a dot reads its operands in any layout: renumbering the transposed operand's "
        "contracting and batch dimensions pairs the same elements, and its free dimensions "
        "keep their order, so the same products are summed in the same order into the same "
        "places (XLA's transpose folding); no transposed copy is made.",
    ),
    Rule(
        "dot_without_sums",
        (Op.DOT_GENERAL,),
        no_contraction,
        outer_product,
        "a dot with no contracting dimensions sums nothing: each element is the one product "
        "a[i] * b[j] (per batch index), which a multiply of the two operands broadcast to the "
        "result gives exactly; it then fuses as elementwise work (a scalar times a vector).",
    ),
    Rule(
        "scatter_one_window_per_cell",
        (Op.SCATTER,),
        one_window_per_cell,
        cell_select,
        "when each cell of the operand's batch receives at most one window and each window "
        "spans its dimensions, an element is updated exactly when its position along the "
        "inserted dimensions equals the (clamped) index of its cell, or, in fill mode, when "
        "the window lies in bounds; the select of combine(old, update) or old there is the "
        "scatter's result, with no two updates meeting at one element.",
    ),
    Rule(
        "transpose_of_dot",
        (Op.TRANSPOSE,),
        swapped_dot,
        swap_dot_operands,
        "(A B)^T = B^T A^T: a dot whose result is read only transposed, with its operands' free "
        "dimensions swapped, is the dot of its operands in the other order: each element is a "
        "sum of the same products (a * b = b * a exactly), summed as any dot sums (BLAS picks the "
        "order), and the transposed copy is never made, so backward passes' weight gradients "
        "come out in the weights' layout (XLA's layout assignment gets there by choosing the "
        "dot's output layout).",
    ),
    Rule(
        "transpose_of_sliced_dot",
        (Op.TRANSPOSE,),
        swapped_dot_slices,
        swap_sliced_dot,
        "a slice picks the same elements from a transposed array at the permuted bounds, so a "
        "transpose of a slice of (A B) is that slice of (A B)^T = B^T A^T, the dot of the "
        "operands in the other order (see transpose_of_dot); taken only where every read of the "
        "dot is such a slice, so the dot is still computed once (cse merges the copies).",
    ),
    Rule(
        "broadcast_broadcast",
        (Op.BROADCAST_IN_DIM,),
        operand_is(Op.BROADCAST_IN_DIM),
        compose_broadcasts,
        "each operand dimension maps through both dims lists; a size-1 dimension may expand "
        "at either step, any other keeps its size, so one broadcast copies the same values.",
    ),
    Rule(
        "broadcast_identity",
        (Op.BROADCAST_IN_DIM,),
        identity_broadcast,
        forward,
        "a broadcast to the same shape with dims 0..n-1 copies each element to its own place.",
    ),
    Rule(
        "convert_same_type",
        (Op.CONVERT_ELEMENT_TYPE,),
        same_shape_operand,
        forward,
        "converting to the operand's own dtype changes no bit.",
    ),
    Rule(
        "bitcast_same_type",
        (Op.BITCAST_CONVERT,),
        same_shape_operand,
        forward,
        "reading bits as the dtype they already are changes none.",
    ),
    Rule(
        "select_same_cases",
        (Op.SELECT_N,),
        all_operands_same,
        forward,
        "whatever the selector holds, every case is the same value.",
    ),
    Rule(
        "select_constant_selector",
        (Op.SELECT_N,),
        constant_selector,
        forward,
        "a splat selector picks the same case everywhere (false: 0, true: 1; an s32 selector "
        "out of range is left alone).",
    ),
    Rule(
        "slice_everything",
        (Op.SLICE,),
        full_slice,
        forward,
        "start 0, limit the dimensions and stride 1 take every element in place.",
    ),
    Rule(
        "concatenate_one",
        (Op.CONCATENATE,),
        single_operand,
        forward,
        "concatenating a single operand copies it.",
    ),
    Rule(
        "integer_pow_one",
        (Op.INTEGER_POW,),
        attr_is("y", exponent(1)),
        forward,
        "x**1 is x itself in the binary expansion (no multiplication happens).",
    ),
    Rule(
        "integer_pow_zero",
        (Op.INTEGER_POW,),
        attr_is("y", exponent(0)),
        splat_of_one,
        "x**0 is 1 for every x, NaN and inf included (lax and XLA expand it to the constant 1).",
    ),
    Rule(
        "reduce_no_axes",
        (Op.REDUCE_SUM, Op.REDUCE_PROD, Op.REDUCE_MAX, Op.REDUCE_MIN, Op.REDUCE_AND, Op.REDUCE_OR),
        reduce_no_axes,
        forward,
        "reducing over no axes returns each element as it is (XLA:CPU does the same, -0.0 "
        "included), so the reduction is its operand.",
    ),
    Rule(
        "idempotent",
        (Op.MAX, Op.MIN, Op.AND, Op.OR),
        all_operands_same,
        forward,
        "max(x, x), min(x, x), x & x and x | x are x (NaN stays NaN, -0.0 stays -0.0).",
    ),
    Rule(
        "max_lowest",
        (Op.MAX,),
        either_is(lowest),
        forward,
        "max(x, -inf) is x for every float x (NaN propagates, no zero meets -inf), and "
        "max(x, MIN) is x for integers (false for pred).",
    ),
    Rule(
        "min_highest",
        (Op.MIN,),
        either_is(highest),
        forward,
        "min(x, +inf) is x for every float x (NaN propagates, no zero meets +inf), and "
        "min(x, MAX) is x for integers (true for pred).",
    ),
    Rule(
        "pad_nothing",
        (Op.PAD,),
        no_padding,
        forward,
        "no low, high or interior padding: the padding value is never used.",
    ),
    Rule(
        "rev_nothing",
        (Op.REV,),
        attr_is("dimensions", no_dimensions),
        forward,
        "reversing no dimensions moves nothing.",
    ),
)


# ---------------------------------------------------------------------------- the driver
class RuleError(RuntimeError):
    """A rule produced something that does not replace the instruction (a bug in the rule)."""


def apply_rules(
    ctx: Context, inst: Instruction, rules: dict[Op, list[Rule]]
) -> tuple[Rule, Replacement] | None:
    """The first rule that matches `inst` and what it replaces `inst` with, or None."""
    for rule in rules.get(inst.op, ()):
        match = rule.pattern(ctx, inst)
        if match is not None:
            return rule, rule.rewrite(ctx, inst, match)
    return None


def check(rule: Rule, inst: Instruction, replacement: Replacement, ctx: Context) -> None:
    if isinstance(replacement, str):
        shape = ctx[replacement].shape
    else:
        last = replacement[-1]
        if last.name != inst.name:
            raise RuleError(f"rule {rule.name} replaced {inst.name} by a value named {last.name}")
        shape = last.shape
    if shape != inst.shape:
        raise RuleError(f"rule {rule.name} replaced {inst.name} ({inst.shape}) by a {shape}")


def sweep(comp: Computation, rules: dict[Op, list[Rule]], max_steps: int) -> Computation:
    """One pass over `comp` in order, rewriting each instruction until no rule matches it.

    Instructions are visited after their operands, so a rule always sees simplified operands.
    """
    ctx = Context(comp)
    forwarded: dict[str, str] = {}  # instruction -> the existing value that replaced it
    result: list[Instruction] = []
    changed = False
    for inst in comp.instructions:
        operands = tuple(forwarded.get(o, o) for o in inst.operands)
        if operands != inst.operands:
            inst = inst.replace(operands=operands)
            ctx.instructions[inst.name] = inst
            changed = True
        for _ in range(max_steps):
            applied = apply_rules(ctx, inst, rules)
            if applied is None:
                break
            rule, replacement = applied
            check(rule, inst, replacement, ctx)
            changed = True
            if isinstance(replacement, str):
                forwarded[inst.name] = replacement
                inst = None
                break
            *added, inst = replacement
            for new in added:
                ctx.instructions[new.name] = new
                result.append(new)
            ctx.instructions[inst.name] = inst
        if inst is not None:
            result.append(inst)
    if not changed:
        return comp
    return Computation(comp.name, tuple(result), forwarded.get(comp.root, comp.root))


@register("simplify")
@dataclass(frozen=True, slots=True)
class AlgebraicSimplifier:
    """Applies `rules` to every instruction of every computation until none matches."""

    name: ClassVar[str] = "simplify"
    rules: Sequence[Rule] = RULES
    max_sweeps: int = 32  # each sweep already reaches the fixpoint; the rest only confirm

    def by_op(self) -> dict[Op, list[Rule]]:
        index: dict[Op, list[Rule]] = {}
        for rule in self.rules:
            for op in rule.ops:
                index.setdefault(op, []).append(rule)
        return index

    def simplify(self, comp: Computation, rules: dict[Op, list[Rule]]) -> Computation:
        for _ in range(self.max_sweeps):
            new = sweep(comp, rules, max_steps=len(comp.instructions) + 8)
            if new is comp:
                break
            comp = new
        return comp

    def run(self, module: Module) -> Module:
        rules = self.by_op()
        return map_computations(module, lambda comp: self.simplify(comp, rules))
