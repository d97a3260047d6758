"""The window rules (`xfuse.frontend.windows`): a convolution layer's shape after fusion (NHWC
and NCHW), a larger convolution than the corpus has (its loops run in parallel), and the error for windows
too large to expand. The corpus (`corpus_windows.py`) checks every form on every backend."""

from __future__ import annotations

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import xfuse
from xfuse.frontend import FrontendError

NHWC = ("NHWC", "HWIO", "NHWC")


def conv_layer(x, w, b):
    y = lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=NHWC)
    y = jax.nn.relu(y + b)
    return lax.reduce_window(y, -jnp.inf, lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")


def _layer_inputs(n=4, size=16, channels=8, features=16):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, size, size, channels)).astype(np.float32)
    w = (rng.standard_normal((3, 3, channels, features)) / np.sqrt(9 * channels)).astype(np.float32)
    b = rng.standard_normal(features).astype(np.float32)
    return x, w, b


def test_a_conv_layer_is_patches_one_product_and_its_epilogue() -> None:
    """The padding and the nine slices fuse into the loop that writes the patches, BLAS runs
    the one product, and bias, relu and the max pool fuse into one loop after it."""
    compiled = xfuse.jit(conv_layer).lower(*_layer_inputs()).compile()
    entry = compiled.as_text().split("ENTRY")[1]
    ops = [line.split("=")[1].split("(")[0].split()[-1] for line in entry.splitlines() if " = " in line]
    assert ops.count("dot_general") == 1 and ops.count("fusion") == 2, ops
    assert not {"pad", "slice", "concatenate", "max", "add", "reduce_window"} & set(ops), ops


@pytest.mark.parametrize("n", [1, 16])
def test_a_conv_layer_matches_jax_jit(n: int) -> None:
    """One image (serial loops) and sixteen (the patches and the epilogue split over threads)."""
    args = _layer_inputs(n=n, size=32)
    got = np.asarray(xfuse.jit(conv_layer)(*args))
    want = np.asarray(jax.jit(conv_layer)(*args))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def test_an_nchw_conv_writes_its_patches_along_the_images_rows() -> None:
    """An input with a spatial axis minor (NCHW, as equinox lays images out) gives patches
    (channels x offsets, images x positions): the loop that writes them ends in the nine-way
    concatenate, whose innermost loop runs along the image's rows; the reshape to the product's
    operand is a view, not part of the loop."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 3, 12, 10)).astype(np.float32)
    w = rng.standard_normal((5, 3, 3, 3)).astype(np.float32)

    def conv(x, w):
        return jax.nn.relu(lax.conv(x, w, (1, 1), "SAME"))

    compiled = xfuse.jit(conv).lower(x, w).compile()
    text = compiled.as_text()
    patches = next(block for block in text.split("\n\n") if "concatenate(" in block)
    assert "ROOT concatenate" in patches and "f32[3,9,4,12,10]" in patches
    got, want = np.asarray(xfuse.jit(conv)(x, w)), np.asarray(jax.jit(conv)(x, w))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def wide_window(x):
    return lax.reduce_window(x, 1.0, lax.mul, (1, 40, 40), (1, 1, 1), "SAME")


def test_a_window_too_large_to_expand_names_the_primitive_and_the_line() -> None:
    """A reduce_window with a jaxpr inlines it once per window position: 1600 is too many."""
    with pytest.raises(FrontendError) as info:
        xfuse.jit(wide_window)(np.zeros((1, 64, 64), np.float32))
    line = inspect.getsourcelines(wide_window)[1] + 1
    message = str(info.value)
    assert "'reduce_window'" in message and "1x40x40" in message, message
    assert f"test_windows.py:{line}" in message, message


def test_a_long_max_window_reduces_one_axis_at_a_time() -> None:
    """A 1x40x40 max window is 80 slices (one axis after another), not 1600."""
    x = np.random.default_rng(1).standard_normal((1, 64, 64)).astype(np.float32)

    def pool(x):
        return lax.reduce_window(x, -jnp.inf, lax.max, (1, 40, 40), (1, 3, 3), "SAME")

    np.testing.assert_array_equal(np.asarray(xfuse.jit(pool)(x)), np.asarray(jax.jit(pool)(x)))


def test_a_depthwise_convolution_is_one_loop() -> None:
    """One 3x3 filter per channel: nine slices times filter rows, summed in one loop kernel,
    no product."""
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 12, 12, 8)).astype(np.float32)
    w = rng.standard_normal((3, 3, 1, 8)).astype(np.float32)

    def depthwise(x, w):
        return lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=NHWC, feature_group_count=8)

    compiled = xfuse.jit(depthwise).lower(x, w).compile()
    assert "dot_general" not in compiled.as_text()
    assert compiled.kernel_count() == 1
    np.testing.assert_allclose(np.asarray(compiled(x, w)), np.asarray(jax.jit(depthwise)(x, w)), rtol=1e-5, atol=1e-5)


def test_a_small_cnn_training_step_matches_jax_jit() -> None:
    """Gradients through two conv layers, relu, max and average pooling and a dense layer:
    conv_general_dilated's transposes, select_and_scatter_add and reduce_window_sum's."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 12, 12, 3)).astype(np.float32)
    labels = np.eye(5, dtype=np.float32)[rng.integers(0, 5, 4)]
    params = {
        "w1": (rng.standard_normal((3, 3, 3, 8)) / 5).astype(np.float32),
        "w2": (rng.standard_normal((3, 3, 8, 8)) / 8).astype(np.float32),
        "dense": (rng.standard_normal((3 * 3 * 8, 5)) / 8).astype(np.float32),
    }

    def loss(params, x, labels):
        y = jax.nn.relu(lax.conv_general_dilated(x, params["w1"], (1, 1), "SAME", dimension_numbers=NHWC))
        y = lax.reduce_window(y, -jnp.inf, lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")
        y = jax.nn.relu(lax.conv_general_dilated(y, params["w2"], (1, 1), "SAME", dimension_numbers=NHWC))
        y = lax.reduce_window(y, 0.0, lax.add, (1, 2, 2, 1), (1, 2, 2, 1), "VALID") / 4
        logits = y.reshape(y.shape[0], -1) @ params["dense"]
        return -jnp.mean(jnp.sum(jax.nn.log_softmax(logits) * labels, axis=-1))

    step = jax.value_and_grad(loss)
    got_loss, got = xfuse.jit(step)(params, x, labels)
    want_loss, want = jax.jit(step)(params, x, labels)
    np.testing.assert_allclose(got_loss, want_loss, rtol=1e-5)
    for name in params:
        scale = np.abs(np.asarray(want[name])).max()
        np.testing.assert_allclose(np.asarray(got[name]), np.asarray(want[name]), rtol=1e-4, atol=1e-5 * scale)
