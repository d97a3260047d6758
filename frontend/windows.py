"""Rules for the window primitives, written as slices of the padded operand, as a loop nest
over the window would read it: reduce_window (sum, max, min and a jaxpr's), max pooling's
derivatives (select_and_gather_add, select_and_scatter_add), and
conv_general_dilated, which becomes its patches (one strided slice per kernel offset, side by
side) times the kernel in one dot_general, so BLAS runs the product and the padding and slicing
fuse into the loop that writes the patches. Registered into `rules.RULES`. May import xfuse.hlo.

A window of more positions than xfuse expands (`MAX_OFFSETS`, `MAX_JAXPR_POSITIONS` for a
reduce_window with a jaxpr) raises FrontendError naming the primitive and its window: each
position is a slice.
"""

from __future__ import annotations

import functools
import itertools
import math

import jax
import jax.extend.core as jcore
import numpy as np

from xfuse.hlo import DType, Instruction, Op

from .rules import RULES, _reshape_to as _reshape, _slice_along, dot, rule
from .translate import Context, FrontendError

MAX_OFFSETS = 1024
# A fused loop reads its operand once per window position; past this many (a 40x40 max pool
# fused with itself: 1,600 loads, minutes of LLVM) max and min store each axis's result.
FUSED_POSITIONS = 64
MAX_JAXPR_POSITIONS = 256  # a reduce_window's jaxpr is inlined once per position
# Kernel offsets per product: each offset is a piece of the loop that writes the patches
# (the numba backend splits a loop at a concatenate's seams, up to 32 pieces); a larger
# kernel's offsets go to several products, summed.
TAPS_PER_PRODUCT = 32


def _check_size(ctx: Context, window: tuple[int, ...], what: str, limit: int = MAX_OFFSETS) -> None:
    if math.prod(window) > limit:
        raise FrontendError(
            f"'{ctx.primitive}' at {ctx.loc}: a {what} of {'x'.join(map(str, window))} positions; "
            f"xfuse expands at most {limit}"
        )


def _pad(ctx: Context, x: Instruction, value: Instruction, padding, dilation) -> Instruction:
    """`x` padded by (low, high) pairs and dilated (holes of `dilation` - 1) with `value`."""
    low = tuple(int(lo) for lo, _ in padding)
    high = tuple(int(hi) for _, hi in padding)
    interior = tuple(int(d) - 1 for d in dilation)
    if not any(low) and not any(high) and not any(interior):
        return x
    return ctx.emit(Op.PAD, x, value, low=low, high=high, interior=interior)


def _offset_slice(ctx, x, offset, strides, dilation, out_dims, axes) -> Instruction:
    """The elements of padded `x` at window `offset` (one entry per axis in `axes`) of every
    output position: start offset * dilation, `out_dims` of them `strides` apart."""
    start, limit, step = [0] * x.array_shape.rank, list(x.array_shape.dims), [1] * x.array_shape.rank
    for axis, k, s, d, n in zip(axes, offset, strides, dilation, out_dims):
        start[axis] = k * d
        limit[axis] = k * d + (n - 1) * s + 1 if n else k * d
        step[axis] = s
    return ctx.emit(Op.SLICE, x, start=tuple(start), limit=tuple(limit), strides=tuple(step))


# ---------------------------------------------------------------------------- reduce_window
def _identity(op: Op, dtype: DType) -> object:
    if op is Op.ADD:
        return 0
    if dtype.is_pred:
        return op is Op.MIN
    if dtype.is_float:
        return -math.inf if op is Op.MAX else math.inf
    info = np.iinfo(dtype.numpy)
    return info.min if op is Op.MAX else info.max


def _window_params(params: dict):
    return (tuple(map(int, params["window_dimensions"])), tuple(map(int, params["window_strides"])),
            params["padding"], params["base_dilation"], tuple(map(int, params["window_dilation"])))


def _monoid_window(op: Op):
    """reduce_window_sum, _max and _min. A window of at most FUSED_POSITIONS positions is
    folded in the order XLA's loop nest reads it; a larger one, one axis after another (for
    max and min the same result; sum(window) slices rather than prod(window)), each axis's
    result stored."""

    def translate(ctx, params, operands):
        (x,) = operands
        window, strides, padding, base, dilation = _window_params(params)
        dtype, out_dims = x.array_shape.dtype, ctx.out.dims
        if dtype.is_pred and op is Op.ADD:
            raise FrontendError(f"'{ctx.primitive}' at {ctx.loc} on booleans")
        combine = {Op.ADD: Op.OR, Op.MAX: Op.OR, Op.MIN: Op.AND}[op] if dtype.is_pred else op
        init = ctx.constant(_identity(op, dtype), dtype)
        if 0 in out_dims:
            return ctx.broadcast_to(init, out_dims)
        x = _pad(ctx, x, init, padding, base)
        rank = len(window)
        if op is Op.ADD and math.prod(window) <= FUSED_POSITIONS:
            total = None
            for offset in itertools.product(*map(range, window)):
                piece = _offset_slice(ctx, x, offset, strides, dilation, out_dims, range(rank))
                total = piece if total is None else ctx.emit(combine, total, piece)
            return total
        _check_size(ctx, (sum(window),), "window")
        apart, reduced = math.prod(window) > FUSED_POSITIONS, False
        for axis in range(rank):
            if window[axis] == 1 and strides[axis] == 1 and x.array_shape.dims[axis] == out_dims[axis]:
                continue
            if apart and reduced:
                (x,) = _barrier(ctx, x)
            pieces = [_offset_slice(ctx, x, (k,), (strides[axis],), (dilation[axis],), (out_dims[axis],), (axis,))
                      for k in range(window[axis])]
            x = functools.reduce(lambda a, b: ctx.emit(combine, a, b), pieces)
            reduced = True
        return x

    return translate


def _barrier(ctx: Context, *xs: Instruction) -> list[Instruction]:
    """`xs` behind one optimization barrier: stored, not fused into what reads them."""
    barrier = ctx.emit(Op.OPTIMIZATION_BARRIER, *xs)
    return [ctx.emit(Op.GET_TUPLE_ELEMENT, barrier, index=i) for i in range(len(xs))]


RULES["reduce_window_sum"] = _monoid_window(Op.ADD)
RULES["reduce_window_max"] = _monoid_window(Op.MAX)
RULES["reduce_window_min"] = _monoid_window(Op.MIN)


@rule("reduce_window")
def _reduce_window(ctx, params, operands):
    """lax.reduce_window with a jaxpr (variadic too): each window folded into the init values
    from its first position to its last, the jaxpr inlined once per position."""
    count = len(operands) // 2
    xs, inits = operands[:count], operands[count:]
    window, strides, padding, base, dilation = _window_params(params)
    _check_size(ctx, window, "window", MAX_JAXPR_POSITIONS)
    out_dims = ctx.out.dims
    accs = [ctx.broadcast_to(init, out_dims) for init in inits]
    if 0 in out_dims:
        return accs
    padded = [_pad(ctx, x, init, padding, base) for x, init in zip(xs, inits)]
    body = _elementwise_body(ctx, params, accs + padded)
    for k, offset in enumerate(itertools.product(*map(range, window))):
        if k and k % FUSED_POSITIONS == 0:  # each FUSED_POSITIONS positions a loop of their own
            accs = _barrier(ctx, *accs)
        pieces = [_offset_slice(ctx, x, offset, strides, dilation, out_dims, range(len(window))) for x in padded]
        accs = ctx.inline(body.jaxpr, body.consts, accs + pieces)
    return accs


def _elementwise_body(ctx: Context, params: dict, operands: list[Instruction]):
    """The reduction jaxpr (on scalars) vmapped over the output's dims and traced: the fold of
    one window position into the accumulators, for every output element at once."""
    closed = params["jaxpr"]
    if not hasattr(closed, "jaxpr"):
        closed = jcore.ClosedJaxpr(closed, params.get("consts", ()))
    fn = jcore.jaxpr_as_fun(closed)
    for _ in range(len(ctx.out.dims)):
        fn = jax.vmap(fn)
    specs = [jax.ShapeDtypeStruct(ctx.out.dims, x.array_shape.dtype.numpy) for x in operands]
    return jax.make_jaxpr(fn)(*specs)


# ---------------------------------------------------------------------------- convolution
@rule("conv_general_dilated")
def _conv(ctx, params, operands):
    """conv_general_dilated as patches times kernel. The input goes to (N, spatial..., C), is
    padded and dilated with zeros, and each kernel offset's strided slice joins the patches
    (N, out spatial..., offsets x C); the kernel goes to (offsets, C / groups, O). With feature
    groups the dot batches over them (output features group-major, as XLA splits them); with
    batch groups, over the groups of the input batch (group-major too)."""
    lhs, rhs = operands
    numbers = params["dimension_numbers"]
    lhs_spec, rhs_spec, out_spec = (tuple(map(int, spec)) for spec in numbers)
    rank = len(lhs_spec) - 2
    groups, batch_groups = int(params["feature_group_count"]), int(params["batch_group_count"])
    strides = tuple(map(int, params["window_strides"]))
    rhs_dilation = tuple(map(int, params["rhs_dilation"]))
    out = ctx.out
    out_spatial = tuple(out.dims[a] for a in out_spec[2:])
    kernel = tuple(rhs.array_shape.dims[a] for a in rhs_spec[2:])
    _check_size(ctx, kernel, "kernel")
    work = out.dtype
    if groups == 1 and batch_groups == 1 and rank and _spatial_minor(lhs, lhs_spec[2:]):
        return _channels_major(ctx, params, lhs, rhs, (lhs_spec, rhs_spec, out_spec), kernel, out_spatial)
    x = ctx.emit(Op.TRANSPOSE, lhs, permutation=(lhs_spec[0], *lhs_spec[2:], lhs_spec[1]))
    w = ctx.emit(Op.TRANSPOSE, rhs, permutation=(*rhs_spec[2:], rhs_spec[1], rhs_spec[0]))
    features_in, features = w.array_shape.dims[-2], w.array_shape.dims[-1]
    zero = ctx.constant(0, x.array_shape.dtype)
    x = _pad(ctx, x, zero, ((0, 0), *params["padding"], (0, 0)), (1, *params["lhs_dilation"], 1))

    offsets = list(itertools.product(*map(range, kernel)))
    w = _reshape(ctx, w, (len(offsets), features_in, features))
    if features_in == 1 and features == groups > 1 and batch_groups == 1:
        result = _depthwise(ctx, x, w, offsets, strides, rhs_dilation, out_spatial, work)
        return _to_out_layout(ctx, ctx.convert(result, out.dtype), out_spec)
    chunks, work = _chunks(offsets, work)
    result = None
    for first in chunks:
        taps = offsets[first : first + TAPS_PER_PRODUCT]
        pieces = [_offset_slice(ctx, x, offset, strides, rhs_dilation, out_spatial, range(1, rank + 1))
                  for offset in taps]
        # side by side along the channels: (N, out spatial..., offsets x C), the offsets major
        patches = pieces[0] if len(pieces) == 1 else ctx.emit(Op.CONCATENATE, *pieces, dimension=rank + 1)
        kernel_part = w if len(chunks) == 1 else _slice_along(ctx, w, 0, first, first + len(taps))
        part = _product(ctx, patches, kernel_part, groups, batch_groups, work)
        result = part if result is None else ctx.emit(Op.ADD, result, part)
    result = ctx.convert(result, out.dtype)
    result = _reshape(ctx, result, (out.dims[out_spec[0]], *out_spatial, features))
    return _to_out_layout(ctx, result, out_spec)


def _spatial_minor(lhs: Instruction, spatial) -> bool:
    """Whether the input's minor axis as stored is a spatial one (NCHW): its last axis, or the
    axis the transpose that made it (a layer's output moved to NCHW) takes from its operand's
    last. A weight gradient's input (batch and features swapped) keeps the patches' layout."""
    minor = lhs.array_shape.rank - 1
    if lhs.op is Op.TRANSPOSE:
        minor = list(lhs.attr("permutation")).index(minor)
    return minor in spatial


def _channels_major(ctx, params, lhs, rhs, specs, kernel, out_spatial) -> Instruction:
    """conv_general_dilated whose input has a spatial axis minor (NCHW, as equinox and PyTorch
    lay images out): the kernel (O, C x offsets) times patches (C x offsets, N x out spatial),
    each offset's strided slice a row block whose loop runs along the input's minor axis (a
    patch matrix with channels minor would read the input a plane apart per element). The
    product (O, N x positions) goes to the output layout."""
    lhs_spec, rhs_spec, out_spec = specs
    rank, out = len(lhs_spec) - 2, ctx.out
    x = ctx.emit(Op.TRANSPOSE, lhs, permutation=(lhs_spec[1], lhs_spec[0], *lhs_spec[2:]))  # (C, N, spatial...)
    channels, batch = x.array_shape.dims[:2]
    zero = ctx.constant(0, x.array_shape.dtype)
    x = _pad(ctx, x, zero, ((0, 0), (0, 0), *params["padding"]), (1, 1, *params["lhs_dilation"]))
    w = ctx.emit(Op.TRANSPOSE, rhs, permutation=(rhs_spec[0], rhs_spec[1], *rhs_spec[2:]))  # (O, C, kernel...)
    features = w.array_shape.dims[0]
    offsets = list(itertools.product(*map(range, kernel)))
    w = _reshape(ctx, w, (features, channels, len(offsets)))
    strides, dilation = tuple(map(int, params["window_strides"])), tuple(map(int, params["rhs_dilation"]))
    positions = batch * math.prod(out_spatial)
    chunks, work = _chunks(offsets, out.dtype)
    result = None
    for first in chunks:
        taps = offsets[first : first + TAPS_PER_PRODUCT]
        pieces = [_reshape(ctx, _offset_slice(ctx, x, offset, strides, dilation, out_spatial, range(2, rank + 2)),
                           (channels, 1, batch, *out_spatial)) for offset in taps]
        patches = pieces[0] if len(pieces) == 1 else ctx.emit(Op.CONCATENATE, *pieces, dimension=1)
        patches = _reshape(ctx, patches, (channels * len(taps), positions))
        kernel_part = w if len(chunks) == 1 else _slice_along(ctx, w, 2, first, first + len(taps))
        kernel_part = _reshape(ctx, kernel_part, (features, channels * len(taps)))
        part = dot(ctx, kernel_part, patches, ((1,), (0,)), ((), ()), work)
        result = part if result is None else ctx.emit(Op.ADD, result, part)
    result = _reshape(ctx, ctx.convert(result, out.dtype), (features, batch, *out_spatial))
    return _to_out_layout(ctx, result, out_spec, batch_at=1, features_at=0, spatial_at=2)


def _chunks(offsets: list, work: DType) -> tuple[range, DType]:
    """(the first offset of each product, the type it sums in): kernel offsets go to products
    TAPS_PER_PRODUCT at a time; f16/bf16 partial products are summed in f32, as XLA
    accumulates, then rounded once."""
    chunks = range(0, len(offsets), TAPS_PER_PRODUCT)
    if len(chunks) > 1 and work in (DType.F16, DType.BF16):
        work = DType.F32
    return chunks, work


def _to_out_layout(ctx: Context, result: Instruction, out_spec: tuple[int, ...], batch_at: int = 0,
                   features_at: int | None = None, spatial_at: int = 1) -> Instruction:
    """`result` transposed to where `out_spec` puts each axis: its batch axis at `batch_at`,
    its features at `features_at` (default: last), its spatial axes in order from
    `spatial_at` (by default `result` is (batch, spatial..., features))."""
    rank = len(out_spec) - 2
    permutation = [0] * (rank + 2)
    permutation[out_spec[0]] = batch_at
    permutation[out_spec[1]] = rank + 1 if features_at is None else features_at
    for i, axis in enumerate(out_spec[2:]):
        permutation[axis] = spatial_at + i
    return ctx.emit(Op.TRANSPOSE, result, permutation=tuple(permutation))


def _product(ctx: Context, patches: Instruction, w: Instruction, groups: int, batch_groups: int,
             work: DType) -> Instruction:
    """(positions, features) of `patches` (N, out spatial..., taps x C) times the kernel `w`
    (taps, C / groups, features)."""
    dims = patches.array_shape.dims
    positions, channels = math.prod(dims[:-1]), dims[-1]
    taps, features_in, features = w.array_shape.dims
    if groups == 1 and batch_groups == 1:
        lhs = _reshape(ctx, patches, (positions, channels))
        rhs = _reshape(ctx, w, (channels, features))
        return dot(ctx, lhs, rhs, ((1,), (0,)), ((), ()), work)
    if batch_groups == 1:  # channels = groups x features_in; features = groups x per group
        lhs = _reshape(ctx, patches, (positions, taps, groups, features_in))
        rhs = _reshape(ctx, w, (taps, features_in, groups, features // groups))
        grouped = dot(ctx, lhs, rhs, ((1, 3), (0, 1)), ((2,), (2,)), work)  # (groups, positions, per)
    else:  # the batch splits into batch_groups x (n / batch_groups), features likewise
        lhs = _reshape(ctx, patches, (batch_groups, positions // batch_groups, channels))
        rhs = _reshape(ctx, w, (channels, batch_groups, features // batch_groups))
        grouped = dot(ctx, lhs, rhs, ((2,), (0,)), ((0,), (1,)), work)  # (groups, per batch, per)
    return _reshape(ctx, ctx.emit(Op.TRANSPOSE, grouped, permutation=(1, 0, 2)), (positions // batch_groups, features))


def _depthwise(ctx, x, w, offsets, strides, dilation, out_spatial, work: DType) -> Instruction:
    """A depthwise convolution (one filter per channel): the sum over kernel offsets of each
    offset's slice times that offset's row of filters, elementwise, in offset order; every
    FUSED_POSITIONS offsets stored (the loop reads the input once per offset)."""
    rank = len(out_spatial)
    channels = x.array_shape.dims[-1]
    dims = (x.array_shape.dims[0], *out_spatial, channels)
    x, w = ctx.convert(x, work), ctx.convert(w, work)
    total = None
    for k, offset in enumerate(offsets):
        if k and k % FUSED_POSITIONS == 0:
            (total,) = _barrier(ctx, total)
        piece = _offset_slice(ctx, x, offset, strides, dilation, out_spatial, range(1, rank + 1))
        row = _reshape(ctx, _slice_along(ctx, w, 0, k, k + 1), (channels,))
        term = ctx.emit(Op.MUL, piece, ctx.emit(Op.BROADCAST_IN_DIM, row, shape=piece.array_shape.with_dims(dims),
                                                dims=(rank + 1,)))
        total = term if total is None else ctx.emit(Op.ADD, total, term)
    return total


# ---------------------------------------------------------------------------- max pooling's derivatives
def _chooser(ctx: Context, params: dict) -> tuple[Op, object]:
    """(the comparison, the init value XLA's lowering pads with) of a select_prim: ge picks a
    window's maximum, le its minimum."""
    name = getattr(params["select_prim"], "name", str(params["select_prim"]))
    if name not in ("ge", "le"):
        raise FrontendError(f"'{ctx.primitive}' at {ctx.loc} with select_prim {name}: xfuse knows ge and le")
    return (Op.GE, -math.inf) if name == "ge" else (Op.LE, math.inf)


@rule("select_and_gather_add")
def _select_and_gather_add(ctx, params, operands):
    """The tangent at each window's chosen element (max pooling's JVP), as jax lowers it: a
    reduce_window over (operand, tangent) pairs from (-inf, 0) (for ge), each position taken
    unless the pair so far compares `select_prim` to it; padding is that init pair."""
    tangents, x = operands
    compare, extreme = _chooser(ctx, params)
    window, strides, padding, base, dilation = _window_params(params)
    _check_size(ctx, window, "window", MAX_JAXPR_POSITIONS)
    out_dims, dtype = ctx.out.dims, x.array_shape.dtype
    best = ctx.broadcast_to(ctx.constant(extreme, dtype), out_dims)
    chosen = ctx.broadcast_to(ctx.constant(0, dtype), out_dims)
    if 0 in out_dims:
        return chosen
    x = _pad(ctx, x, ctx.constant(extreme, dtype), padding, base)
    tangents = _pad(ctx, tangents, ctx.constant(0, dtype), padding, base)
    for k, offset in enumerate(itertools.product(*map(range, window))):
        if k and k % FUSED_POSITIONS == 0:
            best, chosen = _barrier(ctx, best, chosen)
        value = _offset_slice(ctx, x, offset, strides, dilation, out_dims, range(len(window)))
        tangent = _offset_slice(ctx, tangents, offset, strides, dilation, out_dims, range(len(window)))
        keep = ctx.emit(compare, best, value)
        best = ctx.emit(Op.SELECT_N, keep, value, best)
        chosen = ctx.emit(Op.SELECT_N, keep, tangent, chosen)
    return chosen


@rule("select_and_scatter_add")
def _select_and_scatter_add(ctx, params, operands):
    """Max pooling's transpose: each window's source value added at the element the window
    chooses (its first element, then each later one unless the chosen one compares
    `select_prim` to it, as XLA's SelectAndScatter; padding is never chosen). Per window offset,
    the sources whose window chose it are spread back by a pad with holes of stride - 1."""
    source, x = operands
    compare, _ = _chooser(ctx, params)
    window = tuple(map(int, params["window_dimensions"]))
    strides = tuple(map(int, params["window_strides"]))
    padding = tuple((int(lo), int(hi)) for lo, hi in params["padding"])
    _check_size(ctx, window, "window", MAX_JAXPR_POSITIONS)
    out_dims, in_dims = source.array_shape.dims, x.array_shape.dims
    dtype = source.array_shape.dtype
    zero = ctx.constant(0, dtype)
    if 0 in out_dims or 0 in in_dims:
        return ctx.broadcast_to(zero, in_dims)
    rank, ones = len(window), (1,) * len(window)
    x = _pad(ctx, x, ctx.constant(0, x.array_shape.dtype), padding, ones)
    inside = _pad(ctx, ctx.broadcast_to(ctx.constant(True, DType.PRED), in_dims), ctx.constant(False, DType.PRED),
                  padding, ones)
    offsets = list(itertools.product(*map(range, window)))
    best = chosen = None
    for k, offset in enumerate(offsets):
        value = _offset_slice(ctx, x, offset, strides, ones, out_dims, range(rank))
        valid = _offset_slice(ctx, inside, offset, strides, ones, out_dims, range(rank))
        index = ctx.broadcast_to(ctx.constant(k, DType.S32), out_dims)
        if best is None:
            best, chosen = value, ctx.emit(Op.SELECT_N, valid, ctx.broadcast_to(ctx.constant(-1, DType.S32), out_dims),
                                           index)
            continue
        if k % FUSED_POSITIONS == 0:
            best, chosen = _barrier(ctx, best, chosen)
        none_yet = ctx.emit(Op.LT, chosen, ctx.broadcast_to(ctx.constant(0, DType.S32), out_dims))
        better = ctx.emit(Op.NOT, ctx.emit(compare, best, value))
        take = ctx.emit(Op.AND, valid, ctx.emit(Op.OR, none_yet, better))
        best = ctx.emit(Op.SELECT_N, take, best, value)
        chosen = ctx.emit(Op.SELECT_N, take, chosen, index)
    # stored: each offset's spread reads them at an index of its own
    chosen, source = _barrier(ctx, chosen, source)
    total = None
    for k, offset in enumerate(offsets):
        mine = ctx.emit(Op.EQ, chosen, ctx.broadcast_to(ctx.constant(k, DType.S32), out_dims))
        part = ctx.emit(Op.SELECT_N, mine, ctx.broadcast_to(zero, out_dims), source)
        low = tuple(o - lo for o, (lo, _) in zip(offset, padding))
        high = tuple(d - (l + (n - 1) * s + 1) for d, l, n, s in zip(in_dims, low, out_dims, strides))
        spread = ctx.emit(Op.PAD, part, zero, low=low, high=high, interior=tuple(s - 1 for s in strides))
        total = spread if total is None else ctx.emit(Op.ADD, total, spread)
    return total
