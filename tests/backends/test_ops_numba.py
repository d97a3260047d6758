"""Every op x dtype of the op table on the numba backend against the reference interpreter,
with the inputs of the lax suite (tests/hlo/test_ops_vs_jax.py): edge values (NaN, +-inf, +-0,
subnormals, extremes, integer limits, ties, zero divisors, out-of-range shifts, conversions and
indices) and seeded random ones, and its per-op tolerances.

Each op runs alone, unfused, as its own kernel (or BLAS call, or view). Compiling is nearly all
of the run time, so each op x dtype runs its first trial (the edge values) and, where an op has
several attribute variants (axes, slices, permutations), one more that rotates through them by
dtype, so every variant is seen on some dtype.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.hlo.test_ops_vs_jax import CASES, SPECS, Trial, check, trials_of
from xfuse.backends.numba import compile_module
from xfuse.hlo import Builder, DType, Module, Op, Shape, TupleShape


def chosen_trials(op: Op, dtype: DType) -> list[Trial]:
    trials = trials_of(op, dtype)
    if len(trials) <= 2:
        return trials
    rotated = 1 + list(SPECS[op].dtypes).index(dtype) % (len(trials) - 1)
    return [trials[0], trials[rotated]]


def module_of(op: Op, trial: Trial) -> tuple[Module, bool]:
    """A module applying `op` to the trial's parameters; whether its result is a tuple."""
    b = Builder("main")
    params = [b.parameter(Shape.of(a), f"p{i}") for i, a in enumerate(trial.arrays)]
    root = trial.build(b, *params) if trial.build is not None else b.emit(op, *params, **trial.attrs)
    tupled = isinstance(root.shape, TupleShape)
    if tupled:  # the executable returns a tuple's elements
        root = b.tuple(*(b.get_tuple_element(root, index=i) for i in range(len(root.shape.elements))))
    return Module.of(b.build(root)), tupled


def run_on(executable, trial: Trial, tupled: bool) -> object:
    outputs = executable(list(trial.arrays))
    return tuple(outputs) if tupled else outputs[0]


def check_trial(backend: str, op: Op, dtype: DType, trial: Trial, run, platform: object = None) -> None:
    """Runs `run(trial)` on copies of nothing: checks the inputs are left alone and the result
    agrees with the reference (or, element by element, with `platform`: see `check`)."""
    inputs = [a.copy() for a in trial.arrays]
    got = run(trial)
    for before, after in zip(inputs, trial.arrays):
        assert before.tobytes() == after.tobytes(), f"{backend} {op}({dtype}) wrote into its input"
    details = [f"{k}={v}" for k, v in trial.attrs.items()] + [trial.label] * bool(trial.label)
    what = f"{backend} {op}({dtype}) {', '.join(details)}"
    check(op, trial, got, SPECS[op].tolerance, what, platform)


def run_numba(op: Op, trial: Trial) -> object:
    module, tupled = module_of(op, trial)
    return run_on(compile_module(module), trial, tupled)


@pytest.mark.parametrize("op, dtype", CASES, ids=[f"{op}-{dtype}" for op, dtype in CASES])
def test_op_matches_reference(op: Op, dtype: DType) -> None:
    for trial in chosen_trials(op, dtype):
        check_trial("numba", op, dtype, trial, lambda t: run_numba(op, t))
