"""The jax backend's control flow: `while` as lax.while_loop and `conditional` as lax.switch
with the IR's rule for an index out of range (the last branch, negative ones included, where
lax.switch alone would clamp them to branch 0), in both of the backend's modes."""

from __future__ import annotations

import re

import numpy as np
import pytest

from tests.hlo.test_control import counting_loop, three_way
from xfuse.backends.jax import compile_module
from xfuse.fusion import parse_pipeline, run_pipeline
from xfuse.hlo import Op, interpret

MODES = ("fusions", "module")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("index", [-4, -1, 0, 1, 2, 3, 99])
def test_conditional_takes_the_last_branch_out_of_range(mode, index):
    module = three_way()
    executable = compile_module(module, mode=mode)
    x, y = np.array([1, 2, 3], np.float32), np.array([3, 4, 5], np.float32)
    (got,) = executable([np.int32(index), x, y])
    np.testing.assert_array_equal(np.asarray(got), interpret(module, np.int32(index), x, y))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("limit", [0, 3])
def test_while_runs_with_fusions_in_its_body(mode, limit):
    module = run_pipeline(counting_loop(limit), parse_pipeline(None)).module
    executable = compile_module(module, mode=mode)
    x = np.array([1.0, -2.0, 0.5], np.float32)
    (got,) = executable([x])
    np.testing.assert_array_equal(np.asarray(got), interpret(module, x))
    text = executable.kernel_source()
    assert "lax.while_loop(" in text and "def loop_body(" in text


@pytest.mark.parametrize("mode", MODES)
def test_a_loop_from_a_constant_start_has_a_trip_count_xla_knows(mode):
    """The loop's start (a constant of the entry) is compiled into the kernel that runs the loop,
    not passed in: XLA then knows the trip count, and XLA:GPU runs the loop without copying its
    condition back to the host each turn."""
    module = counting_loop(5)  # unfused: the start is an instruction of the entry
    executable = compile_module(module, mode=mode)
    x = np.array([1.0, -2.0, 0.5], np.float32)
    name = module.entry if mode == "module" else next(
        i.name for i in module.entry_computation.instructions if i.op is Op.WHILE)
    text = executable.kernels[name].lower(x).compile().as_text()
    assert re.search(r'known_trip_count"?:\{"n":"5"\}', text), "XLA does not know the trip count"
    (got,) = executable([x])
    np.testing.assert_array_equal(np.asarray(got), interpret(module, x))
