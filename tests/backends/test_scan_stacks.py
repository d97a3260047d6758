"""A scan that stacks several outputs (a recurrent cell's residuals, saved for its gradient):
each stacked output's dynamic_update_slice stays a fusion of its own, even where the updates
read the same index (siblings), so the loop writes just each step's window in place, natively,
instead of one kernel copying every stack at every step."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import xfuse
from xfuse.hlo import Op


def cell(carry, x):
    h = jnp.tanh(x @ carry["w"] + carry["h"])
    gate = jax.nn.sigmoid(h)
    return dict(carry, h=h * gate), (h, gate, h * 2.0)


def run(w, h, xs):
    carry, stacks = lax.scan(cell, {"w": w, "h": h}, xs)
    return carry["h"], stacks


def test_each_stacked_output_is_a_window_of_its_own():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((16, 128)).astype(np.float32) / 4
    h = np.zeros((64, 128), np.float32)
    xs = rng.standard_normal((12, 64, 16)).astype(np.float32)
    compiled = xfuse.jit(run).lower(w, h, xs).compile()
    module = compiled.module
    (loop,) = [i for i in module.entry_computation.instructions if i.op is Op.WHILE]
    body = module[loop.attr("body")]
    for inst in body.instructions:
        if inst.op is Op.FUSION:
            fused = module[inst.attr("calls")]
            updates = [i for i in fused.instructions if i.op is Op.DYNAMIC_UPDATE_SLICE]
            assert len(updates) <= 1, f"{inst.name} writes {len(updates)} stacks"
    steps = compiled.steps_per_call(w, h, xs)
    shorter = xs[:3]
    assert xfuse.jit(run).lower(w, h, shorter).compile().steps_per_call(w, h, shorter) == steps
    got, want = compiled(w, h, xs), jax.jit(run)(w, h, xs)
    for g, j in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(g, j, rtol=2e-5, atol=2e-6)
