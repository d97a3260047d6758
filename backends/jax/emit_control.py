"""jax backend rules for control flow: `while` as `lax.while_loop` over a tuple of the state,
`conditional` as `lax.switch` over the branch functions. The condition, body and branches are
functions of their own (emitted before their caller, fusions inside them inline), named by
`Context.callees` in attribute order.

lax.switch clamps an out-of-range index into range (a negative one to branch 0); the IR runs
the last branch for any index out of range, as XLA does, so the index is mapped first
(`branch_index`). Registered into `emit.RULES` and `emit.NAMESPACE` by emit.py. May import
xfuse.hlo, numpy and jax.
"""

from __future__ import annotations

import numpy as np
from jax import lax

from xfuse.hlo import Op


def branch_index(index, count: int):
    """`index`, or the last branch (count - 1) when it is out of range, as an int32."""
    index = lax.convert_element_type(index, np.int32)
    inside = (index >= 0) & (index < count)
    return lax.select(inside, index, np.asarray(count - 1, np.int32))


def _state(args: list[str]) -> str:
    return f"({', '.join(args)},)" if len(args) == 1 else f"({', '.join(args)})"


def _while(c) -> str:
    condition, body = c.callees
    return (
        f"lax.while_loop(lambda s: {condition}(*s), lambda s: tuple({body}(*s)), {_state(c.args)})"
    )


def _conditional(c) -> str:
    index, *args = c.args
    branches = ", ".join(c.callees)
    operands = "".join(f", {a}" for a in args)
    return f"lax.switch(branch_index({index}, {len(c.callees)}), [{branches}]{operands})"


CONTROL_RULES = {Op.WHILE: _while, Op.CONDITIONAL: _conditional}
CONTROL_NAMESPACE = {"branch_index": branch_index}
