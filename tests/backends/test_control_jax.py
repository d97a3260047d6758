"""The jax backend's control flow: `while` as lax.while_loop and `conditional` as lax.switch
with the IR's rule for an index out of range (the last branch, negative ones included, where
lax.switch alone would clamp them to branch 0), in both of the backend's modes."""

from __future__ import annotations

import numpy as np
import pytest

from tests.hlo.test_control import counting_loop, three_way
from xfuse.backends.jax import compile_module
from xfuse.fusion import parse_pipeline, run_pipeline
from xfuse.hlo import interpret

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
