"""The buffer plan of real executables: random HLO modules, fused by the default pipeline and
compiled by the numba backend. No two temporaries whose lifetimes overlap share a byte, every
in-place write goes into an input that dies at that step, and the planned run gives bitwise the
results of an unplanned one (every buffer its own allocation, steps in dependency order)."""

from __future__ import annotations

from hypothesis import assume, given, settings

from xfuse.backends.numba import compile_module
from xfuse.fusion import parse_pipeline, run_pipeline
from xfuse.hlo import InterpreterError, interpret
from xfuse.runtime.asynchronous import call_async

from ..fusion.helpers import same_values
from ..hlo.strategies import modules_with_inputs
from .planning import check_plan


@settings(max_examples=25, deadline=None)
@given(drawn=modules_with_inputs(max_ops=10))
def test_plans_of_compiled_random_modules(drawn):
    module, args = drawn
    try:
        interpret(module, *args)
    except InterpreterError:
        assume(False)
    fused = run_pipeline(module, parse_pipeline(None)).module
    executable = compile_module(fused)
    check_plan(executable)
    arrays = [a.copy() if hasattr(a, "copy") else a for a in args]
    planned = executable(list(arrays))
    unplanned = call_async(executable, list(arrays)).result(timeout=120)
    assert same_values(tuple(planned), tuple(unplanned))
