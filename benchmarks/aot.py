"""AOT artifacts against the JIT path: `python -m benchmarks.aot [--quick] [--rounds N] [--workloads ...]`.

For each workload, each in a fresh process:
- save: xfuse compiles the workload and saves its artifact (size, kernels, seconds to save);
- load: a process where jax, jaxlib, numba and llvmlite cannot be imported loads the artifact
  and calls it once (milliseconds beyond `import numpy`), then times calls as the suite does;
- jit: the suite's own xfuse timing (`benchmarks.worker time xfuse WORKLOAD`).
The load and jit processes run `--rounds` times, alternating (so a slow spell of the shared
machine hits both); each time is the median over the rounds' medians, and the table shows the
range of the rounds' ratios too. Prints the table and writes benchmarks/results/aot.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import statistics
import tempfile
import time
from pathlib import Path

from .suite import ROOT, machine, run_worker
from .worker import MARKER

BLOCKER = (
    "import builtins\n"
    "_real = builtins.__import__\n"
    "def _guard(name, *a, **k):\n"
    "    if name.split('.')[0] in ('jax', 'jaxlib', 'numba', 'llvmlite'):\n"
    "        raise ImportError(name + ' is blocked: an artifact runs with numpy alone')\n"
    "    return _real(name, *a, **k)\n"
    "builtins.__import__ = _guard\n"
)


def task_save(name: str, folder: str) -> dict:
    import xfuse

    from .workloads import BY_NAME

    workload = BY_NAME[name]
    compiled = xfuse.jit(workload.jax_fn).lower(*workload.inputs(seed=0)).compile()
    start = time.perf_counter()
    path = compiled.save(Path(folder) / f"{name}.xfa")
    return {"ok": True, "path": str(path), "bytes": path.stat().st_size, "save_s": time.perf_counter() - start,
            "kernels": compiled.kernel_count()}


def task_load(name: str, path: str, quick: bool) -> dict:
    start = time.perf_counter()
    import numpy as np

    numpy_s = time.perf_counter() - start
    from .workloads import BY_NAME, check, reference
    from .worker import TimingPlan, measure

    workload = BY_NAME[name]
    inputs = workload.inputs(seed=0)
    begin = time.perf_counter()  # what a user's program pays beyond numpy: import, load, call
    from xfuse.runtime.artifact import load

    fn = load(path)
    fn(*inputs)
    result = {"ok": True, "numpy_import_s": numpy_s, "startup_beyond_numpy_s": time.perf_counter() - begin}
    result.update(measure(lambda: fn(*inputs), TimingPlan.for_mode(quick)))
    result["check"] = check(np.asarray(fn(*inputs)), reference(workload, inputs))
    result["blocked_imported"] = [m for m in ("jax", "jaxlib", "numba", "llvmlite") if m in sys.modules]
    return result


def _child(arguments: list[str], blocked: bool = False) -> dict:
    env = dict(os.environ)
    # As installed by pip: modules load from bytecode (the first child writes it).
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    command = [sys.executable, "-c", (BLOCKER if blocked else "") +
               "import sys; from benchmarks.aot import child; child(sys.argv[1:])", *arguments]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=900)
    for line in reversed(done.stdout.splitlines()):
        if line.startswith(MARKER):
            return json.loads(line[len(MARKER):])
    tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
    return {"ok": False, "error": f"exit {done.returncode}: {' | '.join(tail)}"}


def child(argv: list[str]) -> None:
    task, *rest = argv
    try:
        result = task_save(*rest) if task == "save" else task_load(rest[0], rest[1], rest[2] == "quick")
    except Exception as error:  # reported in the table, not raised
        result = {"ok": False, "error": f"{type(error).__name__}: {error}"}
    print(MARKER + json.dumps(result), flush=True)


def main(argv: list[str] | None = None) -> int:
    from .workloads import WORKLOADS

    parser = argparse.ArgumentParser(prog="python -m benchmarks.aot")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--workloads", nargs="*", default=[w.name for w in WORKLOADS])
    parser.add_argument("--json", default=str(ROOT / "benchmarks" / "results" / "aot.json"))
    parser.add_argument("--rounds", type=int, default=None,
                        help="artifact and JIT processes per workload, alternating (default 3; 1 with --quick)")
    args = parser.parse_args(argv)
    rounds = args.rounds if args.rounds is not None else (1 if args.quick else 3)
    rows = []
    with tempfile.TemporaryDirectory(prefix="xfuse-aot-bench-") as folder:
        warm = _child(["save", args.workloads[0], folder])  # also writes the loader's bytecode
        if warm.get("ok"):
            _child(["load", args.workloads[0], warm["path"], "quick"], blocked=True)
        for name in args.workloads:
            saved = _child(["save", name, folder])
            aot, jit = [], []
            for _ in range(rounds):  # alternating, so a slow spell of the machine hits both
                aot.append(_child(["load", name, saved.get("path", ""), "quick" if args.quick else "full"], blocked=True)
                           if saved.get("ok") else {"ok": False, "error": "not saved"})
                jit.append(run_worker(["time", "xfuse", name], args.quick, None))
            rows.append({"workload": name, "save": saved, "aot": _rounds(aot), "jit": _rounds(jit)})
            print(_line(rows[-1]), flush=True)
    report = {"date": time.strftime("%Y-%m-%d"), "machine": machine(), "quick": args.quick, "rows": rows}
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(report, indent=1))
    print()
    print(table(rows))
    return 0


def _rounds(results: list[dict]) -> dict:
    """The first process's result, its time the median over every process's median, with
    those times listed (`round_times_s`); the first failure if any process failed."""
    failed = [r for r in results if not r.get("ok")]
    if failed:
        return failed[0]
    times = [r["time_s"] for r in results]
    return {**results[0], "time_s": float(statistics.median(times)), "round_times_s": times}


def _line(row: dict) -> str:
    s, a, j = row["save"], row["aot"], row["jit"]
    if not (s.get("ok") and a.get("ok") and j.get("ok")):
        return f"{row['workload']}: failed: {s.get('error') or a.get('error') or j.get('error')}"
    return f"{row['workload']}: {s['bytes']} B, first call {a['startup_beyond_numpy_s'] * 1e3:.1f} ms, " \
           f"aot {a['time_s'] * 1e3:.3f} ms, jit {j['time_s'] * 1e3:.3f} ms"


def table(rows: list[dict]) -> str:
    lines = ["| workload | artifact | kernels | import + load + first call, beyond numpy | AOT time | JIT time "
             "| AOT / JIT | per round | result |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for row in rows:
        s, a, j = row["save"], row["aot"], row["jit"]
        if not (s.get("ok") and a.get("ok") and j.get("ok")):
            lines.append(f"| {row['workload']} | failed: {s.get('error') or a.get('error') or j.get('error')} ||||||||")
            continue
        lines.append(
            f"| {row['workload']} | {s['bytes'] / 1024:.1f} KiB | {s['kernels']} | "
            f"{a['startup_beyond_numpy_s'] * 1e3:.1f} ms | {_ms(a['time_s'])} | {_ms(j['time_s'])} | "
            f"{a['time_s'] / j['time_s']:.2f}x | {_per_round(a, j)} | {'ok' if a['check']['ok'] else 'WRONG'} |")
    return "\n".join(lines)


def _per_round(a: dict, j: dict) -> str:
    """The range of AOT / JIT over the rounds (each round's two processes ran back to back)."""
    ratios = [x / y for x, y in zip(a.get("round_times_s", [a["time_s"]]), j.get("round_times_s", [j["time_s"]]))]
    return f"{min(ratios):.2f}x-{max(ratios):.2f}x" if len(ratios) > 1 else f"{ratios[0]:.2f}x"


def _ms(seconds: float) -> str:
    return f"{seconds * 1e6:.1f} us" if seconds < 1e-3 else f"{seconds * 1e3:.3f} ms"


if __name__ == "__main__":
    sys.exit(main())
