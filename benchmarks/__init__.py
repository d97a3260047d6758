"""The xfuse benchmark suite: xfuse.jit against jax.jit, NumPy and numexpr on a fixed set of
float32 workloads, each engine x workload timed in its own process.

Run it with `python -m benchmarks` or `xfuse bench` (see README.md). Uses xfuse's public API
only; this package itself imports nothing heavy, so importing it is cheap.
"""
