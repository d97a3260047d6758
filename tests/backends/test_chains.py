"""An output fusion and the batched product reading its result run as one step, a block of
leading rows at a time (`runtime.program.chained`): attention's q k^T, softmax, then @ v. The
chain changes no number (the same program run step by step gives the same bits, jax.jit the
same values within float32 tolerance), and it is taken only where the fusion's kernel can run
over a block of rows alone (`analysis.row_slices`)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import xfuse
import xfuse.aot
from xfuse.backends.numba.lowering import lower
from xfuse.runtime import parallel, program

# Each product 16 x 256x32 @ 32x256: 2^25 multiply-adds, past SPLIT_PRODUCT_MIN; the softmax's
# 2^20 elements with an exp each make its kernel parallel.
B, H, S, D = 4, 4, 256, 32
RNG = np.random.default_rng(11)


def _f(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


Q, K, V = _f(B, H, S, D), _f(B, H, S, D), _f(B, H, S, D)
MASK = np.where(RNG.random((B, 1, S, S)) < 0.2, np.float32(-1e9), np.float32(0))  # differs by batch row


def scores(q, k):
    return jnp.einsum("bhqd,bhkd->bhqk", q, k)


def plain(q, k, v):
    return jax.nn.softmax(scores(q, k) / np.sqrt(D), axis=-1) @ v


def masked(q, k, v, m):  # m read by the batch row: cut with the rows
    return jax.nn.softmax(scores(q, k) + m, axis=-1) @ v


def head_bias(q, k, v, h):  # h broadcast over the batch: read whole
    return jax.nn.softmax(scores(q, k) + h, axis=-1) @ v


def key_bias(q, k, v, b):
    return jax.nn.softmax(scores(q, k) + b, axis=-1) @ v


def causal(q, k, v):  # iotas along the query and key axes: the same in every batch row
    s = scores(q, k)
    i = jnp.arange(S)
    return jax.nn.softmax(jnp.where(i[:, None] >= i[None, :], s, -jnp.inf), axis=-1) @ v


def temperature(q, k, v, t):  # a scalar parameter
    return jax.nn.softmax(scores(q, k) * t, axis=-1) @ v


CASES = {
    "plain": (plain, ()),
    "masked": (masked, (MASK,)),
    "head_bias": (head_bias, (_f(1, H, S, S),)),
    "key_bias": (key_bias, (_f(S),)),
    "causal": (causal, ()),
    "temperature": (temperature, (np.float32(0.3),)),
}


def names(compiled) -> list[str]:
    return [s.name for s in compiled.executable.steps]


def chained_steps(compiled) -> list[str]:
    return [n for n in names(compiled) if "+dot_general" in n]


def step_by_step(monkeypatch, fn, args):
    """The same function compiled with chains off."""
    with monkeypatch.context() as m:
        m.setattr(program, "chained", lambda *a: False)
        compiled = xfuse.jit(lambda *xs: fn(*xs)).lower(*args).compile()
    assert not chained_steps(compiled)
    return compiled


def close_to_jax(got, fn, args):
    """Within float32's rounding of these sums: xfuse and jax.jit are each up to 6e-6 from the
    float64 result, and jax 0.10's and 0.11's XLA:CPU differ by as much from each other."""
    np.testing.assert_allclose(got, jax.jit(fn)(*args), rtol=2e-5, atol=1e-5, equal_nan=True)


@pytest.mark.parametrize("case", list(CASES))
def test_attention_runs_as_one_chained_step(monkeypatch, case):
    fn, extra = CASES[case]
    args = (Q, K, V, *extra)
    compiled = xfuse.jit(fn).lower(*args).compile()
    assert len(chained_steps(compiled)) == 1, names(compiled)
    got = compiled(*args)
    np.testing.assert_array_equal(got, step_by_step(monkeypatch, fn, args)(*args))
    close_to_jax(got, fn, args)


def _cuts(fn, args) -> dict[tuple, int] | None:
    """The output fusion's `row_slices`, by parameter dims."""
    compiled = xfuse.jit(fn).lower(*args).compile()
    steps = [s for s in program.walk(lower(compiled.module).program) if s["op"] == "kernel" and s["dot"]]
    (step,) = steps
    cuts = step["dot"]["row_slices"]
    return None if cuts is None else {tuple(dims): cut for (dims, _), cut in zip(step["params"], cuts)}


def test_parameters_are_cut_by_how_the_kernel_reads_them():
    assert _cuts(masked, (Q, K, V, MASK)) == {(B, H, S, D): -1, (B, 1, S, S): 0}
    assert _cuts(head_bias, (Q, K, V, _f(1, H, S, S))) == {(B, H, S, D): -1, (1, H, S, S): -1}
    assert _cuts(key_bias, (Q, K, V, _f(S))) == {(B, H, S, D): -1, (S,): -1}


def by_batch_iota(q, k, v):  # an iota along the batch axis: each row adds its own index
    s = scores(q, k) + jnp.arange(B, dtype=jnp.float32)[:, None, None, None] * 3.0
    return jax.nn.softmax(s, axis=-1) @ v


ROW_CONSTANT = RNG.standard_normal((B, 1, 1, S)).astype(np.float32) * 3


def by_batch_constant(q, k, v):  # a constant array with a row of its own for each batch row
    return jax.nn.softmax(scores(q, k) + ROW_CONSTANT, axis=-1) @ v


@pytest.mark.parametrize("by_batch_row", [by_batch_iota, by_batch_constant])
def test_an_epilogue_reading_the_absolute_row_is_not_chained(by_batch_row):
    args = (Q, K, V)
    assert _cuts(by_batch_row, args) is None
    compiled = xfuse.jit(by_batch_row).lower(*args).compile()
    assert not chained_steps(compiled)
    close_to_jax(compiled(*args), by_batch_row, args)


@pytest.mark.parametrize("block_bytes", [1, 3 * H * S * S * 4, 1 << 30])
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_blocks_and_threads_change_no_result(monkeypatch, block_bytes, threads):
    """One row a block, three rows (a ragged last block in each thread's share of 5), all rows;
    shares of 5 rows over 1, 2 and 3 threads."""
    q, k, v, m = _f(5, H, S, D), _f(5, H, S, D), _f(5, H, S, D), np.where(RNG.random((5, 1, S, S)) < 0.2, -1e9, 0)
    args = (q, k, v, m.astype(np.float32))
    reference = step_by_step(monkeypatch, masked, args)(*args)
    monkeypatch.setattr(program, "CHAIN_BLOCK_BYTES", block_bytes)
    compiled = xfuse.jit(lambda *xs: masked(*xs)).lower(*args).compile()
    assert chained_steps(compiled)
    try:
        parallel.set_num_threads(threads)
        got = compiled(*args)
    finally:
        parallel.set_num_threads(None)
    np.testing.assert_array_equal(got, reference)


def test_edge_values_flow_through_the_chain(monkeypatch):
    q, k, v = Q.copy(), K.copy(), V.copy()
    q[0, 0, 3, 0] = np.nan  # a NaN score row
    q[1, 2, 5, :] = np.inf  # +inf scores: inf - inf is NaN in the softmax
    q[2, 1, 7, :] = -0.0
    k[3, 3, 9, 1] = 1e30  # exp overflows to inf for one key
    v[0, 1, :, 2] = -np.inf
    args = (q, k, v)
    compiled = xfuse.jit(plain).lower(*args).compile()
    assert chained_steps(compiled)
    got = compiled(*args)
    assert np.isnan(got).any() and np.isinf(got).any()
    np.testing.assert_array_equal(got, step_by_step(monkeypatch, plain, args)(*args))
    close_to_jax(got, plain, args)


def test_the_chain_hands_the_pool_work_once(monkeypatch):
    from tests.backends.test_parallel import Spy

    args = (Q, K, V, MASK)
    chained = xfuse.jit(masked).lower(*args).compile()
    separate = step_by_step(monkeypatch, masked, args)
    parallel.set_num_threads(2)
    try:
        counts = []
        for compiled in (chained, separate):
            compiled(*args)
            spy = Spy(parallel._get_pool)
            monkeypatch.setattr(parallel, "_get_pool", spy)
            compiled(*args)
            monkeypatch.undo()
            counts.append(spy.submitted)
    finally:
        parallel.set_num_threads(None)
    assert counts == [1, 3], counts  # one share for the other thread, against one per step


def test_an_intermediate_also_returned_is_not_chained():
    def both(q, k, v):
        p = jax.nn.softmax(scores(q, k), axis=-1)
        return p, p @ v

    args = (Q, K, V)
    compiled = xfuse.jit(both).lower(*args).compile()
    assert not chained_steps(compiled)
    for got, want in zip(compiled(*args), jax.jit(both)(*args)):
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-5)  # as close_to_jax


def test_small_products_are_not_chained():
    args = (_f(2, 2, 32, 16), _f(2, 2, 32, 16), _f(2, 2, 32, 16))
    compiled = xfuse.jit(plain).lower(*args).compile()
    assert not chained_steps(compiled)
    close_to_jax(compiled(*args), plain, args)


def test_an_artifact_runs_the_chain_with_its_c_kernels(tmp_path):
    args = (Q, K, V, MASK)
    compiled = xfuse.jit(masked).lower(*args).compile()
    loaded = xfuse.aot.load(compiled.save(tmp_path / "attention.xfa"))
    assert any("+dot_general" in s.name for s in loaded.executable.steps)
    close_to_jax(loaded(*args), masked, args)
    # its products in numpy's BLAS, the JIT's where the runtime chooses: sums in other orders
    np.testing.assert_allclose(loaded(*args), compiled(*args), rtol=2e-5, atol=1e-5)


def test_float64_attention_chains(monkeypatch):
    args = tuple(x.astype(np.float64) for x in (Q, K, V, MASK))
    with jax.enable_x64(True):
        compiled = xfuse.jit(masked).lower(*args).compile()
        assert chained_steps(compiled)
        got = compiled(*args)
        assert got.dtype == np.float64
        np.testing.assert_array_equal(got, step_by_step(monkeypatch, masked, args)(*args))
        np.testing.assert_allclose(got, jax.jit(masked)(*args), rtol=1e-12, atol=1e-13)


def test_a_loop_body_chains_its_attention(monkeypatch):
    def looped(q, k, v, m):  # attention applied three times to its own output
        return jax.lax.fori_loop(0, 3, lambda i, x: masked(x, k, v, m), q)

    built = []
    real = program._chain_run
    monkeypatch.setattr(program, "_chain_run", lambda step, *rest: built.append(step["name"]) or real(step, *rest))
    args = (Q, K, V, MASK)
    compiled = xfuse.jit(looped).lower(*args).compile()
    assert built, "no chain in the loop's body"
    got = compiled(*args)
    monkeypatch.undo()
    np.testing.assert_array_equal(got, step_by_step(monkeypatch, looped, args)(*args))
    np.testing.assert_allclose(got, jax.jit(looped)(*args), rtol=1e-4, atol=1e-5)


def test_an_epilogue_widening_to_float64_keeps_its_precision(monkeypatch):
    def widened(q, k, v):  # a float32 product, an epilogue computing in float64
        p = jax.nn.softmax(scores(q, k), axis=-1).astype(jnp.float64) * (1.0 + 2.0**-40)
        return p @ v

    args = (Q, K, V.astype(np.float64))
    with jax.enable_x64(True):
        compiled = xfuse.jit(widened).lower(*args).compile()
        assert chained_steps(compiled)
        got = compiled(*args)
        np.testing.assert_array_equal(got, step_by_step(monkeypatch, widened, args)(*args))
        np.testing.assert_allclose(got, jax.jit(widened)(*args), rtol=2e-5, atol=1e-5)  # the product's f32
