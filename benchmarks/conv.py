"""Convolution layers, outside the suite (its workloads are fixed by the issue): xfuse against
jax.jit, each engine in its own process, processes in turns, the median process reported.

    python -m benchmarks.conv [--processes 3]

A layer is conv (3x3, SAME, NHWC) + bias + relu + 2x2 max pool; `depthwise` is the same with
one 3x3 filter per channel (feature_group_count = channels).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

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
    fn()
    compile_s = time.perf_counter() - start
    for _ in range(3):
        fn()
    times = []
    for _ in range(samples):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return {"median": statistics.median(times), "compile": compile_s}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.conv")
    parser.add_argument("--processes", type=int, default=3)
    parser.add_argument("--samples", type=int, default=25)
    parser.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(_worker(*args.worker, args.samples)))
        return
    print(f"{'layer':38s} {'xfuse':>10s} {'jax.jit':>10s} {'speed-up':>9s}   per process (xfuse | jax.jit)")
    for name in LAYERS:
        runs: dict[str, list[float]] = {"xfuse": [], "jax": []}
        for _ in range(args.processes):
            for engine in runs:
                out = subprocess.run([sys.executable, "-m", "benchmarks.conv", "--samples", str(args.samples),
                                      "--worker", engine, name], capture_output=True, text=True, check=True)
                runs[engine].append(json.loads(out.stdout.strip().splitlines()[-1])["median"])
        xf, jx = statistics.median(runs["xfuse"]), statistics.median(runs["jax"])
        shown = " ".join(f"{t * 1e3:.2f}" for t in runs["xfuse"]) + " | " + " ".join(f"{t * 1e3:.2f}" for t in runs["jax"])
        print(f"{name:38s} {xf * 1e3:8.2f}ms {jx * 1e3:8.2f}ms {jx / xf:8.2f}x   {shown}", flush=True)


if __name__ == "__main__":
    main()
