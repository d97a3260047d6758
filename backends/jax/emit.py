"""HLO computations as Python source written in `jax.lax` calls, and the functions it defines.

As torch.fx's code generation does: one line per instruction, named after it, with its shape
and source line as a comment; a computation that a `fusion` or `call` invokes is a function of
its own, defined before its caller. Constants are closure values (read-only numpy arrays bound
in the functions' globals, shown in a comment when small) or, on request, trailing arguments.
`emit_driver` writes the other kind of function: the top level of a module in "fusions" mode,
plain Python calling one jitted kernel per fusion. `compile_source` registers the text with
`linecache`, so a traceback through generated code shows its lines.

The rules follow the reference interpreter (`hlo/reference.py`); where `jax.lax` alone differs
from it, or leaves a choice to the device, the rule says how it is made to agree. May import
xfuse.hlo, numpy and jax.
"""

from __future__ import annotations

import hashlib
import keyword
import linecache
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import jax.numpy as jnp
import numpy as np
from jax import lax

from xfuse.hlo import Computation, DType, Instruction, Module, Op, Shape, TupleShape
from xfuse.hlo.literal import format_literal

from .emit_control import CONTROL_NAMESPACE, CONTROL_RULES
from .emit_data import DATA_NAMESPACE, DATA_RULES

DTYPE_TEXT = {
    DType.PRED: "np.bool_",
    DType.S8: "np.int8",
    DType.S16: "np.int16",
    DType.S32: "np.int32",
    DType.S64: "np.int64",
    DType.U8: "np.uint8",
    DType.U16: "np.uint16",
    DType.U32: "np.uint32",
    DType.U64: "np.uint64",
    DType.F16: "np.float16",
    DType.BF16: "jnp.bfloat16",
    DType.F32: "np.float32",
    DType.F64: "np.float64",
}
HALF = (DType.F16, DType.BF16)
SHOWN_CONSTANT_SIZE = 8  # constants of at most this many elements show their value in a comment
# A constant of at most this many bytes is compiled into each function that reads it, so XLA
# knows its value: a loop whose start is known has a known trip count, and XLA:GPU then runs it
# without copying its condition back to the host each turn (the scanned RNN on an H100: 3.6 ms
# against jax.jit's 1.35 ms while the start was an argument). Larger constants are arguments.
LITERAL_CONSTANT_BYTES = 64


def index_operands(dims: tuple[int, ...], sizes: tuple[int, ...], *indices):
    """Start indices of several integer types as one type (HLO wants one), values unchanged
    where it matters: each is first clamped into [0, dim - size] in its own type, as the
    dynamic slice would clamp it, then converted to s32 (s64 past 2**31 - 1)."""
    wide = np.int64 if max(dims, default=0) > np.iinfo(np.int32).max else np.int32
    out = []
    for index, dim, size in zip(indices, dims, sizes):
        info = np.iinfo(index.dtype)
        top = np.asarray(min(dim - size, info.max), index.dtype)
        clamped = lax.clamp(np.asarray(0, index.dtype), index, top)
        out.append(lax.convert_element_type(clamped, wide))
    return out


def nan_propagating(reduce: Callable) -> Callable:
    """`reduce` (lax.reduce_min or reduce_max) with NaN propagated as lax documents. XLA:CPU
    reduces a matrix's columns in blocks of rows and can drop a block holding a NaN when it
    combines them (min over axis 0 of a float32[32, 130] column with a NaN at row 16 returned
    the first 16 rows' minimum); whether any element is NaN is a second, exact reduction."""

    def fn(x, axes):
        result = reduce(x, axes)
        if not jnp.issubdtype(x.dtype, jnp.inexact) or not axes:
            return result
        return jnp.where(lax.reduce_or(jnp.isnan(x), axes), np.asarray(np.nan, x.dtype), result)

    fn.__name__ = f"nan_propagating_{reduce.__name__}"
    return fn


reduce_min = nan_propagating(lax.reduce_min)
reduce_max = nan_propagating(lax.reduce_max)
NAMESPACE = {"lax": lax, "np": np, "jnp": jnp, "index_operands": index_operands,
             "reduce_min": reduce_min, "reduce_max": reduce_max}


# ---------------------------------------------------------------------------- rules
@dataclass(frozen=True, slots=True)
class Context:
    """What a rule sees: the instruction, its operands' variable names and shapes."""

    inst: Instruction
    args: list[str]
    operand_shapes: list
    callee: str = ""  # the function a fusion or call invokes
    callees: tuple[str, ...] = ()  # every function it invokes (while: condition, body)

    @property
    def dtype(self) -> DType:
        return self.inst.array_shape.dtype

    def attr(self, name: str) -> object:
        return self.inst.attr(name)


def _call(fn: str) -> Callable[[Context], str]:
    return lambda c: f"{fn}({', '.join(c.args)})"


def _ints(values) -> str:
    return repr(tuple(int(v) for v in values))


def _abs(c: Context) -> str:
    # lax.abs refuses unsigned integers; XLA's abs of one is the identity
    return c.args[0] if c.dtype.is_unsigned else f"lax.abs({c.args[0]})"


def _round(c: Context) -> str:
    method = c.attr("rounding_method").upper()
    return f"lax.round({c.args[0]}, lax.RoundingMethod.{method})"


def _pow(c: Context) -> str:
    # the reference converts an integer exponent to the base's type first, and so does this
    x, y = c.args
    if c.operand_shapes[1].dtype.is_integer:
        y = f"lax.convert_element_type({y}, {DTYPE_TEXT[c.dtype]})"
    return f"lax.pow({x}, {y})"


def _convert(c: Context) -> str:
    # XLA:CPU rounds integer -> bf16 and f64 -> f16/bf16 through f32 (the reference follows);
    # the intermediate f32 is written out so that every device rounds the same way
    source, to = c.operand_shapes[0].dtype, c.dtype
    x = c.args[0]
    if source is DType.PRED and to.is_float:
        # XLA's simplifier rewrites `convert(p) * x` (and /, +, ...) into select(p, 1 * x, 0 * x)
        # and folds 0 * x to 0, wrong where x is NaN, an infinity or (dividing) 0: through u8,
        # which it does not rewrite, the predicate converts as a number.
        x, source = f"lax.convert_element_type({x}, np.uint8)", DType.U8
    if (to is DType.BF16 and source.is_integer) or (to in HALF and source is DType.F64):
        x = f"lax.convert_element_type({x}, np.float32)"
    return f"lax.convert_element_type({x}, {DTYPE_TEXT[to]})"


def _nan_kept(fn: str) -> Callable[[Context], str]:
    """exp, exp2, expm1 and logistic, a NaN operand kept as it is. XLA:CPU's exp is wrong on a
    NaN that LLVM sees at compile time (`x + nan`, `min(x, nan)` with the NaN a constant of
    the fusion): it converts the NaN to an integer exponent, which is poison there, and 0, a
    tiny or a large number comes out (jax.jit too: exp(x + nan) gave 6.9e-18, 3.1e-41, ...;
    in bfloat16 expm1 and logistic too). The select leaves such a NaN alone, and costs a
    compare where the operand is a runtime value."""

    def rule(c: Context) -> str:
        x = c.args[0]
        return f"lax.select(lax.ne({x}, {x}), {x}, {fn}({x}))"

    return rule


def _iota(c: Context) -> str:
    shape = c.inst.array_shape
    return f"lax.broadcasted_iota({DTYPE_TEXT[shape.dtype]}, {_ints(shape.dims)}, {c.attr('dimension')})"


def _broadcast_in_dim(c: Context) -> str:
    dims = _ints(c.inst.array_shape.dims)
    return f"lax.broadcast_in_dim({c.args[0]}, {dims}, {_ints(c.attr('dims'))})"


def _slice(c: Context) -> str:
    a = c.attr
    return f"lax.slice({c.args[0]}, {_ints(a('start'))}, {_ints(a('limit'))}, {_ints(a('strides'))})"


def _index_args(c: Context, first: int, sizes: tuple[int, ...]) -> str:
    """The start index operands: as they are when of one type, else through index_operands."""
    indices = c.args[first:]
    if len({s.dtype for s in c.operand_shapes[first:]}) <= 1:
        return ", ".join(indices)
    dims = _ints(c.operand_shapes[0].dims)
    return f"*index_operands({dims}, {_ints(sizes)}, {', '.join(indices)})"


def _dynamic_slice(c: Context) -> str:
    # the primitive itself: lax.dynamic_slice would first wrap negative indices, which the
    # reference (and HLO) clamp instead
    sizes = c.inst.array_shape.dims
    indices = _index_args(c, 1, sizes)
    return f"lax.dynamic_slice_p.bind({c.args[0]}, {indices}, slice_sizes={_ints(sizes)})"


def _dynamic_update_slice(c: Context) -> str:
    indices = _index_args(c, 2, c.operand_shapes[1].dims)
    return f"lax.dynamic_update_slice_p.bind({c.args[0]}, {c.args[1]}, {indices})"


def _pad(c: Context) -> str:
    a = c.attr
    config = tuple(zip(a("low"), a("high"), a("interior")))
    return f"lax.pad({c.args[0]}, {c.args[1]}, {config!r})"


def _reduce(fn: str, accumulate_halves: bool = False) -> Callable[[Context], str]:
    def rule(c: Context) -> str:
        axes = _ints(c.attr("axes"))
        x = c.args[0]
        if accumulate_halves and c.dtype in HALF:
            # f16 and bf16 accumulate in f32, rounded once: the reference sums in f64, and this
            # is what XLA:CPU does on its own (another device might accumulate in f16)
            wide = f"{fn}(lax.convert_element_type({x}, np.float32), {axes})"
            return f"lax.convert_element_type({wide}, {DTYPE_TEXT[c.dtype]})"
        return f"{fn}({x}, {axes})"

    return rule


def _arg_reduce(fn: str) -> Callable[[Context], str]:
    return lambda c: f"{fn}({c.args[0]}, {c.attr('axis')}, {DTYPE_TEXT[c.dtype]})"


def _dot_general(c: Context) -> str:
    (lc, rc), (lb, rb) = c.attr("contracting"), c.attr("batch")
    numbers = f"(({_ints(lc)}, {_ints(rc)}), ({_ints(lb)}, {_ints(rb)}))"
    lhs, rhs = c.args
    if not c.dtype.is_float:
        # Narrower integer operands are widened to the result's type first: the sum wraps the
        # same way, and XLA:GPU's s8 x s8 = s32 product gave twice the sum over 5 terms (an
        # H200, jax 0.11.2)
        wide = DTYPE_TEXT[c.dtype]
        lhs, rhs = (x if s.dtype is c.dtype else f"lax.convert_element_type({x}, {wide})"
                    for x, s in zip((lhs, rhs), c.operand_shapes))
        return f"lax.dot_general({lhs}, {rhs}, {numbers}, preferred_element_type={wide})"
    # HIGHEST: f32 products in f32 (a GPU's default would use tf32); half results accumulate
    # in f32 and round once, as the reference's f64 sum rounded once is best approximated.
    # Half operands are widened first, for a half or an f32 result (preferred_element_type):
    # a product of two f16 or bf16 values is exact in f32, so the result is the same, and
    # XLA:CPU has no bf16 x bf16 = f32 dot for some layouts (a batched one: UNIMPLEMENTED,
    # in jax.jit too).
    accumulate = c.dtype
    if c.dtype in HALF:
        accumulate = DType.F32
    if accumulate is DType.F32 and any(s.dtype in HALF for s in c.operand_shapes):
        lhs, rhs = (f"lax.convert_element_type({x}, np.float32)" for x in (lhs, rhs))
    dot = (f"lax.dot_general({lhs}, {rhs}, {numbers}, precision=lax.Precision.HIGHEST, "
           f"preferred_element_type={DTYPE_TEXT[accumulate]})")
    return dot if accumulate is c.dtype else f"lax.convert_element_type({dot}, {DTYPE_TEXT[c.dtype]})"


def _tuple(c: Context) -> str:
    return f"({', '.join(c.args)},)" if len(c.args) == 1 else f"({', '.join(c.args)})"


def _barrier(c: Context) -> str:
    return f"lax.optimization_barrier({_tuple(c)})"


UNARY = {
    Op.NEG: "lax.neg", Op.SIGN: "lax.sign", Op.FLOOR: "lax.floor", Op.CEIL: "lax.ceil",
    Op.EXP: "lax.exp", Op.EXP2: "lax.exp2", Op.EXPM1: "lax.expm1", Op.LOG: "lax.log",
    Op.LOG1P: "lax.log1p", Op.SQRT: "lax.sqrt", Op.RSQRT: "lax.rsqrt", Op.CBRT: "lax.cbrt",
    Op.TANH: "lax.tanh", Op.LOGISTIC: "lax.logistic", Op.SIN: "lax.sin", Op.COS: "lax.cos",
    Op.TAN: "lax.tan", Op.ATAN: "lax.atan", Op.ERF: "lax.erf", Op.ERFC: "lax.erfc",
    Op.IS_FINITE: "lax.is_finite", Op.NOT: "lax.bitwise_not",
}  # fmt: skip
BINARY = {
    Op.ADD: "lax.add", Op.SUB: "lax.sub", Op.MUL: "lax.mul", Op.DIV: "lax.div",
    Op.REM: "lax.rem", Op.MAX: "lax.max", Op.MIN: "lax.min", Op.ATAN2: "lax.atan2",
    Op.AND: "lax.bitwise_and", Op.OR: "lax.bitwise_or", Op.XOR: "lax.bitwise_xor",
    Op.SHIFT_LEFT: "lax.shift_left", Op.SHIFT_RIGHT_LOGICAL: "lax.shift_right_logical",
    Op.SHIFT_RIGHT_ARITHMETIC: "lax.shift_right_arithmetic",
    Op.EQ: "lax.eq", Op.NE: "lax.ne", Op.LT: "lax.lt", Op.LE: "lax.le", Op.GT: "lax.gt",
    Op.GE: "lax.ge",
}  # fmt: skip

# op -> the expression computing it. Parameters are the function's arguments and constants
# its globals (or arguments), so neither has a rule.
RULES: dict[Op, Callable[[Context], str]] = {
    **{op: _call(fn) for op, fn in UNARY.items()},
    **{op: _call(fn) for op, fn in BINARY.items()},
    Op.EXP: _nan_kept("lax.exp"),
    Op.EXP2: _nan_kept("lax.exp2"),
    Op.EXPM1: _nan_kept("lax.expm1"),
    Op.LOGISTIC: _nan_kept("lax.logistic"),
    Op.IOTA: _iota,
    Op.ABS: _abs,
    Op.ROUND: _round,
    Op.INTEGER_POW: lambda c: f"lax.integer_pow({c.args[0]}, {c.attr('y')})",
    Op.POW: _pow,
    Op.SELECT_N: _call("lax.select_n"),  # XLA clamps an out-of-range selector, as the reference
    Op.CLAMP: _call("lax.clamp"),
    Op.CONVERT_ELEMENT_TYPE: _convert,
    Op.BITCAST_CONVERT: lambda c: f"lax.bitcast_convert_type({c.args[0]}, {DTYPE_TEXT[c.dtype]})",
    Op.BROADCAST_IN_DIM: _broadcast_in_dim,
    Op.RESHAPE: lambda c: f"lax.reshape({c.args[0]}, {_ints(c.inst.array_shape.dims)})",
    Op.TRANSPOSE: lambda c: f"lax.transpose({c.args[0]}, {_ints(c.attr('permutation'))})",
    Op.SLICE: _slice,
    Op.DYNAMIC_SLICE: _dynamic_slice,
    Op.DYNAMIC_UPDATE_SLICE: _dynamic_update_slice,
    Op.CONCATENATE: lambda c: f"lax.concatenate([{', '.join(c.args)}], {c.attr('dimension')})",
    Op.PAD: _pad,
    Op.REV: lambda c: f"lax.rev({c.args[0]}, {_ints(c.attr('dimensions'))})",
    Op.REDUCE_SUM: _reduce("lax.reduce_sum", accumulate_halves=True),
    Op.REDUCE_PROD: _reduce("lax.reduce_prod", accumulate_halves=True),
    Op.REDUCE_MAX: _reduce("reduce_max"),
    Op.REDUCE_MIN: _reduce("reduce_min"),
    Op.REDUCE_AND: _reduce("lax.reduce_and"),
    Op.REDUCE_OR: _reduce("lax.reduce_or"),
    Op.ARGMAX: _arg_reduce("lax.argmax"),
    Op.ARGMIN: _arg_reduce("lax.argmin"),
    Op.DOT_GENERAL: _dot_general,
    Op.TUPLE: _tuple,
    Op.GET_TUPLE_ELEMENT: lambda c: f"{c.args[0]}[{c.attr('index')}]",
    Op.OPTIMIZATION_BARRIER: _barrier,
    Op.FUSION: lambda c: f"{c.callee}({', '.join(c.args)})",
    Op.CALL: lambda c: f"{c.callee}({', '.join(c.args)})",
}
RULES.update(DATA_RULES)  # cumulative ops, sort, top_k, gather, scatter: emit_data.py
NAMESPACE.update(DATA_NAMESPACE)
RULES.update(CONTROL_RULES)  # while and conditional: emit_control.py
NAMESPACE.update(CONTROL_NAMESPACE)
LEAVES = {Op.PARAMETER, Op.CONSTANT}
CALLING = (Op.FUSION, Op.CALL, Op.WHILE, Op.CONDITIONAL)


# ---------------------------------------------------------------------------- names
class Names:
    """Python identifiers for HLO names (`add.3` -> `add_3`), each given out once."""

    def __init__(self, reserved=()) -> None:
        self.taken: set[str] = set(reserved)

    def fresh(self, name: str) -> str:
        base = re.sub(r"\W", "_", name, flags=re.ASCII) or "v"
        if base[0].isdigit() or keyword.iskeyword(base):
            base = "v_" + base
        candidate, k = base, 1
        while candidate in self.taken:
            candidate, k = f"{base}_{k}", k + 1
        self.taken.add(candidate)
        return candidate

    def child(self) -> Names:
        return Names(self.taken)


# ---------------------------------------------------------------------------- sources
@dataclass
class Source:
    """Generated Python: `text` defines `name` (after the functions it calls), which needs
    `globals` (constants by global name, called kernels) besides `NAMESPACE`.

    constant_arguments: the constants (by instruction name) taken as trailing arguments.
    """

    name: str
    text: str
    globals: dict[str, object] = field(default_factory=dict)
    constant_arguments: tuple[str, ...] = ()


def _comment(inst: Instruction) -> str:
    text = str(inst.shape)
    if inst.op is Op.CONSTANT and inst.attr("value").array.size <= SHOWN_CONSTANT_SIZE:
        text += " " + format_literal(inst.attr("value"))
    if inst.loc is not None:
        text += f"  at {inst.loc}"
    return "  # " + text.replace("\n", " ")


def _signature(comp: Computation) -> str:
    params = ", ".join(f"{p.name}: {p.shape}" for p in comp.parameters)
    return f"# {comp.name} ({params}) -> {comp.result_shape}"


def _callees(module: Module, comp: Computation, through=CALLING) -> list[Computation]:
    """The computations `comp` invokes through the ops `through`, directly or not, callees
    before their callers."""
    order: list[Computation] = []

    def visit(c: Computation) -> None:
        for inst in c.instructions:
            if inst.op not in through:
                continue
            for name in inst.callees:
                if all(o.name != name for o in order):
                    visit(module[name])
                    order.append(module[name])

    visit(comp)
    return order


def _unsupported(inst: Instruction, comp: Computation) -> NotImplementedError:
    at = f" at {inst.loc}" if inst.loc else ""
    return NotImplementedError(
        f"the jax backend has no rule for {inst.name} ({inst.op}, {inst.shape}) in {comp.name}{at}"
    )


def _body(
    comp: Computation,
    names: Names,
    constant_names: Mapping[str, str],
    functions: Mapping[str, str],
    flat_return: bool,
    constant_arguments: tuple[str, ...] = (),
) -> list[str]:
    """The lines of one function over `comp`: signature, one line per instruction, return."""
    local = names.child()
    var = {p.name: local.fresh(p.name) for p in comp.parameters}
    for name in constant_arguments:
        var[name] = local.fresh(name)
    arguments = [var[p.name] for p in comp.parameters] + [var[n] for n in constant_arguments]
    lines = [_signature(comp), f"def {functions[comp.name]}({', '.join(arguments)}):"]
    for inst in comp.instructions:
        if inst.op is Op.PARAMETER or inst.name in constant_arguments:
            continue
        var[inst.name] = local.fresh(inst.name)
        if inst.op is Op.CONSTANT:
            expression = constant_names[inst.name]
        else:
            rule = RULES.get(inst.op)
            if rule is None:
                raise _unsupported(inst, comp)
            shapes = [comp[o].shape for o in inst.operands]
            callee = functions.get(inst.called, "") if inst.called else ""
            callees = tuple(functions.get(n, "") for n in inst.callees)
            expression = rule(Context(inst, [var[o] for o in inst.operands], shapes, callee, callees))
        lines.append(f"    {var[inst.name]} = {expression}{_comment(inst)}")
    lines.append(f"    return {_returned(comp, var[comp.root], flat_return)}")
    return lines


def _returned(comp: Computation, root: str, flat: bool) -> str:
    """The return expression: the root, or with `flat` a list of the outputs."""
    if not flat:
        return root
    return f"list({root})" if isinstance(comp.result_shape, TupleShape) else f"[{root}]"


def emit_function(
    module: Module,
    comp: Computation | None = None,
    *,
    constants_as_arguments: bool = False,
    flat_return: bool = False,
) -> Source:
    """The source of `comp` (the entry by default) and every computation it calls.

    constants_as_arguments: `comp`'s own constants larger than `LITERAL_CONSTANT_BYTES` become
        trailing arguments (so they are not compiled in); those of the functions it calls, and
        small ones, stay closure values.
    flat_return: return a list of the outputs (one per tuple element) rather than the root.
    """
    comp = comp or module.entry_computation
    order = [*_callees(module, comp), comp]
    names = Names(NAMESPACE)
    functions = {c.name: names.fresh(c.name) for c in order}
    constant_names: dict[str, dict[str, str]] = {}
    values: dict[str, object] = {}
    for c in order:
        table = constant_names[c.name] = {}
        as_arguments = constants_as_arguments and c is comp
        for inst in c.instructions:
            if inst.op is Op.CONSTANT and (is_literal(inst) or not as_arguments):
                table[inst.name] = names.fresh(f"{inst.name}_value")
                values[table[inst.name]] = inst.attr("value").array
    blocks = []
    for c in order:
        flat = flat_return and c is comp
        arguments = ()
        if c is comp and constants_as_arguments:
            arguments = tuple(i.name for i in c.instructions if i.op is Op.CONSTANT and not is_literal(i))
        blocks.append(_body(c, names, constant_names[c.name], functions, flat, arguments))
    text = "\n\n".join("\n".join(block) for block in blocks) + "\n"
    return Source(functions[comp.name], text, values, arguments)


# ---------------------------------------------------------------------------- the driver
HOST_OPS = {Op.PARAMETER, Op.CONSTANT, Op.TUPLE, Op.GET_TUPLE_ELEMENT, Op.OPTIMIZATION_BARRIER}


@dataclass
class Driver:
    """The top level in "fusions" mode: `source` (whose globals hold the constants) calls
    `kernels`: instruction name (qualified by its computation's name outside the entry) ->
    (the global name it is called by, its Source)."""

    source: Source
    kernels: dict[str, tuple[str, Source]]


def is_literal(inst: Instruction) -> bool:
    """Whether `inst` is a constant small enough to compile into the functions that read it."""
    return inst.op is Op.CONSTANT and inst.attr("value").array.nbytes <= LITERAL_CONSTANT_BYTES


def kernel_operands(comp: Computation, inst: Instruction) -> list[str]:
    """The arguments of the kernel of `inst` alone: its distinct operands, less small constants."""
    return [o for o in dict.fromkeys(inst.operands) if not is_literal(comp[o])]


def kernel_computation(comp: Computation, inst: Instruction) -> Computation:
    """A computation applying `inst` alone: `kernel_operands` as parameters, small constant
    operands as constants of its own."""
    params = [
        Instruction(o, Op.PARAMETER, comp[o].shape, attrs=(("index", i),))
        for i, o in enumerate(kernel_operands(comp, inst))
    ]
    literals = [comp[o] for o in dict.fromkeys(inst.operands) if is_literal(comp[o])]
    return Computation(f"kernel_{inst.name}", (*params, *literals, inst), inst.name)


def emit_driver(module: Module, kernel_source: Callable[[Computation, Instruction], Source]) -> Driver:
    """Plain Python over the entry computation: each instruction that computes is a call of a
    kernel (`kernel_source(comp, inst)` writes its source); parameters, constants, tuples,
    tuple elements and barriers are Python values; a `call` is a driver function of its own.
    The function returns a list of the outputs."""
    entry = module.entry_computation
    order = [*_callees(module, entry, through=(Op.CALL,)), entry]
    names = Names(NAMESPACE)
    functions = {c.name: names.fresh(f"run_{c.name}") for c in order}
    kernels: dict[str, tuple[str, Source]] = {}
    values: dict[str, object] = {}
    blocks = []
    for comp in order:
        # globals are named as the lines are written, so locals share their namespace
        var = {p.name: names.fresh(p.name) for p in comp.parameters}
        arguments = ", ".join(var[p.name] for p in comp.parameters)
        lines = [_signature(comp), f"def {functions[comp.name]}({arguments}):"]
        for inst in comp.instructions:
            if inst.op is Op.PARAMETER:
                continue
            var[inst.name] = names.fresh(inst.name)
            args = [var[o] for o in inst.operands]
            if inst.op is Op.CONSTANT:
                expression = names.fresh(f"{inst.name}_value")
                values[expression] = inst.attr("value").array
            elif inst.op is Op.OPTIMIZATION_BARRIER:  # nothing moves across a Python call
                expression = _tuple(Context(inst, args, []))
            elif inst.op in HOST_OPS:
                expression = RULES[inst.op](Context(inst, args, []))
            elif inst.op is Op.CALL:
                expression = f"{functions[inst.called]}({', '.join(args)})"
            else:
                key = inst.name if comp is entry else f"{comp.name}/{inst.name}"
                source = kernel_source(comp, inst)
                global_name = names.fresh(f"jit_{source.name}")
                kernels[key] = (global_name, source)
                # a fusion's parameters are its operands, one by one; other kernels take each
                # distinct operand once, small constants compiled in (see kernel_computation)
                operands = inst.operands if inst.op is Op.FUSION else kernel_operands(comp, inst)
                expression = f"{global_name}({', '.join(var[o] for o in operands)})"
            lines.append(f"    {var[inst.name]} = {expression}{_comment(inst)}")
        lines.append(f"    return {_returned(comp, var[comp.root], comp is entry)}")
        blocks.append(lines)
    text = "\n\n".join("\n".join(block) for block in blocks) + "\n"
    return Driver(Source(functions[entry.name], text, values), kernels)


# ---------------------------------------------------------------------------- compiling
def compile_source(source: Source, extra: Mapping[str, object] | None = None) -> Callable:
    """Executes `source.text` (registered with linecache) and returns its function."""
    digest = hashlib.sha256(source.text.encode()).hexdigest()[:12]
    filename = f"<xfuse-jax {source.name} {digest}>"
    linecache.cache[filename] = (len(source.text), None, source.text.splitlines(True), filename)
    namespace = {**NAMESPACE, **source.globals, **(extra or {})}
    exec(compile(source.text, filename, "exec"), namespace)
    return namespace[source.name]


def uses_64_bits(module: Module) -> bool:
    """Whether any value of `module` has a 64-bit type (jax computes those only with x64 on)."""

    def wide(shape) -> bool:
        if isinstance(shape, TupleShape):
            return any(wide(s) for s in shape.elements)
        return isinstance(shape, Shape) and shape.dtype.bits == 64

    return any(wide(i.shape) for c in module.computations for i in c.instructions)
