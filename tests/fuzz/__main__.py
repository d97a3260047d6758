"""The long fuzz run: `python -m tests.fuzz --n 10000`.

Draws `--n` random programs (tests/fuzz/programs.py) with their inputs, runs each through
jax.jit and every backend with and without the passes (tests/fuzz/check.py), and compares them
within the error bounds of tests/fuzz/bounds.py. A failing case is shrunk by hypothesis (to
fewer steps, and simpler inputs) and saved under `--save` (by default tests/regressions/, whose
every file tests/test_regressions.py runs from then on); the run goes on with the next seed.
Prints a summary line `programs N, executions E, mismatches M` and exits 1 if M > 0.
The CI slice (tests/fuzz/test_fuzz.py) runs this same command in two shards.

Compiled programs are never freed in full (a loaded C library stays mapped, XLA keeps its
executables), so a run of more than `--chunk` programs runs each chunk of them in a fresh
process, with a progress line after each.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hypothesis_seed

from tests.fuzz.check import BACKENDS, REGRESSIONS, engines, mismatches, report, save_regression
from tests.fuzz.programs import programs_with_inputs


def run(n: int, seed: int, backends: tuple[str, ...], save: Path | None, max_steps: int,
        chunk: int = 100, out=sys.stdout) -> int:
    which = engines(backends)
    totals = {"programs": 0, "executions": 0, "mismatches": 0}
    start = time.perf_counter()
    chunk_seed = seed
    while totals["programs"] < n:
        size = min(chunk, n - totals["programs"])
        state = {"failed": None, "generated": 0}

        @settings(max_examples=size, deadline=None, database=None, derandomize=False,
                  phases=[Phase.generate, Phase.shrink], report_multiple_bugs=False,
                  suppress_health_check=list(HealthCheck))
        @hypothesis_seed(chunk_seed)
        @given(programs_with_inputs(max_steps))
        def one(case) -> None:
            program, inputs = case
            totals["executions"] += 1
            if state["failed"] is None:
                state["generated"] += 1
            problems = mismatches(program, inputs, which)
            if problems:
                state["failed"] = (program, inputs, problems)
                raise AssertionError(problems[0])

        try:
            one()
        except AssertionError:
            pass
        totals["programs"] += state["generated"]
        if state["failed"] is not None:
            program, inputs, problems = state["failed"]  # the last failure: the shrunk one
            totals["mismatches"] += 1
            print(report(program, inputs, problems), file=out)
            if save is not None:
                try:
                    print(f"# saved {save_regression(program, inputs, save)}", file=out)
                except Exception as e:  # noqa: BLE001 - e.g. the eager baseline cannot run it
                    print(f"# not saved: {type(e).__name__}: {e}", file=out)
        chunk_seed += 1
    seconds = time.perf_counter() - start
    print(f"programs {totals['programs']}, executions {totals['executions']}, "
          f"mismatches {totals['mismatches']}, {seconds:.0f} s", file=out, flush=True)
    return totals["mismatches"]


def run_chunked(n: int, seed: int, chunk: int, argv: list[str], out=sys.stdout) -> int:
    """`n` programs as chunks of `chunk`, each chunk in a fresh process of this command."""
    totals = [0, 0, 0]
    start = time.perf_counter()
    done, chunk_seed = 0, seed
    while done < n:
        size = min(chunk, n - done)
        command = [sys.executable, "-m", "tests.fuzz", "--n", str(size), "--seed", str(chunk_seed),
                   "--chunk", str(size), *argv]
        result = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
        lines = result.stdout.strip().splitlines()
        summary = lines[-1] if lines else ""
        if not summary.startswith("programs "):
            print(result.stdout[-5000:], file=out)
            print(f"chunk with seed {chunk_seed} ended without a summary (exit {result.returncode})", file=out)
            return max(totals[2], 1)
        if len(lines) > 1:  # the chunk's mismatch reports
            print("\n".join(lines[:-1]), file=out)
        counts = [int(part.split()[1]) for part in summary.split(", ")[:3]]
        totals = [t + c for t, c in zip(totals, counts)]
        done += counts[0]
        chunk_seed += (size + 99) // 100  # the seeds the chunk used
        print(f"# {done} of {n} programs, {totals[2]} mismatches, {time.perf_counter() - start:.0f} s",
              file=out, flush=True)
    print(f"programs {totals[0]}, executions {totals[1]}, mismatches {totals[2]}, "
          f"{time.perf_counter() - start:.0f} s", file=out, flush=True)
    return totals[2]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.fuzz", description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=10000, help="programs to run")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--backends", default=",".join(BACKENDS))
    parser.add_argument("--max-steps", type=int, default=8)
    parser.add_argument("--save", type=Path, default=REGRESSIONS, help="where failing cases go")
    parser.add_argument("--no-save", action="store_true")
    parser.add_argument("--chunk", type=int, default=500, help="programs per fresh process")
    args = parser.parse_args(argv)
    backends = tuple(b for b in args.backends.split(",") if b)
    if args.n > args.chunk:
        passed = ["--backends", args.backends, "--max-steps", str(args.max_steps)]
        passed += ["--no-save"] if args.no_save else ["--save", str(args.save)]
        found = run_chunked(args.n, args.seed, args.chunk, passed)
        return 1 if found else 0
    found = run(args.n, args.seed, backends, None if args.no_save else args.save, args.max_steps)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
