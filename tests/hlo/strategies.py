"""Hypothesis strategies for the IR: random well-typed modules built with the `Builder`, input
arrays that match them, and malformed HLO text. `modules()` draws a Module, `modules_with_inputs()`
a Module with arguments for its entry computation, `arrays(shape)` one argument, `scalars(dtype)`
one element, `mutated(texts)` a text from `texts` with random edits.

Every op of the table has a recipe in `RECIPES` (a test checks it), so what later tests build on
these strategies (passes, backends) sees every op, every dtype the op accepts, special floats
(NaN of either sign, -0.0, subnormals, extremes), source locations with odd characters, tuples,
and fusions and calls of other computations. Imports hypothesis, numpy and `xfuse.hlo` only.
"""

from __future__ import annotations

import math
import re
import string
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
from hypothesis import strategies as st

from xfuse.hlo import Builder, Computation, DType, Instruction, Loc, Module, Op, Shape, TupleShape
from xfuse.hlo.dtypes import finfo
from xfuse.hlo.ops import FUSION_KINDS, ROUNDING_METHODS

# ---------------------------------------------------------------------------- dtypes and shapes
ALL_DTYPES = tuple(DType)
FLOATS = tuple(d for d in DType if d.is_float)
INTEGERS = tuple(d for d in DType if d.is_integer)
NUMERIC = INTEGERS + FLOATS
INT_OR_PRED = (DType.PRED,) + INTEGERS

UNARY: dict[Op, tuple[DType, ...]] = {
    Op.NEG: NUMERIC,
    Op.ABS: NUMERIC,
    Op.SIGN: NUMERIC,
    **{
        op: FLOATS
        for op in (Op.FLOOR, Op.CEIL, Op.ROUND, Op.EXP, Op.EXP2, Op.EXPM1, Op.LOG, Op.LOG1P)
        + (Op.SQRT, Op.RSQRT, Op.CBRT, Op.TANH, Op.LOGISTIC, Op.SIN, Op.COS, Op.TAN, Op.ATAN)
        + (Op.ERF, Op.ERFC, Op.IS_FINITE)
    },
    Op.NOT: INT_OR_PRED,
    Op.INTEGER_POW: NUMERIC,
}
BINARY: dict[Op, tuple[DType, ...]] = {
    **{op: NUMERIC for op in (Op.ADD, Op.SUB, Op.MUL, Op.DIV, Op.REM)},
    **{op: FLOATS for op in (Op.POW, Op.ATAN2)},
    **{op: ALL_DTYPES for op in (Op.MAX, Op.MIN, Op.EQ, Op.NE, Op.LT, Op.LE, Op.GT, Op.GE)},
    **{op: INT_OR_PRED for op in (Op.AND, Op.OR, Op.XOR)},
    **{
        op: INTEGERS
        for op in (Op.SHIFT_LEFT, Op.SHIFT_RIGHT_LOGICAL, Op.SHIFT_RIGHT_ARITHMETIC)
    },
}
REDUCTIONS: dict[Op, tuple[DType, ...]] = {
    Op.REDUCE_SUM: NUMERIC,
    Op.REDUCE_PROD: NUMERIC,
    Op.REDUCE_MAX: ALL_DTYPES,
    Op.REDUCE_MIN: ALL_DTYPES,
    Op.REDUCE_AND: INT_OR_PRED,
    Op.REDUCE_OR: INT_OR_PRED,
}

MAX_RANK = 3  # of drawn shapes; dot_general and broadcast_in_dim results reach rank 4
dimensions = st.sampled_from((0, 1, 1, 2, 2, 3, 4))


def dims_of_rank(rank: int) -> st.SearchStrategy[tuple[int, ...]]:
    return st.lists(dimensions, min_size=rank, max_size=rank).map(tuple)


def shapes(
    dtypes: Sequence[DType] = ALL_DTYPES, min_rank: int = 0, max_rank: int = MAX_RANK
) -> st.SearchStrategy[Shape]:
    """Array shapes: one of `dtypes`, rank `min_rank..max_rank`, dimensions 0..4."""
    ranks = st.integers(min_rank, max_rank)
    return st.builds(Shape, st.sampled_from(tuple(dtypes)), ranks.flatmap(dims_of_rank))


# ---------------------------------------------------------------------------- values
def _float_specials(dtype: DType) -> list[float]:
    info = finfo(dtype)
    specials = [0.0, -0.0, 1.0, -1.0, 0.5, math.nan, -math.nan, math.inf, -math.inf]
    specials += [float(info.max), -float(info.max), float(info.tiny), -float(info.tiny)]
    specials += [float(info.smallest_subnormal), -float(info.smallest_subnormal)]
    specials += [float(info.eps), 0.1, 1 / 3, -2.5, 100.0]
    return specials


def _canonical(value: np.generic, dtype: DType) -> np.generic:
    """`value` as `dtype`, a NaN made the quiet NaN of its sign: the text keeps no payload."""
    if np.isnan(value):
        return np.asarray(-math.nan if np.signbit(value) else math.nan, dtype.numpy)[()]
    return value


def scalars(dtype: DType) -> st.SearchStrategy[np.generic]:
    """One element of `dtype` as a numpy scalar; specials and random bit patterns included."""
    if dtype.is_pred:
        return st.booleans().map(np.bool_)
    np_type = dtype.numpy.type
    if dtype.is_integer:
        info = np.iinfo(dtype.numpy)
        edges = sorted({int(info.min), int(info.max), 0, 1, int(info.max) // 2 + 1})
        if dtype.is_signed:
            edges += [-1, int(info.min) + 1]
        small = st.integers(max(-8, int(info.min)), 8)
        anything = st.integers(info.min, info.max)
        return st.one_of(st.sampled_from(edges), small, anything).map(np_type)
    unsigned = np.dtype(f"u{dtype.itemsize}")
    from_bits = st.integers(0, 2**dtype.bits - 1).map(
        lambda bits: np.asarray(bits, unsigned).view(dtype.numpy)[()]
    )
    ordinary = st.floats(-100, 100, width=32).map(lambda x: np.asarray(x, dtype.numpy)[()])
    specials = st.sampled_from(_float_specials(dtype)).map(lambda x: np.asarray(x, dtype.numpy)[()])
    return st.one_of(specials, ordinary, from_bits).map(lambda v: _canonical(v, dtype))


def arrays(shape: Shape) -> st.SearchStrategy[np.ndarray]:
    """A numpy array of `shape` (its numpy dtype, bf16 as ml_dtypes' bfloat16)."""
    size = shape.size
    return st.lists(scalars(shape.dtype), min_size=size, max_size=size).map(
        lambda elements: np.array(elements, dtype=shape.dtype.numpy).reshape(shape.dims)
    )


def arguments(module: Module) -> st.SearchStrategy[tuple[object, ...]]:
    """Arguments for `module`'s entry computation: one array (or tuple of them) per parameter."""

    def argument(shape) -> st.SearchStrategy[object]:
        if isinstance(shape, TupleShape):
            return st.tuples(*(argument(e) for e in shape.elements))
        return arrays(shape)

    return st.tuples(*(argument(s) for s in module.entry_computation.parameter_shapes))


# ---------------------------------------------------------------------------- names, locations
NAME_START = string.ascii_letters + "_"
NAME_REST = string.ascii_letters + string.digits + "_.-"
KEYWORDS = ("ROOT", "ENTRY", "HloModule", "nan", "inf", "true", "false", "loc", "kind", "f32")


def names() -> st.SearchStrategy[str]:
    """Names the text grammar admits (`[A-Za-z_][A-Za-z0-9_.-]*`), keywords included."""
    word = st.tuples(st.sampled_from(NAME_START), st.text(NAME_REST, max_size=8)).map("".join)
    return st.one_of(st.sampled_from(KEYWORDS), word)


_ODD = ' "\\/:.()_-\t\n' + "éß中😀\u200b"


def _text(exclude: str, max_size: int) -> st.SearchStrategy[str]:
    odd = st.sampled_from([c for c in _ODD if c not in exclude])
    anything = st.characters(exclude_characters=exclude, exclude_categories=("Cs",))
    return st.text(st.one_of(odd, anything), max_size=max_size)


def locations() -> st.SearchStrategy[Loc]:
    """Source locations; the file holds any character, the function any but ':' (a function
    holding ':12 (' would make the text `file:line (function)` ambiguous, see the printer)."""
    functions = st.one_of(st.just(""), _text(exclude=":", max_size=8))
    return st.builds(Loc, _text(exclude="", max_size=12), st.integers(0, 10**6), functions)


# ---------------------------------------------------------------------------- module generation
@dataclass
class _Context:
    """One computation being built: its builder, the values so far, and what may be added."""

    draw: Callable
    builder: Builder
    arrays: list[Instruction] = field(default_factory=list)
    tuples: list[Instruction] = field(default_factory=list)
    locs: tuple[Loc | None, ...] = (None,)
    new_parameters: bool = True  # callees have their parameters fixed by their call sites
    callees: list[Computation] | None = None  # None: no fusion or call from here
    reserved: set[str] = field(default_factory=set)  # computation names already taken

    def add(self, inst: Instruction) -> Instruction:
        (self.tuples if isinstance(inst.shape, TupleShape) else self.arrays).append(inst)
        return inst

    def pick(
        self, dtypes: Sequence[DType] = ALL_DTYPES, min_rank: int = 0, max_rank: int = MAX_RANK + 1
    ) -> Instruction:
        """An existing array of one of `dtypes` and a rank in range (mostly), else one converted
        from an existing array of another dtype, else a new one."""
        ranked = [v for v in self.arrays if min_rank <= v.shape.rank <= max_rank]
        fits = [v for v in ranked if v.shape.dtype in dtypes]
        if fits and self.draw(st.integers(0, 4)) > 0:
            return self.draw(st.sampled_from(fits))
        if ranked and self.draw(st.booleans()):
            source = self.draw(st.sampled_from(ranked))
            dtype = self.draw(st.sampled_from(tuple(dtypes)))
            return self.add(self.builder.convert_element_type(source, dtype=dtype))
        return self.value_of(self.draw(shapes(dtypes, min_rank, min(max_rank, MAX_RANK))))

    def value_of(self, shape: Shape) -> Instruction:
        """A value of exactly `shape`: an existing one, or one made from a value or a literal."""
        same = [v for v in self.arrays if v.shape == shape]
        same_dims = [v for v in self.arrays if v.shape.dims == shape.dims]
        scalars_ = [v for v in self.arrays if v.shape == Shape(shape.dtype, ())]
        choices = ["splat"] + (["constant"] if shape.size <= 16 else [])
        choices += ["existing"] * 3 if same else []
        choices += ["convert"] if same_dims else []
        choices += ["broadcast"] if scalars_ else []
        choices += ["parameter"] if self.new_parameters else []
        how = self.draw(st.sampled_from(choices))
        b = self.builder
        if how == "existing":
            return self.draw(st.sampled_from(same))
        if how == "convert":
            source = self.draw(st.sampled_from(same_dims))
            return self.add(b.convert_element_type(source, dtype=shape.dtype))
        if how == "broadcast":
            source = self.draw(st.sampled_from(scalars_))
            return self.add(b.broadcast_in_dim(source, shape=shape, dims=()))
        if how == "parameter":
            return self.add(b.parameter(shape, name=self.fresh_name()))
        if how == "splat":
            scalar = self.add(b.constant(self.draw(scalars(shape.dtype)), shape.dtype))
            if shape.rank == 0:
                return scalar
            return self.add(b.broadcast_in_dim(scalar, shape=shape, dims=()))
        return self.add(b.constant(self.draw(arrays(shape)), shape.dtype))

    def index(self) -> Instruction:
        """A scalar of any integer dtype, for dynamic_slice and dynamic_update_slice."""
        return self.value_of(Shape(self.draw(st.sampled_from(INTEGERS)), ()))

    def fresh_name(self) -> str:
        """A random name for a parameter, not yet used in this computation."""
        name = self.draw(names())
        taken = {v.name for v in self.arrays + self.tuples}
        return self.builder.fresh_name(name) if name in taken else name


Recipe = Callable[[_Context, Op], Instruction]


def _parameter(c: _Context, op: Op) -> Instruction:
    return c.add(c.builder.parameter(c.draw(shapes()), name=c.fresh_name()))


def _constant(c: _Context, op: Op) -> Instruction:
    shape = c.draw(shapes())
    value = c.draw(st.one_of(arrays(shape), scalars(shape.dtype)))
    return c.add(c.builder.constant(value, shape.dtype))


def _iota(c: _Context, op: Op) -> Instruction:
    shape = c.draw(shapes(NUMERIC, min_rank=1))
    dimension = c.draw(st.integers(0, shape.rank - 1))
    return c.add(c.builder.iota(shape=shape, dimension=dimension))


def _unary(c: _Context, op: Op) -> Instruction:
    x = c.pick(UNARY[op])
    attrs: dict[str, object] = {}
    if op is Op.ROUND:
        attrs["rounding_method"] = c.draw(st.sampled_from(ROUNDING_METHODS))
    if op is Op.INTEGER_POW:
        attrs["y"] = c.draw(st.integers(-3 if x.shape.dtype.is_float else 0, 5))
    return c.add(c.builder.emit(op, x, **attrs))


def _binary(c: _Context, op: Op) -> Instruction:
    x = c.pick(BINARY[op])
    y_dtype = x.shape.dtype
    if op is Op.POW and c.draw(st.booleans()):
        y_dtype = c.draw(st.sampled_from(INTEGERS))  # pow takes an integer exponent too
    return c.add(c.builder.emit(op, x, c.value_of(Shape(y_dtype, x.shape.dims))))


def _select_n(c: _Context, op: Op) -> Instruction:
    first = c.pick()
    which_dtype = c.draw(st.sampled_from((DType.PRED, DType.S32)))
    count = c.draw(st.integers(1, 2 if which_dtype is DType.PRED else 4))
    cases = [first] + [c.value_of(first.shape) for _ in range(count - 1)]
    which_dims = c.draw(st.sampled_from(((), first.shape.dims)))
    which = c.value_of(Shape(which_dtype, which_dims))
    return c.add(c.builder.select_n(which, *cases))


def _clamp(c: _Context, op: Op) -> Instruction:
    x = c.pick(NUMERIC)
    bounds = [
        c.value_of(Shape(x.shape.dtype, c.draw(st.sampled_from(((), x.shape.dims)))))
        for _ in range(2)
    ]
    return c.add(c.builder.clamp(bounds[0], x, bounds[1]))


def _convert(c: _Context, op: Op) -> Instruction:
    x = c.pick()
    return c.add(c.builder.convert_element_type(x, dtype=c.draw(st.sampled_from(ALL_DTYPES))))


def _bitcast(c: _Context, op: Op) -> Instruction:
    x = c.pick(tuple(d for d in ALL_DTYPES if not d.is_pred))
    width = x.shape.dtype.bits
    to = c.draw(st.sampled_from([d for d in ALL_DTYPES if d.bits == width and not d.is_pred]))
    return c.add(c.builder.emit(Op.BITCAST_CONVERT, x, dtype=to))


def _broadcast_in_dim(c: _Context, op: Op) -> Instruction:
    x = c.pick()
    rank = c.draw(st.integers(x.shape.rank, max(MAX_RANK, x.shape.rank)))
    mapped = sorted(c.draw(st.permutations(range(rank)))[: x.shape.rank])
    out = list(c.draw(dims_of_rank(rank)))
    for i, d in enumerate(mapped):
        if x.shape.dims[i] != 1 or c.draw(st.booleans()):
            out[d] = x.shape.dims[i]
    shape = Shape(x.shape.dtype, tuple(out))
    return c.add(c.builder.broadcast_in_dim(x, shape=shape, dims=tuple(mapped)))


def _reshape_dims(c: _Context, size: int) -> tuple[int, ...]:
    if size == 0:
        rank = c.draw(st.integers(1, MAX_RANK))
        dims = list(c.draw(dims_of_rank(rank)))
        dims[c.draw(st.integers(0, rank - 1))] = 0
        return tuple(dims)
    factors, n, p = [], size, 2
    while n > 1:
        while n % p == 0:
            factors.append(p)
            n //= p
        p += 1
    rank = c.draw(st.integers(0 if size == 1 else 1, MAX_RANK))
    if rank == 0:
        return ()
    dims = [1] * rank
    for f in factors:
        dims[c.draw(st.integers(0, rank - 1))] *= f
    return tuple(dims)


def _reshape(c: _Context, op: Op) -> Instruction:
    x = c.pick()
    shape = Shape(x.shape.dtype, _reshape_dims(c, x.shape.size))
    return c.add(c.builder.reshape(x, shape=shape))


def _transpose(c: _Context, op: Op) -> Instruction:
    x = c.pick()
    permutation = tuple(c.draw(st.permutations(range(x.shape.rank))))
    return c.add(c.builder.transpose(x, permutation=permutation))


def _slice(c: _Context, op: Op) -> Instruction:
    x = c.pick()
    start, limit, strides = [], [], []
    for d in x.shape.dims:
        s = c.draw(st.integers(0, d))
        start.append(s)
        limit.append(c.draw(st.integers(s, d)))
        strides.append(c.draw(st.integers(1, 3)))
    return c.add(c.builder.slice(x, start=start, limit=limit, strides=strides))


def _sizes_within(c: _Context, dims: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(c.draw(st.integers(0, d)) for d in dims)


def _dynamic_slice(c: _Context, op: Op) -> Instruction:
    x = c.pick()
    indices = [c.index() for _ in x.shape.dims]
    shape = x.shape.with_dims(_sizes_within(c, x.shape.dims))
    return c.add(c.builder.dynamic_slice(x, *indices, shape=shape))


def _dynamic_update_slice(c: _Context, op: Op) -> Instruction:
    x = c.pick()
    update = c.value_of(x.shape.with_dims(_sizes_within(c, x.shape.dims)))
    indices = [c.index() for _ in x.shape.dims]
    return c.add(c.builder.dynamic_update_slice(x, update, *indices))


def _concatenate(c: _Context, op: Op) -> Instruction:
    x = c.pick(min_rank=1)
    dimension = c.draw(st.integers(0, x.shape.rank - 1))
    parts = [x]
    for _ in range(c.draw(st.integers(0, 2))):
        dims = list(x.shape.dims)
        dims[dimension] = c.draw(dimensions)
        parts.append(c.value_of(x.shape.with_dims(tuple(dims))))
    order = c.draw(st.permutations(parts))
    return c.add(c.builder.concatenate(*order, dimension=dimension))


def _pad(c: _Context, op: Op) -> Instruction:
    x = c.pick()
    value = c.value_of(Shape(x.shape.dtype, ()))
    low, high, interior = [], [], []
    for d in x.shape.dims:
        it = c.draw(st.integers(0, 2))
        grown = d + max(0, d - 1) * it
        lo = c.draw(st.integers(-min(2, grown), 2))  # negative padding crops
        hi = c.draw(st.integers(max(-2, -(grown + lo)), 2))
        low.append(lo)
        high.append(hi)
        interior.append(it)
    return c.add(c.builder.pad(x, value, low=low, high=high, interior=interior))


def _axes(c: _Context, rank: int) -> tuple[int, ...]:
    """Some distinct dimensions, in any order."""
    order = c.draw(st.permutations(range(rank)))
    return tuple(order[: c.draw(st.integers(0, rank))])


def _rev(c: _Context, op: Op) -> Instruction:
    x = c.pick()
    return c.add(c.builder.rev(x, dimensions=_axes(c, x.shape.rank)))


def _reduce(c: _Context, op: Op) -> Instruction:
    x = c.pick(REDUCTIONS[op])
    return c.add(c.builder.emit(op, x, axes=_axes(c, x.shape.rank)))


def _arg_reduce(c: _Context, op: Op) -> Instruction:
    x = c.pick(NUMERIC, min_rank=1)
    axes = [i for i, d in enumerate(x.shape.dims) if d > 0]
    if not axes:  # every dimension is empty: take a non-empty value instead
        dims = tuple(max(d, 1) for d in x.shape.dims)
        x = c.value_of(x.shape.with_dims(dims))
        axes = list(range(x.shape.rank))
    axis = c.draw(st.sampled_from(axes))
    dims = tuple(d for i, d in enumerate(x.shape.dims) if i != axis)
    shape = Shape(c.draw(st.sampled_from(INTEGERS)), dims)
    return c.add(c.builder.emit(op, x, shape=shape, axis=axis))


def _dot_general(c: _Context, op: Op) -> Instruction:
    lhs = c.pick(NUMERIC, max_rank=MAX_RANK)
    rank = lhs.shape.rank
    order = c.draw(st.permutations(range(rank)))
    n_batch = c.draw(st.integers(0, rank))
    n_contract = c.draw(st.integers(0, rank - n_batch))
    lhs_batch, lhs_contract = order[:n_batch], order[n_batch : n_batch + n_contract]
    # the rhs has rank <= 3 and the result rank <= 4
    free_room = min(MAX_RANK - n_batch - n_contract, 4 - (rank - n_contract))
    n_free = c.draw(st.integers(0, max(0, free_room)))
    rhs_rank = n_batch + n_contract + n_free
    slots = c.draw(st.permutations(range(rhs_rank)))
    rhs_batch, rhs_contract = slots[:n_batch], slots[n_batch : n_batch + n_contract]
    rhs_dims = list(c.draw(dims_of_rank(rhs_rank)))
    for a, b in zip(lhs_batch + lhs_contract, rhs_batch + rhs_contract):
        rhs_dims[b] = lhs.shape.dims[a]
    rhs = c.value_of(lhs.shape.with_dims(tuple(rhs_dims)))
    family = FLOATS if lhs.shape.dtype.is_float else INTEGERS
    dtype = c.draw(st.one_of(st.none(), st.sampled_from(family)))
    return c.add(
        c.builder.dot_general(
            lhs,
            rhs,
            contracting=(tuple(lhs_contract), tuple(rhs_contract)),
            batch=(tuple(lhs_batch), tuple(rhs_batch)),
            dtype=dtype,
        )
    )


def _tuple(c: _Context, op: Op) -> Instruction:
    """tuple (maybe empty, maybe nested) or optimization_barrier (at least one value)."""
    pool = c.arrays + c.tuples
    count = c.draw(st.integers(0 if op is Op.TUPLE else 1, 3))
    elements = [c.draw(st.sampled_from(pool)) if pool else c.pick() for _ in range(count)]
    return c.add(c.builder.emit(op, *elements))


def _get_tuple_element(c: _Context, op: Op) -> Instruction:
    candidates = [t for t in c.tuples if t.shape.elements]
    t = c.draw(st.sampled_from(candidates)) if candidates else c.add(c.builder.tuple(c.pick()))
    index = c.draw(st.integers(0, len(t.shape.elements) - 1))
    return c.add(c.builder.get_tuple_element(t, index=index))


def _called(c: _Context, op: Op) -> Instruction:
    """A fusion or call of a new computation, or of one already called with matching operands."""
    assert c.callees is not None, "callees do not call"
    reusable = [k for k in c.callees if all(isinstance(s, Shape) for s in k.parameter_shapes)]
    if reusable and c.draw(st.booleans()):
        callee = c.draw(st.sampled_from(reusable))
        operands = [c.value_of(s) for s in callee.parameter_shapes]
    else:
        pool = c.arrays + c.tuples
        count = c.draw(st.integers(0, 3))
        operands = [c.draw(st.sampled_from(pool)) if pool else c.pick() for _ in range(count)]
        callee = _callee(c, op, [o.shape for o in operands])
        c.callees.append(callee)
    attrs: dict[str, object] = {"calls": callee.name}
    if op is Op.FUSION:
        attrs["kind"] = c.draw(st.sampled_from(FUSION_KINDS))
    return c.add(c.builder.emit(op, *operands, shape=callee.result_shape, **attrs))


def _fresh_computation_name(c: _Context, base: str) -> str:
    name, n = base, 0
    while name in c.reserved:
        name, n = f"{base}_{n}", n + 1
    c.reserved.add(name)
    return name


def _while(c: _Context, op: Op) -> Instruction:
    """A loop that ends: a counter from 0 to 0..3, the other state doubled or passed along."""
    assert c.callees is not None, "callees do not call"
    count = Shape(DType.S32, ())
    state = [c.draw(st.sampled_from(c.arrays)) if c.arrays else c.pick() for _ in range(c.draw(st.integers(0, 2)))]
    shapes = [count] + [v.shape for v in state]
    cond = Builder(_fresh_computation_name(c, "while_cond"))
    params = [cond.parameter(s, name=f"s{k}") for k, s in enumerate(shapes)]
    cond_comp = cond.build(cond.lt(params[0], cond.constant(np.int32(c.draw(st.integers(0, 3))))))
    body = Builder(_fresh_computation_name(c, "while_body"))
    params = [body.parameter(s, name=f"s{k}") for k, s in enumerate(shapes)]
    updated = [body.add(params[0], body.constant(np.int32(1)))]
    for p in params[1:]:
        doubled = not p.shape.dtype.is_pred and c.draw(st.booleans())
        updated.append(body.add(p, p) if doubled else p)
    body_comp = body.build(updated)
    c.callees.extend([cond_comp, body_comp])
    start = c.add(c.builder.constant(np.int32(c.draw(st.integers(-1, 1)))))
    return c.add(c.builder.emit(op, start, *state, condition=cond_comp.name, body=body_comp.name))


def _conditional(c: _Context, op: Op) -> Instruction:
    """A conditional on an s32[] index (maybe out of range) over random branches of one type."""
    assert c.callees is not None, "callees do not call"
    index = c.value_of(Shape(DType.S32, ()))
    operands = [c.draw(st.sampled_from(c.arrays)) if c.arrays else c.pick() for _ in range(c.draw(st.integers(0, 2)))]
    shapes = [o.shape for o in operands]
    branches = [_callee(c, op, shapes)]
    for _ in range(c.draw(st.integers(0, 2))):
        other = _callee(c, op, shapes)
        if other.result_shape == branches[0].result_shape:
            branches.append(other)
    c.callees.extend(branches)
    names = c.draw(st.lists(st.sampled_from([b.name for b in branches]), min_size=1, max_size=3))
    result = branches[0].result_shape
    return c.add(c.builder.emit(op, index, *operands, branches=[branches[0].name, *names], shape=result))


def _callee(c: _Context, op: Op, parameter_shapes: list) -> Computation:
    base = c.draw(st.one_of(names(), st.just(f"fused_{op.value}")))
    name, n = base, 0
    while name in c.reserved:
        name, n = f"{base}_{n}", n + 1
    c.reserved.add(name)
    inner = _Context(c.draw, Builder(name), locs=c.locs, new_parameters=False)
    for shape in parameter_shapes:
        inner.add(inner.builder.parameter(shape, name=inner.fresh_name()))
    return _body(inner, steps=c.draw(st.integers(0, 4)), ops=CALLEE_OPS)


RECIPES: dict[Op, Recipe] = {
    Op.PARAMETER: _parameter,
    Op.CONSTANT: _constant,
    Op.IOTA: _iota,
    **{op: _unary for op in UNARY},
    **{op: _binary for op in BINARY},
    Op.SELECT_N: _select_n,
    Op.CLAMP: _clamp,
    Op.CONVERT_ELEMENT_TYPE: _convert,
    Op.BITCAST_CONVERT: _bitcast,
    Op.BROADCAST_IN_DIM: _broadcast_in_dim,
    Op.RESHAPE: _reshape,
    Op.TRANSPOSE: _transpose,
    Op.SLICE: _slice,
    Op.DYNAMIC_SLICE: _dynamic_slice,
    Op.DYNAMIC_UPDATE_SLICE: _dynamic_update_slice,
    Op.CONCATENATE: _concatenate,
    Op.PAD: _pad,
    Op.REV: _rev,
    **{op: _reduce for op in REDUCTIONS},
    Op.ARGMAX: _arg_reduce,
    Op.ARGMIN: _arg_reduce,
    Op.DOT_GENERAL: _dot_general,
    Op.TUPLE: _tuple,
    Op.GET_TUPLE_ELEMENT: _get_tuple_element,
    Op.OPTIMIZATION_BARRIER: _tuple,
    Op.FUSION: _called,
    Op.CALL: _called,
    Op.WHILE: _while,
    Op.CONDITIONAL: _conditional,
}

from tests.hlo.strategies_data import DATA_RECIPES  # noqa: E402  (cumsum, sort, gather, ...)

RECIPES.update(DATA_RECIPES)

CALLING_OPS = (Op.FUSION, Op.CALL, Op.WHILE, Op.CONDITIONAL)
CALLEE_OPS = tuple(op for op in RECIPES if op is not Op.PARAMETER and op not in CALLING_OPS)


def _body(c: _Context, steps: int, ops: Sequence[Op] = tuple(RECIPES)) -> Computation:
    """`steps` random ops, then a root: the last value, any value, or a tuple of values."""
    last = None
    for _ in range(steps):
        c.builder.loc = c.draw(st.sampled_from(c.locs))
        op = c.draw(st.sampled_from(tuple(ops)))
        last = RECIPES[op](c, op)
    c.builder.loc = c.draw(st.sampled_from(c.locs))
    if last is None:
        last = c.pick()
    pool = c.arrays + c.tuples
    how = c.draw(st.sampled_from(("last", "last", "any", "tuple")))
    if how == "any":
        return c.builder.build(c.draw(st.sampled_from(pool)))
    if how == "tuple":
        return c.builder.build(c.draw(st.lists(st.sampled_from(pool), min_size=1, max_size=3)))
    return c.builder.build(last)


@st.composite
def modules(
    draw,
    max_ops: int = 8,
    max_parameters: int = 3,
    calls: bool = True,
    source_locations: bool = True,
    ops: Sequence[Op] | None = None,
) -> Module:
    """A random well-typed module: parameters, up to `max_ops` ops drawn from `ops` (default:
    the whole table), maybe fusions/calls of other computations (`calls`), maybe source
    locations (`source_locations`). It verifies; `arguments(module)` draws inputs for it."""
    chosen = tuple(RECIPES) if ops is None else tuple(ops)
    calling = tuple(op for op in (Op.FUSION, Op.CALL) if op in chosen)
    if calls:  # with the whole table, one step in five or so is a fusion or a call
        chosen += calling * (len(chosen) // 8)
    else:
        chosen = tuple(op for op in chosen if op not in CALLING_OPS)
    entry_name = draw(names())
    locs: tuple[Loc | None, ...] = (None,)
    if source_locations and draw(st.booleans()):
        locs += tuple(draw(st.lists(locations(), min_size=1, max_size=3)))
    c = _Context(draw, Builder(entry_name), locs=locs, callees=[], reserved={entry_name})
    for _ in range(draw(st.integers(0, max_parameters))):
        c.builder.loc = draw(st.sampled_from(locs))
        c.add(c.builder.parameter(draw(shapes()), name=c.fresh_name()))
    entry = _body(c, steps=draw(st.integers(1, max_ops)), ops=chosen)
    return Module.of(entry, *c.callees, name=draw(names()))


@st.composite
def modules_with_inputs(draw, **options) -> tuple[Module, tuple[object, ...]]:
    """A module from `modules(**options)` and arguments for its entry computation."""
    module = draw(modules(**options))
    return module, draw(arguments(module))


# ---------------------------------------------------------------------------- malformed text
# Pieces of the grammar to insert or swap in: keywords, punctuation, ops, dtypes, literals,
# attributes, and values at and past the edges (huge integers, overflowing floats, strings).
TEXT_VOCABULARY = (
    *("HloModule", "ENTRY", "ROOT", "->", "(", ")", "{", "}", "[", "]", ",", ";", ":", "="),
    *(op.value for op in Op),
    *(d.value for d in DType),
    *("nan", "-nan", "inf", "-inf", "true", "false", "0", "1", "-1", "0.5", "1e999", "-0.0"),
    *("128", "65520", "18446744073709551616", "9" * 30, "٣", "1_0", "infinity", "NaN"),
    *("kind", "calls", "loc", "dims", "axes", "index", "loop", "multi_output", "sideways"),
    *('"a.py:1"', '"a.py:1 (f)"', '"nowhere"', '"\\x"', '"', "//", "\n", " ", "\t", "\r"),
)
_TOKENS_RE = re.compile(
    r'"(?:[^"\\\n]|\\.)*"|[A-Za-z_][A-Za-z0-9_.\-]*|-?\d[\d.eE+\-]*|->|\s+|.', re.DOTALL
)


def _span(draw, text: str) -> tuple[int, int]:
    start = draw(st.integers(0, len(text)))
    return start, min(len(text), start + draw(st.integers(0, 12)))


def _piece(draw) -> str:
    return draw(st.one_of(st.sampled_from(TEXT_VOCABULARY), st.characters(), st.text(max_size=3)))


def _mutate_characters(draw, text: str) -> str:
    start, end = _span(draw, text)
    how = draw(st.sampled_from(("delete", "insert", "replace", "duplicate", "truncate")))
    if how == "delete":
        return text[:start] + text[end:]
    if how == "insert":
        return text[:start] + _piece(draw) + text[start:]
    if how == "replace":
        return text[:start] + _piece(draw) + text[start + 1 :]
    if how == "duplicate":
        return text[:end] + text[start:end] + text[end:]
    return text[:start]


def _mutate_tokens(draw, text: str) -> str:
    tokens = _TOKENS_RE.findall(text) or [""]
    i = draw(st.integers(0, len(tokens) - 1))
    how = draw(st.sampled_from(("delete", "replace", "duplicate", "swap", "copy")))
    if how == "delete":
        del tokens[i]
    elif how == "replace":
        tokens[i] = draw(st.sampled_from(TEXT_VOCABULARY))
    elif how == "duplicate":
        tokens.insert(i, tokens[i])
    else:
        j = draw(st.integers(0, len(tokens) - 1))
        if how == "swap":
            tokens[i], tokens[j] = tokens[j], tokens[i]
        else:
            tokens[i] = tokens[j]
    return "".join(tokens)


@st.composite
def mutated(draw, texts: st.SearchStrategy[str], max_mutations: int = 4) -> str:
    """A text from `texts` with 1..max_mutations random edits: characters or grammar tokens
    deleted, inserted, replaced, duplicated, swapped, or the text cut short."""
    text = draw(texts)
    for _ in range(draw(st.integers(1, max_mutations))):
        mutate = draw(st.sampled_from((_mutate_characters, _mutate_tokens)))
        text = mutate(draw, text)
    return text
