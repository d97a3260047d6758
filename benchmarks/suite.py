"""The benchmark driver: runs every engine x workload in its own subprocesses (one at a time, so
no two thread pools share the 2 cores; `--processes` of them per engine, taking turns with the
other engines', the median one counting), gathers their JSON, derives speed-ups over jax.jit,
bandwidth fractions and the geometric mean, then prints the tables and writes JSON and PNG.
`--corpus real` runs the real-program corpus (`benchmarks/corpus/`) on xfuse and jax.jit the
same way instead, and reports per program time per call, kernels, steps per call and time to
first result.

`main(argv)` is both `python -m benchmarks` and `xfuse bench`. Imports numpy only; the engines
and the corpus's libraries are imported by the worker processes.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from . import report
from .engines import ENGINES
from .workloads import Workload, select

PACKAGE = __package__ or "benchmarks"
ROOT = Path(__file__).resolve().parent.parent  # the folder that holds the `benchmarks` package
RESULTS = Path(__file__).resolve().parent / "results"
WORKER_TIMEOUT_S = 600
# A process's timings on these shared machines are bimodal: the same code runs a third slower
# in some processes than in others (page placement, which core, a neighbour's load), and the
# median of one process's samples cannot see that. Each engine is timed in this many processes,
# taking turns with the other engines', and the median process counts.
PROCESSES_FULL = 3
CORPUS_ENGINES = ("xfuse", "jax")  # a corpus program is a JAX program: no NumPy version of it


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="fewer, shorter timing runs")
    parser.add_argument(
        "--only",
        action="append",
        metavar="NAME",
        help="run only workloads (or corpus programs) whose name contains NAME (repeatable)",
    )
    parser.add_argument(
        "--engines",
        default=None,
        help="comma-separated engines to run (default: all; xfuse,jax for --corpus real)",
    )
    parser.add_argument(
        "--corpus",
        choices=("workloads", "real"),
        default="workloads",
        help="what to run: the workloads (default), or the real programs of benchmarks/corpus/ "
        "(flax, equinox, optax, numpyro, blackjax, diffrax) on xfuse and jax.jit",
    )
    parser.add_argument(
        "--size",
        choices=("bench", "test"),
        default="bench",
        help="the corpus programs' size (--corpus real; default bench, test: the tests' size)",
    )
    parser.add_argument(
        "--processes",
        type=int,
        default=None,
        metavar="N",
        help="timing processes per engine and workload, run in turns; each time is their "
        f"median (default: {PROCESSES_FULL}, 1 with --quick)",
    )
    parser.add_argument("--backend", default=None, help="xfuse backend (default: xfuse's own)")
    parser.add_argument(
        "--json", type=Path, default=None,
        help="where to write the results (default: results/latest.json; results/corpus.json "
        "for --corpus real)",
    )
    parser.add_argument(
        "--png", type=Path, default=None,
        help="where to draw the chart (default: results/latest.png; results/corpus.png)",
    )
    parser.add_argument(
        "--list", action="store_true", help="list the workloads (or corpus programs) and exit"
    )


def run_worker(arguments: list[str], quick: bool, backend: str | None) -> dict:
    """Runs `python -m benchmarks.worker ARGUMENTS` in a fresh process; its JSON, or an error."""
    from .worker import MARKER

    command = [sys.executable, "-m", f"{PACKAGE}.worker", *arguments]
    if quick:
        command.append("--quick")
    if backend:
        command += ["--backend", backend]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    started = time.perf_counter()
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, env=env, timeout=WORKER_TIMEOUT_S
        )
    except subprocess.TimeoutExpired:
        return {"ok": False, "error": f"worker timed out after {WORKER_TIMEOUT_S} s"}
    wall = time.perf_counter() - started
    for line in reversed(done.stdout.splitlines()):
        if line.startswith(MARKER):
            result = json.loads(line[len(MARKER) :])
            result["process_wall_s"] = wall
            return result
    tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
    return {
        "ok": False,
        "error": f"worker exited with {done.returncode} and no result: {' | '.join(tail)}",
        "process_wall_s": wall,
    }


def median_process(runs: list[dict]) -> dict:
    """One engine's result from its timing processes: the process of median time (the lower
    of the two middle ones for an even count), with every process's time beside it. A process
    that failed, or computed a wrong result, stands for the engine instead."""
    bad = next((r for r in runs if not r.get("ok") or r.get("error")), None)
    if bad is not None:
        return dict(bad, process_times_s=[r.get("time_s") for r in runs])
    ordered = sorted(runs, key=lambda r: r["time_s"])
    return dict(ordered[(len(ordered) - 1) // 2], process_times_s=[r["time_s"] for r in runs])


def machine() -> dict:
    """The CPU's model name, core count and platform, with the core as LLVM names it and its
    widest vector extension: one model name ("AMD EPYC") covers hosts with and without
    AVX-512, and the kernels and BLAS's speeds differ between them."""
    model, flags = None, set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and model is None:
                model = value.strip()
            elif key.strip() == "flags" and not flags:
                flags = set(value.split())
    except OSError:
        pass
    model = model or platform.processor() or platform.machine()
    try:
        from llvmlite import binding

        core = binding.get_host_cpu_name()
    except Exception:  # llvmlite missing or failing: the name is only informative
        core = None
    simd = next((name for flag, name in (("avx512f", "AVX-512"), ("avx2", "AVX2"), ("avx", "AVX"))
                 if flag in flags), None)
    return {"cpu": model, "cores": os.cpu_count(), "platform": platform.platform(), "core": core,
            "simd": simd}


def _load_average() -> list[float] | None:
    """The 1, 5 and 15 minute load averages: other work on the machine skews the timings."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    found = {"python": platform.python_version()}
    for name in ("xfuse", "jax", "jaxlib", "numpy", "numba", "numexpr", "onednn-cpu-gomp"):
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = None
    return found


def derive(workload: Workload, engines: dict, compile_cold: dict | None, copy_gbps: float) -> dict:
    """One workload's row: the worker results plus speed-ups, bandwidth and kernel counts."""
    row: dict = {
        "name": workload.name,
        "description": workload.description,
        "shapes": [list(s) for s in workload.shapes],
        "out_shape": list(workload.out_shape),
        "bytes_moved": workload.bytes_moved(),
        "matmul_flops": workload.flops,
        "memory_bound": workload.memory_bound,
        "engines": engines,
    }
    times = {
        name: r["time_s"]
        for name, r in engines.items()
        if r.get("ok") and r.get("error") is None and "time_s" in r
    }
    jax_time = times.get("jax")
    row["speedup_vs_jax"] = {
        name: (jax_time / t if jax_time else None) for name, t in times.items() if name != "jax"
    }
    # The same between each engine's fastest timing process: on a busy host one slow process
    # of either engine moves the medians' ratio, and the fastest is the least disturbed.
    fastest = {name: min(engines[name].get("process_times_s") or [t]) for name, t in times.items()}
    row["speedup_vs_jax_fastest"] = {
        name: (fastest["jax"] / t if jax_time else None) for name, t in fastest.items() if name != "jax"
    }
    row["bandwidth_fraction"] = {
        name: workload.bytes_moved() / t / 1e9 / copy_gbps if copy_gbps else None
        for name, t in times.items()
    }
    xf, xla = engines.get("xfuse", {}), engines.get("jax", {})
    row["kernels"] = {"xfuse": xf.get("kernel_count"), "xla": xla.get("xla_kernel_count")}
    row["peak_rss_bytes"] = {name: r.get("peak_rss_bytes") for name, r in engines.items()}
    # What the workload itself took: the peak over the memory after the engine's start-up
    # (imports, device, and the inputs) and before it compiled anything.
    row["workload_rss_bytes"] = {
        name: r["peak_rss_bytes"] - r["rss_base_bytes"]
        for name, r in engines.items() if r.get("peak_rss_bytes") and r.get("rss_base_bytes")
    }
    cold = compile_cold or {}
    row["compile"] = {
        "xfuse_cold_s": cold.get("time_to_first_result_s"),
        "xfuse_warm_s": xf.get("time_to_first_result_s"),
        "xfuse_cold_error": cold.get("error"),
        "jax_s": (xla.get("compile_s") or 0) + (xla.get("first_call_s") or 0) or None,
    }
    return row


def geometric_mean(values: list[float]) -> float | None:
    values = [v for v in values if v and v > 0]
    return math.exp(sum(map(math.log, values)) / len(values)) if values else None


def summarize(rows: list[dict], engines: list[str]) -> dict:
    summary = {}
    for engine in engines:
        if engine == "jax":
            continue
        speedups = [r["speedup_vs_jax"].get(engine) for r in rows]
        present = [s for s in speedups if s]
        fastest = [r.get("speedup_vs_jax_fastest", {}).get(engine) for r in rows]
        summary[engine] = {
            "geomean_speedup_vs_jax": geometric_mean(present),
            "geomean_speedup_vs_jax_fastest": geometric_mean([s for s in fastest if s]),
            "workloads_counted": len(present),
            "workloads_run": sum(1 for r in rows if engine in r["engines"]),
        }
    return summary


def chosen_engines(args: argparse.Namespace) -> list[str]:
    """--engines as a list, checked against the engines of what runs."""
    offered = CORPUS_ENGINES if args.corpus == "real" else ENGINES
    engines = [e.strip() for e in (args.engines or ",".join(offered)).split(",") if e.strip()]
    unknown = sorted(set(engines) - set(offered))
    if unknown:
        raise SystemExit(f"unknown engine {', '.join(unknown)}; choose from {', '.join(offered)}")
    return engines


def run(args: argparse.Namespace) -> dict:
    engines = chosen_engines(args)
    if args.corpus == "real":
        return run_corpus(args, engines)
    workloads = select(args.only)
    # A kernel cache of the run's own: the cold compile process finds it empty, the timing
    # process after it finds what the cold one stored (the warm compile).
    cache = tempfile.mkdtemp(prefix="xfuse-bench-cache-")
    os.environ["XFUSE_CACHE_DIR"] = cache
    try:
        return _run(args, engines, workloads)
    finally:
        shutil.rmtree(cache, ignore_errors=True)


def run_meta(args: argparse.Namespace, engines: list[str], processes: int, begun: float,
             load_before) -> dict:
    """What a run's JSON says of the run: when, where, with what, and how busy the host was."""
    return {
        "date": datetime.date.today().isoformat(),
        "machine": machine(),
        "versions": versions(),
        "quick": args.quick,
        "processes": processes,
        "engines": engines,
        "xfuse_backend": args.backend or "default",
        "suite_wall_s": time.perf_counter() - begun,
        "load_average_before": load_before,
        "load_average_after": _load_average(),
    }


def process_count(args: argparse.Namespace) -> int:
    processes = args.processes or (1 if args.quick else PROCESSES_FULL)
    if processes < 1:
        raise SystemExit(f"--processes must be at least 1, not {processes}")
    return processes


def _run(args: argparse.Namespace, engines: list[str], workloads: list) -> dict:
    load_before = _load_average()
    begun = time.perf_counter()
    log = report.Progress()

    log.step("bandwidth", "numpy copy")
    bandwidth = run_worker(["bandwidth"], args.quick, None)
    copy_gbps = bandwidth.get("gbps") or 0.0
    log.done(f"{copy_gbps:.1f} GB/s" if copy_gbps else bandwidth.get("error"))
    log.step("overhead", "bare numba call")
    overhead = run_worker(["overhead"], args.quick, None)
    log.done(report.status(overhead, "time_s"))

    processes = process_count(args)
    rows = []
    for workload in workloads:
        cold = None
        if "xfuse" in engines:
            log.step(workload.name, "xfuse compile (cold process)")
            cold = run_worker(["compile", workload.name], args.quick, args.backend)
            log.done(report.status(cold, "time_to_first_result_s"))
        runs: dict[str, list[dict]] = {e: [] for e in engines if e in workload.engines()}
        for turn in range(processes):
            for engine, done in runs.items():
                log.step(workload.name, engine if processes == 1 else f"{engine} ({turn + 1}/{processes})")
                done.append(run_worker(["time", engine, workload.name], args.quick, args.backend))
                log.done(report.status(done[-1], "time_s"))
        results = {engine: median_process(done) for engine, done in runs.items()}
        rows.append(derive(workload, results, cold, copy_gbps))

    return {
        "meta": {
            **run_meta(args, engines, processes, begun, load_before),
            "xla_kernel_rule": (
                "instructions of the ENTRY computation of jax.jit(f).lower(*args).compile()"
                ".as_text(), except parameter, constant, tuple, get-tuple-element, bitcast, "
                "copy-start, copy-done, after-all, opt-barrier, add-dependency, partition-id, "
                "replica-id"
            ),
        },
        "bandwidth": bandwidth,
        "bare_numba_call": overhead,
        "workloads": rows,
        "summary": summarize(rows, engines),
    }


# --------------------------------------------------------------------------- the corpus


def derive_program(program, runs: dict[str, list[dict]]) -> dict:
    """One corpus program's row: the median process per engine, the speed-up over jax.jit,
    kernels, steps per call, and each engine's time to first result (median over processes)."""
    engines = {engine: median_process(done) for engine, done in runs.items()}
    times = {name: r["time_s"] for name, r in engines.items()
             if r.get("ok") and r.get("error") is None and "time_s" in r}
    jax_time = times.get("jax")
    row: dict = {
        "name": program.name,
        "library": program.library,
        "description": program.description,
        "engines": engines,
        "speedup_vs_jax": {n: jax_time / t for n, t in times.items() if n != "jax" and jax_time},
    }
    fastest = {n: min(engines[n].get("process_times_s") or [t]) for n, t in times.items()}
    row["speedup_vs_jax_fastest"] = {
        n: fastest["jax"] / t for n, t in fastest.items() if n != "jax" and jax_time
    }
    xf, xla = engines.get("xfuse", {}), engines.get("jax", {})
    row["kernels"] = {"xfuse": xf.get("kernel_count"), "xla": xla.get("xla_kernel_count")}
    row["steps_per_call"] = xf.get("steps_per_call")

    def first(engine: str, key: str) -> float | None:
        values = sorted(r[key] for r in runs.get(engine, []) if r.get(key) is not None)
        return values[(len(values) - 1) // 2] if values else None

    row["first_result_s"] = {
        "xfuse": first("xfuse", "time_to_first_result_s"),
        "xfuse_native": first("xfuse", "native_ready_s"),
        "xfuse_cached": first("xfuse", "cached_first_result_s"),
        "jax": first("jax", "time_to_first_result_s"),
    }
    return row


def run_corpus(args: argparse.Namespace, engines: list[str]) -> dict:
    """Every selected corpus program on each engine, `--processes` processes each in turns."""
    from .corpus import select as select_programs

    programs = select_programs(args.only)
    processes = process_count(args)
    load_before = _load_average()
    begun = time.perf_counter()
    log = report.Progress()
    rows = []
    for program in programs:
        runs: dict[str, list[dict]] = {engine: [] for engine in engines}
        for turn in range(processes):
            for engine, done in runs.items():
                what = engine if processes == 1 else f"{engine} ({turn + 1}/{processes})"
                log.step(program.name, what)
                arguments = ["program", engine, program.name, "--size", args.size]
                done.append(run_worker(arguments, args.quick, args.backend))
                log.done(report.status(done[-1], "time_s"))
        rows.append(derive_program(program, runs))
    return {
        "meta": {
            "corpus": "real",
            "size": args.size,
            "library_versions": library_versions(),
            **run_meta(args, engines, processes, begun, load_before),
        },
        "programs": rows,
        "summary": summarize(rows, engines),
    }


def library_versions() -> dict:
    """The versions of the libraries the corpus programs are written with."""
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for name in ("flax", "optax", "equinox", "numpyro", "blackjax", "diffrax"):
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = None
    return found


def main(argv: list[str] | None = None, prog: str = "python -m benchmarks") -> int:
    parser = argparse.ArgumentParser(
        prog=prog, description="Benchmark xfuse against jax.jit, NumPy and numexpr."
    )
    add_arguments(parser)
    args = parser.parse_args(argv)
    corpus = args.corpus == "real"
    if args.list:
        if corpus:
            from .corpus import select as select_programs

            for program in select_programs(args.only):
                print(f"{program.name:34} {program.library:9} {program.description}")
            return 0
        for workload in select(args.only):
            print(f"{workload.name:32} {workload.description}")
        return 0
    args.json = args.json or RESULTS / ("corpus.json" if corpus else "latest.json")
    args.png = args.png or RESULTS / ("corpus.png" if corpus else "latest.png")
    results = run(args)
    print()
    print(report.corpus_tables(results) if corpus else report.tables(results))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=1) + "\n")
    chart = report.chart(results, args.png)
    print(f"\nresults: {args.json}\nchart:   {chart}")
    return 0
