"""Reductions along short rows, outside the suite: xfuse against jax.jit, each engine in its
own process, processes in turns, the median process reported (`benchmarks.pairs`).

    python -m benchmarks.short_rows [--processes 3]

Rows of at most 8 elements run in kernels vectorised across rows (`row_forms.SHORT_ROW`), rows of
9 to 23 too, in blocks of 64 rows through stack tiles (`row_forms.TILED_ROW`); longer rows run
along each row in loops LLVM vectorises (`row_forms.ROW_LOOPS`), argmax through `rows`. The elementwise
`bias_tanh` cases are loop kernels over a short last axis (`row_forms.LOOP_ROWS`), and `head` is a
classifier's softmax(relu(x @ w + b)) over few classes.
"""

from __future__ import annotations

import time

from .pairs import main as run
from .pairs import timed

WORKLOADS = {  # name: (function, shape or shapes), float32 inputs
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
    "softmax_43690x12": ("softmax", (43690, 12)),
    "softmax_21845x24": ("softmax", (21845, 24)),
    "layer_norm_10922x48": ("layer_norm", (10922, 48)),
    "layer_norm_43690x12": ("layer_norm", (43690, 12)),
    "logsumexp_43690x12": ("logsumexp", (43690, 12)),
    "argmax_43690x12": ("argmax", (43690, 12)),
    "softmax_26214x20": ("softmax", (26214, 20)),
    "argmax_16384x32": ("argmax", (16384, 32)),
    "argmax_4096x1024": ("argmax", (4096, 1024)),
    "bias_tanh_131072x4": ("bias_tanh", [(131072, 4), (4,)]),
    "bias_tanh_52428x10": ("bias_tanh", [(52428, 10), (10,)]),
    "bias_tanh_32768x16": ("bias_tanh", [(32768, 16), (16,)]),
    "head_65536x64x4": ("head", [(65536, 64), (64, 4), (4,)]),
    "head_52428x64x10": ("head", [(52428, 64), (64, 10), (10,)]),
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
        "bias_tanh": lambda x, b: jnp.tanh(x + b),
        "head": lambda x, w, b: jax.nn.softmax(jax.nn.relu(x @ w + b), axis=-1),
    }[name]


def _worker(engine: str, name: str, samples: int) -> dict:
    import numpy as np

    kind, shapes = WORKLOADS[name]
    rng = np.random.default_rng(0)
    args = [rng.standard_normal(shape).astype(np.float32) for shape in (shapes if isinstance(shapes, list) else [shapes])]
    fn = _function(kind)
    start = time.perf_counter()
    if engine == "jax":
        import jax

        jitted, on_device = jax.jit(fn), [jax.device_put(a) for a in args]
        call = lambda: jitted(*on_device).block_until_ready()  # noqa: E731
    else:
        import xfuse

        compiled = xfuse.jit(fn).lower(*args).compile()
        call = lambda: compiled(*args)  # noqa: E731
    return timed(call, samples, start)


def main(argv: list[str] | None = None) -> None:
    run(argv, "benchmarks.short_rows", list(WORKLOADS), _worker)


if __name__ == "__main__":
    main()
