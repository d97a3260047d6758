"""How far two correct implementations of a fuzz program may disagree, element by element.

The program runs eagerly in jax, one step at a time (each step rounded to its dtype: the
baseline). Alongside, every value carries a `Bound`: `err`, a bound on the distance between
the baseline and any correct implementation, and `wild`, the elements on which correct
implementations may legitimately differ outright (a comparison of two values closer than their
errors, floor of a value within its error of an integer, a division by a value that may be
zero, an overflow that depends on summation order). This is running error analysis:

- inputs are exact, except that XLA:CPU reads subnormal f32/f64/bf16 inputs as zero;
- each step propagates its operands' errors through its own rule (sums of errors for
  additions, derivatives or the function at x +- err for monotone functions, products of
  magnitudes for dots, ...) and adds its own rounding, in ulps per op and dtype (`ULPS`);
- a result that may underflow gains the dtype's smallest normal (XLA flushes subnormals),
  and so does each product of a dot;
- where XLA:CPU departs from jax's documented semantics (min and max reductions that drop a
  NaN) or from the function's value by more than `ULPS` (float64 log1p), the baseline takes
  the documented or float64 value, and jax.jit (and xfuse's jax backend, which runs XLA's
  kernels) is not held to that output;
- non-finite results of inexact finite operands, and finite results within their error of
  the dtype's maximum, are wild; elsewhere NaN, +-inf and (where the error is zero) the sign
  of zero must match exactly. Integers and booleans must match exactly where not wild.

`compare` allows `SAFETY` times the bound: the bound is of one implementation against the
exact result, two implementations may each be off by it.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from scipy import special

from tests.fuzz.programs import NAMESPACE, Program, Step

SAFETY = 4.0
FLUSHED = ("float32", "float64", "bfloat16")  # XLA:CPU runs with DAZ/FTZ; f16 math is in f32
# Rounding, in ulps of the result, per op (f32 and f64; f16 and bf16 math is done in f32 and
# rounded once, within 2 ulps of their own for every op).
ULPS = {"basic": 1, "transcendental": 4, "erf": 8, "pow": 8, "composite": 2}
NARROW_ULPS = 2

MONOTONE = {
    "exp": np.exp, "exp2": np.exp2, "expm1": np.expm1, "log": np.log, "log1p": np.log1p,
    "sqrt": np.sqrt, "rsqrt": lambda x: 1 / np.sqrt(x), "cbrt": np.cbrt, "tanh": np.tanh,
    "logistic": special.expit, "erf": special.erf, "atan": np.arctan,
}
STEPS = {"floor": np.floor, "ceil": np.ceil, "round": np.round, "sign": np.sign}


@dataclass
class Bound:
    err: np.ndarray  # float64, >= 0, zero where the value is not finite
    wild: np.ndarray  # bool
    # The value depends on a step where XLA:CPU departs from jax's documented semantics or is
    # less accurate than `ULPS` (see `_documented`): jax.jit and xfuse's jax backend, which
    # runs XLA's kernels, are not held to this bound; every other engine is.
    xla_departs: bool = False


# ---------------------------------------------------------------------------- helpers
def is_float(dtype) -> bool:
    return np.dtype(dtype).kind == "f" or np.dtype(dtype) == ml_dtypes.bfloat16


def finfo(dtype):
    return ml_dtypes.finfo(np.dtype(dtype))


def wide(x) -> np.ndarray:
    with np.errstate(invalid="ignore", over="ignore"):
        return np.asarray(x).astype(np.float64)


def exact(shape) -> Bound:
    return Bound(np.zeros(shape), np.zeros(shape, bool))


def ulps(kind: str, dtype) -> float:
    narrow = np.dtype(dtype).itemsize == 2
    return min(ULPS[kind], NARROW_ULPS) if narrow else ULPS[kind]


def accumulator(dtype) -> np.dtype:
    """XLA sums and dots f16 and bf16 in f32."""
    return np.dtype(np.float32) if np.dtype(dtype).itemsize == 2 else np.dtype(dtype)


def input_bound(x: np.ndarray) -> Bound:
    b = exact(x.shape)
    if str(x.dtype) in FLUSHED:
        w = wide(x)
        b.err = np.where((w != 0) & (np.abs(w) < float(finfo(x.dtype).smallest_normal)), np.abs(w), 0.0)
    return b


def _inexact(b: Bound) -> np.ndarray:
    return (b.err > 0) | b.wild


def finish(y, err, wild, operands, rounding: str | None, nonzero=None) -> Bound:
    """The bound of result `y`: `err` and `wild` propagated from `operands` (pairs of wide value
    and Bound), plus this op's rounding and the overflow, underflow and non-finite rules.
    `nonzero`: where the exact result may be nonzero (by default: where `y` or an operand is),
    so that a zero `y` may be a flushed subnormal."""
    y = np.asarray(y)
    wild = np.array(np.broadcast_to(wild, y.shape))
    inexact_in = np.zeros(y.shape, bool)
    finite_in = np.ones(y.shape, bool)
    for x, b in operands:
        inexact_in |= np.broadcast_to(_inexact(b), y.shape)
        finite_in &= np.broadcast_to(np.isfinite(x), y.shape)
    if not is_float(y.dtype):
        return Bound(np.zeros(y.shape), wild)
    info = finfo(y.dtype)
    yw = wide(y)
    fin = np.isfinite(yw)
    with np.errstate(invalid="ignore", over="ignore"):
        err = np.array(np.broadcast_to(np.asarray(err, np.float64), y.shape))
        bad = fin & ~np.isfinite(err)
        wild |= bad
        err[bad] = 0.0
        if rounding:
            err += ulps(rounding, y.dtype) * float(info.eps) * np.where(fin, np.abs(yw), 0.0)
            if nonzero is None:
                nonzero = np.zeros(y.shape, bool)
                for x, _ in operands:
                    nonzero = nonzero | np.broadcast_to(x != 0, y.shape)
            small = fin & (np.abs(yw) < float(info.smallest_normal)) & ((yw != 0) | nonzero)
            err += np.where(small, float(info.smallest_normal), 0.0)
        wild |= ~fin & inexact_in & finite_in
        # f16 and bf16 are computed in f32, and a fusion may keep a value in f32 (XLA's
        # excess precision, on by default): an overflow of finite operands may not happen
        wild |= ~fin & finite_in & (str(y.dtype) in ("float16", "bfloat16"))
        wild |= fin & (err > 0) & (np.abs(yw) + err >= float(info.max))
    err[~fin] = 0.0
    return Bound(err, wild)


def _operands(step: Step, values: list[np.ndarray], bounds: list[Bound]):
    """The step's operands as (wide value, Bound), its python literal put in its place."""
    pairs = [(wide(v), b) for v, b in zip(values, bounds)]
    if step.params[:1] == ("literal",):
        _, literal, at = step.params
        pairs.insert(at, (np.float64(literal), exact(())))
    return pairs


def _dtypes(step: Step, values) -> list:
    """The operands' dtypes, aligned with `_operands` (None for the literal)."""
    dtypes = [v.dtype for v in values]
    if step.params[:1] == ("literal",):
        dtypes.insert(step.params[2], None)
    return dtypes


def _promoted(pairs, dtypes, dtype):
    """Operands converted to the result dtype gain its rounding."""
    if not is_float(dtype):
        return pairs
    eps = float(finfo(dtype).eps)
    out = []
    for (x, b), source in zip(pairs, dtypes):
        if source is not None and source != np.dtype(dtype) and source != np.bool_:
            b = Bound(b.err + eps * np.where(np.isfinite(x), np.abs(x), 0.0), b.wild)
        out.append((x, b))
    return out


def _wild_any(pairs) -> np.ndarray:
    out = np.zeros((), bool)
    for _, b in pairs:
        out = out | b.wild
    return out


# ---------------------------------------------------------------------------- rules
def _elementwise(step: Step, values, bounds, y) -> Bound:
    dtypes = _dtypes(step, values)
    pairs = _promoted(_operands(step, values, bounds), dtypes, y.dtype)
    xs = [x for x, _ in pairs]
    es = [b.err for _, b in pairs]
    wild = _wild_any(pairs)
    rule = step.rule
    with np.errstate(all="ignore"):
        if rule in ("same", "maxmin"):
            return finish(y, np.maximum(es[0], es[-1]), wild, pairs, None)
        if rule == "exact":
            return finish(y, 0.0, wild, pairs, None)
        if rule == "add":
            return finish(y, es[0] + es[1], wild, pairs, "basic")
        if rule == "mul":
            err = es[0] * np.abs(xs[1]) + es[1] * np.abs(xs[0]) + es[0] * es[1]
            zero = [(e > 0) & (np.abs(x) <= e) for x, e in zip(xs, es)]  # 0 * inf is NaN
            wild = wild | (zero[0] & np.isinf(xs[1])) | (zero[1] & np.isinf(xs[0]))
            return finish(y, err, wild, pairs, "basic")
        if rule in ("div", "recip"):
            (a, ea), (b, eb) = ((1.0, 0.0), (xs[0], es[0])) if rule == "recip" else zip(xs, es)
            near = (eb > 0) & (np.abs(b) <= eb)
            err = (ea + np.abs(a / b) * eb) / (np.abs(b) - eb)
            return finish(y, np.where(near, 0.0, err), wild | near, pairs, "basic")
        if rule == "square":
            return finish(y, 2 * np.abs(xs[0]) * es[0] + es[0] ** 2, wild, pairs, "basic")
        if rule == "cube":
            x, e = np.abs(xs[0]), es[0]
            return finish(y, 3 * x * x * e + 3 * x * e * e + e**3, wild, pairs, "basic")
        if rule == "monotone":
            name = step.params[0]
            f, x, e = MONOTONE[name], xs[0], es[0]
            mid = f(x)
            err = np.where(e > 0, np.maximum(np.abs(f(x + e) - mid), np.abs(f(x - e) - mid)), 0.0)
            return finish(y, err, wild, pairs, "erf" if name == "erf" else "transcendental")
        if rule == "lipschitz":
            return finish(y, es[0], wild, pairs, "transcendental")
        if rule == "step":
            f, x, e = STEPS[step.params[0]], xs[0], es[0]
            jumps = (e > 0) & (f(x - e) != f(x + e))
            return finish(y, 0.0, wild | jumps, pairs, None)
        if rule == "pow":
            return _pow(y, pairs, wild)
        if rule == "atan2":
            (a, b), (ea, eb) = xs, es
            r, total = np.hypot(a, b), ea + eb
            near = (total > 0) & ((r <= total) | ((b < 0) & (np.abs(a) <= ea)))
            return finish(y, np.where(near, 0.0, total / (r - total)), wild | near, pairs, "transcendental")
        if rule == "jump":
            inexact = np.zeros((), bool)
            for _, b in pairs:
                inexact = inexact | _inexact(b)
            return finish(y, 0.0, wild | inexact, pairs, "composite" if step.params[0] else None)
        if rule == "compare":
            a, b = xs
            ea = np.where(es[0] > 0, es[0] + 2 * _eps_of(dtypes[0]) * np.abs(a), 0.0)
            eb = np.where(es[1] > 0, es[1] + 2 * _eps_of(dtypes[1]) * np.abs(b), 0.0)
            close = (ea + eb > 0) & (np.abs(a - b) <= ea + eb)
            return finish(y, 0.0, wild | close, pairs, None)
        if rule == "where":
            (p, bp), (_, bx), (_, by) = pairs
            p = p != 0
            return finish(y, np.where(p, bx.err, by.err), np.where(p, bx.wild, by.wild) | bp.wild, pairs, None)
    raise AssertionError(f"no bound for rule {rule!r}")


def _eps_of(dtype) -> float:
    return float(finfo(dtype).eps) if dtype is not None and is_float(dtype) else 0.0


def _pow(y, pairs, wild) -> Bound:
    (a, ea), (b, eb) = ((x, bd.err) for x, bd in pairs)
    inexact = (ea > 0) | (eb > 0)
    risky = inexact & (((ea > 0) & (a - ea <= 0)) | ((a < 0) & (eb > 0)))
    mid = np.power(a, b)
    corners = [np.abs(np.power(a + sa * ea, b + sb * eb) - mid) for sa in (-1, 1) for sb in (-1, 1)]
    err = np.where(inexact & ~risky, np.maximum.reduce(corners), 0.0)
    return finish(y, err, wild | risky, pairs, "pow")


def _convert(step: Step, values, bounds, y) -> Bound:
    (x, b), = _operands(step, values, bounds)
    source = values[0].dtype
    target = np.asarray(y).dtype
    with np.errstate(all="ignore"):
        if is_float(source) and not is_float(target):
            if target == np.bool_:
                jumps = (b.err > 0) & (np.abs(x) <= b.err)
            else:
                info = np.iinfo(target)
                lo = np.clip(np.trunc(x - b.err), info.min, info.max)
                hi = np.clip(np.trunc(x + b.err), info.min, info.max)
                jumps = (b.err > 0) & (lo != hi)
            return finish(y, 0.0, b.wild | jumps, [(x, b)], None)
        narrowing = is_float(target) and (not is_float(source) or finfo(target).eps > finfo(source).eps)
        return finish(y, b.err, b.wild, [(x, b)], "basic" if narrowing else None)


def _reduced(a: np.ndarray, axes, keep, fn=np.sum) -> np.ndarray:
    return fn(a, axis=axes, keepdims=keep)


def _reduction(step: Step, values, bounds, y) -> Bound:
    (x, b), = _operands(step, values, bounds)
    axes, keep = step.params
    wild = _reduced(b.wild, axes, keep, np.any)
    out = np.asarray(y)
    if step.rule == "exact_reduce" and is_float(x.dtype):  # any/all of x != 0
        wild = wild | _reduced((b.err > 0) & (np.abs(x) <= b.err), axes, keep, np.any)
    if not is_float(out.dtype) or step.rule == "exact_reduce":
        return finish(out, 0.0, wild, [], None)
    n = int(np.prod([x.shape[a] for a in axes]))
    acc = finfo(accumulator(out.dtype))
    fin = np.isfinite(x)
    mag = np.where(fin, np.abs(x), 0.0)
    with np.errstate(all="ignore"):
        if step.rule in ("sum", "mean"):
            total = _reduced(mag, axes, keep)
            signed = np.abs(_reduced(np.where(fin, x, 0.0), axes, keep))
            err = _reduced(b.err, axes, keep) + (n + 2) * float(acc.eps) * total
            wild |= (total >= float(acc.max)) & (signed < total * (1 - 1e-6))
            if step.rule == "mean":
                # a sum past the maximum may still have a finite mean (XLA rewrites the mean
                # of a broadcast, or accumulates wider): either answer is right
                wild |= total >= float(acc.max)
                err = err / max(n, 1)
            err = _free_zero_sign(out, err)
            return finish(out, err, wild, [], "basic", nonzero=total > 0)
        if step.rule == "prod":
            upper = _reduced(mag + b.err, axes, keep, np.prod)
            err = upper - _reduced(mag, axes, keep, np.prod) + n * float(acc.eps) * upper
            logs = np.log2(np.where(fin & (x != 0), np.abs(x), 1.0))
            big = _reduced(np.maximum(logs, 0), axes, keep)
            small = _reduced(np.minimum(logs, 0), axes, keep)
            top, bottom = np.log2(float(acc.max)), np.log2(float(acc.smallest_normal))
            wild |= ((big > top) & (big + small < top)) | ((small < bottom) & (big + small > bottom))
            # the order of a product is free: a zero times partial products past the maximum
            # may be 0 * inf (NaN), an infinity times partial products below the smallest
            # normal may be inf * 0
            zero = _reduced(fin & (x == 0), axes, keep, np.any)
            infinite = _reduced(np.isinf(x), axes, keep, np.any)
            wild |= (zero & (big > top)) | (infinite & (small < bottom))
            nonfinite = _reduced(~fin, axes, keep, np.any)
            maybe_zero = _reduced((b.err > 0) & (np.abs(x) <= b.err), axes, keep, np.any)
            wild |= nonfinite & maybe_zero
            return finish(out, err, wild, [], "basic", nonzero=upper > 0)
        if step.rule == "reduce_maxmin":
            err = _reduced(b.err, axes, keep, np.max) if n else 0.0
            zero = x == 0
            both = _reduced(zero & np.signbit(x), axes, keep, np.any) & _reduced(zero & ~np.signbit(x), axes, keep, np.any)
            err = np.where(both & (wide(out) == 0), np.maximum(err, float(finfo(out.dtype).smallest_subnormal)), err)
            return finish(out, err, wild, [], None)
    raise AssertionError(step.rule)


def _arg(step: Step, values, bounds, y) -> Bound:
    (x, b), = _operands(step, values, bounds)
    axis, keep = step.params
    out = np.asarray(y)
    wild = np.any(b.wild, axis=axis, keepdims=keep)
    if is_float(values[0].dtype):
        xs = -x if "argmin" in step.expr else x
        e = np.moveaxis(b.err, axis, -1)
        xs = np.moveaxis(xs, axis, -1)
        with np.errstate(invalid="ignore"):
            top = np.max(np.where(np.isnan(xs), -np.inf, xs), axis=-1, keepdims=True)
            reach = np.max(e, axis=-1, keepdims=True) if xs.shape[-1] else 0.0
            rivals = np.sum(xs + e >= top - reach, axis=-1)
        ambiguous = (rivals > 1) & np.any(e > 0, axis=-1) & ~np.any(np.isnan(xs), axis=-1)
        if keep:
            ambiguous = np.expand_dims(ambiguous, axis)
        wild = wild | ambiguous
    return finish(out, 0.0, wild, [], None)


def _dot(step: Step, values, bounds, y) -> Bound:
    (a, ba), (b, bb) = _operands(step, values, bounds)
    spec = step.params[0]
    out = np.asarray(y)
    ein = lambda p, q: np.einsum(spec, p, q)  # noqa: E731
    wild = ein(ba.wild.astype(float), np.ones_like(b)) + ein(np.ones_like(a), bb.wild.astype(float)) > 0
    if not is_float(out.dtype):
        return finish(out, 0.0, wild, [], None)
    fa, fb = np.isfinite(a), np.isfinite(b)
    ma, mb = np.where(fa, np.abs(a), 0.0), np.where(fb, np.abs(b), 0.0)
    with np.errstate(all="ignore"):
        magnitude = ein(ma, mb)
        k = _contracted(spec, a.shape)
        acc = finfo(accumulator(out.dtype))
        err = ein(ma, bb.err) + ein(ba.err, mb) + ein(ba.err, bb.err) + (k + 2) * float(acc.eps) * magnitude
        # each product that lands below the smallest normal may be flushed to zero (XLA:CPU)
        err = err + k * float(acc.smallest_normal)
        wild |= magnitude >= float(acc.max) / 2
        small_a = ((ba.err > 0) & (np.abs(a) <= ba.err)).astype(float)
        small_b = ((bb.err > 0) & (np.abs(b) <= bb.err)).astype(float)
        wild |= ein(small_a, (~fb).astype(float)) + ein((~fa).astype(float), small_b) > 0
        err = _free_zero_sign(out, err)
    return finish(out, err, wild, [], "basic", nonzero=magnitude > 0)


def _free_zero_sign(out: np.ndarray, err) -> np.ndarray:
    """A zero sum may have either sign: XLA starts some reductions from +0.0 and others from
    the first term (and turns a one-term dot into a product). The smallest error frees it."""
    tiny = float(finfo(out.dtype).smallest_subnormal)
    return np.where(wide(out) == 0, np.maximum(err, tiny), err)


def _contracted(spec: str, a_shape) -> int:
    inputs, result = spec.split("->")
    left = inputs.split(",")[0]
    return int(np.prod([d for letter, d in zip(left, a_shape) if letter not in result]))


_NUMPY_LAYOUT = dict(NAMESPACE, jnp=np)


def _layout(step: Step, values, bounds, y) -> Bound:
    env = dict(zip(step.operands, (b.err for b in bounds)))
    err = eval(step.expr, _NUMPY_LAYOUT, env)
    env = dict(zip(step.operands, (b.wild for b in bounds)))
    wild = eval(step.expr, _NUMPY_LAYOUT, env)
    return Bound(np.asarray(err, np.float64), np.asarray(wild, bool))


RULES = {
    "convert": _convert, "sum": _reduction, "mean": _reduction, "prod": _reduction,
    "reduce_maxmin": _reduction, "exact_reduce": _reduction, "arg": _arg, "dot": _dot,
    "layout": _layout,
}


# ---------------------------------------------------------------------------- running
def evaluate(program: Program, inputs) -> tuple[list[np.ndarray], list[Bound]]:
    """The program's outputs run eagerly step by step, and their bounds."""
    with jax.enable_x64(program.x64):
        env = {v.name: jnp.asarray(a) for v, a in zip(program.inputs, inputs)}
        bounds = {v.name: input_bound(np.asarray(a)) for v, a in zip(program.inputs, inputs)}
        for step in program.steps:
            operands = {n: env[n] for n in step.operands}
            y = eval(step.expr, NAMESPACE, operands)
            documented = _documented(step, operands, y)
            env[step.out.name] = documented
            values = [np.asarray(env[n]) for n in step.operands]
            rule = RULES.get(step.rule, _elementwise)
            bound = rule(step, values, [bounds[n] for n in step.operands], np.asarray(documented))
            bound.xla_departs = documented is not y or any(bounds[n].xla_departs for n in step.operands)
            bounds[step.out.name] = bound
        return [np.asarray(env[n]) for n in program.outputs], [bounds[n] for n in program.outputs]


def _documented(step: Step, operands: dict, y):
    """`y`, or where XLA:CPU departs from jax's documented semantics, the documented value.

    Known departure: XLA:CPU's min and max reductions over an axis of a matrix can drop NaN
    and more (a float32[33, 130] min over axis 0 whose column holds two NaNs and -65504 gave
    -9.46, over the whole column NaN). lax.reduce_min documents NaN propagation, so these steps
    are computed by numpy in float64, exactly, and rounded back (min and max are exact)."""
    if step.rule == "monotone" and str(y.dtype) == "float64" and step.params[0] != "exp2":
        return _accurate(step, operands, y)  # (jax defines exp2 as exp(log(2) * x))
    if step.rule in ("add", "mul", "div") and is_float(y.dtype) and len(operands) == 2 \
            and any(np.asarray(v).dtype == np.bool_ for v in operands.values()):
        return _with_a_boolean(step, operands, y)
    if step.rule != "reduce_maxmin" or not is_float(y.dtype):
        return y
    (x,) = operands.values()
    axes, keep = step.params
    fn = np.min if "jnp.min(" in step.expr else np.max
    with np.errstate(invalid="ignore"):
        exact = fn(wide(x), axis=axes, keepdims=keep).astype(y.dtype) if x.size else np.asarray(y)
    got = np.asarray(y)
    same = (exact == got) | (np.isnan(exact) & np.isnan(got))
    return y if same.all() else jnp.asarray(exact)


def _with_a_boolean(step: Step, operands: dict, y):
    """`y`, or IEEE arithmetic where XLA:CPU's simplifier rewrote an operation with a boolean
    (converted to 0 or 1) into a select: `x * b` as select(b, x, 0) gives +0.0 for a negative x
    (and 0 for NaN or inf) where b is False, in f16, f32 and f64. Computed in float64, where a
    sum, product or quotient of the two values rounds to the dtype as the dtype's own would."""
    a, b = (wide(v) for v in operands.values())
    op = {"add": np.add if "+" in step.expr else np.subtract, "mul": np.multiply, "div": np.divide}[step.rule]
    got = np.asarray(y)
    with np.errstate(all="ignore"):
        exact = op(a, b).astype(got.dtype)
    same = ((exact == got) & (np.signbit(wide(exact)) == np.signbit(wide(got)))) \
        | (np.isnan(wide(exact)) & np.isnan(wide(got)))
    return y if same.all() else jnp.asarray(exact)


def _accurate(step: Step, operands: dict, y):
    """`y`, or where it is further from the function's float64 value (numpy, scipy) than the
    ulps allowed, that value: XLA:CPU's float64 log1p was found 128 ulps off near -0.41."""
    (x,) = (wide(v) for v in operands.values())
    name = step.params[0]
    got = np.asarray(y)
    with np.errstate(all="ignore"):
        exact = MONOTONE[name](x).astype(got.dtype)
        info = finfo(got.dtype)
        room = ulps("erf" if name == "erf" else "transcendental", got.dtype) * float(info.eps)
        allowed = room * np.abs(wide(exact)) + float(info.smallest_normal)
        near = np.abs(wide(got) - wide(exact)) <= allowed
    same = (exact == got) | (np.isnan(wide(exact)) & np.isnan(wide(got))) | near
    normal = (x == 0) | ~(np.abs(x) < float(info.smallest_normal))  # XLA reads subnormals as 0
    far = ~same & normal
    return jnp.asarray(np.where(far, exact, got)) if far.any() else y


def compare(got, want: np.ndarray, bound: Bound) -> np.ndarray:
    """Elements of `got` outside the bound around `want` (True where they disagree)."""
    got = np.asarray(got)
    if got.shape != want.shape or got.dtype != want.dtype:
        return np.ones(want.shape or (1,), bool)
    if not is_float(want.dtype):
        return (got != want) & ~bound.wild
    g, w = wide(got), wide(want)
    fin_g, fin_w = np.isfinite(g), np.isfinite(w)
    with np.errstate(invalid="ignore", over="ignore"):
        ok = fin_g & fin_w & (np.abs(g - w) <= SAFETY * bound.err)
        zero = (g == 0) & (w == 0) & (bound.err == 0)
        ok &= ~zero | (np.signbit(g) == np.signbit(w))
        ok |= np.isnan(g) & np.isnan(w)
        ok |= ~fin_w & ~np.isnan(w) & (g == w)
    return ~(ok | bound.wild)
