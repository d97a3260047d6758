"""Corpus cases for the window primitives: convolutions (every layout, strides, padding,
dilations, feature and batch groups, gradients) and reduce_window (pooling by max, min, sum,
product and a variadic jaxpr).

Imported by `test_corpus.py` once its `case` decorator and input helpers exist; each case
registers itself there and runs in every corpus test (jax.jit against each backend).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from tests.frontend.test_corpus import case, floats, integers
from tests.tolerances import EXACT

NHWC = ("NHWC", "HWIO", "NHWC")


def _image(r, e, shape=(2, 7, 6, 4), dtype=np.float32):
    return floats(r, e, shape, dtype)


def _kernel(r, shape=(3, 3, 4, 5), dtype=np.float32):
    return floats(r, False, shape, dtype, scale=0.3)


# --- convolutions
@case(lambda r, e: (_image(r, e), _kernel(r), floats(r, e, (5,), scale=0.1, large=False)))
def conv_relu_max_pool(x, w, b):
    y = lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=NHWC)
    y = jax.nn.relu(y + b)
    return lax.reduce_window(y, -jnp.inf, lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")


@case(lambda r, e: (_image(r, e), _kernel(r), _kernel(r, (3, 2, 1, 8)), _kernel(r, (2, 2, 2, 6)),
                    _kernel(r, (3, 3, 1, 4))))
def conv_forms(x, w, depthwise, grouped, per_channel):
    nchw = jnp.transpose(x, (0, 3, 1, 2))
    oihw = jnp.transpose(w, (3, 2, 0, 1))
    return {
        "nchw_valid_strided": lax.conv(nchw, oihw, (2, 1), "VALID"),
        "padded_dilated": lax.conv_general_dilated(
            x, w, (1, 2), ((2, 0), (1, -1)), rhs_dilation=(2, 1), dimension_numbers=NHWC),
        "transposed": lax.conv_transpose(x, w, (2, 2), "SAME", dimension_numbers=NHWC),
        "lhs_dilated": lax.conv_general_dilated(
            x, w, (1, 1), ((1, 1), (0, 2)), lhs_dilation=(2, 3), dimension_numbers=NHWC),
        "depthwise": lax.conv_general_dilated(
            x, depthwise, (1, 1), "SAME", dimension_numbers=NHWC, feature_group_count=4),
        "per_channel": lax.conv_general_dilated(
            x, per_channel, (2, 1), "SAME", dimension_numbers=NHWC, feature_group_count=4),
        "grouped": lax.conv_general_dilated(
            x, grouped, (1, 2), "SAME", dimension_numbers=NHWC, feature_group_count=2),
        "batch_grouped": lax.conv_general_dilated(
            x, w[..., :4], (1, 1), "VALID", dimension_numbers=NHWC, batch_group_count=2),
        "chw_layouts": lax.conv_general_dilated(
            jnp.transpose(x, (3, 1, 0, 2)), jnp.transpose(w, (0, 3, 1, 2)), (1, 1), "SAME",
            dimension_numbers=("CHNW", "HOWI", "WHCN")),
    }


@case(lambda r, e: (floats(r, e, (40,)), floats(r, False, (5,), scale=0.5), _image(r, e, (2, 3, 5, 4, 3)),
                    _kernel(r, (2, 3, 2, 3, 4))))
def conv_1d_and_3d(signal, taps, volume, kernel3):
    return {
        "convolve_full": jnp.convolve(signal, taps),
        "convolve_same": jnp.convolve(signal, taps, mode="same"),
        "correlate_valid": jnp.correlate(signal, taps, mode="valid"),
        "conv3d": lax.conv_general_dilated(volume, kernel3, (1, 2, 1), "SAME",
                                           dimension_numbers=("NDHWC", "DHWIO", "NDHWC")),
    }


@case(lambda r, e: (floats(r, e, (2, 6, 6, 3), large=False), _kernel(r, (3, 3, 3, 4)), _kernel(r, (3, 3, 1, 6))))
def conv_gradients(x, w, depthwise):
    def loss(x, w, dw):
        y = jnp.tanh(lax.conv_general_dilated(x, w, (2, 2), "SAME", dimension_numbers=NHWC))
        z = lax.conv_general_dilated(x, dw, (1, 1), "SAME", dimension_numbers=NHWC, feature_group_count=3)
        return jnp.sum(y * y) + jnp.sum(jnp.sin(z))

    return jax.grad(loss, argnums=(0, 1, 2))(x, w, depthwise)


@case(lambda r, e: (integers(r, e, (2, 5, 5, 3), low=-6, high=6), integers(r, False, (2, 2, 3, 2), low=-3, high=3)),
      EXACT)
def conv_int32(x, w):
    return lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=NHWC)


@case(lambda r, e: (_image(r, e, dtype=jnp.bfloat16), _kernel(r, dtype=jnp.bfloat16)))
def conv_bf16_to_f32(x, w):
    return lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=NHWC,
                                    preferred_element_type=jnp.float32)


# --- pooling
@case(lambda r, e: (_image(r, e),))
def pooling_forms(x):
    window, strides = (1, 3, 3, 1), (1, 2, 2, 1)
    return {
        "max_same": lax.reduce_window(x, -jnp.inf, lax.max, window, strides, "SAME"),
        "min_dilated": lax.reduce_window(x, jnp.inf, lax.min, (1, 2, 3, 1), (1, 1, 2, 1),
                                         ((0, 0), (1, 2), (0, 1), (0, 0)), base_dilation=(1, 2, 1, 1),
                                         window_dilation=(1, 1, 2, 1)),
        "avg_pool": lax.reduce_window(x, 0.0, lax.add, window, strides, "SAME") / 9.0,
        "sum_wide": lax.reduce_window(x, 0.0, lax.add, (1, 7, 6, 1), (1, 1, 1, 1), "SAME"),
        "product": lax.reduce_window(x, 1.0, lax.mul, (1, 2, 2, 1), (1, 2, 2, 1), "VALID"),
    }


@case(lambda r, e: (integers(r, e, (3, 7, 5)), integers(r, e, (3, 7, 5)) > 0), EXACT)
def pooling_integers_and_booleans(x, mask):
    return {
        "max": lax.reduce_window(x, jnp.iinfo(jnp.int32).min, lax.max, (1, 3, 2), (1, 2, 1), "SAME"),
        "min": lax.reduce_window(x, jnp.iinfo(jnp.int32).max, lax.min, (1, 2, 2), (1, 1, 1), "VALID"),
        "sum": lax.reduce_window(x, 0, lax.add, (1, 3, 3), (1, 1, 2), "SAME"),
        "any": lax.reduce_window(mask, False, lax.max, (1, 3, 2), (1, 2, 1), "SAME"),
        "all": lax.reduce_window(mask, True, lax.min, (1, 3, 2), (1, 2, 1), "SAME"),
    }


@case(lambda r, e: (_image(r, e, (2, 6, 5, 2)),))
def pooling_argmax_variadic(x):
    """Max pooling that keeps the flat index of each window's maximum (a variadic reduce_window);
    ties and NaN go to the earlier position."""
    index = lax.broadcasted_iota(jnp.int32, x.shape, 1) * x.shape[2] + lax.broadcasted_iota(jnp.int32, x.shape, 2)

    def pick(a, b):
        (va, ia), (vb, ib) = a, b
        take_b = (vb > va) | ((vb == va) & (ib < ia)) | (jnp.isnan(vb) & ~jnp.isnan(va))
        return jnp.where(take_b, vb, va), jnp.where(take_b, ib, ia)

    return lax.reduce_window((x, index), (-jnp.inf, jnp.int32(2**30)), pick, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")


@case(lambda r, e: (floats(r, e, (2, 6, 6, 3), large=False),))
def avg_pool_gradient(x):
    return jax.grad(lambda x: jnp.sum(jnp.cos(lax.reduce_window(x, 0.0, lax.add, (1, 3, 3, 1), (1, 2, 2, 1),
                                                                   "SAME"))))(x)


@case(lambda r, e: (floats(r, e, (2, 7, 6, 3), special=False),))
def max_pool_gradients(x):
    """Max and min pooling's gradients (select_and_scatter_add): each window's cotangent goes
    to the element it chose, the first of its ties. Which element a window holding NaN
    chooses follows XLA's order of evaluation, which xfuse does not copy: no NaN here."""
    def loss(x):
        top = lax.reduce_window(x, -jnp.inf, lax.max, (1, 3, 3, 1), (1, 2, 2, 1), "SAME")
        bottom = lax.reduce_window(x, jnp.inf, lax.min, (1, 2, 3, 1), (1, 1, 2, 1), "VALID")
        return jnp.sum(jnp.tanh(top) * jnp.arange(1.0, 4.0)) + jnp.sum(bottom)

    return jax.grad(loss)(jnp.round(x * 2) / 2)  # halves: ties in many windows


@case(lambda r, e: (floats(r, False, (2, 7, 6, 3)), floats(r, False, (2, 7, 6, 3))))
def max_pool_jvp(x, t):
    """Max pooling's JVP (select_and_gather_add): the tangent of each window's maximum. Of two
    equal maxima (or NaN) XLA:CPU picks the first in an order of its own (in an NHWC window,
    down the columns; in a 2-D one, along the rows), xfuse the first along the rows: the inputs
    here have no ties (no edge values either)."""
    pool = lambda x: lax.reduce_window(x, -jnp.inf, lax.max, (1, 3, 3, 1), (1, 2, 2, 1), "SAME")  # noqa: E731
    return jax.jvp(pool, (x,), (t,))[1]
