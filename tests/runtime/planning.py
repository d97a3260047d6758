"""Independent checks of an executable's buffer plan, shared by the planner tests."""

from __future__ import annotations


def lifetimes(executable):
    """The buffers each value slot refers to (tuple elements tracked exactly), and for every
    buffer the last step reading it or a view of it."""
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
    """No two temporaries alive at once share a byte; an in-place write goes only into an input
    that dies at that step of an in-place step, or into a donated argument no later step reads."""
    plan = executable.plan
    refers, last = lifetimes(executable)
    reads = dict(last)
    for buf, slot in plan.in_place.items():
        step = executable.steps[buf[0]]
        if slot in executable.params:  # a donated argument
            assert executable.params.index(slot) in executable.donated
            read = reads.get(("param", slot), -1)
            assert read < buf[0] or (read == buf[0] and step.in_place), (slot, step.name)
            continue
        assert step.in_place, f"{step.name} is not in-place but was given {slot}"
        assert slot in step.inputs, (step.name, slot)
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
