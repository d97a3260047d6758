"""Reductions along short rows, outside the suite: xfuse against jax.jit, each engine in its
own process, processes in turns, the median process reported (`benchmarks.pairs`).

    python -m benchmarks.short_rows [--processes 3]

Rows of at most 8 elements run in kernels vectorised across rows (`kernels.SHORT_ROW`); rows of
10 to 32 still run along each row.
"""

from __future__ import annotations

import time

from .pairs import main as run
from .pairs import timed

WORKLOADS = {  # name: (function, shape), float32 inputs
    "softmax_65536x8": ("softmax", (65536, 8)),
    "softmax_65536x2": ("softmax", (65536, 2)),
    "softmax_64x512x4": ("softmax", (64, 512, 4)),
    "layer_norm_65536x8": ("layer_norm", (65536, 8)),
    "logsumexp_65536x5": ("logsumexp", (65536, 5)),
    "argmax_65536x7": ("argmax", (65536, 7)),
    "unit_vectors_65536x3": ("unit_vectors", (65536, 3)),
    "softmax_65536x10": ("softmax", (65536, 10)),
    "softmax_32768x16": ("softmax", (32768, 16)),
    "layer_norm_16384x32": ("layer_norm", (16384, 32)),
}


def _function(name: str):
    import jax
    import jax.numpy as jnp

    def layer_norm(x):
        mean = jnp.mean(x, axis=-1, keepdims=True)
        var = jnp.mean((x - mean) ** 2, axis=-1, keepdims=True)
        return (x - mean) * jax.lax.rsqrt(var + 1e-5)

    return {
        "softmax": lambda x: jax.nn.softmax(x, axis=-1),
        "layer_norm": layer_norm,
        "logsumexp": lambda x: jax.nn.logsumexp(x, axis=-1),
        "argmax": lambda x: jnp.argmax(x, axis=-1),
        "unit_vectors": lambda x: x / jnp.sqrt(jnp.sum(x * x, axis=-1, keepdims=True)),
    }[name]


def _worker(engine: str, name: str, samples: int) -> dict:
    import numpy as np

    kind, shape = WORKLOADS[name]
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    fn = _function(kind)
    start = time.perf_counter()
    if engine == "jax":
        import jax

        jitted, xj = jax.jit(fn), jax.device_put(x)
        call = lambda: jitted(xj).block_until_ready()  # noqa: E731
    else:
        import xfuse

        compiled = xfuse.jit(fn).lower(x).compile()
        call = lambda: compiled(x)  # noqa: E731
    return timed(call, samples, start)


def main(argv: list[str] | None = None) -> None:
    run(argv, "benchmarks.short_rows", list(WORKLOADS), _worker)


if __name__ == "__main__":
    main()
