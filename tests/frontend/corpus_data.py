"""Corpus cases for data ops: cumulative ops, sort and argsort, top_k, gather and scatter.

Imported by `test_corpus.py` once its `case` decorator and input helpers exist; each case
registers itself there and runs in every corpus test (jax.jit against each backend). Index
inputs run past both ends of their axis (and, with edge inputs, to the integer extremes), and
hold duplicates, so the out-of-bounds modes and the combining of duplicate updates are checked.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from tests.frontend.test_corpus import case, floats, integers
from tests.tolerances import EXACT


# --- cumulative ops
@case(lambda r, e: (floats(r, e, (4, 6)),))
def cumsum_prefix(x):
    return {
        "rows": jnp.cumsum(x, axis=1),
        "reverse": lax.cumsum(x, axis=0, reverse=True),
        "flat": jnp.cumsum(x),
    }


@case(lambda r, e: (integers(r, e, (3, 7)), floats(r, e, (3, 5))))
def cumsum_int32_and_mask(n, x):
    return jnp.cumsum(n, axis=1), jnp.cumsum(x > 0, axis=1), lax.cumsum(n, axis=0, reverse=True)


@case(lambda r, e: (floats(r, e, (2, 16), np.float16),))
def cumsum_f16(x):
    return jnp.cumsum(x, axis=-1), lax.cumsum(x, axis=0, reverse=True)


@case(lambda r, e: (floats(r, e, (3, 6), large=False, small=False, scale=0.8), integers(r, e, (2, 5), low=-3, high=3)))
def cumprod_forms(x, n):
    return jnp.cumprod(x, axis=1), lax.cumprod(x, axis=0, reverse=True), jnp.cumprod(n, axis=-1)


@case(lambda r, e: (floats(r, e, (4, 6)), integers(r, e, (3, 5))), EXACT)
def cummax_cummin_nan(x, n):
    return {
        "max": lax.cummax(x, axis=1),
        "min": lax.cummin(x, axis=1),
        "max_rev": lax.cummax(x, axis=0, reverse=True),
        "min_rev": lax.cummin(x, axis=0, reverse=True),
        "int_max": lax.cummax(n, axis=1),
        "int_min": lax.cummin(n, axis=0),
    }


# --- sorting
@case(lambda r, e: (floats(r, e, (4, 7)), integers(r, e, (9,))), EXACT)
def sort_floats_nan_zeros(x, n):
    return {
        "rows": jnp.sort(x, axis=-1),
        "columns": jnp.sort(x, axis=0),
        "descending": jnp.sort(x, axis=-1, descending=True),
        "ints": jnp.sort(n),
    }


@case(lambda r, e: (integers(r, e, (3, 8), low=0, high=3, extreme=False), floats(r, e, (3, 8))), EXACT)
def sort_by_key(keys, values):
    by_key = lax.sort((keys, values), dimension=1, num_keys=1)
    by_both = lax.sort((keys, values), dimension=1, num_keys=2)
    return by_key, by_both


@case(lambda r, e: (floats(r, e, (3, 9)), integers(r, e, (10,), low=0, high=4, extreme=False)), EXACT)
def argsort_forms(x, n):
    return jnp.argsort(x, axis=-1), jnp.argsort(x, axis=0), jnp.argsort(n), jnp.argsort(-x, axis=1)


@case(lambda r, e: (floats(r, e, (3, 12), scale=3.0), integers(r, e, (2, 7))), EXACT)
def top_k_sampling_logits(logits, n):
    values, indices = lax.top_k(logits, 4)
    kth = values[..., -1:]
    masked = jnp.where(logits < kth, -jnp.inf, logits)
    return masked, values, indices, lax.top_k(n, 3)


# --- gathers
def _table_and_indices(r, e, rows=5, cols=4, count=6):
    return floats(r, e, (rows, cols)), integers(r, e, (count,), low=-rows - 2, high=rows + 2)


@case(lambda r, e: _table_and_indices(r, e), EXACT)
def gather_rows_clamped(x, idx):
    return x[idx], x[idx[:3], 1], x[2, idx[:2]]


@case(lambda r, e: (floats(r, e, (3, 6)), integers(r, e, (4,), low=-8, high=8)), EXACT)
def gather_columns(x, idx):
    return x[:, idx], x[:, idx].T[1:]


@case(lambda r, e: (floats(r, e, (3, 6)), integers(r, e, (5,), low=-8, high=8)), EXACT)
def take_modes(x, idx):
    return {
        "fill": jnp.take(x, idx, axis=1),
        "clip": jnp.take(x, idx, axis=1, mode="clip"),
        "wrap": jnp.take(x, idx, axis=1, mode="wrap"),
        "rows": jnp.take(x, idx, axis=0, mode="fill", fill_value=-7.0),
        "flat": jnp.take(x, idx),
        "get_fill": x.at[idx].get(mode="fill", fill_value=0.5),
    }


@case(lambda r, e: (integers(r, e, (4, 6)), integers(r, e, (5,), low=-8, high=8)), EXACT)
def take_int_fill(n, idx):
    return jnp.take(n, idx, axis=1), n.astype(jnp.uint8).at[idx].get(mode="fill")


@case(lambda r, e: (floats(r, e, (4, 6)), integers(r, e, (4, 3), low=-7, high=7)), EXACT)
def take_along_axis_forms(x, idx):
    top = jnp.argsort(x, axis=1)[:, :2]
    return jnp.take_along_axis(x, idx, axis=1), jnp.take_along_axis(x, top, axis=1)


@case(lambda r, e: (floats(r, e, (10, 4)), integers(r, e, (3, 5), low=0, high=9, extreme=False), floats(r, False, (4,))))
def embedding_lookup_and_grad(table, ids, w):
    def loss(t):
        return jnp.sum(jnp.tanh(t[ids]) @ w)

    return table[ids], jax.grad(loss)(table)


@case(lambda r, e: (integers(r, e, (6,), low=-8, high=8),), EXACT)
def one_hot_forms(ids):
    return jax.nn.one_hot(ids, 5), jax.nn.one_hot(ids, 4, dtype=jnp.int32, axis=0)


# --- scatters
def _scatter_inputs(r, e, dtype=np.float32):
    x = floats(r, e, (6, 3), dtype) if dtype != np.int32 else integers(r, e, (6, 3))
    u = floats(r, e, (7, 3), dtype) if dtype != np.int32 else integers(r, e, (7, 3))
    idx = integers(r, False, (7,), low=-8, high=8)
    idx[:3] = [1, 1, 4]  # duplicates, always
    return x, idx, u


@case(lambda r, e: _scatter_inputs(r, e))
def scatter_at_ops(x, idx, u):
    return {
        "set": x.at[idx].set(u),
        "add": x.at[idx].add(u),
        "sub": x.at[idx].subtract(u),
        "mul": x.at[idx].mul(u),
        "min": x.at[idx].min(u),
        "max": x.at[idx].max(u),
    }


@case(lambda r, e: _scatter_inputs(r, e, np.int32), EXACT)
def scatter_at_ops_int32(x, idx, u):
    return {
        "set": x.at[idx].set(u),
        "add": x.at[idx].add(u),
        "mul": x.at[idx].mul(u),
        "min": x.at[idx].min(u),
        "max": x.at[idx].max(u),
    }


@case(lambda r, e: _scatter_inputs(r, e))
def scatter_modes(x, idx, u):
    return {
        "set_clip": x.at[idx].set(u, mode="clip"),
        "add_drop": x.at[idx].add(u, mode="drop"),
        "add_clip": x.at[idx].add(u, mode="clip"),
        "max_clip": x.at[idx].max(u, mode="clip"),
        "scalar": x.at[idx].set(2.5),
    }


@case(lambda r, e: (floats(r, e, (5, 4)), integers(r, False, (6,), low=-1, high=5), integers(r, False, (6,), low=-1, high=4), floats(r, e, (6,))))
def scatter_points(x, rows, cols, v):
    return x.at[rows, cols].add(v), x.at[rows, cols].set(v), x.at[rows, 1:3].set(v[:, None])
