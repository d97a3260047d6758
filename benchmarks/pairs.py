"""xfuse against jax.jit on workloads outside the suite (`conv`, `short_rows`): each engine in
its own process, the processes in turns, the median of `samples` calls per process and the
median process reported. A module using it passes `main` its name, its workloads' names and
its worker, `worker(engine, name, samples) -> dict` (from `timed`), which `main` runs in each
timing process.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable


# Calls before the timed ones: at least three, and this long, as the suite warms up (a split
# kernel's first calls in a process run while the OS settles where its threads run).
WARMUP_S = 0.1


def timed(fn: Callable[[], object], samples: int, start: float) -> dict:
    """The median of `samples` calls of `fn` after its first call (which ends the compile
    begun at `start`) and at least three more, for at least WARMUP_S."""
    fn()
    compile_s = time.perf_counter() - start
    warm = time.perf_counter()
    calls = 0
    while calls < 3 or time.perf_counter() - warm < WARMUP_S:
        fn()
        calls += 1
    times = []
    for _ in range(samples):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return {"median": statistics.median(times), "compile": compile_s}


def main(argv: list[str] | None, module: str, names: list[str], worker: Callable[[str, str, int], dict],
         label: str = "workload") -> None:
    parser = argparse.ArgumentParser(prog=f"python -m {module}")
    parser.add_argument("--processes", type=int, default=3)
    parser.add_argument("--samples", type=int, default=25)
    parser.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(*args.worker, args.samples)))
        return
    print(f"{label:38s} {'xfuse':>10s} {'jax.jit':>10s} {'speed-up':>9s}   per process (xfuse | jax.jit)")
    for name in names:
        runs: dict[str, list[float]] = {"xfuse": [], "jax": []}
        for _ in range(args.processes):
            for engine in runs:
                out = subprocess.run([sys.executable, "-m", module, "--samples", str(args.samples),
                                      "--worker", engine, name], capture_output=True, text=True, check=True)
                runs[engine].append(json.loads(out.stdout.strip().splitlines()[-1])["median"])
        xf, jx = statistics.median(runs["xfuse"]), statistics.median(runs["jax"])
        shown = " ".join(f"{t * 1e3:.3f}" for t in runs["xfuse"]) + " | " + " ".join(f"{t * 1e3:.3f}" for t in runs["jax"])
        print(f"{name:38s} {xf * 1e3:8.3f}ms {jx * 1e3:8.3f}ms {jx / xf:8.2f}x   {shown}", flush=True)
