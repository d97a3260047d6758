"""One measurement in one fresh process: `python -m benchmarks.worker TASK ...` prints a single
line `BENCH_RESULT {json}` on stdout and exits 0, also when the engine failed (the error is in
the JSON). Tasks:

    time ENGINE WORKLOAD     compile (if the engine compiles), warm up, time, check the result
    compile WORKLOAD         xfuse only: lower + compile + first call, and the kernel count
    program ENGINE NAME      a corpus program (benchmarks/corpus/) on xfuse or jax: time to
                             first result, kernels, steps per call, time per call, check
    bandwidth                NumPy copy of a large, already-touched buffer

Timing: warm-up calls until `warmup_s` has passed (at least two), then `repeats` samples of
`number` back-to-back calls each (`number` makes a sample last about `sample_s`, so tiny
workloads are not timer-bound); the result is the median sample divided by `number`. Enough
repeats for about `total_s` in all, at least `min_repeats` (fewer for workloads that take
over half a second a call). The garbage collector is off while timing.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

MARKER = "BENCH_RESULT "


@dataclass(frozen=True)
class TimingPlan:
    warmup_s: float
    sample_s: float
    total_s: float
    min_repeats: int
    max_repeats: int

    @classmethod
    def for_mode(cls, quick: bool) -> TimingPlan:
        if quick:
            return cls(warmup_s=0.02, sample_s=0.005, total_s=0.05, min_repeats=3, max_repeats=10)
        return cls(warmup_s=0.1, sample_s=0.02, total_s=0.3, min_repeats=5, max_repeats=40)

    @classmethod
    def for_programs(cls, quick: bool) -> TimingPlan:
        """Corpus programs: a longer warm-up, as xfuse's runtime settles how it runs a program's
        products and splits over the first calls (tens of them: 100 ms calls that become 3-10
        ms ones in the flax.nnx step), and more time in all, calls taking milliseconds."""
        if quick:
            return cls(warmup_s=0.3, sample_s=0.02, total_s=0.3, min_repeats=3, max_repeats=10)
        return cls(warmup_s=1.5, sample_s=0.05, total_s=1.5, min_repeats=5, max_repeats=40)


def measure(call: Callable[[], object], plan: TimingPlan) -> dict:
    """Median time per call of `call` under `plan`, with the numbers behind it."""
    warm_times = []
    started = time.perf_counter()
    while len(warm_times) < 2 or time.perf_counter() - started < plan.warmup_s:
        t0 = time.perf_counter()
        call()
        warm_times.append(time.perf_counter() - t0)
    estimate = max(statistics.median(warm_times[1:]), 1e-9)
    number = max(1, round(plan.sample_s / estimate))
    repeats = math.ceil(plan.total_s / (number * estimate))
    low = plan.min_repeats if estimate < 0.5 else max(3, plan.min_repeats - 2)
    repeats = min(max(repeats, low), plan.max_repeats)

    samples = []
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        for _ in range(repeats):
            t0 = time.perf_counter()
            for _ in range(number):
                call()
            samples.append((time.perf_counter() - t0) / number)
    finally:
        if gc_was_enabled:
            gc.enable()
    return {
        "time_s": statistics.median(samples),
        "min_s": min(samples),
        "max_s": max(samples),
        "number": number,
        "repeats": repeats,
        "warmup_calls": len(warm_times),
        "samples_s": samples,
    }


def peak_rss() -> int:
    """The process's peak resident memory in bytes (Linux reports KiB)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def task_overhead(quick: bool) -> dict:
    """A bare numba call of `x + 1` on 4 floats, allocating its result as xfuse's call does:
    the floor for xfuse's per-call overhead."""
    import numba

    add_one = numba.njit(lambda x: x + np.float32(1.0))
    x = np.ones(4, np.float32)
    add_one(x)
    timing = measure(lambda: add_one(x), TimingPlan.for_mode(quick))
    timing.update(task="overhead", ok=True, error=None)
    return timing


def task_time(engine: str, workload_name: str, quick: bool, backend: str | None) -> dict:
    from .engines import prepare
    from .workloads import BY_NAME, check, reference

    workload = BY_NAME[workload_name]
    result: dict = {"task": "time", "engine": engine, "workload": workload_name, "quick": quick}
    inputs = workload.inputs(seed=0)
    try:
        prepared = prepare(engine, workload, inputs, backend)
        result.update(prepared.info)
        result.update(measure(prepared.call, TimingPlan.for_mode(quick)))
        output = prepared.to_numpy(prepared.call())
    except Exception as error:
        result.update(ok=False, error=_describe(error))
        return result
    result["peak_rss_bytes"] = peak_rss()  # before the float64 reference adds its own
    # The float64 reference runs after timing, so its BLAS threads cannot disturb it.
    result["check"] = check(output, reference(workload, inputs))
    result["ok"] = True
    result["error"] = None if result["check"]["ok"] else "wrong result (see check)"
    return result


def task_compile(workload_name: str, backend: str | None) -> dict:
    from .engines import prepare
    from .workloads import BY_NAME

    workload = BY_NAME[workload_name]
    result: dict = {"task": "compile", "engine": "xfuse", "workload": workload_name}
    try:
        result.update(prepare("xfuse", workload, workload.inputs(seed=0), backend).info)
        result.update(ok=True, error=None)
    except Exception as error:
        result.update(ok=False, error=_describe(error))
    return result


def _library_startup(engine: str, backend: str | None) -> None:
    """What a process sets up once, not counted in the time to first result: jax's backend and
    first trace, and for xfuse its frontend and the numba backend's modules."""
    import jax

    jax.block_until_ready(jax.device_put(0.0))
    jax.jit(lambda a: a * 2.0)(1.0)
    if engine != "xfuse":
        return
    import xfuse

    xfuse.jit(lambda a: a * 2.0).lower(np.float32(1.0))
    if backend in (None, "numba"):
        from xfuse.backends import numba as numba_backend

        numba_backend.initialize()


def task_program(engine: str, name: str, quick: bool, size: str, backend: str | None) -> dict:
    """One corpus program on one engine. Time to first result: a fresh jit's trace, compile
    and first call (xfuse with an empty kernel cache of the process's own, so each process
    compiles every kernel as a first run does). Then the time per call of the jitted
    function; for xfuse also its kernel count and steps per call, and its outputs checked
    against jax.jit's (computed after timing). jax.jit's outputs are the yardstick: its
    check only says they are finite."""
    import os
    import shutil
    import tempfile

    from .corpus import BY_NAME

    program = BY_NAME[name]
    result: dict = {"task": "program", "engine": engine, "program": name,
                    "library": program.library, "size": size, "quick": quick}
    cache = tempfile.mkdtemp(prefix="xfuse-corpus-cache-")
    os.environ["XFUSE_CACHE_DIR"] = cache
    result["stage"] = "build"  # what runs now; `failed_at` if it raises
    try:
        started = time.perf_counter()
        fn, args = program.build(size)
        result["build_s"] = time.perf_counter() - started
        result["stage"] = "start-up"
        _library_startup(engine, backend)
        import jax

        jax.clear_caches()  # `build` may have jitted the program (a training state some steps in)
        if engine == "xfuse":
            call, output = _program_xfuse(fn, args, backend, result)
        elif engine == "jax":
            call, output = _program_jax(fn, args, result)
        else:
            raise ValueError(f"corpus programs run on xfuse or jax, not {engine!r}")
        result["stage"] = "timing"
        result.update(measure(call, TimingPlan.for_programs(quick)))
        result["peak_rss_bytes"] = peak_rss()
        result["stage"] = "check"
        result["check"] = _program_check(engine, fn, args, output)
    except Exception as error:
        result.update(ok=False, error=_describe(error), failed_at=result.pop("stage"))
        return result
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    del result["stage"]
    result["ok"] = True
    result["error"] = None if result["check"]["ok"] else "wrong result (see check)"
    return result


def _program_xfuse(fn: Callable, args: tuple, backend: str | None, result: dict):
    """Time to first result, kernels and steps of a fresh xfuse.jit; then the jitted function
    the user calls, after its own first call, and its output."""
    import jax
    import xfuse

    # The user's path, cold (an empty kernel cache): the first call's result (from the quick
    # tier where the native compile takes long, `xfuse.tiers`), then the native program ready.
    result["stage"] = "first call"
    start = time.perf_counter()
    tiered = xfuse.jit(fn, backend=backend)
    try:
        jax.block_until_ready(tiered(*args))
    except Exception:
        result["stage"] = "trace"  # where it failed: tracing, when tracing alone fails too
        tiered.lower(*args)
        result["stage"] = "first call"
        raise
    first = time.perf_counter()
    first_tier = tiered.tier_of(*args)
    tiered.wait_native()
    native = time.perf_counter()
    # The stages, with the kernels now in the cache
    result["stage"] = "trace"
    start_stages = time.perf_counter()
    lowered = xfuse.jit(fn, backend=backend).lower(*args)
    traced = time.perf_counter()
    result["stage"] = "compile"
    compiled = lowered.compile()
    done = time.perf_counter()
    jax.block_until_ready(compiled(*args))
    result.update(
        backend=lowered.backend,
        trace_s=traced - start_stages,
        compile_s=done - traced,
        first_call_s=time.perf_counter() - done,
        time_to_first_result_s=first - start,
        first_tier=first_tier,
        native_ready_s=native - start,
        kernel_count=compiled.kernel_count(),
        steps_per_call=compiled.steps_per_call(*args),
    )
    on_jax = lowered.backend == "jax"
    del tiered, lowered, compiled  # only the function timed below keeps its buffers
    gc.collect()
    # The user's path: xfuse.jit(fn) called. Its first call traces and compiles again, finding
    # the kernels the first compile left in the cache.
    jitted = xfuse.jit(fn, backend=backend)
    start = time.perf_counter()
    jax.block_until_ready(jitted(*args))
    result["cached_first_result_s"] = time.perf_counter() - start
    jitted.wait_native()  # timed and checked: the native program
    output = jax.block_until_ready(jitted(*args))
    if on_jax:
        return (lambda: jax.block_until_ready(jitted(*args))), output
    return (lambda: jitted(*args)), output


def _program_jax(fn: Callable, args: tuple, result: dict):
    """Time to first result of a fresh jax.jit on device arrays; XLA's kernels (from a lower
    and compile after it); the jitted call, and its output."""
    import jax

    from .engines import xla_kernels

    device_args = jax.block_until_ready(jax.device_put(args))
    result["stage"] = "first call"
    jitted = jax.jit(fn)
    start = time.perf_counter()
    output = jax.block_until_ready(jitted(*device_args))
    result["time_to_first_result_s"] = time.perf_counter() - start
    kernels = xla_kernels(jitted.lower(*device_args).compile().as_text())
    result.update(xla_kernel_count=len(kernels), xla_kernels=kernels)
    return (lambda: jax.block_until_ready(jitted(*device_args))), output


def _program_check(engine: str, fn: Callable, args: tuple, output: object) -> dict:
    """xfuse: its outputs against jax.jit's, leaf by leaf (`corpus.compare`); jax: whether its
    float outputs are finite."""
    import jax

    from .corpus import compare

    if engine == "xfuse":
        return dict(compare(output, jax.jit(fn)(*args)), reference="jax.jit")
    leaves = [np.asarray(leaf) for leaf in jax.tree_util.tree_leaves(output)]
    floats = [leaf for leaf in leaves if np.issubdtype(leaf.dtype, np.inexact)]
    finite = all(np.isfinite(leaf).all() for leaf in floats)
    return {"ok": bool(finite), "leaves": len(leaves), "reference": None}


def task_bandwidth(quick: bool) -> dict:
    """Copy bandwidth: bytes read plus bytes written per second by `np.copyto`."""
    nbytes = (64 if quick else 256) * 2**20
    source = np.ones(nbytes // 4, dtype=np.float32)
    target = np.zeros_like(source)  # zeros_like writes the pages, so they are touched
    target[...] = 2.0
    timing = measure(lambda: np.copyto(target, source), TimingPlan.for_mode(quick))
    timing["gbps"] = 2 * nbytes / timing["time_s"] / 1e9
    timing.update(task="bandwidth", buffer_bytes=nbytes, ok=True, error=None)
    return timing


def _describe(error: BaseException) -> str:
    """The exception and the innermost frames of its traceback, short enough for a table."""
    frames = traceback.extract_tb(error.__traceback__)[-3:]
    where = "; ".join(f"{f.filename.rsplit('/', 2)[-1]}:{f.lineno} {f.name}" for f in frames)
    message = str(error).strip().splitlines()
    first = message[0] if message else ""
    return f"{type(error).__name__}: {first[:300]} [{where}]"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.worker")
    parser.add_argument("task", choices=("time", "compile", "program", "bandwidth", "overhead"))
    parser.add_argument(
        "names", nargs="*",
        help="ENGINE WORKLOAD for time, WORKLOAD for compile, ENGINE PROGRAM for program",
    )
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--size", default="bench", choices=("bench", "test"),
                        help="a corpus program's size (program only; default bench)")
    parser.add_argument("--backend", default=None, help="xfuse backend (default: xfuse's)")
    args = parser.parse_args(argv)
    if args.task == "time":
        engine, workload = args.names
        result = task_time(engine, workload, args.quick, args.backend)
    elif args.task == "compile":
        (workload,) = args.names
        result = task_compile(workload, args.backend)
    elif args.task == "program":
        engine, program = args.names
        result = task_program(engine, program, args.quick, args.size, args.backend)
    elif args.task == "overhead":
        result = task_overhead(args.quick)
    else:
        result = task_bandwidth(args.quick)
    sys.stdout.flush()
    print(MARKER + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
