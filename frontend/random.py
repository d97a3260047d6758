"""Rules for `jax.random`: keys, random bits, splits and fold-ins, registered into `rules.RULES`.

A typed key array (`key<fry>[...]`, what `jax.random.key` makes and what `jax.random.PRNGKey`'s
raw uint32 keys are wrapped into inside every jax.random function) is its key data in the IR:
uint32 with the implementation's key shape appended (threefry: `u32[..., 2]`), as XLA sees it
after JAX lowers the key types away. `random_wrap`, `random_unwrap` and `random_clone` are then
no-ops, and `random_bits`, `random_split`, `random_fold_in` and `random_seed` are the key
implementation's own functions traced by `jax.make_jaxpr` on the key data and inlined, vmapped
over the key array's dims as JAX's lowering does. So every bit equals jax.jit's, under either
setting of `jax_threefry_partitionable`. Inside them, `threefry2x32` is the hash's 20 rounds
written out on uint32, and `iota_2x32_shape` the flat index of each element as two uint32
words. May import xfuse.hlo and jax.
"""

from __future__ import annotations

import math

import jax

from xfuse.hlo import DType, Op

from .rules import RULES, rule
from .translate import KEY_PRIMITIVES, Elementwise, FrontendError, key_impl


def _vmapped(fn, times: int):
    for _ in range(times):
        fn = jax.vmap(fn)
    return fn


def _inline_traced(ctx, fn, specs, operands):
    """Traces fn on `specs` (ShapeDtypeStructs of the operands' key data) and inlines it."""
    try:
        closed = jax.make_jaxpr(fn)(*specs)
    except Exception as error:  # an implementation xfuse cannot trace (a custom PRNG's host call)
        raise FrontendError(f"'{ctx.primitive}' at {ctx.loc}: its key implementation could not be traced: {error}") \
            from None
    results = ctx.inline(closed.jaxpr, closed.consts, operands)
    return results[0] if len(results) == 1 else results


def _spec(instruction) -> jax.ShapeDtypeStruct:
    shape = instruction.array_shape
    return jax.ShapeDtypeStruct(shape.dims, shape.dtype.numpy)


def _keys(ctx):
    """(impl, key array dims) of the equation's first operand, a key array."""
    aval = ctx.in_avals[0]
    impl = key_impl(aval)
    if impl is None:
        raise FrontendError(f"'{ctx.primitive}' at {ctx.loc} expects a key array, got {aval}")
    return impl, len(aval.shape)


RULES["random_wrap"] = RULES["random_unwrap"] = RULES["random_clone"] = RULES["copy"]  # the same data


@rule("random_bits")
def _random_bits(ctx, params, operands):
    impl, ndim = _keys(ctx)
    bits, shape = int(params["bit_width"]), tuple(int(d) for d in params["shape"])
    fn = _vmapped(lambda k: impl.random_bits(k, bits, shape), ndim)
    return _inline_traced(ctx, fn, [_spec(operands[0])], operands)


@rule("random_split")
def _random_split(ctx, params, operands):
    impl, ndim = _keys(ctx)
    shape = tuple(int(d) for d in params["shape"])
    fn = _vmapped(lambda k: impl.split(k, shape), ndim)
    return _inline_traced(ctx, fn, [_spec(operands[0])], operands)


@rule("random_fold_in")
def _random_fold_in(ctx, params, operands):
    """Each key folds in its message: one message for every key, one key for every message, or
    keys and messages broadcast together (dims of 1 against any), as jax.random.fold_in does."""
    impl, ndim = _keys(ctx)
    keys, msgs = operands
    key_dims, msg_dims = keys.array_shape.dims[:ndim], msgs.array_shape.dims
    if not msg_dims:
        fn = lambda k, m: _vmapped(lambda one: impl.fold_in(one, m), ndim)(k)  # noqa: E731
    elif not ndim:  # one key, many messages: a key for each
        fn = lambda k, m: _vmapped(lambda one: impl.fold_in(k, one), len(msg_dims))(m)  # noqa: E731
    elif len(msg_dims) == ndim and all(1 in (k, m) or k == m for k, m in zip(key_dims, msg_dims)):
        common = tuple(max(k, m) for k, m in zip(key_dims, msg_dims))  # both broadcast, as jax does
        if key_dims != common:
            physical = keys.array_shape.with_dims(common + keys.array_shape.dims[ndim:])
            keys = ctx.emit(Op.BROADCAST_IN_DIM, keys, shape=physical, dims=tuple(range(keys.array_shape.rank)))
        if msg_dims != common:
            msgs = ctx.emit(Op.BROADCAST_IN_DIM, msgs, shape=msgs.array_shape.with_dims(common),
                            dims=tuple(range(ndim)))
        fn = _vmapped(impl.fold_in, ndim)
    else:
        raise FrontendError(f"'random_fold_in' at {ctx.loc}: messages of shape {msg_dims} for keys of shape "
                            f"{key_dims} do not broadcast together")
    return _inline_traced(ctx, fn, [_spec(keys), _spec(msgs)], [keys, msgs])


@rule("random_seed")
def _random_seed(ctx, params, operands):
    impl = params["impl"]
    (seeds,) = operands
    fn = _vmapped(impl.seed, seeds.array_shape.rank)
    return _inline_traced(ctx, fn, [_spec(seeds)], operands)


# Threefry-2x32 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC 2011): 20
# rounds of add, rotate, xor on two uint32 words, the key injected every four, as jax hashes.
_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))
_PARITY = 0x1BD11BDA


@rule("threefry2x32")
def _threefry2x32(ctx, params, operands):
    """The hash of counters (x1, x2) under key (k1, k2), written out round by round in uint32."""
    dims = ctx.out.dims
    k1, k2, x1, x2 = (ctx.broadcast_to(x, dims) for x in operands)
    e = Elementwise(ctx, dims, DType.U32)

    def rotate_left(v, r):
        return e.or_(e.shift_left(v, e.c(r)), e.shift_right_logical(v, e.c(32 - r)))

    keys = [k1, k2, e.xor(e.xor(k1, k2), e.c(_PARITY))]
    x = [e.add(x1, keys[0]), e.add(x2, keys[1])]
    for block in range(5):
        for r in _ROTATIONS[block % 2]:
            x[0] = e.add(x[0], x[1])
            x[1] = e.xor(rotate_left(x[1], r), x[0])
        x[0] = e.add(x[0], keys[(block + 1) % 3])
        x[1] = e.add(e.add(x[1], keys[(block + 2) % 3]), e.c(block + 1))
    return x


@rule("iota_2x32_shape")
def _iota_2x32_shape(ctx, params, operands):
    """The row-major index of each element in two uint32 words (high, low): the high word is
    zero, as xfuse draws fewer than 2^32 numbers at once (16 GiB of uint32)."""
    dims = tuple(int(d) for d in params["shape"])
    if math.prod(dims) >= 1 << 32:
        raise FrontendError(f"'{ctx.primitive}' at {ctx.loc}: xfuse draws fewer than 2**32 random numbers at once, "
                            f"not {dims}")
    e = Elementwise(ctx, dims, DType.U32)
    index, stride = None, 1
    for axis in reversed(range(len(dims))):
        term = ctx.emit(Op.IOTA, shape=ctx.out, dimension=axis)
        term = term if stride == 1 else e.mul(term, e.c(stride))
        index = term if index is None else e.add(index, term)
        stride *= dims[axis]
    return [e.c(0), index]


# ---------------------------------------------------------------------------- key arrays
# Ops that move key arrays around see their key data, which has the key's dims after the
# array's own: a slice, broadcast or transpose of keys carries those trailing dims along
# untouched. Other ops on key arrays (arithmetic on them, gathers) raise FrontendError.
def _trailing(ctx) -> tuple[int, ...]:
    impl = next(i for i in map(key_impl, ctx.in_avals) if i is not None)
    return tuple(int(d) for d in impl.key_shape)


def _logical_rank(ctx, index: int = 0) -> int:
    return len(ctx.in_avals[index].shape)


def _slice_keys(plain, ctx, params, operands):
    key = _trailing(ctx)
    rank = _logical_rank(ctx)
    params = dict(params, start_indices=(*params["start_indices"], *(0,) * len(key)),
                  limit_indices=(*params["limit_indices"], *key),
                  strides=(*(params.get("strides") or (1,) * rank), *(1,) * len(key)))
    return plain(ctx, params, operands)


def _broadcast_keys(plain, ctx, params, operands):
    key = _trailing(ctx)
    rank = len(ctx.out.dims) - len(key)
    dims = (*params["broadcast_dimensions"], *range(rank, rank + len(key)))
    return plain(ctx, dict(params, broadcast_dimensions=dims), operands)


def _transpose_keys(plain, ctx, params, operands):
    rank, key = _logical_rank(ctx), _trailing(ctx)
    return plain(ctx, dict(params, permutation=(*params["permutation"], *range(rank, rank + len(key)))), operands)


def _reshape_keys(plain, ctx, params, operands):
    if params.get("dimensions") is not None:
        rank, key = _logical_rank(ctx), _trailing(ctx)
        params = dict(params, dimensions=(*params["dimensions"], *range(rank, rank + len(key))))
    return plain(ctx, params, operands)


def _indexed_keys(first_index: int):
    """dynamic_slice (indices from operand 1) and dynamic_update_slice (from 2): a zero index
    for each trailing key dim."""

    def translate(plain, ctx, params, operands):
        key = _trailing(ctx)
        index_type = operands[first_index].array_shape.dtype if len(operands) > first_index else DType.S32
        zeros = [ctx.constant(0, index_type) for _ in key]
        return plain(ctx, params, [*operands, *zeros])

    return translate


def _select_keys(plain, ctx, params, operands):
    which, *cases = operands
    if which.array_shape.rank:  # the predicate has the keys' own dims: spread it over the key data
        which = ctx.emit(Op.BROADCAST_IN_DIM, which, shape=which.array_shape.with_dims(ctx.out.dims),
                         dims=tuple(range(which.array_shape.rank)))
    return plain(ctx, params, [which, *cases])


_KEY_MOVES = {
    "slice": _slice_keys, "broadcast_in_dim": _broadcast_keys, "transpose": _transpose_keys,
    "reshape": _reshape_keys, "dynamic_slice": _indexed_keys(1), "dynamic_update_slice": _indexed_keys(2),
    "select_n": _select_keys,
}  # fmt: skip
# Rules that take key data as they are: they read their output's dims, not their parameters'.
_KEY_AS_IS = ("squeeze", "expand_dims", "concatenate", "copy", "copy_p", "optimization_barrier", "device_put",
              "sharding_constraint", "pvary")
# Rules whose parameters name axes of the key array, which are the key data's leading axes:
# jax 0.11 splits keys with `unstack`.
_KEY_LEADING_AXES = ("stack", "unstack", "split")


def _keyed(name: str, physical) -> None:
    plain = RULES[name]

    def translate(ctx, params, operands):
        return physical(plain, ctx, params, operands) if ctx.keyed else plain(ctx, params, operands)

    RULES[name] = translate


for _name, _physical in _KEY_MOVES.items():
    _keyed(_name, _physical)

# Primitives whose rules take key arrays (as key data); the frontend refuses any other
# primitive given one, naming it, rather than let its rule misread the trailing dims.
KEY_PRIMITIVES.update({
    *_KEY_MOVES, *_KEY_AS_IS, *_KEY_LEADING_AXES, "random_wrap", "random_unwrap", "random_clone", "random_bits", "random_split", "random_fold_in",
    "random_gamma",
    "jit", "pjit", "closed_call", "core_call", "remat", "checkpoint", "remat2", "custom_jvp_call",
    "custom_vjp_call", "custom_vjp_call_jaxpr", "while", "cond", "scan",
})  # fmt: skip


@rule("random_gamma")
def _random_gamma(ctx, params, operands):
    """Gamma samples as jax lowers them on the CPU: its own sampler (Marsaglia and Tsang's
    rejection loop, vmapped over the alphas) traced on the key array and inlined."""
    try:
        from jax._src.random.core import _gamma_impl
    except ImportError:  # another jax's layout
        raise FrontendError(f"'random_gamma' at {ctx.loc}: xfuse cannot find this jax's gamma sampler") from None
    key_aval, alpha = ctx.in_avals[0], operands[1]
    spec = jax.ShapeDtypeStruct(key_aval.shape, key_aval.dtype)
    fn = lambda k, a: _gamma_impl(k, a, log_space=bool(params["log_space"]), use_vmap=True)  # noqa: E731
    return _inline_traced(ctx, fn, [spec, _spec(alpha)], operands)
