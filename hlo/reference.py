"""numpy reference implementations of every op, with `jax.lax` semantics to the bit where it can.

Each function is `ref(operands, attrs, shape) -> np.ndarray`. Transcendentals are computed in
float64 and rounded once, so the reference is at least as exact as XLA's (exp2 is first
rewritten to exp(log(2) * x) in x's dtype, as jax lowers it). Integer division and
remainder round toward zero (x/0 = -1, x%0 = x), shifts past the bit width give 0 (or the sign),
float->int conversion saturates with NaN -> 0, max/min propagate NaN and order -0.0 < +0.0,
reductions of empty axes give the identity. One departure: XLA:CPU flushes subnormals to zero,
the reference keeps IEEE gradual underflow. Imports numpy only.
"""

from __future__ import annotations

import math

import numpy as np

from .dtypes import DType, Shape

F64 = np.float64


def _dtype(shape: Shape) -> np.dtype:
    return shape.dtype.numpy


def _is_float(a: np.ndarray) -> bool:
    return DType.from_numpy(a.dtype).is_float


# ---------------------------------------------------------------------------- elementwise
def via_f64(fn):
    """A float function computed in float64 and rounded once to the result dtype."""

    def ref(ops, attrs, shape):
        args = [np.asarray(a, F64) if _is_float(a) else a for a in ops]
        return np.asarray(fn(*args)).astype(_dtype(shape))

    return ref


def native(fn):
    """An exactly rounded op (add, mul, ...) computed in the operands' own dtype."""

    def ref(ops, attrs, shape):
        return np.asarray(fn(*ops)).astype(_dtype(shape), copy=False)

    return ref


def sign(ops, attrs, shape):
    (x,) = ops
    if not _is_float(x):
        return np.sign(x)
    return np.where((x == 0) | np.isnan(x), x, np.sign(x)).astype(x.dtype)


def round_(ops, attrs, shape):
    (x,) = ops
    if attrs["rounding_method"] == "to_nearest_even":
        return np.rint(x)
    t = np.trunc(x)
    with np.errstate(invalid="ignore"):
        away = np.abs(x - t) >= 0.5
    return np.where(away, t + np.sign(x), t).astype(x.dtype)


_erf = np.frompyfunc(math.erf, 1, 1)


def erf(x):
    return np.asarray(_erf(x), dtype=F64)  # frompyfunc gives a Python float for 0-d input


_erfc = np.frompyfunc(math.erfc, 1, 1)


def erfc(x):
    return np.asarray(_erfc(x), dtype=F64)


def exp2(ops, attrs, shape):
    """jax lowers exp2 to exp(log(2) * x), with log(2) and the product rounded to x's dtype."""
    (x,) = ops
    scaled = np.asarray(np.log(2.0), x.dtype) * x
    return np.exp(np.asarray(scaled, F64)).astype(x.dtype)


def logistic(x):
    return 1.0 / (1.0 + np.exp(-x))


def not_(ops, attrs, shape):
    (x,) = ops
    return np.logical_not(x) if x.dtype == np.bool_ else np.invert(x)


def integer_pow(ops, attrs, shape):
    """Binary exponentiation in the operand's dtype, as XLA expands it."""
    (x,) = ops
    y = attrs["y"]
    reciprocal, y = y < 0, abs(y)
    acc = None
    while y > 0:
        if y & 1:
            acc = x if acc is None else acc * x
        y >>= 1
        if y > 0:
            x = x * x
    if acc is None:
        acc = np.ones_like(x)
    return (np.asarray(1, acc.dtype) / acc).astype(acc.dtype) if reciprocal else acc


def _signed_min(dtype: np.dtype):
    return np.iinfo(dtype).min if np.issubdtype(dtype, np.signedinteger) else None


def div(ops, attrs, shape):
    x, y = ops
    if _is_float(x):
        return x / y
    return _int_div_rem(x, y)[0]


def rem(ops, attrs, shape):
    x, y = ops
    if _is_float(x):
        return np.fmod(x, y)
    return _int_div_rem(x, y)[1]


def _int_div_rem(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Division rounding toward zero; x/0 = -1 (all ones), x%0 = x, MIN/-1 = MIN, MIN%-1 = 0."""
    zero = y == 0
    lo = _signed_min(x.dtype)
    overflow = (x == lo) & (y == -1) if lo is not None else np.zeros_like(zero)
    safe = np.where(zero | overflow, np.ones_like(y), y)
    q = x // safe
    r = x - q * safe
    if lo is not None:  # floor -> trunc
        fix = (r != 0) & ((r < 0) != (x < 0))  # a truncated remainder has x's sign
        q = np.where(fix, q + 1, q)
        r = np.where(fix, r - safe, r)
    q = np.where(zero, np.asarray(-1).astype(x.dtype), q)
    r = np.where(zero, x, r)
    return q.astype(x.dtype), r.astype(x.dtype)


def pow_(ops, attrs, shape):
    x, y = ops
    return np.power(np.asarray(x, F64), np.asarray(y.astype(x.dtype), F64)).astype(x.dtype)


def maximum(x, y):
    if x.dtype == np.bool_:
        return np.logical_or(x, y)
    r = np.maximum(x, y)
    return np.where((x == 0) & (y == 0), x + y, r).astype(x.dtype) if _is_float(x) else r


def minimum(x, y):
    if x.dtype == np.bool_:
        return np.logical_and(x, y)
    r = np.minimum(x, y)
    return np.where((x == 0) & (y == 0), -((-x) + (-y)), r).astype(x.dtype) if _is_float(x) else r


def _shift(kind: str):
    def ref(ops, attrs, shape):
        x, y = ops
        bits = x.dtype.itemsize * 8
        unsigned = np.dtype(f"u{x.dtype.itemsize}")
        signed = np.dtype(f"i{x.dtype.itemsize}")
        amount = y.view(unsigned)
        past = amount >= bits
        safe = np.where(past, 0, amount).astype(unsigned)
        if kind == "left":
            out = np.left_shift(x.view(unsigned), safe).view(x.dtype)
            return np.where(past, np.zeros_like(x), out)
        if kind == "logical":
            out = np.right_shift(x.view(unsigned), safe).view(x.dtype)
            return np.where(past, np.zeros_like(x), out)
        xs = x.view(signed)
        out = np.right_shift(xs, np.where(past, bits - 1, safe).astype(signed))
        return out.view(x.dtype)

    return ref


def select_n(ops, attrs, shape):
    which, *cases = ops
    if len(cases) == 1:
        return np.array(cases[0])
    which = np.clip(which, 0, len(cases) - 1)  # XLA clamps a selector out of range
    result = cases[0]
    for i, case in enumerate(cases[1:], start=1):
        result = np.where(which == i, case, result)
    return np.array(result, dtype=cases[0].dtype)


def clamp(ops, attrs, shape):
    lo, x, hi = ops
    return minimum(maximum(x, np.broadcast_to(lo, x.shape)), np.broadcast_to(hi, x.shape))


def convert(ops, attrs, shape):
    (x,) = ops
    to = shape.dtype
    if to.is_pred:
        return x != 0
    if to.is_integer and _is_float(x):
        bits = to.bits
        lo, hi = (-(2.0 ** (bits - 1)), 2.0 ** (bits - 1)) if to.is_signed else (0.0, 2.0**bits)
        info = np.iinfo(to.numpy)
        xf = np.asarray(x, F64)
        inside = (xf >= lo) & (xf < hi)
        out = np.where(inside, np.trunc(np.where(inside, xf, 0.0)), 0.0).astype(to.numpy)
        out = np.where(xf >= hi, np.asarray(info.max, to.numpy), out)
        return np.where(xf < lo, np.asarray(info.min, to.numpy), out)
    # XLA rounds an integer to a float once (s64 -> f64 -> f32 would round twice), but goes
    # through f32 for integer -> bf16 and for f64 -> bf16 and f64 -> f16.
    if to.is_float and x.dtype.kind in "iu":
        return x.astype(np.float32 if to is DType.BF16 else to.numpy).astype(to.numpy)
    if to in (DType.F16, DType.BF16) and x.dtype == F64:
        return x.astype(np.float32).astype(to.numpy)
    return x.astype(to.numpy)


# ---------------------------------------------------------------------------- leaves, movement
def constant(ops, attrs, shape):
    return np.array(attrs["value"].array)


def bitcast_convert(ops, attrs, shape):
    (x,) = ops
    return np.ascontiguousarray(x).view(_dtype(shape))


def iota(ops, attrs, shape):
    dim = attrs["dimension"]
    ramp = np.arange(shape.dims[dim]).reshape([-1 if i == dim else 1 for i in range(shape.rank)])
    return np.broadcast_to(ramp, shape.dims).astype(_dtype(shape))


def broadcast_in_dim(ops, attrs, shape):
    (x,) = ops
    dims = attrs["dims"]
    expanded = [1] * shape.rank
    for i, d in enumerate(dims):
        expanded[d] = x.shape[i]
    return np.array(np.broadcast_to(x.reshape(expanded), shape.dims))


def reshape(ops, attrs, shape):
    return ops[0].reshape(shape.dims).copy()


def transpose(ops, attrs, shape):
    return np.ascontiguousarray(np.transpose(ops[0], attrs["permutation"]))


def slice_(ops, attrs, shape):
    index = tuple(slice(s, l, st) for s, l, st in zip(attrs["start"], attrs["limit"], attrs["strides"]))
    return ops[0][index].copy()


def _clamped_starts(indices, dims, sizes) -> list[int]:
    return [int(min(max(int(i), 0), d - s)) for i, d, s in zip(indices, dims, sizes)]


def dynamic_slice(ops, attrs, shape):
    x, *indices = ops
    starts = _clamped_starts(indices, x.shape, shape.dims)
    return x[tuple(slice(s, s + n) for s, n in zip(starts, shape.dims))].copy()


def dynamic_update_slice(ops, attrs, shape):
    x, update, *indices = ops
    starts = _clamped_starts(indices, x.shape, update.shape)
    out = x.copy()
    out[tuple(slice(s, s + n) for s, n in zip(starts, update.shape))] = update
    return out


def concatenate(ops, attrs, shape):
    return np.concatenate(ops, axis=attrs["dimension"])


def pad(ops, attrs, shape):
    x, value = ops
    out = x
    for axis, (lo, hi, it) in enumerate(zip(attrs["low"], attrs["high"], attrs["interior"])):
        d = out.shape[axis]
        size = d + max(0, d - 1) * it
        grown = np.full(out.shape[:axis] + (size,) + out.shape[axis + 1 :], value, dtype=x.dtype)
        index = [slice(None)] * out.ndim
        index[axis] = slice(0, size, it + 1)
        grown[tuple(index)] = out
        before = [(0, 0)] * out.ndim
        before[axis] = (max(lo, 0), max(hi, 0))
        grown = np.pad(grown, before, constant_values=value)
        crop = [slice(None)] * out.ndim
        crop[axis] = slice(max(-lo, 0), grown.shape[axis] - max(-hi, 0))
        out = grown[tuple(crop)]
    return np.array(out, dtype=x.dtype)


def rev(ops, attrs, shape):
    return np.flip(ops[0], attrs["dimensions"]).copy()


# ---------------------------------------------------------------------------- reductions
def reduce_sum(ops, attrs, shape):
    (x,) = ops
    axes = tuple(attrs["axes"])
    if not axes:  # XLA returns the operand as it is (-0.0 stays -0.0)
        return x.copy()
    if _is_float(x):
        return np.sum(np.asarray(x, F64), axis=axes).astype(x.dtype)
    return np.sum(x, axis=axes, dtype=x.dtype)


def reduce_prod(ops, attrs, shape):
    (x,) = ops
    axes = tuple(attrs["axes"])
    if _is_float(x):
        return np.prod(np.asarray(x, F64), axis=axes).astype(x.dtype)
    return np.prod(x, axis=axes, dtype=x.dtype)


def _reduce_extreme(largest: bool):
    def ref(ops, attrs, shape):
        (x,) = ops
        axes = tuple(attrs["axes"])
        if x.dtype == np.bool_:
            fn = np.logical_or if largest else np.logical_and
            return fn.reduce(x, axis=axes, initial=not largest)
        if not _is_float(x):
            info = np.iinfo(x.dtype)
            fn = np.maximum if largest else np.minimum
            return fn.reduce(x, axis=axes, initial=info.min if largest else info.max)
        wide = np.asarray(x, np.float32) if x.dtype.itemsize < 4 else x
        fn = np.maximum if largest else np.minimum
        r = fn.reduce(wide, axis=axes, initial=-np.inf if largest else np.inf)
        zeros = wide == 0
        # -0.0 < +0.0: max is +0.0 if any +0.0 is present, min is -0.0 if any -0.0 is.
        wanted = zeros & (np.signbit(wide) != largest)
        has = np.any(wanted, axis=axes)
        signed_zero = np.where(has == largest, 0.0, -0.0).astype(wide.dtype)
        return np.where(r == 0, signed_zero, r).astype(x.dtype)

    return ref


def _reduce_bits(conjunction: bool):
    def ref(ops, attrs, shape):
        (x,) = ops
        axes = tuple(attrs["axes"])
        if x.dtype == np.bool_:
            fn = np.logical_and if conjunction else np.logical_or
            return fn.reduce(x, axis=axes, initial=conjunction)
        fn = np.bitwise_and if conjunction else np.bitwise_or
        identity = np.invert(np.zeros((), x.dtype)) if conjunction else np.zeros((), x.dtype)
        return fn.reduce(x, axis=axes, initial=identity)

    return ref


def _arg_reduce(fn):
    def ref(ops, attrs, shape):
        (x,) = ops
        wide = np.asarray(x, np.float32) if x.dtype.itemsize < 4 and _is_float(x) else x
        return fn(wide, axis=attrs["axis"]).astype(_dtype(shape))

    return ref


def dot_general(ops, attrs, shape):
    lhs, rhs = ops
    (lc, rc), (lb, rb) = attrs["contracting"], attrs["batch"]
    letters = iter("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
    lhs_sub = [next(letters) for _ in range(lhs.ndim)]
    rhs_sub = [next(letters) for _ in range(rhs.ndim)]
    for a, b in zip(list(lc) + list(lb), list(rc) + list(rb)):
        rhs_sub[b] = lhs_sub[a]
    out = [lhs_sub[i] for i in lb]
    out += [s for i, s in enumerate(lhs_sub) if i not in lc and i not in lb]
    out += [s for i, s in enumerate(rhs_sub) if i not in rc and i not in rb]
    spec = f"{''.join(lhs_sub)},{''.join(rhs_sub)}->{''.join(out)}"
    wide = F64 if shape.dtype.is_float else _dtype(shape)
    if not lc:  # nothing summed: each element is one product, its zero's sign kept (as XLA)
        lfree = [i for i in range(lhs.ndim) if i not in lb]
        rfree = [i for i in range(rhs.ndim) if i not in rb]
        a = np.transpose(lhs.astype(wide), [*lb, *lfree]).reshape(
            [lhs.shape[i] for i in (*lb, *lfree)] + [1] * len(rfree))
        b = np.transpose(rhs.astype(wide), [*rb, *rfree]).reshape(
            [rhs.shape[i] for i in rb] + [1] * len(lfree) + [rhs.shape[i] for i in rfree])
        return np.asarray(a * b).astype(_dtype(shape))
    result = np.einsum(spec, lhs.astype(wide), rhs.astype(wide))
    return np.asarray(result).astype(_dtype(shape))


# ---------------------------------------------------------------------------- tuples
def tuple_(ops, attrs, shape):
    return tuple(ops)


def get_tuple_element(ops, attrs, shape):
    return ops[0][attrs["index"]]


REDUCE_MAX = _reduce_extreme(largest=True)
REDUCE_MIN = _reduce_extreme(largest=False)
REDUCE_AND = _reduce_bits(conjunction=True)
REDUCE_OR = _reduce_bits(conjunction=False)
ARGMAX = _arg_reduce(np.argmax)
ARGMIN = _arg_reduce(np.argmin)
SHIFT_LEFT = _shift("left")
SHIFT_RIGHT_LOGICAL = _shift("logical")
SHIFT_RIGHT_ARITHMETIC = _shift("arithmetic")
