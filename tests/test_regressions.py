"""Every case the fuzzer ever found (tests/regressions/*.hlo, each with its .npz of inputs,
expected outputs and error bounds, see tests/fuzz/check.py) runs forever after: on the reference
interpreter, and on every backend with and without the passes, from the HLO text alone."""

from __future__ import annotations

import numpy as np

from tests.fuzz.bounds import Bound
from tests.fuzz.check import BACKENDS, REGRESSIONS, describe, load_regression, save_regression
from tests.fuzz.programs import Program, Step, Value, make_inputs
from xfuse.compiler import compile_module, make_choice
from xfuse.hlo import interpret, parse, verify


def run_case(path) -> list[str]:
    """What disagrees with the case's expected outputs (empty: everything agrees)."""
    text, arrays = load_regression(path)
    module = parse(text)
    verify(module)
    inputs = [arrays[f"input{i}"] for i in range(len(module.entry_computation.parameters))]
    count = sum(1 for key in arrays if key.startswith("want"))
    want = [arrays[f"want{i}"] for i in range(count)]
    bounds = [Bound(arrays[f"err{i}"], arrays[f"wild{i}"]) for i in range(count)]
    result = interpret(module, *inputs)
    problems = describe("interpreter", list(result) if isinstance(result, tuple) else [result], want, bounds)
    for backend in BACKENDS:
        for passes in (None, "none"):
            options = {"mode": "module"} if backend == "jax" and passes else None
            name = f"{backend}{', no passes' if passes else ''}"
            try:
                executable = compile_module(module, make_choice(backend, options=options), passes).executable
                got = [np.asarray(g) for g in executable([np.copy(a) for a in inputs])]
            except Exception as e:  # noqa: BLE001 - reported with the case's name
                problems.append(f"{name} raised {type(e).__name__}: {e}")
                continue
            problems += describe(name, got, want, bounds)
    return problems


def test_every_saved_case_agrees_on_every_backend():
    cases = sorted(REGRESSIONS.glob("*.hlo"))
    assert cases, f"{REGRESSIONS} holds no cases"
    failures = {path.name: problems for path in cases if (problems := run_case(path))}
    assert not failures, failures


def test_the_runner_reports_a_case_whose_expectation_is_not_met(tmp_path):
    """A case saved with a wrong expected output fails on every engine: the runner checks."""
    value = Value("a0", (6,), "float32")
    step = Step(Value("v0", (6,), "float32"), "jnp.tanh(a0) * 2", ("a0",), "lipschitz", ("tanh",))
    program = Program((value,), (step,), ("v0",))
    path = save_regression(program, make_inputs(program, 3, 2), tmp_path)
    assert run_case(path) == []
    npz = path.with_suffix(".npz")
    with np.load(npz) as data:
        arrays = dict(data)
    arrays["want0"] = np.where(np.isfinite(arrays["want0"]), arrays["want0"] + 1, 0.0).astype(np.float32)
    np.savez(npz, **arrays)
    problems = run_case(path)
    assert len(problems) == 1 + 2 * len(BACKENDS), problems
