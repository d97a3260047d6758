"""A gather inside a kernel (`emitter.Emitter.op_gather`): every layout, mode and index type of
the lax suite's gathers on the numba backend against the reference interpreter (out-of-bounds
and extreme indices, clamped or filled); and fused with its producer and consumers in real
patterns (cross-entropy's take_along_axis with labels out of range, an embedding lookup),
against jax.jit on the numba and C backends."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import xfuse
from tests.backends.test_ops_numba import check_trial, run_numba
from tests.hlo.test_ops_vs_jax import trials_of
from xfuse.hlo import DType, Op


@pytest.mark.parametrize("dtype", [DType.F32, DType.S16], ids=str)
def test_every_gather_layout_mode_and_index_type(dtype):
    trials = trials_of(Op.GATHER, dtype)
    assert len(trials) == 15
    for trial in trials:
        check_trial("numba", Op.GATHER, dtype, trial, lambda t: run_numba(Op.GATHER, t))


def _loss(logits, labels):  # optax's integer-label cross-entropy, as flax examples write it
    shifted = logits * 2.0 + 1.0
    picked = jnp.take_along_axis(shifted, labels[:, None], axis=-1)[:, 0]
    return jax.nn.logsumexp(shifted, axis=-1) - picked


def _embed(table, ids, scale):
    return jnp.tanh(table[ids] * scale)


def _fused_computations(compiled) -> str:
    text = compiled.as_text()
    return text[: text.index("ENTRY")]


@pytest.mark.parametrize("backend", ["numba", "c"])
def test_gathers_fuse_with_their_producers_and_consumers(backend):
    rng = np.random.default_rng(5)
    logits = rng.standard_normal((33, 10)).astype(np.float32)
    logits[3, 4], logits[5] = np.nan, -np.inf
    labels = rng.integers(0, 10, 33).astype(np.int32)
    labels[:4] = [-1, 10, 2**31 - 1, -(2**31)]  # out of range: jnp fills with NaN
    fn = xfuse.jit(_loss, backend=backend)
    compiled = fn.lower(logits, labels).compile()
    assert "gather(" in _fused_computations(compiled)
    got, want = np.asarray(fn(logits, labels)), np.asarray(jax.jit(_loss)(logits, labels))
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-6)

    table = rng.standard_normal((50, 16)).astype(np.float32)
    ids = rng.integers(-60, 60, (4, 7)).astype(np.int32)  # negative ids count from the end
    scale = np.float32(0.5)
    fn = xfuse.jit(_embed, backend=backend)
    assert "gather(" in _fused_computations(fn.lower(table, ids, scale).compile())
    got, want = np.asarray(fn(table, ids, scale)), np.asarray(jax.jit(_embed)(table, ids, scale))
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-6)
