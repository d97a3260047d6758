"""Every op of the opcode table against `jax.lax` on XLA:CPU, for every dtype the op accepts.

`SPECS` maps each op to its dtypes, its trials (a `jax.lax` callable, the arrays to run it on,
the op's attributes) and its tolerance (tests/tolerances.py). Inputs: edge values (NaN, +-inf,
+-0, subnormals, extreme finite values, integer limits, rounding ties, zero divisors, over-wide
and negative shifts, out-of-range conversions and indices, empty axes) and 64 seeded random ones.
XLA:CPU reads subnormal inputs as zero, so a result may instead match the reference on flushed
inputs; cbrt, pow and atan2 only see flushed inputs (`Spec.flush_inputs`). All trials of an op
run under one `jax.jit` (`lax_results`): compiling is nearly all of this file's run time.
"""

from __future__ import annotations

import functools
import itertools
import math
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from tests.tolerances import (
    ACCUMULATION,
    EXACT,
    TRANSCENDENTAL,
    Tolerance,
    assert_close,
    flush_subnormals,
)
from xfuse.hlo import OPS, Builder, BuilderError, DType, Module, Op, Shape, interpret
from xfuse.hlo.dtypes import finfo



@pytest.fixture(autouse=True, scope="module")
def enable_x64():
    """64-bit types need jax's x64 mode; it is global, so it is on only while these tests run."""
    previous = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    yield
    jax.config.update("jax_enable_x64", previous)

N_RANDOM = 64
Rng = np.random.Generator
ALL = tuple(DType)
FLOATS = (DType.F16, DType.BF16, DType.F32, DType.F64)
INTEGERS = tuple(d for d in DType if d.is_integer)
NUMERIC = INTEGERS + FLOATS
INT_OR_PRED = (DType.PRED,) + INTEGERS


# ---------------------------------------------------------------------------- inputs
def edge_values(dtype: DType) -> np.ndarray:
    """The values most likely to show a difference: specials, limits, ties, signed zeros."""
    if dtype.is_pred:
        return np.array([False, True])
    if dtype.is_integer:
        info = np.iinfo(dtype.numpy)
        values = {0, 1, 2, 3, 7, 100, info.max, info.max - 1, info.min, info.min + 1}
        if dtype.is_signed:
            values |= {-1, -2, -3, -7, -100}
        # just past a rounding tie of bf16/f16/f32/f64, where rounding twice goes wrong
        top = dtype.bits - (2 if dtype.is_signed else 1)
        for mantissa in (8, 11, 24, 53):
            if top - mantissa >= 1:
                value = 2**top + 2 ** (top - mantissa) + 1
                values |= {value, -value} if dtype.is_signed else {value}
        return np.array(sorted(values), dtype.numpy)
    info = finfo(dtype)
    tiny, least, big, eps = (
        float(v) for v in (info.smallest_normal, info.smallest_subnormal, info.max, info.eps)
    )
    values = [math.nan, math.inf, -math.inf, 0.0, -0.0, least, -least, tiny / 2, -tiny / 4]
    values += [tiny, -tiny, big, -big, 1.0, -1.0, 0.5, -0.5, 0.5 - eps / 4, 1.5, -1.5, 2.5]
    values += [-2.5, 1.0 + eps, 3.0, -7.0, 100.0, math.pi, -math.pi / 2, 1e4, -2e-3]
    return np.array(values).astype(dtype.numpy)


def conversion_values(dtype: DType) -> np.ndarray:
    """Extra inputs of convert_element_type: integer boundaries and narrowing float ties."""
    if not dtype.is_float:
        return edge_values(dtype)
    values = [127.5, -128.5, 255.5, -129.0, 32768.0, 65504.0, 65519.0, 65520.0, 6e-8, 3e-8]
    values += [2.0**31, -(2.0**31), 2.0**31 - 128, 2.0**32, 2.0**63, -(2.0**63), 2.0**64]
    values += [3.3895e38, 3.40282e38, 1e300]
    nmant = int(finfo(dtype).nmant)
    for target in (7, 10, 23):  # just past a tie of the narrower mantissa
        if nmant > target + 1:
            past_tie = 1 + 2.0 ** -(target + 1) + 2.0**-nmant
            values += [past_tie, -past_tie]
    with np.errstate(over="ignore"):
        extra = np.array(values).astype(dtype.numpy)
    return np.concatenate([edge_values(dtype), extra])


def random_values(dtype: DType, n: int, rng: Rng) -> np.ndarray:
    """Uniform integers; floats half of ordinary size, half random bit patterns (any value)."""
    if dtype.is_pred:
        return rng.random(n) < 0.5
    if dtype.is_integer:
        info = np.iinfo(dtype.numpy)
        return rng.integers(info.min, info.max, n, dtype=dtype.numpy, endpoint=True)
    bits = rng.integers(0, 2**dtype.bits, n - n // 2, dtype=np.uint64)
    patterns = bits.astype(f"u{dtype.itemsize}").view(dtype.numpy)
    return np.concatenate([ordinary_values(dtype, n // 2, rng), patterns])


def ordinary_values(dtype: DType, n: int, rng: Rng) -> np.ndarray:
    """Floats of either sign with magnitudes from 1e-3 to 1e3, roughly."""
    return (rng.standard_normal(n) * 10.0 ** rng.uniform(-3, 3, n)).astype(dtype.numpy)


def sample(dtype: DType, rng: Rng, n: int = N_RANDOM) -> np.ndarray:
    return np.concatenate([edge_values(dtype), random_values(dtype, n, rng)])


def pairs(
    xs: np.ndarray, ys: np.ndarray, x_random: np.ndarray, y_random: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Every edge value against every other, then the random pairs."""
    x = np.concatenate([np.repeat(xs, len(ys)), x_random])
    y = np.concatenate([np.tile(ys, len(xs)), y_random])
    return x, y


def binary_sample(
    dtype: DType, rng: Rng, y_dtype: DType | None = None
) -> tuple[np.ndarray, np.ndarray]:
    y_dtype = y_dtype or dtype
    return pairs(
        edge_values(dtype),
        edge_values(y_dtype),
        random_values(dtype, N_RANDOM, rng),
        random_values(y_dtype, N_RANDOM, rng),
    )


def moderate(dtype: DType, shape: tuple[int, ...], rng: Rng, low=-4.0, high=4.0) -> np.ndarray:
    """Values whose short sums and products stay finite (integers: anything, they wrap)."""
    if not dtype.is_float:
        return random_values(dtype, math.prod(shape), rng).reshape(shape)
    magnitude = rng.uniform(low, high, shape)
    return (magnitude * rng.choice([-1.0, 1.0], shape)).astype(dtype.numpy)


def shaped(dtype: DType, shape: tuple[int, ...], rng: Rng) -> np.ndarray:
    """Edge values first, then random ones, filling `shape`."""
    size = math.prod(shape)
    values = np.concatenate([edge_values(dtype), random_values(dtype, size, rng)])
    return values[:size].reshape(shape)


# ---------------------------------------------------------------------------- the table
@dataclass(frozen=True)
class Trial:
    """One comparison: `lax_fn(*arrays)` against the op with `attrs` on the same arrays.

    label: what else tells this trial apart in a failure message.
    build: instead of `emit(op, *parameters, **attrs)`, how to build the op (constant, iota,
        get_tuple_element); attrs then only labels the trial.
    scale: per-element magnitude an ACCUMULATION tolerance is relative to.
    """

    lax_fn: Callable
    arrays: tuple[np.ndarray, ...]
    attrs: Mapping[str, object] = field(default_factory=dict)
    label: str = ""
    build: Callable | None = None
    scale: np.ndarray | None = None


Trials = Callable[[DType, Rng], list[Trial]]


@dataclass(frozen=True)
class Spec:
    """An op's test: the dtypes it accepts, how to make its trials, its tolerance.

    flush_inputs: give both sides inputs with subnormals flushed to zero. For XLA's cbrt, pow
        and atan2, which mix float arithmetic (reading subnormals as zero) with bit
        manipulation (which does not), so that their results follow neither IEEE nor the flush.
    """

    dtypes: tuple[DType, ...]
    trials: Trials
    tolerance: Tolerance = EXACT
    flush_inputs: bool = False


def unary(fn: Callable, dtypes, tolerance: Tolerance = EXACT) -> Spec:
    return Spec(dtypes, lambda dtype, rng: [Trial(fn, (sample(dtype, rng),))], tolerance)


def binary(fn: Callable, dtypes, tolerance: Tolerance = EXACT) -> Spec:
    return Spec(dtypes, lambda dtype, rng: [Trial(fn, binary_sample(dtype, rng))], tolerance)


def _abs(x):
    # lax.abs refuses unsigned integers; XLA's abs of one is the identity, as jnp.abs is
    return x if jnp.issubdtype(x.dtype, jnp.unsignedinteger) else lax.abs(x)


def round_trials(dtype: DType, rng: Rng) -> list[Trial]:
    x = sample(dtype, rng)
    return [
        Trial(lambda x: lax.round(x, lax.RoundingMethod.AWAY_FROM_ZERO), (x,),
              {"rounding_method": "away_from_zero"}),
        Trial(lambda x: lax.round(x, lax.RoundingMethod.TO_NEAREST_EVEN), (x,),
              {"rounding_method": "to_nearest_even"}),
    ]


def integer_pow_trials(dtype: DType, rng: Rng) -> list[Trial]:
    """y in -3..5 (0..5 for integers). Float inputs are edge values and ordinary random ones:
    where x**|y| is subnormal XLA:CPU flushes it to zero before taking the reciprocal."""
    x = sample(dtype, rng) if not dtype.is_float else np.concatenate(
        [edge_values(dtype), ordinary_values(dtype, N_RANDOM, rng)]
    )
    exponents = range(-3, 6) if dtype.is_float else range(0, 6)
    return [Trial(lambda x, y=y: lax.integer_pow(x, y), (x,), {"y": y}) for y in exponents]


def pow_trials(dtype: DType, rng: Rng) -> list[Trial]:
    """float ** float, and float ** each integer type (converted to the float type first)."""
    trials = [Trial(lax.pow, binary_sample(dtype, rng))]
    for y_dtype in INTEGERS:
        trials.append(Trial(lax.pow, binary_sample(dtype, rng, y_dtype), label=f"y: {y_dtype}"))
    return trials


def shift_trials(fn: Callable) -> Trials:
    def trials(dtype: DType, rng: Rng) -> list[Trial]:
        bits = dtype.bits
        amounts = [0, 1, 2, bits - 1, bits, bits + 1, 2 * bits, 255]
        if dtype.is_signed:
            amounts += [-1, -bits, -128]
        y = np.array(amounts).astype(dtype.numpy)
        x_random, y_random = (random_values(dtype, N_RANDOM, rng) for _ in range(2))
        in_range = (y_random % bits).astype(dtype.numpy)  # over-wide amounts are edge values
        return [Trial(fn, pairs(edge_values(dtype), y, x_random, in_range))]

    return trials


def select_n_trials(dtype: DType, rng: Rng) -> list[Trial]:
    n = len(edge_values(dtype)) + N_RANDOM
    cases = [sample(dtype, rng) for _ in range(3)]
    fn = lax.select_n
    return [
        Trial(fn, (rng.random(n) < 0.5, *cases[:2]), label="which: pred"),
        Trial(fn, (rng.integers(0, 3, n).astype(np.int32), *cases), label="which: s32"),
        Trial(fn, (np.array(True), *cases[:2]), label="which: scalar pred"),
        Trial(fn, (np.array(2, np.int32), *cases), label="which: scalar s32"),
        Trial(fn, (np.array(0, np.int32), cases[0]), label="which: one case"),
    ]


def clamp_trials(dtype: DType, rng: Rng) -> list[Trial]:
    if dtype.is_float:
        bounds = [(-1.0, 1.0), (-0.0, 0.0), (0.0, -0.0), (1.0, -1.0), (math.nan, 1.0),
                  (-1.0, math.nan), (-math.inf, math.inf), (2.5, 2.5)]
    elif dtype.is_integer:
        info = np.iinfo(dtype.numpy)
        bounds = [(info.min, info.max), (0, 1), (5, 2), (7, 7), (info.max, info.max)]
        bounds += [(-1, 1), (-100, -3)] if dtype.is_signed else []
    else:
        bounds = [(False, True)]
    x = sample(dtype, rng)
    trials = [
        Trial(lax.clamp, (np.array(lo).astype(dtype.numpy), x, np.array(hi).astype(dtype.numpy)),
              label=f"bounds {lo}, {hi}")
        for lo, hi in bounds
    ]
    lo, hi = sample(dtype, rng), sample(dtype, rng)
    return trials + [Trial(lax.clamp, (lo, x, hi), label="array bounds")]


def convert_trials(dtype: DType, rng: Rng) -> list[Trial]:
    x = np.concatenate([conversion_values(dtype), random_values(dtype, N_RANDOM, rng)])
    return [
        Trial(lambda x, to=to: lax.convert_element_type(x, to.numpy), (x,), {"dtype": to})
        for to in ALL
    ]


def bitcast_trials(dtype: DType, rng: Rng) -> list[Trial]:
    """To every other dtype of the same width (pred has none: it is refused, as by lax)."""
    x = np.concatenate([conversion_values(dtype), random_values(dtype, N_RANDOM, rng)])
    targets = [to for to in ALL if to.bits == dtype.bits and not to.is_pred and to is not dtype] or [DType.U8]
    return [
        Trial(lambda x, to=to: lax.bitcast_convert_type(x, to.numpy), (x,), {"dtype": to})
        for to in [dtype, *targets] if not dtype.is_pred or to is not dtype
    ]


def broadcast_in_dim_trials(dtype: DType, rng: Rng) -> list[Trial]:
    layouts = [((3, 1), (2, 3, 4), (1, 2)), ((), (2, 3), ()), ((4,), (4, 5), (0,)),
               ((2, 3), (2, 0, 3), (0, 2))]
    return [
        Trial(lambda x, s=s, d=d: lax.broadcast_in_dim(x, s, d), (shaped(dtype, x, rng),),
              {"shape": s, "dims": d})
        for x, s, d in layouts
    ]


def reshape_trials(dtype: DType, rng: Rng) -> list[Trial]:
    x = shaped(dtype, (4, 6), rng)
    news = [(2, 12), (24,), (2, 3, 4), (1, 24, 1)]
    trials = [Trial(lambda x, s=s: lax.reshape(x, s), (x,), {"shape": s}) for s in news]
    return trials + [Trial(lambda x: lax.reshape(x, (0, 3)), (shaped(dtype, (3, 0), rng),),
                           {"shape": (0, 3)})]


def transpose_trials(dtype: DType, rng: Rng) -> list[Trial]:
    x = shaped(dtype, (2, 3, 4), rng)
    perms = [(2, 0, 1), (0, 1, 2), (1, 0, 2)]
    return [
        Trial(lambda x, p=p: lax.transpose(x, p), (x,), {"permutation": p}) for p in perms
    ]


def slice_trials(dtype: DType, rng: Rng) -> list[Trial]:
    x = shaped(dtype, (6, 8), rng)
    windows = [((1, 2), (5, 8), (2, 3)), ((0, 0), (6, 8), (1, 1)), ((3, 8), (3, 8), (1, 1)),
               ((5, 1), (6, 7), (4, 5))]
    return [
        Trial(lambda x, s=s, l=l, t=t: lax.slice(x, s, l, t), (x,),
              {"start": s, "limit": l, "strides": t})
        for s, l, t in windows
    ]


# (start indices, their dtype): in range, negative, past the end; they clamp into range
STARTS = [
    ((2, 3), DType.S32),
    ((-3, 100), DType.S64),
    ((6, -1), DType.S8),
    ((-1, 4), DType.U8),  # -1 wraps to 255
]


def _indices(starts, index_dtype: DType) -> tuple[np.ndarray, ...]:
    """Start indices; negative ones wrap around in unsigned types (so clamp from above)."""
    return tuple(np.array(s).astype(index_dtype.numpy) for s in starts)


def dynamic_slice_trials(dtype: DType, rng: Rng) -> list[Trial]:
    x = shaped(dtype, (6, 8), rng)
    fn = lambda x, *i: lax.dynamic_slice_p.bind(x, *i, slice_sizes=(3, 4))  # noqa: E731
    return [
        Trial(fn, (x, *_indices(s, d)), {"shape": (3, 4)}, f"starts {s} as {d}")
        for s, d in STARTS
    ]


def dynamic_update_slice_trials(dtype: DType, rng: Rng) -> list[Trial]:
    x, update = shaped(dtype, (6, 8), rng), sample(dtype, rng)[:12].reshape(3, 4)
    fn = lax.dynamic_update_slice_p.bind
    return [
        Trial(fn, (x, update, *_indices(s, d)), label=f"starts {s} as {d}")
        for s, d in STARTS
    ]


def concatenate_trials(dtype: DType, rng: Rng) -> list[Trial]:
    parts = [shaped(dtype, (2, 3), rng), shaped(dtype, (4, 3), rng), shaped(dtype, (0, 3), rng)]
    columns = [shaped(dtype, (2, 1), rng), shaped(dtype, (2, 5), rng)]
    return [
        Trial(lambda *xs: lax.concatenate(xs, 0), tuple(parts), {"dimension": 0}),
        Trial(lambda *xs: lax.concatenate(xs, 1), (parts[0], *columns), {"dimension": 1}),
        Trial(lambda x: lax.concatenate([x], 0), (parts[1],), {"dimension": 0}),
    ]


def pad_trials(dtype: DType, rng: Rng) -> list[Trial]:
    x = shaped(dtype, (3, 4), rng)
    configs = [
        ((1, 2, 0), (0, 0, 1)),
        ((-1, 2, 1), (2, -2, 2)),
        ((0, -3, 0), (-4, 0, 0)),
        ((-2, -2, 3), (3, -5, 1)),
        ((0, 0, 0), (0, 0, 0)),
    ]
    values = itertools.cycle(edge_values(dtype)[:3])  # NaN, inf, -inf for floats
    trials = []
    for config, value in zip(configs, values):
        low, high, interior = zip(*config)
        trials.append(Trial(
            lambda x, v, c=config: lax.pad(x, v, c),
            (x, np.array(value, dtype.numpy)),
            {"low": low, "high": high, "interior": interior},
        ))
    return trials


def rev_trials(dtype: DType, rng: Rng) -> list[Trial]:
    x = shaped(dtype, (3, 4), rng)
    return [
        Trial(lambda x, d=d: lax.rev(x, d), (x,), {"dimensions": d})
        for d in [(0,), (1,), (0, 1), ()]
    ]


REDUCTION_LAYOUTS = [
    ((4, 16), (0,)),
    ((4, 16), (1,)),
    ((4, 16), (0, 1)),
    ((4, 16), ()),
    ((0, 5), (0,)),  # an empty axis: the identity
    ((3, 0), (0, 1)),
]


def reduction_trials(fn: Callable, values: Callable) -> Trials:
    """`fn(x, axes)` over every layout; `values(dtype, shape, rng)` makes the operand."""

    def trials(dtype: DType, rng: Rng) -> list[Trial]:
        operands = [(values(dtype, shape, rng), axes) for shape, axes in REDUCTION_LAYOUTS]
        zeros = np.array([[-0.0, 0.0], [0.0, -0.0], [-0.0, -0.0], [0.0, 0.0]]).astype(dtype.numpy)
        operands.append((zeros, (1,)))  # -0.0 < +0.0 for max and min, whichever comes first
        out = []
        for x, axes in operands:
            scale = np.sum(np.abs(x.astype(np.float64)), axis=axes) if dtype.is_float else None
            out.append(Trial(lambda x, a=axes: fn(x, a), (x,), {"axes": axes}, scale=scale))
        return out

    return trials


def summands(dtype: DType, shape: tuple[int, ...], rng: Rng) -> np.ndarray:
    """Moderate values, with NaN, infinities and signed zeros in the first rows."""
    x = moderate(dtype, shape, rng)
    if dtype.is_float and x.size:
        x[0, :3] = [math.nan, 1.0, -0.0]
        x[1, :2] = [math.inf, -0.0]
        x[2, :2] = [math.inf, -math.inf]
        x[3, :] = -0.0
    return x


def factors(dtype: DType, shape: tuple[int, ...], rng: Rng) -> np.ndarray:
    """Factors near 1 (16 of them stay finite in f16), with specials in the first rows."""
    if not dtype.is_float:
        return moderate(dtype, shape, rng)
    x = moderate(dtype, shape, rng, 0.7, 1.4)
    if x.size:
        x[0, :3] = [math.nan, 1.0, -0.0]
        x[1, :2] = [math.inf, -0.0]
        x[2, :2] = [math.inf, 0.0]
    return x


def argument_trials(fn: Callable) -> Trials:
    def trials(dtype: DType, rng: Rng) -> list[Trial]:
        tied = rng.integers(-2, 3, (5, 12)).astype(dtype.numpy)  # many ties
        edges = shaped(dtype, (5, 12), rng)
        out = []
        for x, axis, index_dtype in [
            (edges, 0, DType.S32),
            (edges, 1, DType.U8),
            (tied, 0, DType.S64),
            (tied, 1, DType.S32),
        ]:
            out.append(Trial(
                lambda x, a=axis, d=index_dtype: fn(x, a, d.numpy),
                (x,),
                {"axis": axis, "shape": Shape(index_dtype, (x.shape[1 - axis],))},
            ))
        return out

    return trials


DOT_LAYOUTS = [  # lhs shape, rhs shape, contracting, batch
    ((3, 4), (4, 5), ((1,), (0,)), ((), ())),
    ((2, 3, 4), (2, 4, 5), ((2,), (1,)), ((0,), (0,))),
    ((3, 2, 4), (4, 2, 5), ((1, 2), (1, 0)), ((), ())),
    ((3,), (4,), ((), ()), ((), ())),  # an outer product
    ((2, 0), (0, 3), ((1,), (0,)), ((), ())),  # an empty contraction: zeros
]
PREFERRED = {DType.S8: DType.S32, DType.U8: DType.U32, DType.F16: DType.F32, DType.BF16: DType.F32}


def dot_trials(dtype: DType, rng: Rng) -> list[Trial]:
    out = []
    for lhs_shape, rhs_shape, contracting, batch in DOT_LAYOUTS:
        lhs, rhs = moderate(dtype, lhs_shape, rng), moderate(dtype, rhs_shape, rng)
        if dtype.is_float and lhs_shape == (3, 4):  # specials: NaN, inf and inf - inf = NaN
            lhs[0, 1], lhs[1, 2], rhs[3, 4] = math.nan, math.inf, -math.inf
        numbers = (contracting, batch)
        scale = None
        if dtype.is_float:
            wide = [np.abs(a.astype(np.float64)) for a in (lhs, rhs)]
            scale = np.asarray(lax.dot_general(*wide, numbers))
        for result in {dtype, PREFERRED.get(dtype, dtype)}:
            out.append(Trial(
                lambda a, b, n=numbers, r=result: lax.dot_general(
                    a, b, n, preferred_element_type=r.numpy
                ),
                (lhs, rhs),
                {"contracting": contracting, "batch": batch, "dtype": result},
                scale=scale,
            ))
    return out


def constant_trials(dtype: DType, rng: Rng) -> list[Trial]:
    value = sample(dtype, rng)
    return [Trial(lambda: jnp.asarray(value), (), label="edge and random values",
                  build=lambda b: b.constant(value))]


def iota_trials(dtype: DType, rng: Rng) -> list[Trial]:
    shape = Shape(dtype, (3, 130))  # past 127 and 255: s8 and u8 wrap
    return [
        Trial(lambda d=d: lax.broadcasted_iota(dtype.numpy, shape.dims, d), (), {"dimension": d},
              build=lambda b, d=d: b.iota(shape=shape, dimension=d))
        for d in (0, 1)
    ]


def optimization_barrier_trials(dtype: DType, rng: Rng) -> list[Trial]:
    arrays = (sample(dtype, rng), shaped(dtype, (2, 3), rng))
    return [
        Trial(lambda x, y: lax.optimization_barrier((x, y)), arrays),
        Trial(lambda x: lax.optimization_barrier((x,)), arrays[:1]),
    ]


def tuple_trials(dtype: DType, rng: Rng) -> list[Trial]:
    return [Trial(lambda x, y: (x, y), (sample(dtype, rng), shaped(dtype, (2, 3), rng)))]


def get_tuple_element_trials(dtype: DType, rng: Rng) -> list[Trial]:
    arrays = (sample(dtype, rng), shaped(dtype, (2, 3), rng))
    return [
        Trial(lambda x, y, i=i: (x, y)[i], arrays, {"index": i},
              build=lambda b, x, y, i=i: b.get_tuple_element(b.tuple(x, y), index=i))
        for i in (0, 1)
    ]


SPECS: dict[Op, Spec] = {
    Op.CONSTANT: Spec(ALL, constant_trials),
    Op.IOTA: Spec(NUMERIC, iota_trials),
    Op.NEG: unary(lax.neg, NUMERIC),
    Op.ABS: unary(_abs, NUMERIC),
    Op.SIGN: unary(lax.sign, NUMERIC),
    Op.FLOOR: unary(lax.floor, FLOATS),
    Op.CEIL: unary(lax.ceil, FLOATS),
    Op.ROUND: Spec(FLOATS, round_trials),
    Op.EXP: unary(lax.exp, FLOATS, TRANSCENDENTAL),
    Op.EXP2: unary(lax.exp2, FLOATS, TRANSCENDENTAL),
    Op.EXPM1: unary(lax.expm1, FLOATS, TRANSCENDENTAL),
    Op.LOG: unary(lax.log, FLOATS, TRANSCENDENTAL),
    Op.LOG1P: unary(lax.log1p, FLOATS, TRANSCENDENTAL),
    Op.SQRT: unary(lax.sqrt, FLOATS),  # correctly rounded
    Op.RSQRT: unary(lax.rsqrt, FLOATS, TRANSCENDENTAL),
    Op.CBRT: replace(unary(lax.cbrt, FLOATS, TRANSCENDENTAL), flush_inputs=True),
    Op.TANH: unary(lax.tanh, FLOATS, TRANSCENDENTAL),
    Op.LOGISTIC: unary(lax.logistic, FLOATS, TRANSCENDENTAL),
    Op.SIN: unary(lax.sin, FLOATS, TRANSCENDENTAL),
    Op.COS: unary(lax.cos, FLOATS, TRANSCENDENTAL),
    Op.TAN: unary(lax.tan, FLOATS, TRANSCENDENTAL),
    Op.ATAN: unary(lax.atan, FLOATS, TRANSCENDENTAL),
    Op.ERF: unary(lax.erf, FLOATS, TRANSCENDENTAL),
    Op.ERFC: unary(lax.erfc, FLOATS, TRANSCENDENTAL),
    Op.IS_FINITE: unary(lax.is_finite, FLOATS),
    Op.NOT: unary(lax.bitwise_not, INT_OR_PRED),
    Op.INTEGER_POW: Spec(NUMERIC, integer_pow_trials),
    Op.ADD: binary(lax.add, NUMERIC),
    Op.SUB: binary(lax.sub, NUMERIC),
    Op.MUL: binary(lax.mul, NUMERIC),
    Op.DIV: binary(lax.div, NUMERIC),
    Op.REM: binary(lax.rem, NUMERIC),
    Op.POW: Spec(FLOATS, pow_trials, TRANSCENDENTAL, flush_inputs=True),
    Op.MAX: binary(lax.max, ALL),
    Op.MIN: binary(lax.min, ALL),
    Op.ATAN2: replace(binary(lax.atan2, FLOATS, TRANSCENDENTAL), flush_inputs=True),
    Op.AND: binary(lax.bitwise_and, INT_OR_PRED),
    Op.OR: binary(lax.bitwise_or, INT_OR_PRED),
    Op.XOR: binary(lax.bitwise_xor, INT_OR_PRED),
    Op.SHIFT_LEFT: Spec(INTEGERS, shift_trials(lax.shift_left)),
    Op.SHIFT_RIGHT_LOGICAL: Spec(INTEGERS, shift_trials(lax.shift_right_logical)),
    Op.SHIFT_RIGHT_ARITHMETIC: Spec(INTEGERS, shift_trials(lax.shift_right_arithmetic)),
    Op.EQ: binary(lax.eq, ALL),
    Op.NE: binary(lax.ne, ALL),
    Op.LT: binary(lax.lt, ALL),
    Op.LE: binary(lax.le, ALL),
    Op.GT: binary(lax.gt, ALL),
    Op.GE: binary(lax.ge, ALL),
    Op.SELECT_N: Spec(ALL, select_n_trials),
    Op.CLAMP: Spec(NUMERIC, clamp_trials),
    Op.CONVERT_ELEMENT_TYPE: Spec(ALL, convert_trials),
    Op.BITCAST_CONVERT: Spec(tuple(d for d in ALL if not d.is_pred), bitcast_trials),
    Op.BROADCAST_IN_DIM: Spec(ALL, broadcast_in_dim_trials),
    Op.RESHAPE: Spec(ALL, reshape_trials),
    Op.TRANSPOSE: Spec(ALL, transpose_trials),
    Op.SLICE: Spec(ALL, slice_trials),
    Op.DYNAMIC_SLICE: Spec(ALL, dynamic_slice_trials),
    Op.DYNAMIC_UPDATE_SLICE: Spec(ALL, dynamic_update_slice_trials),
    Op.CONCATENATE: Spec(ALL, concatenate_trials),
    Op.PAD: Spec(ALL, pad_trials),
    Op.REV: Spec(ALL, rev_trials),
    Op.REDUCE_SUM: Spec(NUMERIC, reduction_trials(lax.reduce_sum, summands), ACCUMULATION),
    Op.REDUCE_MAX: Spec(ALL, reduction_trials(lax.reduce_max, shaped)),
    Op.REDUCE_MIN: Spec(ALL, reduction_trials(lax.reduce_min, shaped)),
    Op.REDUCE_PROD: Spec(NUMERIC, reduction_trials(lax.reduce_prod, factors), ACCUMULATION),
    Op.REDUCE_AND: Spec(INT_OR_PRED, reduction_trials(lax.reduce_and, shaped)),
    Op.REDUCE_OR: Spec(INT_OR_PRED, reduction_trials(lax.reduce_or, shaped)),
    Op.ARGMAX: Spec(NUMERIC, argument_trials(lax.argmax)),
    Op.ARGMIN: Spec(NUMERIC, argument_trials(lax.argmin)),
    Op.DOT_GENERAL: Spec(NUMERIC, dot_trials, ACCUMULATION),
    Op.TUPLE: Spec(ALL, tuple_trials),
    Op.GET_TUPLE_ELEMENT: Spec(ALL, get_tuple_element_trials),
    Op.OPTIMIZATION_BARRIER: Spec(ALL, optimization_barrier_trials),
}

from tests.hlo.data_specs import DATA_SPECS  # noqa: E402  (cumulative ops, sort, gather, ...)

SPECS.update(DATA_SPECS)


# ---------------------------------------------------------------------------- running
def run_reference(op: Op, trial: Trial, arrays: Sequence[np.ndarray]) -> object:
    """The op on `arrays` through the builder and the reference interpreter."""
    b = Builder("main")
    params = [b.parameter(Shape.of(a), f"p{i}") for i, a in enumerate(arrays)]
    if trial.build is not None:
        root = trial.build(b, *params)
    else:
        root = b.emit(op, *params, **trial.attrs)
    return interpret(Module.of(b.build(root)), *arrays)


@functools.cache
def trials_of(op: Op, dtype: DType) -> list[Trial]:
    spec = SPECS[op]
    trials = spec.trials(dtype, np.random.default_rng(zlib.crc32(f"{op}-{dtype}".encode())))
    if spec.flush_inputs:
        trials = [replace(t, arrays=tuple(map(flush_subnormals, t.arrays))) for t in trials]
    return trials


@functools.cache
def lax_results(op: Op, platform: str = "cpu") -> dict[DType, list[object]]:
    """XLA's results for every trial of `op`, every dtype, from a single `jax.jit` on the first
    device of `platform`. The reference follows XLA:CPU, so its suite runs there whatever device
    jax defaults to; the jax backend's suite also asks for the device it runs on.

    Compiling is most of this file's run time, and one computation of many small independent
    ops compiles far faster than as many computations: XLA fuses same-shaped ones into one loop.
    """
    runs = [(dtype, trial) for dtype in SPECS[op].dtypes for trial in trials_of(op, dtype)]

    def run_all(*arrays):
        results, at = [], 0
        for _, trial in runs:
            count = len(trial.arrays)
            results.append(trial.lax_fn(*arrays[at : at + count]))
            at += count
        return results

    with jax.default_device(jax.devices(platform)[0]):
        results = jax.jit(run_all)(*(a for _, trial in runs for a in trial.arrays))
    by_dtype: dict[DType, list[object]] = {dtype: [] for dtype in SPECS[op].dtypes}
    for (dtype, _), result in zip(runs, results):
        by_dtype[dtype].append(result)
    return by_dtype


def _rounded_once(trial: Trial) -> object | None:
    """f64 -> f16 rounded once, as XLA does from jax 0.11 on; before, XLA went through f32, as
    the reference does (rounding twice: 1 + 2**-11 + 2**-52 becomes 1.0 rather than 1.001)."""
    (x,) = trial.arrays
    if x.dtype == np.float64 and trial.attrs.get("dtype") is DType.F16:
        with np.errstate(over="ignore"):  # to inf, as XLA
            return x.astype(np.float16)
    return None


# Results of another XLA version that an element may equal bit for bit instead of the reference's.
VERSIONS: dict[Op, Callable[[Trial], object | None]] = {Op.CONVERT_ELEMENT_TYPE: _rounded_once}


def as_tuple(value: object) -> tuple:
    return tuple(value) if isinstance(value, (tuple, list)) else (value,)


def check(
    op: Op, trial: Trial, got: object, tolerance: Tolerance, what: str, platform: object = None
) -> None:
    """XLA's `got` against the reference on the trial's arrays (or on them flushed); where
    `platform` (XLA's own results on the device `got` came from) is given, an element equal to
    it bit for bit passes too, as one equal to a result of another XLA version (`VERSIONS`)."""
    want = run_reference(op, trial, trial.arrays)
    flushed_arrays = [flush_subnormals(a) for a in trial.arrays]
    flushed = None
    if any(f is not a for f, a in zip(flushed_arrays, trial.arrays)):
        flushed = as_tuple(run_reference(op, trial, flushed_arrays))
    wants, gots = as_tuple(want), as_tuple(got)
    other_version = VERSIONS[op](trial) if op in VERSIONS else None
    alternatives = [as_tuple(a) for a in (platform, other_version) if a is not None]
    assert len(gots) == len(wants), f"{what}: {len(gots)} results, expected {len(wants)}"
    for i, (g, w) in enumerate(zip(gots, wants)):
        g, w = np.asarray(g), np.asarray(w)
        assert g.dtype == w.dtype, f"{what}: jax gives {g.dtype}, the reference {w.dtype}"
        assert_close(
            g,
            w,
            DType.from_numpy(w.dtype),
            what if len(wants) == 1 else f"{what} result {i}",
            tolerance,
            scale=trial.scale,
            flushed=None if flushed is None else flushed[i],
            inputs=trial.arrays,
            also=[a[i] for a in alternatives],
        )


CASES = [(op, dtype) for op, spec in SPECS.items() for dtype in spec.dtypes]


@pytest.mark.parametrize("op, dtype", CASES, ids=[f"{op}-{dtype}" for op, dtype in CASES])
def test_op_matches_lax(op: Op, dtype: DType) -> None:
    spec = SPECS[op]
    for trial, got in zip(trials_of(op, dtype), lax_results(op)[dtype], strict=True):
        details = [f"{k}={v}" for k, v in trial.attrs.items()] + [trial.label] * bool(trial.label)
        check(op, trial, got, spec.tolerance, f"{op}({dtype}) {', '.join(details)}")


def test_every_op_with_a_reference_is_covered() -> None:
    # a callback calls a Python function, not a lax op: tests/frontend/test_host_callback.py
    with_reference = {op for op, info in OPS.items() if info.ref is not None and op is not Op.CALLBACK}
    assert set(SPECS) == with_reference


@pytest.mark.parametrize("op", list(SPECS), ids=str)
def test_every_accepted_dtype_is_covered(op: Op) -> None:
    """Each op rejects the dtypes its spec leaves out, so none it accepts goes untested."""
    for dtype in set(ALL) - set(SPECS[op].dtypes):
        trial = SPECS[op].trials(dtype, np.random.default_rng(0))[0]
        with pytest.raises(BuilderError):
            run_reference(op, trial, trial.arrays)
