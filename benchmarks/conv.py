"""Convolution layers, outside the suite (its workloads are fixed by the issue): xfuse against
jax.jit, each engine in its own process, processes in turns, the median process reported.

    python -m benchmarks.conv [--processes 3]

A layer is conv (3x3, SAME, NHWC) + bias + relu + 2x2 max pool; `depthwise` is the same with
one 3x3 filter per channel (feature_group_count = channels).
"""

from __future__ import annotations

import time

from .pairs import main as run
from .pairs import timed

LAYERS = {  # name: (batch, size, channels, features, groups)
    "conv3x3_relu_pool_8x32x32x64": (8, 32, 64, 64, 1),
    "conv3x3_relu_pool_1x56x56x64": (1, 56, 64, 64, 1),
    "conv3x3_relu_pool_32x16x16x32": (32, 16, 32, 32, 1),
    "depthwise3x3_relu_pool_8x32x32x64": (8, 32, 64, 64, 64),
}


def _layer(groups: int):
    import jax
    import jax.numpy as jnp
    from jax import lax

    def layer(x, w, b):
        y = lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"),
                                     feature_group_count=groups)
        y = jax.nn.relu(y + b)
        return lax.reduce_window(y, -jnp.inf, lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")

    return layer


def _worker(engine: str, name: str, samples: int) -> dict:
    import numpy as np

    n, size, channels, features, groups = LAYERS[name]
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, size, size, channels)).astype(np.float32)
    w = (rng.standard_normal((3, 3, channels // groups, features)) / np.sqrt(9 * channels // groups)).astype(np.float32)
    b = rng.standard_normal(features).astype(np.float32)
    start = time.perf_counter()
    if engine == "jax":
        import jax

        jitted = jax.jit(_layer(groups))
        fn = lambda: jitted(x, w, b).block_until_ready()  # noqa: E731
    else:
        import xfuse

        compiled = xfuse.jit(_layer(groups)).lower(x, w, b).compile()
        fn = lambda: compiled(x, w, b)  # noqa: E731
    return timed(fn, samples, start)


def main(argv: list[str] | None = None) -> None:
    run(argv, "benchmarks.conv", list(LAYERS), _worker, label="layer")


if __name__ == "__main__":
    main()
