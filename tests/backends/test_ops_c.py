"""Every op x dtype of the op table on the C backend against the reference interpreter, with
the same trials as the numba backend's suite (edge values and seeded random inputs, per-op
tolerances). All trials are compiled together into one library: one compiler run."""

from __future__ import annotations

import pytest

from tests.backends.test_ops_numba import CASES, check_trial, chosen_trials, module_of, run_on
from xfuse.backends.c.backend import c_source, compile_modules
from xfuse.backends.numba.lowering import lower
from xfuse.hlo import DType, Op


@pytest.fixture(scope="module")
def compiled() -> dict:
    """(op, dtype, trial number) -> (executable, tupled) or the exception rendering it raised."""
    found, modules, keys = {}, [], []
    for op, dtype in CASES:
        for k, trial in enumerate(chosen_trials(op, dtype)):
            module, tupled = module_of(op, trial)
            try:
                c_source(lower(module))  # a kernel the renderer cannot take fails its own case
            except NotImplementedError as e:
                found[(op, dtype, k)] = e
                continue
            modules.append(module)
            keys.append((op, dtype, k, tupled))
    for (op, dtype, k, tupled), executable in zip(keys, compile_modules(modules)):
        found[(op, dtype, k)] = (executable, tupled)
    return found


@pytest.mark.parametrize("op, dtype", CASES, ids=[f"{op}-{dtype}" for op, dtype in CASES])
def test_op_matches_reference(compiled: dict, op: Op, dtype: DType) -> None:
    for k, trial in enumerate(chosen_trials(op, dtype)):
        entry = compiled[(op, dtype, k)]
        if isinstance(entry, Exception):
            raise entry
        executable, tupled = entry
        check_trial("c", op, dtype, trial, lambda t: run_on(executable, t, tupled))
