"""The elemental emitter: Python source for the value of any member of a fused computation at
an index, as XLA's elemental IR emitter does for LLVM IR.

An index is one `Ix` per dimension: its text and the loop variables it uses. Each computed
value becomes one statement, placed at the loop level of the deepest variable it depends on,
so values that do not change along inner loops are computed outside them (hoisted), and a
value needed twice at the same index is computed once. The op -> code table is `UNARY`,
`BINARY` and the methods below; every op result is cast back to its dtype, so integer
arithmetic wraps as in XLA. f16 and bf16 are computed in f32 (the runtime converts at the
kernel boundary, as XLA:CPU does inside its fusions).
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, field

import numpy as np

from xfuse.hlo import Computation, DType, Instruction, Op, Shape


def clamp_text(i: str, lo: int, hi: int) -> str:
    """The source of `scalar.clamp` of the index expression `i`. The bounds are int64 values, not
    literals: numba compiles a function called with int literals again for each value."""
    return f"scalar.clamp({i}, np.int64({lo}), np.int64({hi}))"


@dataclass(frozen=True)
class Ix:
    """An expression (an index or a value) and the loop variables it depends on."""

    text: str
    deps: frozenset = frozenset()


def index_text(index: tuple[Ix, ...]) -> str:
    """An index as source. Components that numba cannot see are non-negative (the outer loop
    runs from `row_start`, and arithmetic on it) are cast to unsigned: numba then skips its
    negative-index wraparound, whose selects stop LLVM from vectorising the loop."""
    return ", ".join(unsigned_index(i.text) for i in index) if index else "0"


def linear_index(index: tuple[Ix, ...], dims: tuple[int, ...]) -> str:
    """The linear index of `index` into a C-ordered array of `dims`, as source."""
    terms, stride = [], 1
    for ix, d in zip(reversed(index), reversed(dims)):
        terms.append(ix.text if stride == 1 else f"({ix.text}) * {stride}")
        stride *= d
    return " + ".join(reversed(terms))


def unsigned_index(text: str) -> str:
    """An index component as source, cast to unsigned unless plainly non-negative (`index_text`)."""
    if SAFE_INDEX.fullmatch(text):
        return text
    return f"U({text})"


SAFE_INDEX = re.compile(r"\d+|[rct]\d+(_\d+)?|[ik][1-9]\d*")  # literals, loops from 0


def const(text: str) -> Ix:
    return Ix(text)


def compute_dtype(dtype: DType) -> DType:
    """The type a kernel computes a dtype in: f16 and bf16 in f32."""
    return DType.F32 if dtype in (DType.F16, DType.BF16) else dtype


def np_name(dtype: DType) -> str:
    return "np.bool_" if dtype is DType.PRED else f"np.{compute_dtype(dtype).numpy.name}"


def bitcast_text(x: str, source: DType, target: DType) -> str:
    """x's bits read as `target` (same width). f16 and bf16 are held in f32 inside kernels, so
    their bits go through `scalar.f16_bits` and `scalar.bits_f16` (and bf16's)."""
    half = (DType.F16, DType.BF16)
    if source in half:
        x, source = f"scalar.{source.value}_bits({x})", DType.U16
    if target in half:
        bits = x if source is DType.U16 else f"scalar.bitcast_u16({x})"
        return f"scalar.bits_{target.value}({bits})"
    return x if source is target else f"scalar.bitcast_{target.value}({x})"


def literal(value: object, dtype: DType) -> str:
    """A scalar of `dtype` as typed source text."""
    dtype = compute_dtype(dtype)
    if dtype.is_pred:
        return "True" if bool(value) else "False"
    if dtype.is_integer:
        return f"{np_name(dtype)}({int(value)})"
    x = float(value)
    if x != x:
        return f"{np_name(dtype)}(np.nan)"
    if x in (float("inf"), float("-inf")):
        return f"{np_name(dtype)}({'-' if x < 0 else ''}np.inf)"
    return f"{np_name(dtype)}({x!r})"


UNARY_FLOAT_LIB = {
    Op.EXP: "exp", Op.EXPM1: "expm1", Op.LOG: "log", Op.LOG1P: "log1p",
    Op.TANH: "tanh", Op.LOGISTIC: "logistic", Op.SIN: "sin", Op.COS: "cos", Op.TAN: "tan",
    Op.ATAN: "atan", Op.ERF: "erf", Op.ERFC: "erfc", Op.CBRT: "cbrt",
}  # fmt: skip

COMPARE = {Op.EQ: "==", Op.NE: "!=", Op.LT: "<", Op.LE: "<=", Op.GT: ">", Op.GE: ">="}
ARITH = {Op.ADD: "+", Op.SUB: "-", Op.MUL: "*"}
BITS = {Op.AND: "&", Op.OR: "|", Op.XOR: "^"}


@dataclass
class Emitter:
    """Emits the members of `comp` into statements grouped by loop level.

    `params` maps each parameter instruction to a function from an index to a load
    expression; `level_of` maps loop variables to their level (deeper is larger), and
    `helpers` collects the helper functions a kernel needs (name -> source).
    """

    comp: Computation
    loads: dict
    level_of: dict[str, int]
    math: str = "f32"  # which mathlib variant to call for f32 values
    statements: dict[int, list[str]] = field(default_factory=dict)
    memo: dict = field(default_factory=dict)
    helpers: dict[str, str] = field(default_factory=dict)
    globals: dict[str, object] = field(default_factory=dict)
    counter: int = 0
    overrides: dict = field(default_factory=dict)  # member name -> fn(index) -> Ix
    # Loop variables known to lie in [lo, hi) here (a piece of a split loop), and the points
    # where a concatenate or a pad indexed by a bare loop variable switches what it reads.
    ranges: dict[str, tuple[int, int]] = field(default_factory=dict)
    cuts: dict[str, set[int]] = field(default_factory=dict)
    flat_loads: dict = field(default_factory=dict)  # parameter -> fn(linear index) -> Ix

    def level(self, deps: frozenset) -> int:
        return max((self.level_of[d] for d in deps), default=0)

    def emit(self, expr: str, deps: frozenset, hint: str = "v") -> Ix:
        self.counter += 1
        var = f"{hint}{self.counter}"
        self.statements.setdefault(self.level(deps), []).append(f"{var} = {expr}")
        return Ix(var, deps)

    # ------------------------------------------------------------------ values
    def value(self, name: str, index: tuple[Ix, ...]) -> Ix:
        key = (name, tuple(i.text for i in index))
        if key in self.memo:
            return self.memo[key]
        if name in self.overrides:
            result = self.overrides[name](index)
        else:
            result = self.compute(self.comp[name], index)
        self.memo[key] = result
        return result

    def compute(self, inst: Instruction, index: tuple[Ix, ...]) -> Ix:
        op = inst.op
        if op is Op.PARAMETER:
            return self.loads[inst.name](index)
        if op is Op.CONSTANT:
            return self.constant(inst, index)
        if op is Op.IOTA:
            i = index[inst.attr("dimension")]
            return Ix(f"{np_name(inst.shape.dtype)}({i.text})", i.deps)
        method = getattr(self, f"op_{op.value}", None)
        if method is not None:
            return method(inst, index)
        if inst.info.kind.name == "ELEMENTWISE":
            args = [self.value(o, index) for o in inst.operands]
            return self.elementwise(inst, args)
        raise NotImplementedError(f"the numba backend cannot emit {op} ({inst.name}, {inst.shape})")

    def constant(self, inst: Instruction, index: tuple[Ix, ...]) -> Ix:
        lit = inst.attr("value")
        if lit.is_splat():
            value = lit.array.reshape(-1)[0] if lit.array.size else 0
            return const(literal(value, lit.dtype))
        name = f"const_{inst.name.replace('.', '_').replace('-', '_')}"
        self.globals[name] = np.ascontiguousarray(lit.array.astype(compute_dtype(lit.dtype).numpy))
        text = f"{name}[{', '.join(i.text for i in index)}]"
        return Ix(text, frozenset().union(*(i.deps for i in index)))

    # ------------------------------------------------------------------ elementwise
    def elementwise(self, inst: Instruction, args: list[Ix]) -> Ix:
        deps = frozenset().union(*(a.deps for a in args)) if args else frozenset()
        expr = self.elementwise_expr(inst, [a.text for a in args])
        return self.emit(expr, deps)

    def elementwise_expr(self, inst: Instruction, a: list[str]) -> str:
        op = inst.op
        out = inst.shape.dtype
        operand_dtype = self.comp[inst.operands[0]].shape.dtype if inst.operands else out
        T = np_name(out)
        cd = compute_dtype(operand_dtype)
        if op in COMPARE:
            return f"({a[0]} {COMPARE[op]} {a[1]})"
        if op in ARITH:
            if out.is_pred:
                raise NotImplementedError(f"{op} of pred")
            return f"{T}({a[0]} {ARITH[op]} {a[1]})"
        if op in BITS:
            return f"({a[0]} {BITS[op]} {a[1]})" if out.is_pred else f"{T}({a[0]} {BITS[op]} {a[1]})"
        if op is Op.NEG:
            return f"{T}(-{a[0]})"
        if op is Op.ABS:
            return f"{T}(abs({a[0]}))"
        if op is Op.NOT:
            return f"(not {a[0]})" if out.is_pred else f"{T}(~{a[0]})"
        if op is Op.SIGN:
            if cd.is_float:
                one = literal(1, out)
                return f"({one} if {a[0]} > 0 else ({T}(-1) if {a[0]} < 0 else {a[0]}))"
            return f"{T}(({a[0]} > 0) - ({a[0]} < 0))" if cd.is_signed else f"{T}({a[0]} > 0)"
        if op in (Op.FLOOR, Op.CEIL):
            return f"{T}(np.{op.value}({a[0]}))"
        if op is Op.ROUND:
            if inst.attr("rounding_method") == "to_nearest_even":
                return f"{T}(np.rint({a[0]}))"
            return f"{T}(scalar.round_away({a[0]}))"
        if op is Op.SQRT:
            return f"{T}(np.sqrt({a[0]}))"
        if op is Op.RSQRT:
            return f"{T}({literal(1, out)} / np.sqrt({a[0]}))"
        if op is Op.IS_FINITE:
            return f"scalar.is_finite({a[0]})"
        if op is Op.EXP2:  # as jax lowers it: exp(log(2) * x), both rounded to x's dtype
            ln2 = literal(float(np.asarray(np.log(2.0), operand_dtype.numpy)), out)
            product = self.narrow(f"{T}({ln2} * {a[0]})", out)
            return f"{T}(mathlib.exp_{self.variant(cd)}({product}))"
        if op is Op.EXP and self.variant(cd) == "f32" and self.shifted_by_its_max(inst.operands[0]):
            return f"{T}(mathlib.exp_nonpositive_f32({a[0]}))"
        if op in UNARY_FLOAT_LIB:
            return f"{T}(mathlib.{UNARY_FLOAT_LIB[op]}_{self.variant(cd)}({a[0]}))"
        if op is Op.ATAN2:
            return f"{T}(mathlib.atan2_{self.variant(cd)}({a[0]}, {a[1]}))"
        if op is Op.POW:  # an integer exponent is converted to x's dtype first, as in jax
            y_dtype = self.comp[inst.operands[1]].shape.dtype
            y = a[1] if y_dtype == operand_dtype else self.narrow(f"{T}({a[1]})", out)
            return f"{T}(mathlib.pow_{self.variant(cd)}({a[0]}, {y}))"
        if op in (Op.MAX, Op.MIN):
            if out.is_pred:
                return f"({a[0]} {'or' if op is Op.MAX else 'and'} {a[1]})"
            kind = ("f" if cd.is_float else "i") + op.value
            return f"{T}(scalar.{kind}({a[0]}, {a[1]}))"
        if op is Op.DIV:
            if cd.is_float:
                return f"{T}({a[0]} / {a[1]})"
            return f"{T}({self.int_helper('div', cd)}({a[0]}, {a[1]}))"
        if op is Op.REM:
            if cd.is_float:
                return f"{T}(np.fmod({a[0]}, {a[1]}))"
            return f"{T}({self.int_helper('rem', cd)}({a[0]}, {a[1]}))"
        if op in (Op.SHIFT_LEFT, Op.SHIFT_RIGHT_LOGICAL, Op.SHIFT_RIGHT_ARITHMETIC):
            return f"{T}({self.shift_helper(op, cd)}({a[0]}, {a[1]}))"
        if op is Op.INTEGER_POW:
            return self.integer_pow(a[0], int(inst.attr("y")), out)
        if op is Op.SELECT_N:
            which, *cases = a
            if len(cases) == 1:
                return cases[0]
            if self.comp[inst.operands[0]].shape.dtype.is_pred:
                return f"({cases[1]} if {which} else {cases[0]})"
            expr = cases[-1]
            for i in range(len(cases) - 2, -1, -1):
                expr = f"({cases[i]} if {which} <= {i} else {expr})"
            return expr
        if op is Op.CLAMP:
            kind = "f" if cd.is_float else "i"
            return f"{T}(scalar.{kind}min(scalar.{kind}max({a[1]}, {a[0]}), {a[2]}))"
        if op is Op.CONVERT_ELEMENT_TYPE:
            return self.convert(a[0], operand_dtype, out)
        if op is Op.BITCAST_CONVERT:
            return bitcast_text(a[0], operand_dtype, out)
        raise NotImplementedError(f"the numba backend has no code for {op} ({inst.name})")

    def shifted_by_its_max(self, name: str) -> bool:
        """Whether member `name` is `x - broadcast(reduce_max(x))`, the max taken over the axes
        the broadcast adds back (softmax's shift): at most 0 everywhere, or NaN, since each
        element's max covers the element itself. Its exp needs no upper clamp and scales by
        2**k with k <= 0 (`mathlib.exp_nonpositive_f32`)."""
        sub = self.comp[name]
        if sub.op is not Op.SUB:
            return False
        x, shifted = sub.operands
        spread = self.comp[shifted]
        if spread.op is not Op.BROADCAST_IN_DIM:
            return False
        peak = self.comp[spread.operands[0]]
        if peak.op is not Op.REDUCE_MAX or peak.operands[0] != x:
            return False
        kept = [d for d in range(len(sub.array_shape.dims)) if d not in peak.attr("axes")]
        return list(spread.attr("dims")) == kept

    def variant(self, dtype: DType) -> str:
        return "f64" if dtype is DType.F64 else "f32"

    def integer_pow(self, x: str, y: int, out: DType) -> str:
        """Binary exponentiation, as XLA expands integer_pow."""
        T = np_name(out)
        reciprocal, y = y < 0, abs(y)
        acc, power = None, x
        while y > 0:
            if y & 1:
                acc = power if acc is None else self.narrow(f"{T}({acc} * {power})", out)
            y >>= 1
            if y:
                power = self.narrow(f"{T}({power} * {power})", out)
        expr = acc if acc is not None else literal(1, out)
        return self.narrow(f"{T}({literal(1, out)} / {expr})", out) if reciprocal else f"{T}({expr})"

    def narrow(self, expr: str, dtype: DType) -> str:
        """An f16/bf16 intermediate (held in f32) rounded to its dtype, where XLA rounds it
        too: inside integer_pow's multiplications, exp2's product, pow's converted exponent."""
        if dtype in (DType.F16, DType.BF16):
            return f"scalar.round_{dtype.value}(np.float32({expr}))"
        return expr

    def convert(self, x: str, source: DType, target: DType) -> str:
        T = np_name(target)
        if target.is_pred:
            return f"({x} != 0)"
        if source.is_pred:
            return f"{T}(1 if {x} else 0)"
        if target.is_integer and compute_dtype(source).is_float:
            bits = target.bits
            lo, hi = (-(2.0 ** (bits - 1)), 2.0 ** (bits - 1)) if target.is_signed else (0.0, 2.0**bits)
            info = np.iinfo(target.numpy)
            inner = f"{T}(np.trunc({x}) if ({x} >= {lo!r}) & ({x} < {hi!r}) else 0.0)"
            return f"({T}({info.min}) if {x} < {lo!r} else ({T}({info.max}) if {x} >= {hi!r} else {inner}))"
        if target in (DType.F16, DType.BF16) and source not in (DType.F16, DType.BF16):
            return self.round_to_half(x, target, source)
        return f"{T}({x})"

    def round_to_half(self, x: str, target: DType, source: DType) -> str:
        """Rounds to f16/bf16 precision while staying in f32 (the value is stored in f32)."""
        return f"scalar.round_{target.value}(np.float32({x}))"

    def int_helper(self, kind: str, dtype: DType) -> str:
        name = f"{kind}_{dtype.value}"
        if name not in self.helpers:
            self.helpers[name] = _int_div_source(kind, dtype)
        return name

    def shift_helper(self, op: Op, dtype: DType) -> str:
        name = f"{op.value}_{dtype.value}"
        if name not in self.helpers:
            self.helpers[name] = _shift_source(op, dtype)
        return name

    # ------------------------------------------------------------------ data movement
    def op_get_tuple_element(self, inst: Instruction, index: tuple[Ix, ...]) -> Ix:
        """An element of a tuple built in the same kernel is that element's value."""
        tup = self.comp[inst.operands[0]]
        if tup.op is not Op.TUPLE:
            raise NotImplementedError(f"the numba backend cannot take an element of {tup.op} inside a kernel ({inst.name})")
        return self.value(tup.operands[inst.attr("index")], index)

    def op_broadcast_in_dim(self, inst: Instruction, index: tuple[Ix, ...]) -> Ix:
        source = self.comp[inst.operands[0]].array_shape
        mapped = tuple(
            index[d] if source.dims[k] != 1 else const("0") for k, d in enumerate(inst.attr("dims"))
        )
        return self.value(inst.operands[0], mapped)

    def op_reshape(self, inst: Instruction, index: tuple[Ix, ...]) -> Ix:
        source = self.comp[inst.operands[0]].array_shape
        target = inst.array_shape
        squeezed_out = [(i, d) for i, d in enumerate(target.dims) if d != 1]
        squeezed_in = [(i, d) for i, d in enumerate(source.dims) if d != 1]
        if [d for _, d in squeezed_out] == [d for _, d in squeezed_in]:  # only unit dims change
            mapped = [const("0")] * source.rank
            for (o, _), (s, _) in zip(squeezed_out, squeezed_in):
                mapped[s] = index[o]
            return self.value(inst.operands[0], tuple(mapped))
        flat = inst.operands[0] in self.flat_loads  # a parameter, read through its flat buffer
        lead = trail = 0  # dims both shapes share at either end keep their indices
        if not flat:
            while lead < min(source.rank, target.rank) and source.dims[lead] == target.dims[lead]:
                lead += 1
            while trail < min(source.rank, target.rank) - lead \
                    and source.dims[-1 - trail] == target.dims[-1 - trail]:
                trail += 1
        terms, deps = [], frozenset()
        stride = 1
        for i in range(target.rank - 1 - trail, lead - 1, -1):
            if target.dims[i] != 1:
                terms.append(f"{index[i].text} * {stride}" if stride != 1 else index[i].text)
                deps |= index[i].deps
            stride *= target.dims[i]
        linear = self.emit(" + ".join(reversed(terms)) or "0", deps, "lin")
        if flat:
            return self.flat_loads[inst.operands[0]](linear)
        middle = source.dims[lead : source.rank - trail]
        mapped, stride = [], 1
        strides = []
        for d in reversed(middle):
            strides.append(stride)
            stride *= d
        strides.reverse()
        for d, s in zip(middle, strides):
            mapped.append(Ix(f"(({linear.text} // {s}) % {d})" if d != 1 else "0", deps))
        tail = index[target.rank - trail :] if trail else ()
        return self.value(inst.operands[0], index[:lead] + tuple(mapped) + tail)

    def op_transpose(self, inst: Instruction, index: tuple[Ix, ...]) -> Ix:
        perm = inst.attr("permutation")
        mapped = [None] * len(perm)
        for j, p in enumerate(perm):
            mapped[p] = index[j]
        return self.value(inst.operands[0], tuple(mapped))

    def op_slice(self, inst: Instruction, index: tuple[Ix, ...]) -> Ix:
        mapped = []
        for i, s, st in zip(index, inst.attr("start"), inst.attr("strides")):
            text = i.text if st == 1 else f"{i.text} * {st}"
            mapped.append(Ix(f"({text} + {s})" if s else text, i.deps))
        return self.value(inst.operands[0], tuple(mapped))

    def op_rev(self, inst: Instruction, index: tuple[Ix, ...]) -> Ix:
        dims = inst.array_shape.dims
        mapped = [
            Ix(f"({dims[k] - 1} - {i.text})", i.deps) if k in inst.attr("dimensions") else i
            for k, i in enumerate(index)
        ]
        return self.value(inst.operands[0], tuple(mapped))

    def cut(self, i: Ix, points) -> tuple[int, int] | None:
        """The range of the bare loop variable `i` in this piece of its loop, if known; else
        records `points`, where the loop could be split (see `Writer.split_loop`)."""
        if i.text not in self.level_of:
            return None
        known = self.ranges.get(i.text)
        if known is None:
            self.cuts.setdefault(i.text, set()).update(points)
        return known

    def op_concatenate(self, inst: Instruction, index: tuple[Ix, ...]) -> Ix:
        dim = inst.attr("dimension")
        i = index[dim]
        sizes = [(o, self.comp[o].array_shape.dims[dim]) for o in inst.operands]
        sizes = [(o, size) for o, size in sizes if size]  # the non-empty operands
        ends = list(itertools.accumulate(size for _, size in sizes))
        known = self.cut(i, ends[:-1])
        for (o, size), end in zip(sizes, ends) if known is not None else ():
            if end - size <= known[0] and known[1] <= end:  # one operand
                local = Ix(f"{i.text} - {end - size}" if end > size else i.text, i.deps)
                return self.value(o, index[:dim] + (local,) + index[dim + 1 :])
        pieces = []  # (end offset, value) per non-empty operand
        for (o, size), end in zip(sizes, ends):
            local = Ix(clamp_text(f"{i.text} - {end - size}", 0, size - 1), i.deps)
            pieces.append((end, self.value(o, index[:dim] + (local,) + index[dim + 1 :])))
        if not pieces:  # every operand empty, so the result too: no index ever reads it
            return const(literal(0, inst.shape.dtype))
        expr = pieces[-1][1].text
        for end, value in reversed(pieces[:-1]):
            expr = f"({value.text} if {i.text} < {end} else {expr})"
        deps = frozenset().union(*(i.deps for i in index), *(v.deps for _, v in pieces))
        return self.emit(expr, deps)

    def op_pad(self, inst: Instruction, index: tuple[Ix, ...]) -> Ix:
        x = self.comp[inst.operands[0]].array_shape
        pad_value = self.value(inst.operands[1], ())
        conditions, mapped = [], []
        deps = frozenset().union(*(i.deps for i in index)) if index else frozenset()
        for i, d, lo, hi, it in zip(index, x.dims, inst.attr("low"), inst.attr("high"), inst.attr("interior")):
            t = f"({i.text} - {lo})" if lo else i.text
            step = it + 1
            if step == 1 and lo <= 0 and hi <= 0:  # no padding on this axis: always in range
                mapped.append(Ix(t, i.deps))
                continue
            known = self.cut(i, (lo, lo + d)) if step == 1 and x.size else None
            if known is not None and (known[1] <= lo or known[0] >= lo + d):  # all padding
                return pad_value
            if known is not None and lo <= known[0] and known[1] <= lo + d:  # all the operand
                mapped.append(Ix(t, i.deps))
            elif step == 1:
                conditions.append(Ix(f"(({t}) >= 0) & (({t}) < {d})", i.deps))
                mapped.append(Ix(clamp_text(t, 0, max(d - 1, 0)), i.deps))
            else:
                conditions.append(Ix(f"(({t}) >= 0) & (({t}) % {step} == 0) & (({t}) // {step} < {d})", i.deps))
                mapped.append(Ix(clamp_text(f"({t}) // {step}", 0, max(d - 1, 0)), i.deps))
        if x.size == 0:
            return pad_value
        inner = self.value(inst.operands[0], tuple(mapped))
        if not conditions:
            return inner
        # The test is a statement of its own, placed by its own indices: where the padded axes
        # are outer ones, it is made once per row, outside the loop that copies along it (a
        # convolution's patches: 3.5x faster than testing every element).
        inside = self.emit(" & ".join(c.text for c in conditions), frozenset().union(*(c.deps for c in conditions)),
                           "ok")
        return self.emit(f"({inner.text} if {inside.text} else {pad_value.text})",
                         deps | inner.deps | pad_value.deps)

    def start_indices(self, inst: Instruction, operand_dims, sizes, first: int) -> list[Ix]:
        starts = []
        for k, (d, s) in enumerate(zip(operand_dims, sizes)):
            i = self.value(inst.operands[first + k], ())
            starts.append(self.emit(clamp_text(f"np.int64({i.text})", 0, d - s), i.deps, "start"))
        return starts

    def op_dynamic_slice(self, inst: Instruction, index: tuple[Ix, ...]) -> Ix:
        x = self.comp[inst.operands[0]].array_shape
        starts = self.start_indices(inst, x.dims, inst.array_shape.dims, 1)
        mapped = tuple(Ix(f"({i.text} + {s.text})", i.deps | s.deps) for i, s in zip(index, starts))
        return self.value(inst.operands[0], mapped)

    def op_dynamic_update_slice(self, inst: Instruction, index: tuple[Ix, ...]) -> Ix:
        x = self.comp[inst.operands[0]].array_shape
        u = self.comp[inst.operands[1]].array_shape
        starts = self.start_indices(inst, x.dims, u.dims, 2)
        old = self.value(inst.operands[0], index)
        if u.size == 0:
            return old
        inside, mapped = [], []
        for i, s, n in zip(index, starts, u.dims):
            inside.append(f"({i.text} >= {s.text}) & ({i.text} < {s.text} + {n})")
            mapped.append(Ix(clamp_text(f"{i.text} - {s.text}", 0, n - 1), i.deps | s.deps))
        new = self.value(inst.operands[1], tuple(mapped))
        # The condition reads the index and the starts: the statement lives where they do.
        deps = old.deps | new.deps | frozenset().union(*(i.deps | s.deps for i, s in zip(index, starts)))
        condition = " & ".join(inside) or "True"
        return self.emit(f"({new.text} if {condition} else {old.text})", deps)

    def op_gather(self, inst: Instruction, index: tuple[Ix, ...]) -> Ix:
        """The operand element this result element reads, as `hlo.reference_data.gather`: the
        index vector at the result's batch position gives each window's start (clamped so the
        window fits; in fill mode, first wrapped to int32 as jax does, and the fill value where
        the window does not fit), batching dims follow the batch position."""
        a = dict(inst.attrs)
        x = self.comp[inst.operands[0]].array_shape
        indices = self.comp[inst.operands[1]].array_shape
        offset, sizes = a["offset_dims"], a["slice_sizes"]
        batch = [ix for d, ix in enumerate(index) if d not in offset]
        fill = a["mode"] == "fill_or_drop"
        wide = any(d > np.iinfo(np.int32).max for d in x.dims)
        starts: dict[int, Ix] = {}
        inside = []
        for k, d in enumerate(a["start_index_map"]):
            raw = self.value(inst.operands[1], (*batch, const(str(k))))
            text = raw.text
            if fill and not wide:
                text = f"np.int32({text})"  # jax converts fill-mode indices to int32, wrapping
            elif indices.dtype is DType.U64:
                text = f"min({text}, np.uint64({np.iinfo(np.int64).max}))"
            s = self.emit(f"np.int64({text})", raw.deps, "at")
            hi = x.dims[d] - sizes[d]
            inside.append(f"({s.text} >= 0) & ({s.text} <= {hi})")
            starts[d] = self.emit(clamp_text(s.text, 0, hi), s.deps, "start")
        for d, b in zip(a["operand_batching_dims"], a["start_indices_batching_dims"]):
            starts[d] = batch[b]
        kept = [d for d in range(x.rank) if d not in a["collapsed_slice_dims"] and d not in a["operand_batching_dims"]]
        where = dict(zip(kept, offset))
        mapped = []
        for d in range(x.rank):
            start = starts.get(d, const("0"))
            if d in where:
                i = index[where[d]]
                mapped.append(Ix(i.text if start.text == "0" else f"({start.text} + {i.text})", start.deps | i.deps))
            else:
                mapped.append(start)
        value = self.value(inst.operands[0], tuple(mapped))
        if not fill or not inside:
            return value
        filler = self.value(inst.operands[2], ())
        deps = value.deps | filler.deps | frozenset().union(*(s.deps for s in starts.values()))
        return self.emit(f"({value.text} if {' & '.join(inside)} else {filler.text})", deps)


def _int_div_source(kind: str, dtype: DType) -> str:
    T = np_name(dtype)
    if dtype.is_signed:
        lo = -(2 ** (dtype.bits - 1))
        guard = f"(y != 0) & ~((x == {T}({lo})) & (y == {T}(-1)))"
        if kind == "div":
            body = (
                f"    safe = y if {guard} else {T}(1)\n"
                "    q = x // safe\n"  # floor; to zero where the floor remainder is not 0
                "    m = x % safe\n"  # and the signs differ (x - q * safe could overflow)
                f"    q = q + {T}(1) if (m != 0) & ((x < 0) != (safe < 0)) else q\n"
                f"    return q if y != 0 else {T}(-1)\n"
            )
        else:
            body = (
                f"    safe = y if {guard} else {T}(1)\n"
                "    m = x % safe\n"  # floor remainder, sign of y; lax's has the sign of x
                "    r = m - safe if (m != 0) & ((x < 0) != (safe < 0)) else m\n"
                "    return r if y != 0 else x\n"
            )
    else:
        ones = 2**dtype.bits - 1
        if kind == "div":
            body = f"    safe = y if y != 0 else {T}(1)\n    return x // safe if y != 0 else {T}({ones})\n"
        else:
            body = f"    safe = y if y != 0 else {T}(1)\n    return x % safe if y != 0 else x\n"
    return f"@inline\ndef {kind}_{dtype.value}(x, y):\n{body}"


def _shift_source(op: Op, dtype: DType) -> str:
    bits = dtype.bits
    U = f"np.uint{bits}"
    S = f"np.int{bits}"
    T = np_name(dtype)
    name = f"{op.value}_{dtype.value}"
    past = f"{U}(y) >= {U}({bits})"
    if op is Op.SHIFT_LEFT:
        body = f"    return {T}(0) if {past} else {T}({U}(x) << {U}(y))"
    elif op is Op.SHIFT_RIGHT_LOGICAL:
        body = f"    return {T}(0) if {past} else {T}({U}(x) >> {U}(y))"
    else:
        body = (
            f"    amount = {U}({bits - 1}) if {past} else {U}(y)\n"
            f"    return {T}({S}(x) >> {S}(amount))"
        )
    return f"@inline\ndef {name}(x, y):\n{body}\n"


__all__ = ["Emitter", "Ix", "Shape", "compute_dtype", "const", "literal", "np_name"]
