"""Random recurrent cells, differentially: `rowsplit` either leaves a loop alone or splits it
into loops whose results equal the unsplit loop's bit for bit on the reference interpreter (the
same operations on each row), NaN, infinities and -0.0 included. A cell built only from terms
that keep rows apart, with a product of the state, always splits; a cell with a term that
mixes rows (a mean over the batch, a roll or reversal of the rows, a product contracting the
batch) never does."""

from __future__ import annotations

import random

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jax import lax

import xfuse
from xfuse.fusion import RowSplitLoops, parse_pipeline, run_pipeline
from xfuse.hlo import interpret, verify

BATCH, HIDDEN, FEATURES, STEPS = 16, 128, 24, 4

# Terms of the pre-activation, each of shape (batch, hidden): h, the state; x, the step's input;
# wh, wx and b, weights the same in every row.
APART = [
    "h @ wh", "x @ wx", "h @ wh.T", "b", "h * 0.5", "jnp.maximum(h, 0.0)", "jnp.sum(h, axis=1, keepdims=True)",
    "jnp.where(h > 0, h, -h * 0.25)", "jnp.tanh(x @ wx) * h", "(h @ wh)[:, ::-1]", "jnp.broadcast_to(b[0], h.shape)",
    "jnp.transpose(jnp.transpose(h) * 2.0)", "h.reshape(BATCH, 2, HIDDEN // 2).reshape(BATCH, HIDDEN)",
]
MIXING = [
    "jnp.mean(h, axis=0)", "jnp.roll(h, 1, axis=0)", "h[::-1]", "(h.T @ h)[:BATCH]", "h[:1] * h",
]
ACTIVATIONS = ["jnp.tanh({})", "jax.nn.relu({})", "jax.nn.sigmoid({}) * 2.0 - 1.0", "({}) * 0.5"]


def cell_source(r: random.Random, mixing: bool) -> str:
    terms = ["h @ wh"] + r.sample(APART, r.randint(1, 4))
    if mixing:
        terms.insert(r.randrange(len(terms) + 1), r.choice(MIXING))
    return r.choice(ACTIVATIONS).format(" + ".join(terms))


def scan_of(source: str):
    scope = {"jnp": jnp, "jax": jax, "BATCH": BATCH, "HIDDEN": HIDDEN}
    exec(f"def step(h, x, wx, wh, b):\n    return {source}\n", scope)
    step = scope["step"]

    def fn(xs, wx, wh, b):
        def cell(h, x):
            h = step(h, x, wx, wh, b)
            return h, h

        return lax.scan(cell, jnp.full((BATCH, HIDDEN), 0.1, xs.dtype), xs)[1]

    return fn


def inputs(seed: int):
    rng = np.random.default_rng(seed)
    xs = rng.standard_normal((STEPS, BATCH, FEATURES)).astype(np.float32)
    wx = (rng.standard_normal((FEATURES, HIDDEN)) / 8).astype(np.float32)
    wh = (rng.standard_normal((HIDDEN, HIDDEN)) / 16).astype(np.float32)
    b = (rng.standard_normal(HIDDEN) / 4).astype(np.float32)
    flat = xs.reshape(-1)
    flat[rng.choice(flat.size, 6, replace=False)] = [np.nan, np.inf, -np.inf, -0.0, 3e38, -3e38]
    return xs, wx, wh, b


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), mixing=st.booleans())
def test_a_split_equals_the_whole_loop_and_mixed_rows_never_split(seed, mixing):
    r = random.Random(seed)
    source = cell_source(r, mixing)
    fn, args = scan_of(source), inputs(seed)
    module = xfuse.jit(fn, passes="none").lower(*args).module
    before = run_pipeline(module, parse_pipeline("simplify,fold,cse,licm")).module
    rowsplit = RowSplitLoops(parts=2)
    after = rowsplit.run(before)
    verify(after)
    assert len(rowsplit.splits) == (0 if mixing else 1), source
    with np.errstate(all="ignore"):
        want = np.asarray(interpret(before, *args))
        got = np.asarray(interpret(after, *args))
    np.testing.assert_array_equal(got, want, err_msg=source)
    assert np.array_equal(np.signbit(got), np.signbit(want)), source
