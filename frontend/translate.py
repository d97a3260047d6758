"""Jaxpr -> `hlo.Module`: walks the equations of a closed jaxpr, looks each primitive up in the
rule table (`rules.py`), and keeps every equation's user source line on what it produces.

Calls (`jit`, `closed_call`, `custom_jvp_call`, `custom_vjp_call`, `remat`, ...) are inlined.
May import xfuse.hlo and jax.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

import jax
import numpy as np
from jax._src import source_info_util
from jax.extend import core as jcore

from xfuse.hlo import Builder, Computation, DType, Instruction, Loc, Module, Op, Shape


class FrontendError(Exception):
    """A JAX program xfuse cannot translate; names the primitive and the user's source line."""


def implementation_rule(eqn) -> Callable | None:
    """A rule for a primitive that has none of its own but whose implementation is JAX code (a
    library's own primitives, as equinox's `unvmap_any` that every diffrax solve binds): the
    implementation traced for the equation's operands into a jaxpr of other primitives, inlined.
    None where it does not trace, or traces back to the primitive itself (JAX's own, whose
    implementation binds it)."""
    primitive, params = eqn.primitive, dict(eqn.params)
    impl = getattr(primitive, "impl", None)
    if impl is None:
        return None
    structs = [jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype,
                                    weak_type=getattr(v.aval, "weak_type", False)) for v in eqn.invars]
    try:
        closed = jax.make_jaxpr(lambda *args: impl(*args, **params))(*structs)
    except Exception:  # an implementation that needs concrete values (a host callback)
        return None
    if any(e.primitive is primitive for e in closed.jaxpr.eqns) \
            or len(closed.jaxpr.outvars) != len(eqn.outvars):
        return None

    def translate(ctx, params, operands):
        name, loc, pinned = primitive.name, ctx.loc, ctx.pinned
        ctx.expanding.append(name)
        ctx.pinned = pinned or loc  # its equations are at the call's line, not the library's
        try:
            return ctx.inline(closed.jaxpr, closed.consts, operands)
        except UnsupportedPrimitiveError:  # the implementation needs what has no rule either
            raise UnsupportedPrimitiveError(name, params, loc) from None
        finally:
            ctx.expanding.pop()
            ctx.pinned = pinned

    return translate


class UnsupportedPrimitiveError(FrontendError):
    """A JAX primitive with no rule in the table."""

    def __init__(self, primitive: str, params: dict, loc: Loc | None) -> None:
        self.primitive = primitive
        self.params = params
        self.loc = loc
        shown = ", ".join(f"{k}={_short(v)}" for k, v in params.items())
        where = f" at {loc}" if loc else ""
        super().__init__(
            f"xfuse has no rule for the JAX primitive '{primitive}'{where}; params: {{{shown}}}"
        )


def _short(value: object, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


KEY_PRIMITIVES: set[str] = set()  # those whose rules take key arrays: filled in by `frontend.random`


def key_impl(aval):
    """The PRNG implementation of a key-typed abstract value, or None for any other value."""
    dtype = getattr(aval, "dtype", None)
    if dtype is None or not jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
        return None
    impl = getattr(dtype, "_impl", None)  # the PRNGImpl jax's own lowering reads
    if impl is None:
        raise FrontendError(f"xfuse cannot read the PRNG implementation of {dtype}")
    return impl


def physical_dims(aval) -> tuple[tuple[int, ...], object]:
    """(dims, numpy dtype) of a value as the IR holds it: a key array as its key data."""
    impl = key_impl(aval)
    if impl is None:
        return tuple(aval.shape), aval.dtype
    return (*aval.shape, *impl.key_shape), np.dtype(np.uint32)  # jax's implementations: uint32 words


def shape_of_aval(aval, where: str = "") -> Shape:
    """The xfuse Shape of a jax abstract value; FrontendError for dtypes xfuse lacks."""
    dims, numpy_dtype = physical_dims(aval)
    try:
        dtype = DType.from_numpy(numpy_dtype)
    except TypeError:
        raise FrontendError(f"xfuse does not support the dtype {aval.dtype}{where}") from None
    return Shape(dtype, tuple(int(d) for d in dims))


def loc_of(eqn) -> Loc | None:
    """The innermost user frame of an equation: file (relative to the cwd when inside it)."""
    frame = source_info_util.user_frame(eqn.source_info.traceback)
    if frame is None:
        return None
    path = frame.file_name
    try:
        relative = os.path.relpath(path)
        if not relative.startswith(".."):
            path = relative
    except ValueError:  # a different drive
        pass
    return Loc(path, int(frame.start_line), frame.function_name)


Rule = Callable[["Context", dict, list[Instruction]], "Instruction | Sequence[Instruction]"]


class Elementwise:
    """Elementwise ops over one dims and dtype, spelled short for the rules that expand a
    function into many of them (`frontend.special`, threefry in `frontend.random`): `e.add(a, b)`
    emits add, `e.c(2.0)` a constant of the dtype (or another) broadcast to the dims,
    `e.where(p, yes, no)` a select; an op named like a Python keyword takes a trailing _
    (`e.and_`)."""

    def __init__(self, ctx: "Context", dims: tuple[int, ...], dtype: DType) -> None:
        self.ctx, self.dims, self.dtype = ctx, dims, dtype

    def c(self, value: object, dtype: DType | None = None) -> Instruction:
        return self.ctx.broadcast_to(self.ctx.constant(value, dtype or self.dtype), self.dims)

    def where(self, p: Instruction, yes: Instruction, no: Instruction) -> Instruction:
        return self.ctx.emit(Op.SELECT_N, p, no, yes)

    def __getattr__(self, name: str) -> Callable[..., Instruction]:
        op = Op(name.rstrip("_"))
        return lambda *xs: self.ctx.emit(op, *xs)


class Context:
    """What a rule sees: the builder, the equation's location and output types, and helpers."""

    def __init__(self, builder: Builder, rules: dict[str, Rule]) -> None:
        self.b = builder
        self.rules = rules
        self.loc: Loc | None = None
        self.out_shapes: list[Shape] = []
        self.in_avals: list = []  # the equation's operands' abstract values (key arrays' impls)
        self.keyed = False  # whether any of them is a PRNG key array
        self.primitive = ""
        self.called: list[Computation] = []  # loop bodies, branches: shared with nested contexts
        # primitives being translated through their implementation (`implementation_rule`):
        # their equations take the line of the call, and the primitive is not expanded again
        self.expanding: list[str] = []
        self.pinned: Loc | None = None

    # ------------------------------------------------------------------ helpers for rules
    @property
    def out(self) -> Shape:
        """The (first) output type of the equation being translated."""
        return self.out_shapes[0]

    def emit(self, op: Op, *operands: Instruction, **kw: object) -> Instruction:
        return self.b.emit(op, *operands, loc=self.loc, **kw)

    def constant(self, value: object, dtype: DType) -> Instruction:
        saved = self.b.loc
        self.b.loc = self.loc
        try:
            return self.b.constant(np.asarray(value, dtype=dtype.numpy), dtype)
        finally:
            self.b.loc = saved

    def broadcast_to(self, x: Instruction, dims: tuple[int, ...]) -> Instruction:
        """`x` broadcast to `dims` numpy-style (lax ops broadcast rank-0 and size-1 operands)."""
        shape = x.array_shape
        if shape.dims == dims:
            return x
        offset = len(dims) - shape.rank
        mapping = tuple(range(offset, len(dims)))
        return self.emit(Op.BROADCAST_IN_DIM, x, shape=Shape(shape.dtype, dims), dims=mapping)

    def convert(self, x: Instruction, dtype: DType) -> Instruction:
        if x.array_shape.dtype == dtype:
            return x
        return self.emit(Op.CONVERT_ELEMENT_TYPE, x, dtype=dtype)

    # ------------------------------------------------------------------ jaxprs
    def value_of(self, env: dict, var) -> Instruction:
        if isinstance(var, jcore.Literal):
            shape = shape_of_aval(var.aval, f" (a literal) at {self.loc}")
            return self.constant(var.val, shape.dtype)
        return env[var]

    def inline(self, jaxpr, consts: Sequence[object], operands: Sequence[Instruction]) -> list[Instruction]:
        """Translates `jaxpr` with its invars bound to `operands`; returns its outputs."""
        env: dict = {}
        saved = self.loc
        for var, const in zip(jaxpr.constvars, consts):
            shape = shape_of_aval(var.aval, " (a captured constant)")
            if key_impl(var.aval) is not None:  # a captured key array: its key data
                const = jax.random.key_data(const)
            env[var] = self.constant(np.asarray(const), shape.dtype)
        if len(jaxpr.invars) != len(operands):
            raise FrontendError(
                f"a call passes {len(operands)} operands to a jaxpr of {len(jaxpr.invars)} inputs"
            )
        env.update(zip(jaxpr.invars, operands))
        for eqn in jaxpr.eqns:
            self.equation(env, eqn, default_loc=saved)
        outputs = [self.value_of(env, v) for v in jaxpr.outvars]
        self.loc = saved
        return outputs

    def equation(self, env: dict, eqn, default_loc: Loc | None = None) -> None:
        """Translates one equation; one with no user frame of its own (the body of a library
        function jax traced once and cached) takes the location of the call it is inlined in."""
        name = eqn.primitive.name
        self.loc = self.pinned or loc_of(eqn) or default_loc
        self.primitive = name
        rule = self.rules.get(name)
        if rule is None and name not in self.expanding:
            rule = implementation_rule(eqn)
        if rule is None:
            raise UnsupportedPrimitiveError(name, dict(eqn.params), self.loc)
        where = f" of '{name}' at {self.loc}" if self.loc else f" of '{name}'"
        out_shapes = [shape_of_aval(v.aval, where) for v in eqn.outvars]
        self.out_shapes = out_shapes
        self.in_avals = [v.aval for v in eqn.invars]
        self.keyed = any(key_impl(a) is not None for a in self.in_avals)
        if self.keyed and name not in KEY_PRIMITIVES:
            raise FrontendError(f"xfuse does not support '{name}' on PRNG key arrays (at {self.loc})")
        loc = self.loc
        operands = [self.value_of(env, v) for v in eqn.invars]
        results = rule(self, dict(eqn.params), operands)
        self.loc, self.primitive = loc, name  # an inlined call translated other equations
        results = [results] if isinstance(results, Instruction) else list(results)
        if len(results) != len(eqn.outvars):
            raise FrontendError(f"the rule for '{name}' gave {len(results)} results, expected {len(eqn.outvars)}")
        for var, result, want in zip(eqn.outvars, results, out_shapes):
            if result.shape != want:
                raise FrontendError(
                    f"the rule for '{name}' at {self.loc} produced {result.shape}, JAX expects {want}"
                )
            if not isinstance(var, jcore.DropVar):
                env[var] = result


def jaxpr_to_module(
    closed_jaxpr,
    name: str,
    param_names: Sequence[str],
    rules: dict[str, Rule],
) -> Module:
    """The module of a closed jaxpr: one parameter per input, a tuple root unless one output."""
    builder = Builder("main")
    params = [
        builder.parameter(shape_of_aval(v.aval, f" (input {n})"), name=n)
        for v, n in zip(closed_jaxpr.jaxpr.invars, param_names)
    ]
    ctx = Context(builder, rules)
    outputs = ctx.inline(closed_jaxpr.jaxpr, closed_jaxpr.consts, params)
    root = outputs[0] if len(outputs) == 1 else builder.emit(Op.TUPLE, *outputs)
    return Module.of(builder.build(root), *ctx.called, name=name)
