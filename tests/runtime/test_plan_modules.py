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


def lifetimes(executable):
    """For every buffer (step, k): the last step reading it or a view of it, tracking tuple
    elements exactly; and the slots each value refers to."""
    refers, parts = {}, {}
    for slot in executable.params:
        refers[slot] = {("param", slot)}
    for slot in executable.constants:
        refers[slot] = {("const", slot)}
    for i, step in enumerate(executable.steps):
        if step.kind == "alias":
            covered = set().union(*(refers.get(v, set()) for v in step.inputs))
            if step.element == -1:
                parts[step.outputs[0]] = [refers.get(v, set()) for v in step.inputs]
            elif step.element is not None and step.inputs[0] in parts:
                covered = parts[step.inputs[0]][step.element]
            refers[step.outputs[0]] = covered
        elif len(step.outputs) == 1 and len(step.out_specs) > 1:
            refers[step.outputs[0]] = {(i, k) for k in range(len(step.out_specs))}
            parts[step.outputs[0]] = [{(i, k)} for k in range(len(step.out_specs))]
        else:
            refers[step.outputs[0]] = {(i, 0)}
    last = {}
    for i, step in enumerate(executable.steps):
        for v in step.inputs:
            for buf in refers.get(v, ()):
                last[buf] = i
    return refers, last


def check_plan(executable) -> None:
    plan = executable.plan
    refers, last = lifetimes(executable)
    reads = dict(last)
    for buf, slot in plan.in_place.items():
        step = executable.steps[buf[0]]
        if slot in executable.params:
            assert executable.params.index(slot) in executable.donated
            continue
        assert step.in_place and slot in step.inputs, (step.name, slot)
        for source in refers[slot]:
            assert reads.get(source, -1) <= buf[0], f"{slot} is read after {step.name} wrote over it"
            last[source] = max(last.get(source, 0), last.get(buf, buf[0]))
    spans = {buf: (buf[0], last.get(buf, buf[0])) for buf in plan.offsets}
    size = {buf: executable.steps[buf[0]].out_specs[buf[1]].nbytes for buf in plan.offsets}
    for a in spans:
        for b in spans:
            if a < b and not (spans[a][1] < spans[b][0] or spans[b][1] < spans[a][0]):
                lo_a, lo_b = plan.offsets[a], plan.offsets[b]
                assert lo_a + size[a] <= lo_b or lo_b + size[b] <= lo_a, (a, b, spans, plan)


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
