"""Shape rules: from operand shapes and attributes to the result shape, or a `ShapeError`.

Every rule has the signature `rule(operands, attrs, result) -> shape`. `result` is the declared
result shape where the op cannot derive it (reshape, broadcast_in_dim, convert_element_type,
...), or None; rules that derive the shape ignore it. Imports numpy-free code only.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from .dtypes import AnyShape, DType, Shape, TupleShape


class ShapeError(ValueError):
    """An op was given operands or attributes its shape rule rejects."""


ShapeRule = Callable[[Sequence[AnyShape], Mapping[str, object], "AnyShape | None"], AnyShape]


# ---------------------------------------------------------------------------- dtype classes
def _dtype_class_check(allowed: str, what: str, dtype: DType) -> None:
    ok = {
        "float": dtype.is_float,
        "numeric": dtype.is_float or dtype.is_integer,
        "integer": dtype.is_integer,
        "int_or_pred": dtype.is_integer or dtype.is_pred,
        "any": True,
    }[allowed]
    if not ok:
        raise ShapeError(f"{what} has dtype {dtype}, expected a {allowed.replace('_', ' ')} type")


def _array(shape: AnyShape, what: str) -> Shape:
    if not isinstance(shape, Shape):
        raise ShapeError(f"{what} is a tuple {shape}, expected an array")
    return shape


def _need_result(result: AnyShape | None, op: str) -> Shape:
    if result is None:
        raise ShapeError(f"{op} needs its result shape to be given")
    return _array(result, "the result")


def _check_axes(axes: Sequence[int], rank: int, what: str) -> None:
    if len(set(axes)) != len(axes):
        raise ShapeError(f"{what} {tuple(axes)} has duplicates")
    for a in axes:
        if not 0 <= a < rank:
            raise ShapeError(f"{what} {tuple(axes)} out of range for rank {rank}")


# ---------------------------------------------------------------------------- elementwise
def unary(allowed: str, result_dtype: DType | None = None) -> ShapeRule:
    def rule(operands, attrs, result):
        x = _array(operands[0], "the operand")
        _dtype_class_check(allowed, "the operand", x.dtype)
        return x if result_dtype is None else x.with_dtype(result_dtype)

    return rule


def binary(allowed: str, result_dtype: DType | None = None, rhs_int_ok: bool = False) -> ShapeRule:
    def rule(operands, attrs, result):
        x = _array(operands[0], "the lhs")
        y = _array(operands[1], "the rhs")
        _dtype_class_check(allowed, "the lhs", x.dtype)
        if x.dims != y.dims:
            raise ShapeError(f"operand shapes {x} and {y} do not match")
        if x.dtype != y.dtype and not (rhs_int_ok and y.dtype.is_integer):
            raise ShapeError(f"operand dtypes {x} and {y} do not match")
        return x if result_dtype is None else x.with_dtype(result_dtype)

    return rule


def integer_pow(operands, attrs, result):
    x = _array(operands[0], "the operand")
    _dtype_class_check("numeric", "the operand", x.dtype)
    if x.dtype.is_integer and attrs["y"] < 0:
        raise ShapeError(f"integer_pow of integers needs a non-negative exponent, got {attrs['y']}")
    return x


def select_n(operands, attrs, result):
    which = _array(operands[0], "the selector")
    cases = [_array(c, f"case {i}") for i, c in enumerate(operands[1:])]
    if not cases:
        raise ShapeError("select_n needs at least one case")
    if not (which.dtype.is_pred or which.dtype is DType.S32):
        raise ShapeError(f"the selector {which} must be pred or s32")
    if which.dtype.is_pred and len(cases) > 2:
        raise ShapeError(f"a pred selector picks from at most 2 cases, got {len(cases)}")
    for c in cases[1:]:
        if c != cases[0]:
            raise ShapeError(f"case shapes {cases[0]} and {c} do not match")
    if which.dims not in ((), cases[0].dims):
        raise ShapeError(f"selector {which} must be a scalar or match the cases {cases[0]}")
    return cases[0]


def clamp(operands, attrs, result):
    lo, x, hi = (_array(s, w) for s, w in zip(operands, ("min", "the operand", "max")))
    _dtype_class_check("numeric", "the operand", x.dtype)
    for bound, what in ((lo, "min"), (hi, "max")):
        if bound.dtype != x.dtype or bound.dims not in ((), x.dims):
            raise ShapeError(f"clamp {what} {bound} must be a scalar or match {x}")
    return x


def convert(operands, attrs, result):
    x = _array(operands[0], "the operand")
    r = _need_result(result, "convert_element_type")
    if r.dims != x.dims:
        raise ShapeError(f"convert_element_type cannot change dimensions: {x} -> {r}")
    return r


def bitcast_convert(operands, attrs, result):
    x = _array(operands[0], "the operand")
    r = _need_result(result, "bitcast_convert")
    if r.dims != x.dims:
        raise ShapeError(f"bitcast_convert cannot change dimensions: {x} -> {r}")
    if x.dtype.is_pred or r.dtype.is_pred or x.dtype.bits != r.dtype.bits:
        raise ShapeError(f"bitcast_convert needs two non-pred dtypes of one width: {x} -> {r}")
    return r


# ---------------------------------------------------------------------------- leaves
def parameter(operands, attrs, result):
    if attrs["index"] < 0:
        raise ShapeError(f"parameter index {attrs['index']} is negative")
    if result is None:
        raise ShapeError("parameter needs its shape to be given")
    return result


def constant(operands, attrs, result):
    literal = attrs["value"]
    r = _array(result if result is not None else literal.shape, "a constant")
    if literal.shape != r:
        raise ShapeError(f"literal of shape {literal.shape} does not match {r}")
    return r


def iota(operands, attrs, result):
    r = _need_result(result, "iota")
    _dtype_class_check("numeric", "iota", r.dtype)
    _check_axes([attrs["dimension"]], r.rank, "iota dimension")
    return r


# ---------------------------------------------------------------------------- data movement
def broadcast_in_dim(operands, attrs, result):
    x = _array(operands[0], "the operand")
    r = _need_result(result, "broadcast_in_dim")
    dims = attrs["dims"]
    if len(dims) != x.rank:
        raise ShapeError(f"dims {dims} must have one entry per operand dimension of {x}")
    _check_axes(dims, r.rank, "dims")
    if list(dims) != sorted(dims):
        raise ShapeError(f"dims {dims} must be increasing")
    for i, d in enumerate(dims):
        if x.dims[i] not in (1, r.dims[d]):
            raise ShapeError(f"cannot broadcast {x} to {r} along dims {dims}")
    if r.dtype != x.dtype:
        raise ShapeError(f"broadcast_in_dim cannot change dtype: {x} -> {r}")
    return r


def reshape(operands, attrs, result):
    x = _array(operands[0], "the operand")
    r = _need_result(result, "reshape")
    if r.size != x.size or r.dtype != x.dtype:
        raise ShapeError(f"cannot reshape {x} to {r}")
    return r


def transpose(operands, attrs, result):
    x = _array(operands[0], "the operand")
    perm = attrs["permutation"]
    if sorted(perm) != list(range(x.rank)):
        raise ShapeError(f"permutation {perm} is not a permutation of the {x.rank} dimensions of {x}")
    return x.with_dims(tuple(x.dims[p] for p in perm))


def slice_(operands, attrs, result):
    x = _array(operands[0], "the operand")
    start, limit, strides = attrs["start"], attrs["limit"], attrs["strides"]
    if not len(start) == len(limit) == len(strides) == x.rank:
        raise ShapeError(f"start, limit and strides need {x.rank} entries each for {x}")
    dims = []
    for s, l, st, d in zip(start, limit, strides, x.dims):
        if not 0 <= s <= l <= d or st < 1:
            raise ShapeError(f"slice start={start} limit={limit} strides={strides} out of range for {x}")
        dims.append(-(-(l - s) // st))
    return x.with_dims(tuple(dims))


def _index_operands(indices: Sequence[AnyShape], rank: int) -> None:
    if len(indices) != rank:
        raise ShapeError(f"expected {rank} start indices, got {len(indices)}")
    for i in indices:
        i = _array(i, "a start index")
        if i.rank != 0 or not i.dtype.is_integer:
            raise ShapeError(f"start index {i} must be an integer scalar")


def dynamic_slice(operands, attrs, result):
    x = _array(operands[0], "the operand")
    _index_operands(operands[1:], x.rank)
    r = _need_result(result, "dynamic_slice")
    if r.dtype != x.dtype or r.rank != x.rank or any(a > b for a, b in zip(r.dims, x.dims)):
        raise ShapeError(f"dynamic_slice of {x} cannot give {r}")
    return r


def dynamic_update_slice(operands, attrs, result):
    x = _array(operands[0], "the operand")
    u = _array(operands[1], "the update")
    _index_operands(operands[2:], x.rank)
    if u.dtype != x.dtype or u.rank != x.rank or any(a > b for a, b in zip(u.dims, x.dims)):
        raise ShapeError(f"update {u} does not fit in {x}")
    return x


def concatenate(operands, attrs, result):
    xs = [_array(s, f"operand {i}") for i, s in enumerate(operands)]
    if not xs:
        raise ShapeError("concatenate needs at least one operand")
    dim = attrs["dimension"]
    _check_axes([dim], xs[0].rank, "dimension")
    for x in xs[1:]:
        same = all(a == b for i, (a, b) in enumerate(zip(x.dims, xs[0].dims)) if i != dim)
        if x.dtype != xs[0].dtype or x.rank != xs[0].rank or not same:
            raise ShapeError(f"cannot concatenate {xs[0]} and {x} along dimension {dim}")
    dims = list(xs[0].dims)
    dims[dim] = sum(x.dims[dim] for x in xs)
    return xs[0].with_dims(tuple(dims))


def pad(operands, attrs, result):
    x = _array(operands[0], "the operand")
    v = _array(operands[1], "the padding value")
    if v.rank != 0 or v.dtype != x.dtype:
        raise ShapeError(f"padding value {v} must be a scalar of dtype {x.dtype}")
    low, high, interior = attrs["low"], attrs["high"], attrs["interior"]
    if not len(low) == len(high) == len(interior) == x.rank:
        raise ShapeError(f"low, high and interior need {x.rank} entries each for {x}")
    dims = []
    for d, lo, hi, it in zip(x.dims, low, high, interior):
        size = lo + hi + d + max(0, d - 1) * it
        if it < 0 or size < 0:
            raise ShapeError(f"padding low={low} high={high} interior={interior} invalid for {x}")
        dims.append(size)
    return x.with_dims(tuple(dims))


def rev(operands, attrs, result):
    x = _array(operands[0], "the operand")
    _check_axes(attrs["dimensions"], x.rank, "dimensions")
    return x


# ---------------------------------------------------------------------------- reductions
def reduce(allowed: str) -> ShapeRule:
    def rule(operands, attrs, result):
        x = _array(operands[0], "the operand")
        _dtype_class_check(allowed, "the operand", x.dtype)
        axes = attrs["axes"]
        _check_axes(axes, x.rank, "axes")
        return x.with_dims(tuple(d for i, d in enumerate(x.dims) if i not in axes))

    return rule


def arg_reduce(operands, attrs, result):
    x = _array(operands[0], "the operand")
    _dtype_class_check("numeric", "the operand", x.dtype)
    axis = attrs["axis"]
    _check_axes([axis], x.rank, "axis")
    if x.dims[axis] == 0:
        raise ShapeError(f"cannot take an arg-reduction over the empty axis {axis} of {x}")
    r = _need_result(result, "argmax/argmin")
    if not r.dtype.is_integer:
        raise ShapeError(f"index dtype {r.dtype} must be an integer type")
    want = tuple(d for i, d in enumerate(x.dims) if i != axis)
    if r.dims != want:
        raise ShapeError(f"result {r} should have dimensions {want}")
    return r


def dot_general(operands, attrs, result):
    lhs, rhs = _array(operands[0], "the lhs"), _array(operands[1], "the rhs")
    (lc, rc), (lb, rb) = attrs["contracting"], attrs["batch"]
    if lhs.dtype != rhs.dtype:
        raise ShapeError(f"operand dtypes {lhs} and {rhs} do not match")
    _dtype_class_check("numeric", "the lhs", lhs.dtype)
    if len(lc) != len(rc) or len(lb) != len(rb):
        raise ShapeError(f"contracting {attrs['contracting']} / batch {attrs['batch']} unpaired")
    _check_axes(list(lc) + list(lb), lhs.rank, "lhs contracting and batch dimensions")
    _check_axes(list(rc) + list(rb), rhs.rank, "rhs contracting and batch dimensions")
    for a, b in zip(list(lc) + list(lb), list(rc) + list(rb)):
        if lhs.dims[a] != rhs.dims[b]:
            raise ShapeError(f"lhs dimension {a} of {lhs} and rhs dimension {b} of {rhs} differ")
    dims = [lhs.dims[i] for i in lb]
    dims += [d for i, d in enumerate(lhs.dims) if i not in lc and i not in lb]
    dims += [d for i, d in enumerate(rhs.dims) if i not in rc and i not in rb]
    dtype = lhs.dtype if result is None else _array(result, "the result").dtype
    if dtype.is_pred or (dtype.is_float != lhs.dtype.is_float):
        raise ShapeError(f"dot of {lhs.dtype} operands cannot produce {dtype}")
    return Shape(dtype, tuple(dims))


# ---------------------------------------------------------------------------- tuples, calls
def tuple_(operands, attrs, result):
    return TupleShape(tuple(operands))


def get_tuple_element(operands, attrs, result):
    t = operands[0]
    if not isinstance(t, TupleShape):
        raise ShapeError(f"get_tuple_element needs a tuple operand, got {t}")
    if not 0 <= attrs["index"] < len(t.elements):
        raise ShapeError(f"index {attrs['index']} out of range for {t}")
    return t.elements[attrs["index"]]


def called(operands, attrs, result):
    """fusion and call: the verifier checks the result against the called computation."""
    if result is None:
        raise ShapeError("fusion and call need their result shape to be given")
    return result


def while_(operands, attrs, result):
    """while: the loop state, as a tuple (the verifier checks condition and body)."""
    return TupleShape(tuple(operands))


def conditional(operands, attrs, result):
    """conditional: an s32[] index; the result is declared (the verifier checks the branches)."""
    index = operands[0]
    if index != Shape(DType.S32, ()):
        raise ShapeError(f"the branch index of a conditional must be s32[], got {index}")
    if result is None:
        raise ShapeError("conditional needs its result shape to be given")
    return result
