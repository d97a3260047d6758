"""The rule table: one entry per JAX primitive, `RULES[name](ctx, params, operands) -> results`.

Most primitives map one to one onto an xfuse op of the same name; the rest are rewritten here
(`square` -> mul, `squeeze` -> reshape, `split` and `unstack` -> slices, `stack` -> reshapes and
concatenate, `tile` -> broadcast and reshape) or inlined (`jit`, `custom_jvp_call`, `remat2`, ...).
May import xfuse.hlo and jax.
"""

from __future__ import annotations

from xfuse.hlo import DType, Instruction, Op

from .translate import Context, FrontendError, Rule

RULES: dict[str, Rule] = {}


def rule(*names: str):
    def register(fn: Rule) -> Rule:
        for name in names:
            RULES[name] = fn
        return fn

    return register


# ---------------------------------------------------------------------------- elementwise
def _elementwise(op: Op) -> Rule:
    """A lax elementwise primitive; rank-0 operands (weak-typed literals) are broadcast."""

    def translate(ctx: Context, params: dict, operands: list[Instruction]) -> Instruction:
        dims = ctx.out.dims
        operands = [ctx.broadcast_to(o, dims) for o in operands]
        return ctx.emit(op, *operands)

    return translate


SAME_NAME = [
    Op.NEG, Op.ABS, Op.SIGN, Op.FLOOR, Op.CEIL, Op.EXP, Op.EXP2, Op.EXPM1, Op.LOG, Op.LOG1P,
    Op.SQRT, Op.RSQRT, Op.CBRT, Op.TANH, Op.LOGISTIC, Op.SIN, Op.COS, Op.TAN, Op.ATAN, Op.ERF,
    Op.ERFC, Op.IS_FINITE, Op.NOT, Op.ADD, Op.SUB, Op.DIV, Op.REM, Op.POW, Op.MAX, Op.MIN,
    Op.ATAN2, Op.AND, Op.OR, Op.XOR, Op.SHIFT_LEFT, Op.SHIFT_RIGHT_LOGICAL,
    Op.SHIFT_RIGHT_ARITHMETIC, Op.EQ, Op.NE, Op.LT, Op.LE, Op.GT, Op.GE,
]  # fmt: skip
for _op in SAME_NAME:
    RULES[_op.value] = _elementwise(_op)
RULES["add_any"] = _elementwise(Op.ADD)


@rule("mul")
def _mul(ctx, params, operands):
    result = _elementwise(Op.MUL)(ctx, params, operands)
    return ctx.convert(result, ctx.out.dtype)  # out_dtype, when set


@rule("square")
def _square(ctx, params, operands):
    (x,) = operands
    return ctx.emit(Op.MUL, x, x)


@rule("one_minus_square")
def _one_minus_square(ctx, params, operands):
    """1 - x*x, the primitive in tanh's derivative from jax 0.11 on, as (1 - x) * (1 + x): the
    product jax 0.10 wrote out in its place, exact near x = +-1."""
    (x,) = operands
    one = ctx.broadcast_to(ctx.constant(1, x.array_shape.dtype), x.array_shape.dims)
    return ctx.emit(Op.MUL, ctx.emit(Op.SUB, one, x), ctx.emit(Op.ADD, one, x))


@rule("integer_pow")
def _integer_pow(ctx, params, operands):
    return ctx.emit(Op.INTEGER_POW, operands[0], y=int(params["y"]))


@rule("round")
def _round(ctx, params, operands):
    method = int(params.get("rounding_method", 0))
    name = ("away_from_zero", "to_nearest_even")[method]
    return ctx.emit(Op.ROUND, operands[0], rounding_method=name)


@rule("select_n")
def _select_n(ctx, params, operands):
    which, *cases = operands
    dims = ctx.out.dims
    return ctx.emit(Op.SELECT_N, which, *(ctx.broadcast_to(c, dims) for c in cases))


@rule("clamp")
def _clamp(ctx, params, operands):
    lo, x, hi = operands
    x = ctx.broadcast_to(x, ctx.out.dims)
    return ctx.emit(Op.CLAMP, lo, x, hi)


@rule("convert_element_type")
def _convert(ctx, params, operands):
    return ctx.convert(operands[0], ctx.out.dtype)


@rule("bitcast_convert_type")
def _bitcast_convert(ctx, params, operands):
    (x,) = operands
    source, target = x.array_shape.dtype, ctx.out.dtype
    if source.bits != target.bits or source.is_pred or target.is_pred:
        raise FrontendError(f"bitcast_convert_type from {source} to {target} at {ctx.loc}: xfuse bitcasts only "
                            "between dtypes of one width (not pred)")
    return ctx.emit(Op.BITCAST_CONVERT, x, dtype=target)


@rule("copy", "copy_p", "stop_gradient", "sharding_constraint", "device_put", "pvary")
def _identity(ctx, params, operands):
    return operands


@rule("reduce_precision")
def _reduce_precision(ctx, params, operands):
    (x,) = operands
    dtype = x.array_shape.dtype
    exact = {DType.F16: (5, 10), DType.BF16: (8, 7), DType.F32: (8, 23), DType.F64: (11, 52)}
    wanted = (params["exponent_bits"], params["mantissa_bits"])
    if exact.get(dtype) is None or wanted[0] < exact[dtype][0] or wanted[1] < exact[dtype][1]:
        raise FrontendError(f"reduce_precision to {wanted} bits of {dtype} at {ctx.loc} is not supported")
    return x


@rule("optimization_barrier")
def _optimization_barrier(ctx, params, operands):
    barrier = ctx.emit(Op.OPTIMIZATION_BARRIER, *operands)
    return [ctx.emit(Op.GET_TUPLE_ELEMENT, barrier, index=i) for i in range(len(operands))]


# ---------------------------------------------------------------------------- shapes
@rule("broadcast_in_dim")
def _broadcast_in_dim(ctx, params, operands):
    x = operands[0]
    return ctx.emit(
        Op.BROADCAST_IN_DIM, x, shape=ctx.out, dims=tuple(params["broadcast_dimensions"])
    )


@rule("reshape")
def _reshape(ctx, params, operands):
    x = operands[0]
    if params.get("dimensions") is not None:
        x = ctx.emit(Op.TRANSPOSE, x, permutation=tuple(params["dimensions"]))
    return _reshape_to(ctx, x, ctx.out.dims)


def _reshape_to(ctx: Context, x: Instruction, dims: tuple[int, ...]) -> Instruction:
    if x.array_shape.dims == dims:
        return x
    return ctx.emit(Op.RESHAPE, x, shape=x.array_shape.with_dims(dims))


@rule("squeeze")
def _squeeze(ctx, params, operands):
    return _reshape_to(ctx, operands[0], ctx.out.dims)


@rule("expand_dims")
def _expand_dims(ctx, params, operands):
    return _reshape_to(ctx, operands[0], ctx.out.dims)


@rule("transpose")
def _transpose(ctx, params, operands):
    return ctx.emit(Op.TRANSPOSE, operands[0], permutation=tuple(params["permutation"]))


@rule("slice")
def _slice(ctx, params, operands):
    x = operands[0]
    strides = params.get("strides") or (1,) * x.array_shape.rank
    return ctx.emit(
        Op.SLICE,
        x,
        start=tuple(params["start_indices"]),
        limit=tuple(params["limit_indices"]),
        strides=tuple(strides),
    )


@rule("dynamic_slice")
def _dynamic_slice(ctx, params, operands):
    return ctx.emit(Op.DYNAMIC_SLICE, *operands, shape=ctx.out)


@rule("dynamic_update_slice")
def _dynamic_update_slice(ctx, params, operands):
    return ctx.emit(Op.DYNAMIC_UPDATE_SLICE, *operands)


@rule("concatenate")
def _concatenate(ctx, params, operands):
    return ctx.emit(Op.CONCATENATE, *operands, dimension=int(params["dimension"]))


@rule("stack")
def _stack(ctx, params, operands):
    axis = int(params["axis"])
    pieces = []
    for x in operands:
        dims = list(x.array_shape.dims)
        dims.insert(axis, 1)
        pieces.append(_reshape_to(ctx, x, tuple(dims)))
    return ctx.emit(Op.CONCATENATE, *pieces, dimension=axis)


def _slice_along(ctx: Context, x: Instruction, axis: int, start: int, stop: int) -> Instruction:
    dims = x.array_shape.dims
    begin, end = [0] * len(dims), list(dims)
    begin[axis], end[axis] = start, stop
    return ctx.emit(Op.SLICE, x, start=tuple(begin), limit=tuple(end), strides=(1,) * len(dims))


@rule("split")
def _split(ctx, params, operands):
    (x,) = operands
    axis = int(params["axis"])
    results, start = [], 0
    for size in params["sizes"]:
        results.append(_slice_along(ctx, x, axis, start, start + int(size)))
        start += int(size)
    return results


@rule("unstack")
def _unstack(ctx, params, operands):
    (x,) = operands
    axis = int(params["axis"])
    dims = x.array_shape.dims
    rest = dims[:axis] + dims[axis + 1 :]
    return [
        _reshape_to(ctx, _slice_along(ctx, x, axis, index, index + 1), rest)
        for index in range(dims[axis])
    ]


@rule("tile")
def _tile(ctx, params, operands):
    """`tile` as a broadcast to (r0, d0, r1, d1, ...) and a reshape to (r0*d0, r1*d1, ...)."""
    (x,) = operands
    reps, dims = tuple(int(r) for r in params["reps"]), x.array_shape.dims
    interleaved = tuple(d for pair in zip(reps, dims) for d in pair)
    spread = ctx.emit(
        Op.BROADCAST_IN_DIM,
        x,
        shape=x.array_shape.with_dims(interleaved),
        dims=tuple(range(1, 2 * len(dims), 2)),
    )
    return _reshape_to(ctx, spread, ctx.out.dims)


@rule("pad")
def _pad(ctx, params, operands):
    x, value = operands
    config = params["padding_config"]
    return ctx.emit(
        Op.PAD,
        x,
        value,
        low=tuple(int(c[0]) for c in config),
        high=tuple(int(c[1]) for c in config),
        interior=tuple(int(c[2]) for c in config),
    )


@rule("rev")
def _rev(ctx, params, operands):
    return ctx.emit(Op.REV, operands[0], dimensions=tuple(params["dimensions"]))


@rule("iota")
def _iota(ctx, params, operands):
    return ctx.emit(Op.IOTA, shape=ctx.out, dimension=int(params["dimension"]))


# ---------------------------------------------------------------------------- reductions
def _reduction(op: Op) -> Rule:
    def translate(ctx, params, operands):
        return ctx.emit(op, operands[0], axes=tuple(int(a) for a in params["axes"]))

    return translate


for _op in (Op.REDUCE_SUM, Op.REDUCE_MAX, Op.REDUCE_MIN, Op.REDUCE_PROD, Op.REDUCE_AND, Op.REDUCE_OR):
    RULES[_op.value] = _reduction(_op)


def _arg_reduction(op: Op) -> Rule:
    """argmax/argmin; a pred operand (jnp.select's argmax over its conditions) is taken as u8,
    which keeps False < True."""

    def translate(ctx, params, operands):
        (axis,) = params["axes"]
        (x,) = operands
        if x.array_shape.dtype.is_pred:
            x = ctx.convert(x, DType.U8)
        return ctx.emit(op, x, axis=int(axis), shape=ctx.out)

    return translate


RULES["argmax"] = _arg_reduction(Op.ARGMAX)
RULES["argmin"] = _arg_reduction(Op.ARGMIN)


@rule("dot_general")
def _dot_general(ctx, params, operands):
    (lc, rc), (lb, rb) = params["dimension_numbers"]
    return dot(ctx, *operands, (lc, rc), (lb, rb), ctx.out.dtype)


def dot(ctx: Context, lhs: Instruction, rhs: Instruction, contracting, batch, out: DType) -> Instruction:
    """A dot_general giving `out` (jax's preferred_element_type): mixed operands are converted
    to it first; a pred dot (an OR of ANDs) is counted in s32 and compared with zero."""
    (lc, rc), (lb, rb) = contracting, batch
    accumulate = DType.S32 if out.is_pred else out
    if lhs.array_shape.dtype != rhs.array_shape.dtype:
        lhs, rhs = ctx.convert(lhs, accumulate), ctx.convert(rhs, accumulate)
    if lhs.array_shape.dtype.is_float != out.is_float or lhs.array_shape.dtype.is_pred:
        lhs, rhs = ctx.convert(lhs, accumulate), ctx.convert(rhs, accumulate)
    result = ctx.emit(
        Op.DOT_GENERAL,
        lhs,
        rhs,
        contracting=(tuple(map(int, lc)), tuple(map(int, rc))),
        batch=(tuple(map(int, lb)), tuple(map(int, rb))),
        dtype=accumulate,
    )
    return ctx.convert(result, out)


# ---------------------------------------------------------------------------- calls
def _inline(*param_names: str) -> Rule:
    """Inlines the called jaxpr found under the first of `param_names` present."""

    def translate(ctx, params, operands):
        for name in param_names:
            called = params.get(name)
            if called is not None:
                break
        else:
            raise FrontendError(f"'{ctx.primitive}' at {ctx.loc} carries no jaxpr")
        if hasattr(called, "consts"):  # a ClosedJaxpr
            return ctx.inline(called.jaxpr, called.consts, operands)
        return ctx.inline(called, (), operands)

    return translate


RULES["jit"] = RULES["pjit"] = _inline("jaxpr")
RULES["closed_call"] = RULES["core_call"] = _inline("call_jaxpr")
RULES["remat"] = RULES["checkpoint"] = RULES["remat2"] = _inline("jaxpr")
RULES["custom_jvp_call"] = _inline("call_jaxpr")
RULES["custom_vjp_call"] = RULES["custom_vjp_call_jaxpr"] = _inline("call_jaxpr", "fun_jaxpr")
# A custom_vjp's forward pass under differentiation (defvjp(..., optimize_remat=True)): its
# outputs are the residuals and then the primal outputs, just as `fwd_jaxpr` returns them.
RULES["remat_opt"] = _inline("fwd_jaxpr")


def supported_primitives() -> list[str]:
    return sorted(RULES)


__all__ = ["RULES", "supported_primitives"]
