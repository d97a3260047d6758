"""A scan that stacks several outputs (a recurrent cell's residuals, saved for its gradient):
each stacked output's dynamic_update_slice stays a fusion of its own, even where the updates
read the same index (siblings), so the loop writes just each step's window in place, natively,
instead of one kernel copying every stack at every step. A backward scan whose kernels the
runtime would split over threads runs natively too."""

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


def test_a_backward_scan_with_kernels_split_over_threads_runs_natively():
    """The gradient of a recurrent cell: its backward loop's weight-gradient epilogue and bias
    sum are large enough for the runtime to split over threads; in a native loop they run on
    one thread, and the call runs the same number of Python steps whatever the trip count."""
    rng = np.random.default_rng(1)
    w = rng.standard_normal((256, 256)).astype(np.float32) / 16
    h = rng.standard_normal((256, 256)).astype(np.float32)

    def loss(w, h, xs):
        def step(h, x):
            h = jnp.tanh(h @ w + x)
            return h, h.sum()

        h, sums = lax.scan(step, h, xs)
        return jnp.sum(h**2) + sums.sum()

    grad = jax.grad(loss)
    counts = []
    for length in (3, 9):
        xs = rng.standard_normal((length, 256, 256)).astype(np.float32)
        compiled = xfuse.jit(grad).lower(w, h, xs).compile()
        counts.append(compiled.steps_per_call(w, h, xs))
        got, want = np.asarray(compiled(w, h, xs)), np.asarray(jax.jit(grad)(w, h, xs))
        np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-4 * np.abs(want).max())
    assert counts[0] == counts[1], counts
