"""A hypothesis strategy for modules built around the simplifier's rules: random values wrapped
in the patterns the rules look for (x + splat, neg(neg x), transpose chains, select_n with
constant selectors, integer_pow(x, 0), ...) and in near misses (x + 0.0 on floats, x * 0,
x - x, partial slices, out-of-range selectors), over random shapes and dtypes. The generic
strategy of tests/hlo/strategies.py almost never builds these, so the rules' exactness is
checked here. Imports hypothesis, numpy and xfuse.hlo only.
"""

from __future__ import annotations

import math

import numpy as np
from hypothesis import strategies as st

from xfuse.hlo import Builder, DType, Instruction, Module, Op, Shape

FLOATS = (DType.F32, DType.F16, DType.BF16, DType.F64)
INTEGERS = (DType.S32, DType.S8, DType.U8, DType.U32, DType.S64)
NUMERIC = FLOATS + INTEGERS
ALL = NUMERIC + (DType.PRED,)
dims = st.sampled_from((1, 2, 2, 3, 3, 0))


def splat_values(dtype: DType) -> list[object]:
    if dtype.is_pred:
        return [True, False]
    if dtype.is_integer:
        return [0, 0, 1, 1, 2, 3] + ([-1] if dtype.is_signed else [])
    return [0.0, -0.0, 0.0, -0.0, 1.0, 1.0, -1.0, 2.0, math.nan, math.inf]


class _Builder:
    """The module being drawn: a builder, the values so far and the parameters."""

    def __init__(self, draw) -> None:
        self.draw = draw
        self.b = Builder("main")
        self.values: list[Instruction] = []
        self.parameters = 0

    def parameter(self, shape: Shape) -> Instruction:
        self.parameters += 1
        return self.b.parameter(shape, name=f"p{self.parameters}")

    def keep(self, inst: Instruction) -> Instruction:
        self.values.append(inst)
        return inst

    def value(self, dtypes=ALL, min_rank: int = 0) -> Instruction:
        """An existing value of one of `dtypes` (and at least `min_rank`), or a new parameter."""
        fits = [v for v in self.values if v.shape.dtype in dtypes and v.shape.rank >= min_rank]
        if fits and self.draw(st.integers(0, 3)) > 0:
            return self.draw(st.sampled_from(fits))
        dtype = self.draw(st.sampled_from(dtypes))
        rank = self.draw(st.integers(min_rank, 3))
        return self.keep(self.parameter(Shape(dtype, tuple(self.draw(dims) for _ in range(rank)))))

    def splat(self, shape: Shape, value: object | None = None) -> Instruction:
        """A splat of `shape`: a broadcast scalar (maybe through two broadcasts) or a literal."""
        b, dtype = self.b, shape.dtype
        if value is None:
            value = self.draw(st.sampled_from(splat_values(dtype)))
        how = self.draw(st.sampled_from(("broadcast", "broadcast", "twice", "literal", "mixed")))
        if shape.rank == 0 or how == "literal":
            return b.constant(np.full(shape.dims, value, dtype.numpy), dtype)
        if how == "mixed" and shape.size > 1:  # not a splat: the rules must not match it
            array = np.full(shape.dims, value, dtype.numpy).reshape(-1)
            array[-1] = np.asarray(0 if dtype.is_pred else 3, dtype.numpy)
            return b.constant(array.reshape(shape.dims), dtype)
        scalar = b.constant(value, dtype)
        if how == "twice":
            inner = b.broadcast_in_dim(scalar, shape=Shape(dtype, shape.dims[-1:]), dims=())
            return b.broadcast_in_dim(inner, shape=shape, dims=(shape.rank - 1,))
        return b.broadcast_in_dim(scalar, shape=shape, dims=())


# The splat value that makes each op an identity, where there is one (drawn half the time).
IDENTITY = {
    Op.ADD: lambda dtype: -0.0 if dtype.is_float else 0,
    Op.SUB: lambda dtype: 0.0 if dtype.is_float else 0,
    Op.MUL: lambda dtype: 1,
    Op.DIV: lambda dtype: 1,
    Op.MAX: lambda dtype: _extreme(dtype, lowest=True),
    Op.MIN: lambda dtype: _extreme(dtype, lowest=False),
}


def _extreme(dtype: DType, lowest: bool) -> object:
    if dtype.is_float:
        return -math.inf if lowest else math.inf
    if dtype.is_pred:
        return not lowest
    info = np.iinfo(dtype.numpy)
    return int(info.min if lowest else info.max)


def _binary_splat(c: _Builder) -> Instruction:
    op = c.draw(st.sampled_from((Op.ADD, Op.SUB, Op.MUL, Op.DIV, Op.MAX, Op.MIN, Op.AND, Op.OR)))
    dtypes = {Op.AND: (DType.PRED,) + INTEGERS, Op.OR: (DType.PRED,) + INTEGERS}.get(op, NUMERIC)
    if op in (Op.MAX, Op.MIN):
        dtypes = ALL
    x = c.value(dtypes)
    value = None
    if op in IDENTITY and c.draw(st.booleans()):
        value = IDENTITY[op](x.shape.dtype)
    s = c.splat(x.shape, value)
    operands = (x, s) if c.draw(st.booleans()) else (s, x)
    return c.b.emit(op, *operands)


def _same_operands(c: _Builder) -> Instruction:
    op = c.draw(st.sampled_from((Op.ADD, Op.SUB, Op.MUL, Op.DIV, Op.MAX, Op.MIN, Op.AND, Op.OR)))
    x = c.value((DType.PRED,) + INTEGERS if op in (Op.AND, Op.OR) else NUMERIC)
    return c.b.emit(op, x, x)


def _involution(c: _Builder) -> Instruction:
    op = c.draw(st.sampled_from((Op.NEG, Op.NOT)))
    x = c.value(NUMERIC if op is Op.NEG else (DType.PRED,) + INTEGERS)
    for _ in range(c.draw(st.integers(1, 3))):
        x = c.keep(c.b.emit(op, x))
    return x


def _factorisation(c: _Builder, size: int) -> tuple[int, ...]:
    if size == 0:
        return (0, c.draw(st.integers(1, 3)))
    out, rest = [], size
    for p in (2, 3, 5, 7):
        while rest % p == 0:
            out.append(p)
            rest //= p
    if rest > 1:
        out.append(rest)
    out += [1] * c.draw(st.integers(0, 1))
    return tuple(c.draw(st.permutations(out)))


def _reshapes(c: _Builder) -> Instruction:
    x = c.value()
    for _ in range(c.draw(st.integers(1, 3))):
        dims_ = c.draw(st.sampled_from((x.shape.dims, _factorisation(c, x.shape.size))))
        x = c.keep(c.b.reshape(x, shape=x.shape.with_dims(dims_)))
    return x


def _transposes(c: _Builder) -> Instruction:
    x = c.value()
    for _ in range(c.draw(st.integers(1, 3))):
        permutation = tuple(c.draw(st.permutations(range(x.shape.rank))))
        x = c.keep(c.b.transpose(x, permutation=permutation))
    return x


def _broadcasts(c: _Builder) -> Instruction:
    x = c.value()
    for _ in range(c.draw(st.integers(1, 2))):
        extra = c.draw(st.integers(0, 1 if x.shape.rank >= 3 else 2))
        rank = x.shape.rank + extra
        mapped = sorted(c.draw(st.permutations(range(rank)))[: x.shape.rank])
        out = [c.draw(dims) for _ in range(rank)]
        for i, d in enumerate(mapped):
            if x.shape.dims[i] != 1 or c.draw(st.booleans()):
                out[d] = x.shape.dims[i]
        shape = x.shape.with_dims(tuple(out))
        x = c.keep(c.b.broadcast_in_dim(x, shape=shape, dims=tuple(mapped)))
    return x


def _convert(c: _Builder) -> Instruction:
    x = c.value()
    dtype = c.draw(st.sampled_from((x.shape.dtype, x.shape.dtype) + ALL))
    return c.b.convert_element_type(x, dtype=dtype)


def _select(c: _Builder) -> Instruction:
    x = c.value()
    n = c.draw(st.integers(1, 3))
    cases = [x] + [c.draw(st.sampled_from((x, c.parameter(x.shape)))) for _ in range(n - 1)]
    which_dims = c.draw(st.sampled_from(((), x.shape.dims)))
    if n <= 2 and c.draw(st.booleans()):
        which = c.splat(Shape(DType.PRED, which_dims), c.draw(st.booleans()))
    elif c.draw(st.booleans()):
        which = c.splat(Shape(DType.S32, which_dims), c.draw(st.integers(-1, n)))
    else:
        which = c.parameter(Shape(DType.PRED, which_dims))
        if n > 2:
            which = c.b.convert_element_type(which, dtype=DType.S32)
    return c.b.select_n(which, *cases)


def _slice(c: _Builder) -> Instruction:
    x = c.value()
    full = c.draw(st.booleans())
    start = [0 if full else c.draw(st.integers(0, d)) for d in x.shape.dims]
    limit = [d if full else c.draw(st.integers(s, d)) for s, d in zip(start, x.shape.dims)]
    strides = [1 if full else c.draw(st.integers(1, 2)) for _ in x.shape.dims]
    return c.b.slice(x, start=start, limit=limit, strides=strides)


def _concatenate(c: _Builder) -> Instruction:
    x = c.value(min_rank=1)
    parts = [x] * c.draw(st.integers(1, 2))
    return c.b.concatenate(*parts, dimension=c.draw(st.integers(0, x.shape.rank - 1)))


def _integer_pow(c: _Builder) -> Instruction:
    x = c.value(NUMERIC)
    y = c.draw(st.sampled_from((0, 1, 2) + ((-1,) if x.shape.dtype.is_float else ())))
    return c.b.integer_pow(x, y=y)


def _reduce(c: _Builder) -> Instruction:
    op = c.draw(st.sampled_from((Op.REDUCE_SUM, Op.REDUCE_PROD, Op.REDUCE_MAX, Op.REDUCE_MIN)))
    x = c.value(NUMERIC)
    axes = c.draw(st.sampled_from(((), (), tuple(range(x.shape.rank))[:1])))
    return c.b.emit(op, x, axes=axes)


def _pad(c: _Builder) -> Instruction:
    x = c.value()
    value = c.splat(Shape(x.shape.dtype, ()))
    zero = c.draw(st.booleans())
    pads = [[0 if zero else c.draw(st.integers(0, 1)) for _ in x.shape.dims] for _ in range(3)]
    return c.b.pad(x, value, low=pads[0], high=pads[1], interior=pads[2])


def _rev(c: _Builder) -> Instruction:
    x = c.value()
    dimensions = c.draw(st.sampled_from(((), tuple(range(x.shape.rank))[:1])))
    return c.b.rev(x, dimensions=dimensions)


TEMPLATES = (
    _binary_splat,
    _binary_splat,
    _binary_splat,
    _same_operands,
    _involution,
    _involution,
    _select,
    _reshapes,
    _transposes,
    _broadcasts,
    _convert,
    _select,
    _slice,
    _concatenate,
    _integer_pow,
    _reduce,
    _pad,
    _rev,
)


@st.composite
def rule_modules(draw, max_steps: int = 6) -> Module:
    """A module whose entry applies a few rule patterns (and near misses) to its parameters."""
    c = _Builder(draw)
    made = []
    for _ in range(draw(st.integers(1, max_steps))):
        template = draw(st.sampled_from(TEMPLATES))
        made.append(c.keep(template(c)))
    roots = made[-draw(st.integers(1, min(3, len(made)))) :]
    return Module.of(c.b.build(roots if len(roots) > 1 else roots[0]))
