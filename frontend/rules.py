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


# Giles, "Approximating the erfinv function" (GPU Computing Gems, 2011), single precision: the
# polynomial XLA evaluates for erf_inv, in w - 2.5 where w = -log1p(-x*x) < 5, else in sqrt(w) - 3.
_ERF_INV_SMALL_W = (2.81022636e-08, 3.43273939e-07, -3.5233877e-06, -4.39150654e-06, 0.00021858087,
                    -0.00125372503, -0.00417768164, 0.246640727, 1.50140941)
_ERF_INV_LARGE_W = (-0.000200214257, 0.000100950558, 0.00134934322, -0.00367342844, 0.00573950773,
                    -0.0076224613, 0.00943887047, 1.00167406, 2.83297682)


@rule("erf_inv")
def _erf_inv(ctx, params, operands):
    """erf_inv as XLA expands it (f16 and bf16 through f32): Giles' polynomial times x, and
    +-inf at +-1 (NaN past them, from the log of a negative number). float64 takes that value
    as a first guess and refines it with Newton steps (`_erf_inv_f64`)."""
    (x,) = operands
    out = ctx.out.dtype
    work = DType.F64 if out is DType.F64 else DType.F32
    x = ctx.convert(x, work)
    dims = x.array_shape.dims

    def c(value, dtype=work):
        return ctx.broadcast_to(ctx.constant(value, dtype), dims)

    def giles(v):  # in f32
        c32 = lambda value: c(value, DType.F32)  # noqa: E731
        w = ctx.emit(Op.NEG, ctx.emit(Op.LOG1P, ctx.emit(Op.NEG, ctx.emit(Op.MUL, v, v))))
        small = ctx.emit(Op.LT, w, c32(5.0))
        w = ctx.emit(Op.SELECT_N, small, ctx.emit(Op.SUB, ctx.emit(Op.SQRT, w), c32(3.0)), ctx.emit(Op.SUB, w, c32(2.5)))
        p = None
        for lo, hi in zip(_ERF_INV_SMALL_W, _ERF_INV_LARGE_W):
            k = ctx.emit(Op.SELECT_N, small, c32(hi), c32(lo))
            p = k if p is None else ctx.emit(Op.ADD, k, ctx.emit(Op.MUL, p, w))
        return ctx.emit(Op.MUL, p, v)

    if work is DType.F32:
        result = giles(x)
    else:
        result = _erf_inv_f64(ctx, x, giles, c)
        outside = ctx.emit(Op.GT, ctx.emit(Op.ABS, x), c(1.0))  # NaN, as the f32 log gives
        result = ctx.emit(Op.SELECT_N, outside, result, c(float("nan")))
    edge = ctx.emit(Op.EQ, ctx.emit(Op.ABS, x), c(1.0))
    result = ctx.emit(Op.SELECT_N, edge, result, ctx.emit(Op.MUL, x, c(float("inf"))))
    return ctx.convert(result, out)


def _erf_inv_f64(ctx, x, giles, c):
    """erf_inv in float64, where the tail matters: for |x| <= 0.9, Newton on erf(r) = x from the
    f32 polynomial; past it, Newton on log(erfc(r)) = log(1 - |x|) (1 - |x| is exact there),
    which is nearly quadratic in r, from the asymptotic r^2 = -log(t) - log(r sqrt(pi)). The
    result is as good as erf's and erfc's own, times erf_inv's condition number."""
    near = ctx.emit(Op.CLAMP, c(-0.95), x, c(0.95))  # the central guess stays finite
    central = ctx.convert(giles(ctx.convert(near, DType.F32)), DType.F64)
    for _ in range(3):  # r -= (erf(r) - x) * sqrt(pi)/2 * exp(r^2)
        error = ctx.emit(Op.SUB, ctx.emit(Op.ERF, central), x)
        slope = ctx.emit(Op.MUL, c(0.886226925452758), ctx.emit(Op.EXP, ctx.emit(Op.MUL, central, central)))
        central = ctx.emit(Op.SUB, central, ctx.emit(Op.MUL, error, slope))
    magnitude = ctx.emit(Op.ABS, x)
    t = ctx.emit(Op.SUB, c(1.0), ctx.emit(Op.CLAMP, c(0.5), magnitude, c(1.0 - 2.0**-53)))
    log_t = ctx.emit(Op.LOG, t)
    tail = ctx.emit(Op.SQRT, ctx.emit(Op.NEG, log_t))
    root_pi = c(1.7724538509055159)
    tail = ctx.emit(Op.SQRT, ctx.emit(Op.SUB, ctx.emit(Op.NEG, log_t),
                                      ctx.emit(Op.LOG, ctx.emit(Op.MUL, tail, root_pi))))
    for _ in range(4):  # r += (log(erfc(r)) - log(t)) * erfc(r) * sqrt(pi)/2 * exp(r^2)
        erfc = ctx.emit(Op.ERFC, tail)
        error = ctx.emit(Op.SUB, ctx.emit(Op.LOG, erfc), log_t)
        slope = ctx.emit(Op.MUL, ctx.emit(Op.MUL, erfc, c(0.886226925452758)),
                         ctx.emit(Op.EXP, ctx.emit(Op.MUL, tail, tail)))
        tail = ctx.emit(Op.ADD, tail, ctx.emit(Op.MUL, error, slope))
    signed_tail = ctx.emit(Op.SELECT_N, ctx.emit(Op.LT, x, c(0.0)), tail, ctx.emit(Op.NEG, tail))
    return ctx.emit(Op.SELECT_N, ctx.emit(Op.GT, magnitude, c(0.9)), central, signed_tail)


@rule("nextafter")
def _nextafter(ctx, params, operands):
    """The float next to x toward y, on the bits as XLA expands it: y where x == y, NaN where
    either is NaN, the smallest subnormal of y's sign where x is zero, else x's bits one step
    (as an integer of its width) away from or toward zero."""
    dims = ctx.out.dims
    x, y = (ctx.broadcast_to(v, dims) for v in operands)
    dtype = ctx.out.dtype
    if dtype not in (DType.F32, DType.F64):
        raise FrontendError(f"nextafter on {dtype} at {ctx.loc}: xfuse takes float32 and float64")
    bits = DType.U32 if dtype is DType.F32 else DType.U64

    def c(value, t):
        return ctx.broadcast_to(ctx.constant(value, t), dims)

    xi, yi = ctx.emit(Op.BITCAST_CONVERT, x, dtype=bits), ctx.emit(Op.BITCAST_CONVERT, y, dtype=bits)
    sign = c(1 << (bits.bits - 1), bits)
    magnitude = c((1 << (bits.bits - 1)) - 1, bits)
    x_abs, y_abs = ctx.emit(Op.AND, xi, magnitude), ctx.emit(Op.AND, yi, magnitude)
    x_sign, y_sign = ctx.emit(Op.AND, xi, sign), ctx.emit(Op.AND, yi, sign)
    smaller = ctx.emit(Op.OR, ctx.emit(Op.GT, x_abs, y_abs), ctx.emit(Op.NE, x_sign, y_sign))
    stepped = ctx.emit(Op.SELECT_N, smaller, ctx.emit(Op.ADD, xi, c(1, bits)), ctx.emit(Op.SUB, xi, c(1, bits)))
    from_zero = ctx.emit(Op.OR, y_sign, c(1, bits))
    result = ctx.emit(Op.SELECT_N, ctx.emit(Op.EQ, x_abs, c(0, bits)), stepped, from_zero)
    result = ctx.emit(Op.BITCAST_CONVERT, result, dtype=dtype)
    result = ctx.emit(Op.SELECT_N, ctx.emit(Op.EQ, x, y), result, y)
    nan = ctx.emit(Op.OR, ctx.emit(Op.NE, x, x), ctx.emit(Op.NE, y, y))
    return ctx.emit(Op.SELECT_N, nan, result, c(float("nan"), dtype))


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
    """A pred dot (an OR of ANDs) is counted in s32 and compared with zero."""
    lhs, rhs = operands
    (lc, rc), (lb, rb) = params["dimension_numbers"]
    out = ctx.out.dtype
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
