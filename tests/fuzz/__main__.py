"""The long fuzz run: `python -m tests.fuzz --n 10000`.

Draws `--n` random programs (tests/fuzz/programs.py) with their inputs, runs each through
jax.jit and every backend with and without the passes (tests/fuzz/check.py), and compares them
within the error bounds of tests/fuzz/bounds.py. A failing case is shrunk by hypothesis (to
fewer steps, and simpler inputs) and saved under `--save` (by default tests/regressions/, whose
every file tests/test_regressions.py runs from then on); the run goes on with the next seed.
Prints a summary line `programs N, executions E, mismatches M` and exits 1 if M > 0.
The CI slice (tests/fuzz/test_fuzz.py) runs this same command in two shards.
"""

from __future__ import annotations

import argparse
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
                print(f"# saved {save_regression(program, inputs, save)}", file=out)
        chunk_seed += 1
    seconds = time.perf_counter() - start
    print(f"programs {totals['programs']}, executions {totals['executions']}, "
          f"mismatches {totals['mismatches']}, {seconds:.0f} s", file=out, flush=True)
    return totals["mismatches"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.fuzz", description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=10000, help="programs to run")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--backends", default=",".join(BACKENDS))
    parser.add_argument("--max-steps", type=int, default=8)
    parser.add_argument("--save", type=Path, default=REGRESSIONS, help="where failing cases go")
    parser.add_argument("--no-save", action="store_true")
    args = parser.parse_args(argv)
    backends = tuple(b for b in args.backends.split(",") if b)
    found = run(args.n, args.seed, backends, None if args.no_save else args.save, args.max_steps)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
