"""Corpus cases for control flow: lax.cond, lax.switch, lax.while_loop, lax.fori_loop, lax.scan.

Imported by `test_corpus.py` once its `case` decorator and input helpers exist; each case
registers itself there and runs in every corpus test (jax.jit against each backend).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from tests.frontend.test_corpus import COMPOSITE, case, floats, integers
from tests.tolerances import EXACT


# --- scan: an RNN cell over time, its states stacked; a reverse scan; a scan of a cond
def rnn_inputs(rng, edge):
    xs = floats(rng, edge, (6, 4, 3))
    h0 = floats(rng, False, (4, 5), scale=0.5)
    wx = floats(rng, False, (3, 5), scale=0.4)
    wh = floats(rng, False, (5, 5), scale=0.3)
    b = floats(rng, False, (5,), scale=0.1)
    return xs, h0, wx, wh, b


@case(rnn_inputs)
def rnn_scan(xs, h0, wx, wh, b):
    def cell(h, x):
        h = jnp.tanh(x @ wx + h @ wh + b)
        return h, h

    return lax.scan(cell, h0, xs)


@case(lambda r, e: (floats(r, e, (7, 3)), floats(r, False, (3,))))
def reverse_scan(xs, init):
    def step(carry, x):
        total, count = carry
        return (total * 0.5 + x, count + 1), jnp.maximum(total, x)

    (total, count), peaks = lax.scan(step, (init, jnp.int32(0)), xs, reverse=True)
    return total, count, peaks


@case(lambda r, e: (floats(r, e, (5, 4)), floats(r, False, (4,))))
def cond_inside_scan(xs, init):
    def step(carry, x):
        carry = lax.cond(jnp.sum(x) > 0, lambda c: c + x, lambda c: c * 0.5 - x, carry)
        return carry, jnp.sum(carry)

    return lax.scan(step, init, xs)


@case(lambda r, e: (floats(r, e, (4, 3)), floats(r, e, (3,))), EXACT)
def scan_of_no_steps(xs, init):
    return lax.scan(lambda c, x: (c + x, c * x), init, xs[:0])


# --- while_loop: Newton's square root to a tolerance (at most 40 steps), and a loop that
# never runs its body
@case(lambda r, e: (floats(r, e, (4, 6), large=False),))
def newton_sqrt(x):
    a = jnp.abs(x) + 0.5

    def unconverged(state):
        i, y = state
        return (i < 40) & jnp.any(jnp.abs(y * y - a) > 1e-6 * a)

    def step(state):
        i, y = state
        return i + 1, 0.5 * (y + a / y)

    _, y = lax.while_loop(unconverged, step, (jnp.int32(0), a))
    return y


@case(lambda r, e: (floats(r, e, (3, 4)),), EXACT)
def while_zero_iterations(x):
    never = lax.while_loop(lambda s: s[0] < 0, lambda s: (s[0] + 1, s[1] * 2), (jnp.int32(0), x))
    return never[1], never[0]


@case(lambda r, e: (floats(r, e, (5, 3), large=False), integers(r, e, (5,), low=-1, high=6, extreme=False)),
      COMPOSITE)
def vmapped_while(x, n):
    """A while_loop under vmap whose condition depends on the element: JAX's batched predicate
    (the loop runs while any element's holds; the others keep their carry)."""
    def one(row, k):
        def step(state):
            i, v = state
            return i + 1, v * 0.5 + jnp.cos(v)

        return lax.while_loop(lambda s: (s[0] < k) & (s[1][0] < 4.0), step, (jnp.int32(0), row))

    steps, rows = jax.vmap(one)(x, n)
    return steps, rows


# --- fori_loop: static bounds (a scan) and traced bounds (a while)
@case(lambda r, e: (floats(r, e, (4, 5), large=False), integers(r, e, (), low=-2, high=6, extreme=False)),
      COMPOSITE)
def fori_loops(x, n):
    static = lax.fori_loop(0, 4, lambda i, c: c * 0.5 + jnp.sin(c) + i, x)
    traced = lax.fori_loop(0, n, lambda i, c: c * 0.75 + i.astype(c.dtype), x)
    total = lax.fori_loop(1, n + 1, lambda i, t: t + i, jnp.int32(0))
    return static, traced, total


# --- lax.switch (the index out of range on both sides) and lax.cond on a predicate
@case(lambda r, e: (integers(r, e, (), low=-3, high=5, extreme=False), floats(r, e, (3, 4))), COMPOSITE)
def piecewise_switch(k, x):
    branches = [lambda x: x * 2.0, lambda x: jnp.exp(-jnp.abs(x)), lambda x: jnp.maximum(x, 0.0) - 1.0]
    return lax.switch(k, branches, x)


@case(lambda r, e: (floats(r, e, (4,)), floats(r, e, (4,)), integers(r, e, (4,))))
def cond_several_outputs(x, y, n):
    def positive(x, y, n):
        return x + y, n * 2, jnp.sum(x * y)

    def negative(x, y, n):
        return x - y, n - 1, jnp.float32(0)

    return lax.cond(jnp.sum(x) > jnp.sum(y), positive, negative, x, y, n)


@case(lambda r, e: (np.asarray(r.random() < 0.5), floats(r, e, (2, 3))))
def cond_on_boolean_argument(flag, x):
    return lax.cond(flag, lambda x: jnp.tanh(x), lambda x: x, x)


# --- host callbacks: jax.pure_callback in a chain, and vmapped one element at a time (a loop)
def _host_softsign(x):
    with np.errstate(invalid="ignore"):  # inf / inf: NaN, as jax.jit's run of it gives
        return (np.asarray(x) / (1.0 + np.abs(x))).astype(np.asarray(x).dtype)


@case(lambda r, e: (floats(r, e, (4, 3)),))
def pure_callback_in_a_chain(x):
    spec = jax.ShapeDtypeStruct(x.shape, x.dtype)
    y = jax.pure_callback(_host_softsign, spec, jnp.exp(x * 0.5))
    rows = jax.ShapeDtypeStruct(x.shape[1:], x.dtype)
    mapped = jax.vmap(lambda r: jax.pure_callback(_host_softsign, rows, r, vmap_method="sequential"))(x)
    return y * 2.0 + 1.0, mapped
