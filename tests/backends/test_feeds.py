"""A loop kernel and the product that alone reads its result as its rows run as one step, a
block of rows at a time (`runtime.program.fed`): a convolution's patches, then their product
with the filter; an elementwise prologue, then a matmul. The feed changes what is in cache,
not what is computed: the same program run step by step gives the same values (within the
rounding of BLAS's blocking), and so does jax.jit. Also: a kernel reads each scalar parameter
once, before its loops."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import xfuse
import xfuse.aot
from xfuse.runtime import parallel, program

RNG = np.random.default_rng(23)


def _f(*shape, scale=1.0):
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def conv_layer(x, w, b):
    y = lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))
    return jax.nn.relu(y + b)


def prologue(x, w):  # a flattened elementwise loop (its rows are elements) before the product
    return jnp.tanh(x) @ w


def transposed(x, w):  # the product's right side read transposed
    return (x * 0.5 + 1.0) @ w.T


# Patches 4096 x 288 @ 288 x 64: 2^26.2 multiply-adds, enough for oneDNN in xfuse's threads.
CONV = (conv_layer, (_f(4, 32, 32, 32), _f(3, 3, 32, 64, scale=0.06), _f(64)))
CASES = {
    "conv": CONV,
    "prologue": (prologue, (_f(4096, 512), _f(512, 64, scale=0.05))),
    "transposed": (transposed, (_f(2048, 512), _f(96, 512, scale=0.05))),
}


def fed_steps(compiled) -> list[str]:
    return [s.name for s in compiled.executable.steps if "+dot_general" in s.name]


def step_by_step(monkeypatch, fn, args):
    with monkeypatch.context() as m:
        m.setattr(program, "fed", lambda *a: None)
        compiled = xfuse.jit(lambda *xs: fn(*xs)).lower(*args).compile()
    assert not fed_steps(compiled)
    return compiled


def close(got, want):
    """float32 sums of up to 576 products, in BLAS's blocking or XLA's order."""
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5, equal_nan=True)


@pytest.mark.parametrize("case", list(CASES))
def test_the_kernel_feeds_its_product_a_block_at_a_time(monkeypatch, case):
    fn, args = CASES[case]
    compiled = xfuse.jit(fn).lower(*args).compile()
    (name,) = fed_steps(compiled)
    step = next(s for s in compiled.executable.steps if s.name == name)
    assert "a block of rows at a time" in step.label
    got = compiled(*args)
    close(got, step_by_step(monkeypatch, fn, args)(*args))
    close(got, jax.jit(fn)(*args))


@pytest.mark.parametrize("block_bytes", [1, 7 * 288 * 4, 1 << 30])
def test_blocks_and_threads_change_no_result(monkeypatch, block_bytes):
    """One row a block, seven (a ragged last block in every thread's share), all rows; over 1,
    2 and 3 threads. Where the blocks fall changes which BLAS kernel sums a row (and a share
    past ONEDNN_MIN goes to oneDNN), so only rows computed alone give the same bits."""
    fn, args = CONV
    reference = step_by_step(monkeypatch, fn, args)(*args)
    monkeypatch.setattr(program, "FEED_BLOCK_BYTES", block_bytes)
    compiled = xfuse.jit(lambda *xs: fn(*xs)).lower(*args).compile()
    assert fed_steps(compiled)
    results = []
    try:
        for threads in (1, 2, 3):
            parallel.set_num_threads(threads)
            results.append(compiled(*args))
    finally:
        parallel.set_num_threads(None)
    for got in results:
        close(got, reference)
    if block_bytes == 1:
        for got in results[1:]:
            np.testing.assert_array_equal(got, results[0])


def test_edge_values_flow_through_the_feed(monkeypatch):
    fn, (x, w, b) = CONV
    x = x.copy()
    x[0, 3, 4, 5] = np.nan
    x[1, 10, 10, :] = np.inf
    x[2, 0, 0, :] = -0.0
    x[3, 31, 31, 7] = -np.inf
    args = (x, w, b)
    compiled = xfuse.jit(fn).lower(*args).compile()
    assert fed_steps(compiled)
    got = compiled(*args)
    want = step_by_step(monkeypatch, fn, args)(*args)
    assert np.isnan(got).any()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    close(got, want)
    close(got, jax.jit(fn)(*args))


def test_patches_also_returned_or_read_again_are_not_fed():
    x, w = CASES["prologue"][1]

    def returned(x, w):
        t = jnp.tanh(x)
        return t, t @ w

    def read_again(x, w):
        t = jnp.tanh(x)
        return (t @ w).sum() + t.sum()

    for fn in (returned, read_again):
        compiled = xfuse.jit(fn).lower(x, w).compile()
        assert not fed_steps(compiled), fn.__name__
        for got, want in zip(jax.tree.leaves(compiled(x, w)), jax.tree.leaves(jax.jit(fn)(x, w))):
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-3)


def test_small_products_are_not_fed():
    args = (_f(64, 32), _f(32, 16))
    compiled = xfuse.jit(prologue).lower(*args).compile()
    assert not fed_steps(compiled)
    close(compiled(*args), jax.jit(prologue)(*args))


def test_an_artifact_runs_the_feed_with_its_c_kernels(tmp_path):
    fn, args = CONV
    compiled = xfuse.jit(fn).lower(*args).compile()
    loaded = xfuse.aot.load(compiled.save(tmp_path / "conv.xfa"))
    assert any("+dot_general" in s.name for s in loaded.executable.steps)
    close(loaded(*args), compiled(*args))
    close(loaded(*args), jax.jit(fn)(*args))


def test_a_scalar_parameter_is_read_once_before_the_loops():
    """Read inside a loop, it is read again after every store (LLVM cannot tell the output
    from the input), and the loop does not vectorise."""
    x = _f(256, 300)
    fn = lambda x, t: jnp.maximum(x * t, t)  # noqa: E731
    compiled = xfuse.jit(fn).lower(x, np.float32(0.25)).compile()
    source = compiled.kernel_source()
    body = source[source.index("def k_"):]
    first_loop = body.index("for ")
    scalar = re.search(r"\bs\d+ = (p\d+)\[0\]", body[:first_loop])
    assert scalar, source
    assert f"{scalar.group(1)}[0]" not in body[first_loop:], source
    np.testing.assert_array_equal(compiled(x, np.float32(0.25)), np.maximum(x * np.float32(0.25), np.float32(0.25)))
    t = np.float32(np.nan)
    np.testing.assert_array_equal(compiled(x, t), np.full_like(x, np.nan))


def test_a_padded_copy_tests_its_bounds_once_a_row():
    fn, args = CONV
    source = xfuse.jit(fn).lower(*args).compile().kernel_source()
    patches = source[source.index("def k_"):].split("def k_")[1]
    inner = [line for line in patches.splitlines() if line.startswith(" " * 12)]
    assert inner and all(" else s" in line for line in inner if " if " in line), patches
    assert not any("//" in line or "%" in line for line in inner), patches
