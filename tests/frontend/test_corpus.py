"""End to end: a corpus of realistic JAX functions, each run through `xfuse.jit` and `jax.jit` on
random inputs and on edge inputs (NaN, +-inf, -0.0, large and small magnitudes, integer extremes),
and a check that the corpus exercises every rule in `xfuse.frontend.RULES`.

XLA's result is `got`, the reference interpreter's `want` (as `tests/tolerances.py` has it).
Integers and booleans match exactly; floats within the case's tolerance. NORMWISE cases (chains of
reductions and dots) measure the error against the largest finite magnitude of each output, since
summation order alone moves small elements of such outputs by more than a few ulps.
Edge pools stay clear of values whose result depends on summation order in f32 versus the
reference's f64 (a sum of terms that overflow f32, or a product of huge and tiny factors).
The file runs past the usual module length because the corpus is one table, read top to bottom.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.extend import core as jax_core

import xfuse
from xfuse.frontend import RULES
from xfuse.hlo import DType
from tests.tolerances import (
    EXACT,
    TRANSCENDENTAL,
    Tolerance,
    assert_close,
    flush_subnormals,
)

F16, BF16, F32, F64 = DType.F16, DType.BF16, DType.F32, DType.F64
NORMWISE = Tolerance("normwise", relative={F16: 4e-3, BF16: 3e-2, F32: 1e-5, F64: 1e-13})
# The same with the sign of a zero free, as for ACCUMULATION, where a zero that a sum of zeros
# reaches keeps the +0.0 XLA starts some reduction loops from (cross_entropy_grad: XLA negates
# a sum of -0.0s into -0.0 where the reference sums +0.0s).
NORMWISE_ANY_ZERO = dataclasses.replace(NORMWISE, name="normwise, any zero", signed_zeros=False)
# Short chains of elementwise ops, and erf/erfc: XLA's f32 erfc was measured up to 6 ulps off for
# |x| < 4 (and up to 64 ulps in its tail, 5 < x < 9, which the inputs here stay out of).
COMPOSITE = Tolerance("composite", ulps={F16: 4, BF16: 4, F32: 16, F64: 16})
# pow(x, y) and its integer-exponent forms: XLA's powf is good to a few ulps of the exact value.
POW = Tolerance("pow", ulps={F16: 2, BF16: 2, F32: 8, F64: 8})

bf16 = jnp.bfloat16


# ---------------------------------------------------------------------------- inputs
def _sprinkle(rng: np.random.Generator, x: np.ndarray, pool: list) -> np.ndarray:
    """`x` with pool values written at random places: each value once where there is room,
    further picks up to half the elements."""
    flat = x.reshape(-1).copy()
    pool = [pool[i] for i in rng.permutation(len(pool))]
    count = min(flat.size, max(len(pool), flat.size // 2))
    places = rng.permutation(flat.size)[:count]
    picks = [pool[i] if i < len(pool) else pool[rng.integers(len(pool))] for i in range(count)]
    wide = np.float64 if x.dtype.kind == "f" or x.dtype == bf16 else np.int64
    with np.errstate(over="ignore", invalid="ignore"):
        flat[places] = np.asarray(picks, wide).astype(x.dtype)
    return flat.reshape(x.shape)


def floats(
    rng: np.random.Generator,
    edge: bool,
    shape: tuple[int, ...],
    dtype=np.float32,
    *,
    scale: float = 1.0,
    special: bool = True,
    large: bool = True,
    small: bool = True,
    extreme: bool = False,
    subnormal: bool = False,
) -> np.ndarray:
    """Normal samples; with `edge`, mixed with the chosen edge values of `dtype`:
    special (NaN, +-inf, +-0), large (max**0.4) and small (smallest normal**0.4) magnitudes, whose
    products stay finite and normal, extreme ones (+-max, +-the smallest normal) and subnormals."""
    x = (rng.standard_normal(shape) * scale).astype(dtype)
    if not edge:
        return x
    info = jnp.finfo(dtype)
    top, bottom = float(info.max), float(info.smallest_normal)
    pool = [-0.0, 0.0, 1.0, -1.0, 0.5, -2.5]
    if special:
        pool += [math.nan, math.inf, -math.inf]
    if large:
        pool += [top**0.4, -(top**0.4)]
    if small:
        pool += [bottom**0.4, -(bottom**0.4)]
    if extreme:
        pool += [top, -top, bottom, -bottom]
    if subnormal:
        pool += [bottom / 4, -bottom / 2]
    return _sprinkle(rng, x, pool)


def integers(
    rng: np.random.Generator,
    edge: bool,
    shape: tuple[int, ...],
    dtype=np.int32,
    *,
    low: int = -20,
    high: int = 20,
    extreme: bool = True,
) -> np.ndarray:
    """Uniform integers in [low, high]; with `edge`, mixed with 0, +-1 and the dtype's extremes."""
    info = np.iinfo(dtype)
    x = rng.integers(max(low, info.min), min(high, info.max), shape, endpoint=True).astype(dtype)
    if not edge:
        return x
    pool = [0, 1, 2] + ([-1, -2] if info.min < 0 else [])
    if extreme:
        pool += [int(info.min), int(info.max), int(info.min) + 1, int(info.max) - 1]
    return _sprinkle(rng, x, pool)


def booleans(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    return rng.random(shape) < 0.5


# ---------------------------------------------------------------------------- the corpus
Inputs = Callable[[np.random.Generator, bool], tuple]


@dataclass(frozen=True)
class Case:
    """One corpus function: `inputs(rng, edge)` gives its positional arguments, `static` its
    static keyword arguments; `tolerance` applies to its float outputs."""

    name: str
    fun: Callable
    inputs: Inputs
    tolerance: Tolerance
    static: dict = field(default_factory=dict)


CORPUS: dict[str, Case] = {}


def case(inputs: Inputs, tolerance: Tolerance = NORMWISE, **static: object):
    def register(fun: Callable) -> Callable:
        assert fun.__name__ not in CORPUS, fun.__name__
        CORPUS[fun.__name__] = Case(fun.__name__, fun, inputs, tolerance, static)
        return fun

    return register


# --- MLP layers: x @ w + b and an activation
def mlp_inputs(rng, edge, dtype=np.float32):
    x = floats(rng, edge, (4, 8), dtype)
    w = floats(rng, False, (8, 16), dtype, scale=0.35)
    b = floats(rng, edge, (16,), dtype, scale=0.1, large=False)
    return x, w, b


@case(mlp_inputs)
def mlp_relu(x, w, b):
    return jax.nn.relu(x @ w + b)


@case(mlp_inputs)
def mlp_gelu_tanh(x, w, b):
    return jax.nn.gelu(x @ w + b, approximate=True)


@case(mlp_inputs)
def mlp_gelu_erf(x, w, b):
    return jax.nn.gelu(x @ w + b, approximate=False)


@case(mlp_inputs)
def mlp_silu(x, w, b):
    return jax.nn.silu(x @ w + b)


@case(mlp_inputs)
def mlp_sigmoid(x, w, b):
    return jax.nn.sigmoid(jnp.dot(x, w) + b)


@case(mlp_inputs)
def mlp_softplus(x, w, b):
    return jax.nn.softplus(x @ w + b)


@case(lambda r, e: (*mlp_inputs(r, e), floats(r, False, (16, 3), scale=0.25)))
def mlp_tanh_two_layers(x, w, b, w_out):
    return jnp.tanh(x @ w + b) @ w_out


@case(lambda r, e: mlp_inputs(r, e, bf16))
def mlp_bf16_f32_accumulation(x, w, b):
    h = jnp.dot(x, w, preferred_element_type=jnp.float32) + b.astype(jnp.float32)
    return jax.nn.relu(h).astype(bf16)


@case(lambda r, e: (floats(r, e, (4, 6), extreme=True, subnormal=True),), COMPOSITE)
def activations(x):
    return {
        "relu": jax.nn.relu(x),
        "relu6": jax.nn.relu6(x),
        "leaky_relu": jax.nn.leaky_relu(x, 0.1),
        "elu": jax.nn.elu(x),
        "hard_tanh": jax.nn.hard_tanh(x),
        "log_sigmoid": jax.nn.log_sigmoid(x),
        "soft_sign": jax.nn.soft_sign(x),
        "tanh": jnp.tanh(x),
        "sigmoid": jax.nn.sigmoid(x),
    }


# --- softmax, log-softmax, logsumexp, normalisation
@case(lambda r, e: (floats(r, e, (3, 4, 5)),))
def softmax_axes(x):
    return {
        "last": jax.nn.softmax(x),
        "first": jax.nn.softmax(x, axis=0),
        "pair": jax.nn.softmax(x, axis=(0, 2)),
        "masked": jax.nn.softmax(x, axis=-1, where=x > -1.0),
    }


@case(lambda r, e: (floats(r, e, (3, 4, 5)),))
def log_softmax_axes(x):
    return {
        "last": jax.nn.log_softmax(x),
        "first": jax.nn.log_softmax(x, axis=0),
        "pair": jax.nn.log_softmax(x, axis=(1, 2)),
    }


@case(lambda r, e: (floats(r, e, (4, 6)), np.abs(floats(r, False, (4, 6)))))
def logsumexp_forms(x, weights):
    lse, sign = jax.scipy.special.logsumexp(x, axis=-1, b=weights - 0.5, return_sign=True)
    return {
        "all": jax.nn.logsumexp(x),
        "rows_keepdims": jax.nn.logsumexp(x, axis=1, keepdims=True),
        "weighted": jax.nn.logsumexp(x, axis=0, b=weights),
        "signed": (lse, sign),
    }


@case(lambda r, e: (floats(r, e, (4, 8)), floats(r, False, (8,)), floats(r, False, (8,))))
def layer_norm(x, gamma, beta):
    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
    return (x - mean) * lax.rsqrt(var + 1e-5) * gamma + beta


@case(lambda r, e: (floats(r, e, (4, 8), bf16), floats(r, False, (8,), bf16)))
def rms_norm_bf16(x, weight):
    x32 = x.astype(jnp.float32)
    scale = lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + 1e-6)
    return (x32 * scale).astype(bf16) * weight


@case(lambda r, e: (floats(r, e, (4, 6)),))
def standardize(x):
    return {
        "last": jax.nn.standardize(x, axis=-1),
        "all": jax.nn.standardize(x, axis=(0, 1), epsilon=1e-3),
        "given": jax.nn.standardize(x, axis=0, mean=jnp.zeros(6), variance=jnp.full(6, 4.0)),
    }


# --- attention
def causal_mask(n: int) -> jax.Array:
    return jnp.tril(jnp.ones((n, n), dtype=bool))


@case(lambda r, e: (floats(r, e, (5, 4)), floats(r, False, (5, 4)), floats(r, e, (5, 4))))
def attention(q, k, v):
    scores = jnp.einsum("qd,kd->qk", q, k) / jnp.sqrt(q.shape[-1]).astype(q.dtype)
    scores = jnp.where(causal_mask(q.shape[0]), scores, -jnp.inf)
    return jax.nn.softmax(scores, axis=-1) @ v


@case(
    lambda r, e: (
        floats(r, e, (2, 5, 8)),
        *(floats(r, False, (8, 8), scale=0.35) for _ in range(4)),
    ),
    heads=2,
)
def multi_head_attention(x, wq, wk, wv, wo, *, heads):
    batch, length, width = x.shape

    def split_heads(y):
        return y.reshape(batch, length, heads, width // heads).transpose(0, 2, 1, 3)

    q, k, v = split_heads(x @ wq), split_heads(x @ wk), split_heads(x @ wv)
    scores = jnp.einsum("bhqd,bhkd->bhqk", q, k) / math.sqrt(width // heads)
    scores = jnp.where(causal_mask(length)[None, None], scores, -jnp.inf)
    out = jnp.einsum("bhqk,bhkd->bhqd", jax.nn.softmax(scores, axis=-1), v)
    return out.transpose(0, 2, 1, 3).reshape(batch, length, width) @ wo


# --- losses and their gradients
def cross_entropy(logits, labels):
    log_probs = jax.nn.log_softmax(logits)
    return -jnp.mean(jnp.sum(jax.nn.one_hot(labels, logits.shape[-1]) * log_probs, axis=-1))


def ce_inputs(rng, edge):
    return floats(rng, edge, (4, 5)), integers(rng, edge, (4,), low=0, high=4)


case(ce_inputs)(cross_entropy)


@case(ce_inputs, NORMWISE_ANY_ZERO)
def cross_entropy_grad(logits, labels):
    return jax.grad(cross_entropy)(logits, labels)


def mlp_loss(params, x, y):
    hidden = jax.nn.relu(x @ params["w1"] + params["b1"])
    out = hidden @ params["w2"] + params["b2"]
    return jnp.mean((out - y) ** 2)


def mlp_params(rng):
    return {
        "w1": floats(rng, False, (6, 8), scale=0.4),
        "b1": floats(rng, False, (8,), scale=0.1),
        "w2": floats(rng, False, (8, 2), scale=0.4),
        "b2": floats(rng, False, (2,), scale=0.1),
    }


@case(lambda r, e: (mlp_params(r), floats(r, e, (4, 6), special=False), floats(r, e, (4, 2))))
def mlp_value_and_grad(params, x, y):
    return jax.value_and_grad(mlp_loss)(params, x, y)


@case(lambda r, e: (floats(r, e, (4, 6)), floats(r, False, (4, 6)), floats(r, False, (6, 3))))
def vmapped(a, b, w):
    def cosine(u, v):
        return jnp.dot(u, v) / (jnp.linalg.norm(u) * jnp.linalg.norm(v) + 1e-8)

    project = jax.vmap(lambda row, w: jnp.tanh(row @ w), in_axes=(0, None))
    return jax.vmap(cosine)(a, b), project(a, w)


def adam_inputs(rng, edge):
    params = {"w": floats(rng, False, (3, 4)), "b": floats(rng, False, (4,))}
    grads = {"w": floats(rng, edge, (3, 4), large=False), "b": floats(rng, edge, (4,))}
    m = {"w": floats(rng, False, (3, 4), scale=0.1), "b": floats(rng, False, (4,), scale=0.1)}
    v = {"w": np.abs(floats(rng, False, (3, 4), scale=0.01)), "b": np.zeros(4, np.float32)}
    step = np.int32(integers(rng, edge, (), low=0, high=100, extreme=False))
    return params, grads, {"m": m, "v": v, "step": step}, 1e-3


@case(adam_inputs)
def adam_update(params, grads, state, learning_rate):
    b1, b2, eps = 0.9, 0.999, 1e-8
    step = state["step"] + 1
    m = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, state["m"], grads)
    v = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * jnp.square(g), state["v"], grads)
    m_scale, v_scale = 1 / (1 - b1**step), 1 / (1 - b2**step)

    def update(p, m, v):
        return p - learning_rate * (m * m_scale) / (jnp.sqrt(v * v_scale) + eps)

    return jax.tree.map(update, params, m, v), {"m": m, "v": v, "step": step}


# --- integer and boolean code
def two_ints(rng, edge, shape=(3, 4)):
    return integers(rng, edge, shape), integers(rng, edge, shape)


@case(two_ints)
def integer_arithmetic(a, b):
    return {
        "add": a + b,
        "sub": a - b,
        "mul": a * b,
        "floordiv": a // b,
        "mod": a % b,
        "div": lax.div(a, b),
        "rem": lax.rem(a, b),
        "neg": -a,
        "abs": jnp.abs(a),
        "sign": jnp.sign(a),
        "max": jnp.maximum(a, b),
        "min": jnp.minimum(a, b),
        "cube": a**3,
        "affine": 3 * a - 7,
    }


@case(
    lambda r, e: (
        *two_ints(r, e),
        integers(r, e, (3, 4), low=-3, high=40, extreme=False),
        integers(r, e, (3, 4), np.uint32, low=0, high=2**32 - 1),
    )
)
def integer_bits(a, b, shift, u):
    return {
        "and": a & b,
        "or": a | b,
        "xor": a ^ b,
        "invert": ~a,
        "shift_left": a << shift,
        "shift_right_arithmetic": a >> shift,
        "shift_right_logical": lax.shift_right_logical(a, shift),
        "bit_3": (a >> 3) & 1,
        "u_shift_right": u >> shift.astype(jnp.uint32),
        "u_shift_left": u << 3,
        "u_invert": ~u,
        "u_mul": u * u,
        "u_floordiv": u // jnp.uint32(7),
        "u_mod": u % (b.astype(jnp.uint32) | 1),
    }


@case(lambda r, e: (integers(r, e, (4, 6)), 3))
def integer_selection(x, k):
    return {
        "clip": jnp.clip(x, -10, 10),
        "argmax": jnp.argmax(x, axis=1),
        "argmin": jnp.argmin(x, axis=0),
        "argmax_flat": jnp.argmax(x),
        "one_hot": jax.nn.one_hot(x[:, 0] % 5, 5, dtype=jnp.int32),
        "gt": x > k,
        "le": x <= 0,
        "eq": x == x[::-1],
        "ne": x != k,
        "ge": x >= -k,
        "lt": x < x[:, ::-1],
        "where": jnp.where(x > 0, x, -x),
        "pairwise_max": jnp.maximum(x[:, :3], x[:, 3:]),
    }


@case(lambda r, e: (integers(r, e, (3, 4)), integers(r, e, (3, 4), np.uint8, low=0, high=255)))
def integer_reductions(a, u):
    return {
        "u8_mean": jnp.mean(u, axis=0),
        "sum0": a.sum(0),
        "sum": jnp.sum(a),
        "prod1": jnp.prod(a, axis=1),
        "max1": a.max(1),
        "min0": a.min(0, keepdims=True),
        "and0": jnp.bitwise_and.reduce(a, axis=0),
        "or1": jnp.bitwise_or.reduce(a, axis=1),
        "any_nonzero": jnp.any(a),
        "all_positive": jnp.all(a > 0, axis=1),
        "count_negative": jnp.sum(a < 0),
    }


@case(
    lambda r, e: (
        booleans(r, (3, 4)),
        booleans(r, (3, 4)),
        floats(r, e, (3, 4)),
        floats(r, e, (3, 4), special=False),
    )
)
def boolean_logic(p, q, x, finite):
    return {
        "any0": p.any(0),
        "all1": q.all(1),
        "all_either": jnp.all(p | q),
        "and": p & q,
        "or": jnp.logical_or(p, q),
        "xor": p ^ q,
        "logical_xor": jnp.logical_xor(p, q),
        "not": ~p,
        "logical_not": jnp.logical_not(q),
        "where": jnp.where(p, x, -x),
        "count": p.sum(1),
        "eq": p == q,
        "gt": p > q,
        "max": jnp.maximum(p, q),
        # XLA rewrites mul(convert(p), x) into select(p, x, 0), which loses 0 * NaN = NaN,
        # 0 * inf = NaN and 0 * -1 = -0.0; so only finite, non-negative values here.
        "mask_scale": p.astype(jnp.float32) * jnp.abs(finite),
        "finite_nonzero": (x != 0) & ~jnp.isnan(x),
        "scalar_where": jnp.where(jnp.any(p), x, 0.0),
        "select": jnp.select([p, q], [x, -x], default=jnp.inf),
        "first_true": jnp.argmax(p, axis=1),
        "last_false": jnp.argmin(q[:, ::-1], axis=1),
        "reachable": jnp.dot(p, q.T),
        "paths": jnp.matmul(p, q.T, preferred_element_type=jnp.int32),
    }


# --- mixed dtypes
@case(
    lambda r, e: (
        floats(r, e, (3, 4), np.float16, extreme=True, subnormal=True),
        floats(r, e, (3, 4), bf16),
    )
)
def half_precision(h, b):
    y, z = h.astype(jnp.float32), b.astype(jnp.float32)
    return {
        "upcast": jnp.tanh(y) * z + 1,
        "round_trip": (y * 3).astype(jnp.float16),
        "bf16_math": b * b + b,
        "f16_math": h * 2 + h,
        "promoted": h + b,
        "weak_scalar": h * 0.1,
        "sum_f16": h.sum(0),
        "mean_bf16": jnp.mean(b, axis=1),
        "max_f16": h.max(1),
    }


@case(lambda r, e: (floats(r, e, (4, 5), scale=200, extreme=True, subnormal=True),), EXACT)
def float_conversions(x):
    return {
        "i32": x.astype(jnp.int32),
        "u8": x.astype(jnp.uint8),
        "i8": x.astype(jnp.int8),
        "u32": x.astype(jnp.uint32),
        "bool": x.astype(bool),
        "f16": x.astype(jnp.float16),
        "bf16": x.astype(bf16),
        "int_round_trip": x.astype(jnp.int32).astype(jnp.float32),
        "f16_round_trip": x.astype(jnp.float16).astype(jnp.float32),
        "bf16_to_f16": x.astype(bf16).astype(jnp.float16),
    }


@case(
    lambda r, e: (
        integers(r, e, (3, 4), low=-1000, high=1000),
        integers(r, e, (3, 4), np.uint8, low=0, high=255),
        booleans(r, (3, 4)),
    ),
    EXACT,
)
def integer_conversions(a, u, p):
    return {
        "f32": a.astype(jnp.float32),
        "f16": a.astype(jnp.float16),
        "bf16": a.astype(bf16),
        "u8_f32": u.astype(jnp.float32),
        "bool_f32": p.astype(jnp.float32),
        "bool_i32": p.astype(jnp.int32),
        "i32_u8": a.astype(jnp.uint8),
        "i32_i8": a.astype(jnp.int8),
        "u8_i32": u.astype(jnp.int32),
        "i32_bool": a.astype(bool),
        "mixed": u + a,
    }


# --- reductions
@case(lambda r, e: (floats(r, e, (3, 4, 5), large=False, small=False),))
def float_reductions(x):
    return {
        "sum": x.sum(),
        "sum0": x.sum(0),
        "sum12": x.sum((1, 2)),
        "mean_keepdims": x.mean(-1, keepdims=True),
        "prod": x.prod(2),
        "var0": x.var(0),
        "std": x.std(axis=(1, 2), ddof=1),
        "var_keepdims": jnp.var(x, axis=1, keepdims=True),
    }


@case(lambda r, e: (floats(r, e, (3, 4, 5), extreme=True, subnormal=True),), EXACT)
def float_extrema(x):
    return {
        "max": x.max(),
        "max1": x.max(1),
        "min02": x.min((0, 2)),
        "max_keepdims": x.max(axis=2, keepdims=True),
        "argmax": jnp.argmax(x, 1),
        "argmin": jnp.argmin(x, -1),
        "any": (x > 0).any(1),
        "all": jnp.all(x, 0),
        "maximum": jnp.maximum(x, x[::-1]),
        "minimum": jnp.minimum(x, -x),
    }


@case(lambda r, e: (floats(r, e, (2, 3, 4)),), EXACT, axis=1, keepdims=True)
def static_reduction(x, *, axis, keepdims):
    return jnp.max(x, axis=axis, keepdims=keepdims), jnp.sum(x > 0, axis=axis, keepdims=keepdims)


# --- shapes
@case(lambda r, e: (floats(r, e, (2, 3, 4)),), EXACT)
def reshapes(x):
    return {
        "reshape": x.reshape(6, 4),
        "flatten": x.reshape(-1),
        "fortran": jnp.ravel(x, order="F"),
        "T": x.T,
        "transpose": x.transpose(1, 0, 2),
        "swapaxes": jnp.swapaxes(x, 0, 2),
        "moveaxis": jnp.moveaxis(x, -1, 0),
        "squeeze": x[:, :1].squeeze(1),
        "expand_dims": jnp.expand_dims(x, (0, 2)),
        "new_axis": x[:, None],
        "broadcast": jnp.broadcast_to(x[:, :1], (2, 3, 4)),
        "repeat": jnp.repeat(x, 2, axis=0),
    }


@case(lambda r, e: (floats(r, e, (2, 6)), floats(r, e, (2, 6))), EXACT)
def joins_and_splits(a, b):
    first, middle, last = jnp.split(a, [1, 3], axis=1)
    return {
        "concatenate": jnp.concatenate([a, b], axis=0),
        "concatenate_last": jnp.concatenate([a, b, a], axis=-1),
        "stack": jnp.stack([a, b], axis=1),
        "hstack": jnp.hstack([a, b]),
        "vstack": jnp.vstack([a, b]),
        "split": [first, middle, last],
        "array_split": jnp.array_split(b, 3, axis=1),
        "unstack": jnp.unstack(a, axis=0),
        "tile": jnp.tile(a, (2, 1)),
        "tile_new_axis": jnp.tile(b[0], (2, 2)),
    }


@case(lambda r, e: (floats(r, e, (6, 5)),), EXACT)
def slicing(x):
    return {
        "stepped": x[1:5:2],
        "reversed": x[::-1],
        "columns_backwards": x[:, ::-2],
        "negative": x[-3:, -1],
        "row": x[0],
        "new_axis": x[:, None],
        "ellipsis": x[..., 2],
        "negative_step": x[-1:-5:-2, 1:-1],
        "leading": x[None, ::3],
        "flip": jnp.flip(x, axis=(0, 1)),
        "roll": jnp.roll(x, 2, axis=1),
        "diagonal_block": x[1:3, 2:4],
    }


@case(lambda r, e: (floats(r, e, (3, 4)),), EXACT)
def padding(x):
    return {
        "constant": jnp.pad(x, ((1, 0), (0, 2))),
        "value": jnp.pad(x, 1, constant_values=-1.5),
        "edge": jnp.pad(x, ((0, 2), (1, 1)), mode="edge"),
        "reflect": jnp.pad(x, ((1, 1), (2, 0)), mode="reflect"),
        "interior_and_crop": lax.pad(x, jnp.float32(0), ((1, -1, 1), (-1, 2, 0))),
    }


# --- contractions
@case(
    lambda r, e: (
        floats(r, e, (3, 4)),
        floats(r, False, (4, 5)),
        floats(r, e, (5,)),
        floats(r, e, (2, 3, 4)),
        floats(r, False, (2, 4, 5)),
    )
)
def contractions(a, b, c, p, q):
    return {
        "dot": jnp.dot(a, b),
        "matmul": a @ b,
        "matvec": b @ c,
        "batched_matmul": p @ q,
        "einsum_chain": jnp.einsum("ij,jk,k->i", a, b, c),
        "einsum_batched": jnp.einsum("bij,bjk->bik", p, q),
        "tensordot_1": jnp.tensordot(p, b, axes=1),
        "tensordot_pairs": jnp.tensordot(p, q, axes=([0, 2], [0, 1])),
        "inner": jnp.inner(a, a),
        "outer": jnp.outer(c, c),
        "vdot": jnp.vdot(a, a),
        "gram": a.T @ a,
    }


@case(
    lambda r, e: (
        integers(r, e, (3, 5), extreme=False),
        integers(r, e, (5, 4), extreme=False),
        integers(r, e, (3, 5), np.int8, low=-128, high=127),
        integers(r, e, (5, 4), np.int8, low=-128, high=127),
    )
)
def integer_matmul(a, b, qa, qb):
    return {
        "i32": a @ b,
        "i8_to_i32": jnp.matmul(qa, qb, preferred_element_type=jnp.int32),
        "mixed": jnp.dot(a, qb),
    }


# --- elementwise math
@case(
    lambda r, e: (
        floats(r, e, (3, 4), extreme=True),
        floats(r, e, (3, 4), large=False, small=False),
        integers(r, e, (3, 4), low=-3, high=6, extreme=False),
    ),
    POW,
)
def powers(x, y, n):
    return {
        "square": x**2,
        "cube": x**3,
        "inverse_square": x**-2,
        "zeroth": x**0,
        "seventh": x**7,
        "jnp_square": jnp.square(x),
        "half": jnp.abs(x) ** 0.5,
        "pow": jnp.power(jnp.abs(x), y),
        "pow_negative_base": jnp.power(x, 3.0),
        "integer_exponent": lax.pow(x, n),
        "integer_base": n**3,
        "integer_pow_negative": lax.integer_pow(x, -3),
    }


@case(
    lambda r, e: (
        floats(r, e, (4, 5), extreme=True, subnormal=True),
        floats(r, e, (4, 5), extreme=True),
    ),
    TRANSCENDENTAL,
)
def unary_math(x, normal):
    return {
        "sin": jnp.sin(x),
        "cos": jnp.cos(x),
        "tan": jnp.tan(x),
        "arctan": jnp.arctan(x),
        "exp": jnp.exp(x),
        "exp2": jnp.exp2(x),
        "expm1": jnp.expm1(x),
        "log": jnp.log(x),
        "log_abs": jnp.log(jnp.abs(x)),
        "log1p": jnp.log1p(x),
        "sqrt": jnp.sqrt(x),
        "rsqrt": lax.rsqrt(x),
        # XLA:CPU's cbrt of a subnormal is neither cbrt(0) nor the true root (-5.6e-16 for
        # -2.9e-39), so cbrt sees no subnormals.
        "cbrt": jnp.cbrt(normal),
        "reciprocal": jnp.reciprocal(x),
    }


@case(
    lambda r, e: (
        floats(r, e, (4, 5), extreme=True, subnormal=True),
        np.clip(floats(r, e, (4, 5), scale=0.6), -1.25, 1.25),
        floats(r, e, (3, 4), bf16, scale=3.0),
    ),
    COMPOSITE,
)
def hyperbolic_and_inverse_trig(x, y, h):
    """asin, acos, sinh, cosh, asinh, acosh and atanh, as XLA expands them. Composite: XLA's
    own f32 expm1, inside sinh, was measured up to 5 ulps off."""
    return {
        "arcsin": jnp.arcsin(y),
        "arccos": jnp.arccos(y),
        "arctanh": jnp.arctanh(y),
        "sinh": jnp.sinh(x),
        "cosh": jnp.cosh(x),
        "arcsinh": jnp.arcsinh(x),
        "arccosh": jnp.arccosh(x),
        "outside": (jnp.arcsin(x), jnp.arccos(x), jnp.arctanh(x)),
        "bf16": (jnp.sinh(h), jnp.cosh(h), jnp.arcsinh(h), jnp.arccosh(h), jnp.arcsin(h / 4)),
    }


@case(
    lambda r, e: (
        integers(r, e, (3, 5), low=-300, high=300),
        integers(r, e, (3, 5), np.uint8, low=0, high=255),
        integers(r, e, (4,), np.int16, low=-(2**15), high=2**15 - 1),
        integers(r, e, (4,), np.uint32, low=0, high=2**32 - 1),
    ),
    EXACT,
)
def bit_counts(a, u, s, w):
    """population_count and clz (shifts, masks and adds on the unsigned bits) on four types."""
    return {
        "popcount": lax.population_count(a),
        "clz": lax.clz(a),
        "bitwise_count": jnp.bitwise_count(a),
        "u8": (lax.population_count(u), lax.clz(u)),
        "s16": (lax.population_count(s), lax.clz(s)),
        "u32": (lax.population_count(w), lax.clz(w)),
    }


@case(lambda r, e: (floats(r, e, (4, 5), extreme=True, subnormal=True),), COMPOSITE)
def gaussian(x):
    norm = jax.scipy.stats.norm
    return {
        "erf": lax.erf(x),
        "erfc": lax.erfc(x),
        "special_erf": jax.scipy.special.erf(x),
        "cdf": norm.cdf(x),
        "logpdf": norm.logpdf(x),
    }


@case(lambda r, e: (floats(r, e, (4, 6), scale=3, extreme=True, subnormal=True),), EXACT)
def rounding_and_classes(x):
    halves = jnp.round(x * 2) / 2
    return {
        "floor": jnp.floor(x),
        "ceil": jnp.ceil(x),
        "round_even": jnp.round(halves),
        "round_away": lax.round(halves),
        "rint": jnp.rint(x),
        "trunc": jnp.trunc(x),
        "sign": jnp.sign(x),
        "abs": jnp.abs(x),
        "negative": -x,
        "isfinite": jnp.isfinite(x),
        "isnan": jnp.isnan(x),
        "isinf": jnp.isinf(x),
        "nan_to_num": jnp.nan_to_num(x),
    }


@case(lambda r, e: (floats(r, e, (4, 5), scale=5), floats(r, e, (4, 5), scale=2)), EXACT)
def float_modulo(x, y):
    return {
        "remainder": jnp.remainder(x, y),
        "fmod": jnp.fmod(x, y),
        "rem": lax.rem(x, y),
        "mod_scalar": x % 1.5,
        "floor_divide": x // y,
        "divide": x / y,
    }


@case(lambda r, e: (floats(r, e, (4, 5)), floats(r, e, (4, 5))), COMPOSITE)
def polar(x, y):
    return {
        "theta": jnp.arctan2(y, x),
        "radius": jnp.sqrt(x * x + y * y),
        "hypot": jnp.hypot(x, y),
        "degrees": jnp.degrees(jnp.arctan2(y, 1.0)),
    }


@case(
    lambda r, e: (
        floats(r, e, (3, 4), scale=4, extreme=True),
        floats(r, False, (), scale=0.1 if not e else 1e-3),
    ),
    EXACT,
)
def quantize_int8(x, scale):
    q = lax.clamp(-128.0, jnp.round(x / scale), 127.0).astype(jnp.int8)
    return q, q.astype(jnp.float32) * scale


# --- array constructors
@case(lambda r, e: (floats(r, e, (3, 4)),), COMPOSITE)
def constructors(x):
    return {
        "arange": jnp.arange(6),
        "arange_float": jnp.arange(2, 11, 3, dtype=jnp.float32),
        "zeros": jnp.zeros((2, 3)),
        "ones_like": jnp.ones_like(x),
        "full": jnp.full((2, 2), 7, jnp.int32),
        "full_like": jnp.full_like(x, -0.0),
        "linspace": jnp.linspace(0.0, 1.0, 5),
        "linspace_open": jnp.linspace(-1, 1, 4, endpoint=False),
        "eye": jnp.eye(3, k=1),
        "tri": jnp.tri(3, dtype=jnp.int32),
        "tril": jnp.tril(x),
        "triu": jnp.triu(x, 1),
        "offset": x + jnp.arange(4),
    }


# --- dynamic slicing
def dynamic_inputs(rng, edge):
    """x and 6 start indices: in range, or (edge) negative, past the end and the int32 extremes."""
    x = floats(rng, edge, (6, 5))
    if not edge:
        return x, rng.integers(0, 4, 6).astype(np.int32)
    pool = [-1, -4, -7, 3, 5, 6, 100, -(2**31), 2**31 - 1]
    return x, rng.permutation(pool)[:6].astype(np.int32)


@case(dynamic_inputs, EXACT)
def dynamic_slices(x, starts):
    return [
        {
            "static_start": lax.dynamic_slice(x, (2, 1), (3, 2)),
            "traced_start": lax.dynamic_slice(x, (i, j), (2, 3)),
            "in_dim": lax.dynamic_slice_in_dim(x, i, 2, axis=1),
            "index": x[i],
            "index_in_dim": lax.dynamic_index_in_dim(x, j, axis=1, keepdims=False),
        }
        for i, j in zip(starts[:3], starts[3:])
    ]


@case(dynamic_inputs, EXACT)
def dynamic_updates(x, starts):
    patch = jnp.full((2, 2), -1.0)
    return [
        {
            "traced": lax.dynamic_update_slice(x, patch, (i, j)),
            "static": lax.dynamic_update_slice(x, patch, (4, 3)),
            "in_dim": lax.dynamic_update_slice_in_dim(x, x[:1] * 2, i, axis=0),
        }
        for i, j in zip(starts[:3], starts[3:])
    ]


# --- transformations, custom derivatives, placement
@case(lambda r, e: (floats(r, e, (3, 4)), floats(r, e, (3, 4))), EXACT)
def optimization_barrier(x, y):
    a, b = lax.optimization_barrier((x * 2, y + 1))
    return a - b


@case(lambda r, e: (floats(r, e, (4, 4), special=False), floats(r, False, (4, 4), scale=0.5)))
def checkpointed_grad(x, w):
    @functools.partial(jax.checkpoint, policy=jax.checkpoint_policies.dots_saveable)
    def block(x):
        return jnp.tanh(jnp.sin(x @ w) @ w)

    return jax.grad(lambda x: jnp.sum(block(x)))(x)


@jax.custom_vjp
def clip_gradient(x):
    return x


clip_gradient.defvjp(lambda x: (x, None), lambda _, g: (jnp.clip(g, -1.0, 1.0),))


@jax.custom_vjp
def scaled_sin(x):
    return jnp.sin(x)


scaled_sin.defvjp(
    lambda x: (jnp.sin(x), jnp.cos(x)), lambda cos, g: (0.5 * g * cos,), optimize_remat=True
)


@case(lambda r, e: (floats(r, e, (3, 4)), floats(r, False, (4, 2))))
def custom_vjp_grads(x, w):
    def loss(x):
        return jnp.sum((clip_gradient(x) @ w) ** 2)

    return clip_gradient(x) * 3, jax.value_and_grad(loss)(x), jax.grad(
        lambda x: jnp.sum(scaled_sin(x))
    )(x)


@case(lambda r, e: (floats(r, e, (3, 4)),), EXACT)
def placement(x):
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    y = lax.with_sharding_constraint(x * 2, device)
    return jax.device_put(y) + jnp.copy(x), lax.stop_gradient(y)


# --- jax.random: raw uint32 keys (edge: zero and all-ones words), typed keys inside
def key_inputs(rng, edge):
    key = integers(rng, edge, (2,), np.uint32, low=0, high=2**32 - 1)
    return key, floats(rng, edge, (4, 6))


@case(key_inputs, TRANSCENDENTAL)
def random_dropout_and_noise(key, x):
    """bits, uniform (a bitcast of the bits), bernoulli and normal (erf_inv) from one key."""
    keep = jax.random.bernoulli(key, 0.75, x.shape)
    noise = jax.random.normal(key, x.shape)
    return jnp.where(keep, x * 1.25, 0.0), keep, noise, jax.random.bits(key, (5,), jnp.uint8)


@case(key_inputs, TRANSCENDENTAL)
def random_key_plumbing(key, x):
    """Typed keys: wrapped, split, folded (one message, and one per key), cloned, unwrapped,
    indexed, carried through a loop, and seeded from a traced integer."""
    k = jax.random.wrap_key_data(key)
    a, b = jax.random.split(k)
    folded = jax.vmap(lambda i: jax.random.fold_in(a, i))(jnp.arange(3))
    c = jax.random.clone(jax.random.fold_in(b, 3))
    seeded = jax.random.PRNGKey(key[0] >> 1)

    def body(i, carry):
        kk, total = carry
        kk, sub = jax.random.split(kk)
        return kk, total + jax.random.uniform(sub, (6,))

    _, walked = lax.fori_loop(0, 3, body, (folded[jnp.argmax(x[0])], x[0]))
    return (jax.random.key_data(folded), jax.random.randint(c, (5,), -3, 9), jax.random.uniform(seeded, (2,)),
            jax.random.permutation(a, 6), walked)


@case(lambda r, e: (integers(r, e, (2,), np.uint32, low=0, high=2**32 - 1),
                    np.abs(floats(r, e, (5,), special=False, large=False)) + np.float32(0.05)), NORMWISE)
def random_gamma_beta(key, alpha):
    """gamma (jax's rejection sampler: a vmapped while with a batched predicate) and beta (its
    log-space form)."""
    k1, k2 = jax.random.split(key)
    return jax.random.gamma(k1, alpha), jax.random.beta(k2, alpha, 2.0)


@case(key_inputs, NORMWISE)
def random_truncated_normal(key, x):
    """truncated_normal: erf, erf_inv and nextafter at the bounds. Normwise: erf_inv of a
    difference of two erf values near zero amplifies their last-ulp differences (10 ulps seen)."""
    return jax.random.truncated_normal(key, -2.0, 1.5, x.shape) * x


@case(lambda r, e: (integers(r, e, (2,), np.uint32, low=0, high=2**32 - 1),
                    integers(r, e, (7,), np.uint32, low=0, high=2**32 - 1)), EXACT)
def threefry_hash(key, counts):
    return jax.extend.random.threefry_2x32(key, counts)


def gamma_inputs(rng, edge):
    x = floats(rng, edge, (60,), scale=4.0, large=False)
    if edge:  # the poles, the zeros of lgamma, digamma's root, and past them
        x[:12] = [0.0, -0.0, -1.0, -2.0, 1.0, 2.0, 1.4616321, 0.5, -0.5, -2.5, 1e-20, 30.0]
    return (x,)


@case(gamma_inputs, NORMWISE)
def log_gamma_and_digamma(x):
    """lgamma and digamma (Lanczos, reflected below 1/2) and what uses them. Normwise: both
    lose relative precision near their zeros and poles, as XLA's do."""
    return lax.lgamma(x), lax.digamma(x), jax.scipy.special.gammaln(jnp.abs(x) + 1.0)


def erf_inv_inputs(rng, edge):
    x = np.clip(floats(rng, edge, (40,), scale=0.5, large=False), -1.5, 1.5)
    x[:6] = [1.0, -1.0, 0.9999999, -0.99999994, 1e-30, -0.0] if edge else x[:6]
    y = floats(rng, edge, (40,), extreme=edge, subnormal=edge)
    return x, y, x.astype(jnp.bfloat16)


@case(erf_inv_inputs, TRANSCENDENTAL)
def erf_inv_and_nextafter(x, y, h):
    return lax.erf_inv(x), lax.erf_inv(h), lax.nextafter(x, y), lax.nextafter(y, x), lax.bitcast_convert_type(y, jnp.int32)


# --- Python scalars (weak types), pytrees, closures
def weak_inputs(rng, edge):
    """Arrays and two Python scalars, weakly typed f32 and i32 (edge: NaN, inf, -0.0, extremes)."""
    x, h = floats(rng, edge, (3, 4)), floats(rng, edge, (3, 4), np.float16)
    if not edge:
        return x, h, 2.5, 3
    scale = [math.nan, math.inf, -0.0, 1e30][rng.integers(4)]
    return x, h, scale, [-(2**31), 2**31 - 1, 0, -1][rng.integers(4)]


@case(weak_inputs, COMPOSITE)
def weak_scalars(x, h, scale, offset):
    return {
        "affine": x * scale + offset,
        "half": h * scale,
        "int_range": jnp.arange(4) * offset,
        "power": x**offset,
        "where": jnp.where(x > offset, x, scale),
        "scalar": scale * offset,
    }


class Batch(NamedTuple):
    x: jax.Array
    y: jax.Array


@jax.tree_util.register_dataclass
@dataclass
class Linear:
    w: jax.Array
    b: jax.Array


@case(
    lambda r, e: (
        Linear(floats(r, False, (4, 3)), floats(r, False, (3,))),
        Batch(floats(r, e, (2, 4)), integers(r, e, (2,), low=0, high=2)),
        {"scale": floats(r, False, ()), "bias": [floats(r, e, (3,)), floats(r, e, (3,))]},
        (floats(r, e, (2,)),),
    )
)
def pytrees(layer, batch, extras, pair):
    logits = batch.x @ layer.w + layer.b
    shifted = [logits + b for b in extras["bias"]]
    return {
        "linear": Linear(layer.w * extras["scale"], layer.b),
        "batch": Batch(logits, batch.y + 1),
        "list": shifted,
        "tuple": (pair[0] * 2, jnp.sum(logits)),
    }


_WEIGHT = np.random.default_rng(7).standard_normal((4, 3))  # float64, as numpy gives it
_BIAS = np.linspace(-1.0, 1.0, 3)
_TABLE = np.arange(10, dtype=np.int32)


@case(lambda r, e: (floats(r, e, (2, 4)),))
def closure_over_numpy(x):
    return jnp.tanh(x @ _WEIGHT + _BIAS), jnp.asarray(_TABLE[::2]) * 2, x * np.float32(0.5)


# Control flow (lax.cond, switch, while_loop, fori_loop, scan) and data ops (cumulative ops,
# sort, top_k, gather, scatter) register their cases from their own modules.
from tests.frontend import corpus_control, corpus_data, corpus_windows  # noqa: E402,F401


# ---------------------------------------------------------------------------- running
def _rng(name: str, kind: str) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(f"{name}/{kind}".encode()))


@functools.cache
def _jitted(name: str, backend: str | None = None) -> tuple[Callable, Callable]:
    """(jax.jit, xfuse.jit) of a corpus function, cached so each compiles once per signature."""
    c = CORPUS[name]
    return jax.jit(c.fun, static_argnames=tuple(c.static)), xfuse.jit(
        c.fun, static_argnames=tuple(c.static), backend=backend
    )


def _flushed_inputs(args: tuple) -> tuple | None:
    """`args` with XLA:CPU's view of subnormal inputs (zeros), or None when there are none."""
    leaves, tree = jax.tree.flatten(args)
    flushed = [flush_subnormals(x) if isinstance(x, np.ndarray) else x for x in leaves]
    if all(a is b for a, b in zip(leaves, flushed)):
        return None
    return jax.tree.unflatten(tree, flushed)


def _finite_max(array: np.ndarray) -> float:
    wide = np.abs(array.astype(np.float64))
    finite = wide[np.isfinite(wide)]
    return float(finite.max()) if finite.size else 0.0


# Outputs where some jax version's XLA:CPU is off on edge inputs: there an element jax.jit gets
# wrong passes if xfuse's agrees with the reference interpreter's (numpy, float64 inside).
# On the jax backend, xfuse's own output is XLA's too, and is held to the reference likewise.
XLA_OFF = {
    "unary_math['log']": "jax 0.11's XLA:CPU takes the log of the subnormal 2**-128 as -103.97 "
    "(it is -88.72; jax 0.10 reads the input as 0 and gives -inf)",
    "unary_math['log_abs']": "the same, and of the subnormal 2**-127 (-88.03)",
}
# The same where jax.jit runs on a GPU (seen on an H200, jax 0.11.2). xfuse's jax backend, its
# code compiled by XLA:GPU too, is held to the reference there as well.
XLA_GPU_OFF = {
    "conv_forms['padded_dilated']": "XLA:GPU's convolution gives NaN at outputs whose windows hold "
    "no NaN or infinity (0.1772 at [1, 0, 1, 0]) when other windows of the input hold some",
    "float_conversions['bf16_to_f16']": "XLA:GPU skips the rounding to bf16 on the way to f16 "
    "(172.4 for 172.4 where bf16 holds 172; --xla_allow_excess_precision, on by default)",
    "float_conversions['f16_round_trip']": "XLA:GPU skips the rounding to f16 between two f32 "
    "values (--xla_allow_excess_precision, on by default)",
    "float_modulo['divide']": "XLA:GPU divides f32 to within an ulp, not correctly rounded",
    "float_modulo['floor_divide']": "the same division, then its floor",
    "integer_matmul['i8_to_i32']": "XLA:GPU's i8 x i8 = s32 product over 5 terms gives twice the "
    "sum (over 8, 16, 64 or 256 it is right); xfuse's jax backend widens the operands first",
    **{output: "duplicate indices: XLA:GPU applies the first update of a duplicate index, XLA:CPU "
       "the last (jax leaves the order of conflicting updates to the implementation)"
       for output in ("scatter_at_ops['set']", "scatter_at_ops_int32['set']",
                      "scatter_modes['set_clip']", "scatter_points[1]", "scatter_points[2]")},
}


def _xla_off() -> dict[str, str]:
    return XLA_OFF | XLA_GPU_OFF if jax.default_backend() == "gpu" else XLA_OFF


def _unless_off(c: Case, got: np.ndarray, k: int, args: tuple, flushed_args: tuple | None):
    """`got` (jax.jit's output `k`), with the reference's value where it is neither that nor
    the reference's on flushed inputs (to the bit for an exact case)."""
    reference = _jitted(c.name, "reference")[1]
    results = [np.asarray(jax.tree.leaves(reference(*inputs, **c.static))[k])
               for inputs in ((args, flushed_args) if flushed_args is not None else (args,))]
    wide = got.astype(np.float64)
    right = np.zeros(got.shape, bool)
    for r in results:
        right |= np.isclose(wide, r.astype(np.float64), rtol=0 if c.tolerance is EXACT else 1e-6,
                            atol=0, equal_nan=True)
    return np.where(right, got, results[0])


def _jax_jit(c: Case, jax_fn: Callable, args: tuple):
    """jax.jit's result; on the CPU where XLA cannot compile it for the default device (XLA:GPU
    has no integer convolutions but cuDNN's int8 ones), as the reference must come from XLA."""
    try:
        return jax_fn(*args, **c.static)
    except jax.errors.JaxRuntimeError as error:
        if jax.default_backend() == "cpu" or not str(error).startswith("UNIMPLEMENTED"):
            raise
    with jax.default_device(jax.devices("cpu")[0]):
        return jax_fn(*args, **c.static)


def check(c: Case, args: tuple, backend: str | None = None) -> None:
    jax_fn, xfuse_fn = _jitted(c.name, backend)
    got = _jax_jit(c, jax_fn, args)
    want = xfuse_fn(*args, **c.static)
    flushed_args = _flushed_inputs(args)
    flushed = None if flushed_args is None else xfuse_fn(*flushed_args, **c.static)
    got_leaves, got_tree = jax.tree_util.tree_flatten_with_path(got)
    want_leaves, want_tree = jax.tree_util.tree_flatten(want)
    assert got_tree == want_tree, f"{c.name}: output structure {want_tree}, jax gives {got_tree}"
    flushed_leaves = [None] * len(want_leaves) if flushed is None else jax.tree.leaves(flushed)
    for k, ((path, g), w, f) in enumerate(zip(got_leaves, want_leaves, flushed_leaves)):
        what = c.name + jax.tree_util.keystr(path)
        g, w = np.asarray(g), np.asarray(w)
        assert g.dtype == w.dtype, f"{what}: dtype {w.dtype}, jax gives {g.dtype}"
        dtype = DType.from_numpy(w.dtype)
        scale = None
        if c.tolerance in (NORMWISE, NORMWISE_ANY_ZERO) and dtype.is_float:
            scale = np.full(w.shape, _finite_max(w))
        if what in _xla_off():  # where jax.jit is neither the reference nor it on flushed inputs
            g = _unless_off(c, g, k, args, flushed_args)
            if xfuse_fn.lower(*args, **c.static).backend == "jax":
                w = _unless_off(c, w, k, args, flushed_args)
        assert_close(g, w, dtype, f"{what} (got: jax.jit's, want: xfuse's)", c.tolerance, scale=scale, flushed=f)


@pytest.mark.parametrize("kind", ["random", "edge"])
@pytest.mark.parametrize("name", sorted(CORPUS))
def test_matches_jax_jit(name: str, kind: str) -> None:
    c = CORPUS[name]
    check(c, c.inputs(_rng(name, kind), kind == "edge"))


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_c_backend_matches_jax_jit(name: str) -> None:
    """The C backend (what AOT artifacts run) on the whole corpus, random and edge inputs."""
    c = CORPUS[name]
    for kind in ("random", "edge"):
        check(c, c.inputs(_rng(name, kind), kind == "edge"), backend="c")


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_jax_backend_matches_jax_jit(name: str) -> None:
    """The jax backend on the whole corpus, random and edge inputs: one jitted function per
    fusion, and the whole optimised module as one jitted function (mode="module")."""
    c = CORPUS[name]
    for kind in ("random", "edge"):
        args = c.inputs(_rng(name, kind), kind == "edge")
        check(c, args, backend="jax")
        with xfuse.default_backend("jax", options={"mode": "module"}):
            check(c, args)


def test_corpus_is_large_enough() -> None:
    assert len(CORPUS) >= 45


# ---------------------------------------------------------------------------- rule coverage
# Names in RULES that jax 0.10 never gives a primitive (kept for older jax versions).
NOT_EMITTED = {
    "pjit": "the jit primitive's older name; jax 0.10 calls it 'jit'",
    "checkpoint": "jax.checkpoint's primitive's older name; jax 0.10 calls it 'remat2'",
    "remat": "another older name of jax.checkpoint's primitive ('remat2')",
    "copy_p": "the copy primitive's older name; jax 0.10 calls it 'copy'",
    "core_call": "gone from jax 0.10, whose call primitives are 'jit' and 'closed_call'",
    "custom_vjp_call_jaxpr": "gone from jax 0.10: custom_vjp functions trace to 'custom_vjp_call'",
    "expand_dims": "not a primitive: jnp.expand_dims and x[:, None] give broadcast_in_dim",
}
# Names jax 0.10 emits, but never into a jaxpr xfuse can trace.
UNREACHABLE = {
    "iota_2x32_shape": "bound only inside a PRNG implementation's functions, which the random_* rules "
    "trace themselves",
    "closed_call": "made only by jax's own passes (DCE of remat_opt, scan partial evaluation) "
    "that jax.make_jaxpr does not run",
    "pvary": "bound only inside shard_map bodies, which xfuse does not translate",
}


# Names of later jax versions than this one may be: exempt where this jax does not emit them.
# tests/frontend/test_jax_versions.py runs the rules of those the jax CI installs lacks.
LATER = {
    "one_minus_square": "jax 0.11's primitive in tanh's derivative (1 - x*x)",
    "stack": "jnp.stack's primitive in jax 0.10.2 (jax 0.10.0 concatenates broadcasts)",
    "unstack": "jnp.unstack's primitive in jax 0.10.2 (jax 0.10.0 slices)",
}


def _sub_jaxprs(value: object):
    if isinstance(value, jax_core.ClosedJaxpr):
        yield value.jaxpr
    elif isinstance(value, jax_core.Jaxpr):
        yield value
    elif isinstance(value, (tuple, list)):
        for item in value:
            yield from _sub_jaxprs(item)


def primitive_names(jaxpr) -> set[str]:
    """Every primitive in `jaxpr` and the jaxprs in its equations' parameters."""
    names = set()
    for eqn in jaxpr.eqns:
        names.add(eqn.primitive.name)
        for value in eqn.params.values():
            for sub in _sub_jaxprs(value):
                names |= primitive_names(sub)
    return names


def test_every_rule_is_exercised() -> None:
    seen: set[str] = set()
    for name, c in CORPUS.items():
        args = c.inputs(_rng(name, "random"), False)
        closed = jax.make_jaxpr(functools.partial(c.fun, **c.static))(*args)
        seen |= primitive_names(closed.jaxpr)
    exempt = NOT_EMITTED.keys() | UNREACHABLE.keys()
    assert exempt | LATER.keys() <= RULES.keys(), f"exempt names without a rule: {exempt - RULES.keys()}"
    assert not seen & exempt, f"listed as never emitted, but seen: {seen & exempt}"
    exempt |= LATER.keys() - seen
    assert seen <= RULES.keys(), f"primitives without a rule: {sorted(seen - RULES.keys())}"
    missing = RULES.keys() - seen - exempt
    assert not missing, f"rules no corpus function exercises: {sorted(missing)}"
