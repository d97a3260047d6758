"""The rule for `jax.pure_callback` (and so `equinox.error_if`, which diffrax's solvers call):
a `callback` instruction that calls the traced Python function on numpy arrays when the
program runs, as jax.jit's executable calls back into Python. Registered into `rules.RULES`.
May import xfuse.hlo.
"""

from __future__ import annotations

from xfuse.hlo import Op, TupleShape
from xfuse.hlo import callbacks

from .rules import rule


@rule("pure_callback")
def _pure_callback(ctx, params, operands):
    number = callbacks.register(params["callback"])
    if len(ctx.out_shapes) == 1:
        return ctx.emit(Op.CALLBACK, *operands, callback=number, shape=ctx.out)
    result = ctx.emit(Op.CALLBACK, *operands, callback=number, shape=TupleShape(tuple(ctx.out_shapes)))
    return [ctx.emit(Op.GET_TUPLE_ELEMENT, result, index=k) for k in range(len(ctx.out_shapes))]
