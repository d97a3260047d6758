"""The parts of a loop split by rows (`fusion.rowsplit`) in a program: while steps next to each
other with one body and one condition, the second reading nothing the first makes (`parts_of`).
`runtime.program.build` runs them at once, one step (`beside_loop`, `parts_step`): each part on a
thread of its own (`run_each`). The slices and broadcasts that only the parts read run as views
that each part copies on its own thread (`read_by_parts_alone`), and a concatenation of one
element of the parts' final states is written by the parts themselves as they end
(`gathered`), so that no copy runs on one thread before or after them. Imports numpy and the
standard library only.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import numpy as np

from .executable import Step
from .library import VIEWS
from .parallel import run_each
from .pool import POOL
from .products import cut_rows, dtype


def parts_of(a: dict, b: dict) -> bool:
    """Whether while steps `a` and `b` are parts of one loop split by rows (`fusion.rowsplit`):
    one body and one condition, and `b` reads nothing `a` makes."""
    return a["op"] == b["op"] == "while" and "computations" in a and a["computations"] == b.get("computations") \
        and not set(b["inputs"]) & set(a["outputs"])


def read_by_parts_alone(program: dict) -> set[int]:
    """Positions of the slice and broadcast steps whose results only the parts of loops split
    by rows read (through tuple elements; none a result of the program): the slices of the
    inputs of a rowsplit loop (`fusion.rowsplit`) and the states it starts from. They run as
    views, and each part copies what it reads into an array of its own on its own thread
    (`control.while_run`; the numba backend's drivers take C-ordered arrays and copy what is
    not, and a copy they made is theirs to write), so the copies run at once instead of one
    after another before the loops."""
    steps = program["steps"]
    parts = {at for at in range(1, len(steps)) if parts_of(steps[at - 1], steps[at])}
    parts |= {at - 1 for at in parts}
    readers: dict[int, list[int]] = {}
    for at, s in enumerate(steps):
        for slot in s["inputs"]:
            readers.setdefault(slot, []).append(at)
    results = set(program["results"])

    def parts_alone(slot: int) -> bool:
        if slot in results:
            return False
        for at in readers.get(slot, ()):
            s = steps[at]
            if at in parts or s["op"] == "alias" and s["kind"] == "element" and all(map(parts_alone, s["outputs"])):
                continue
            return False
        return True

    return {at for at, s in enumerate(steps) if parts and s["op"] == "library" and s["fn"] in VIEWS
            and all(map(parts_alone, s["outputs"]))}


def loops_side_by_side(steps: list[dict]) -> bool:
    """Whether two loops of these steps run at once (`beside_loop`): then, as where kernels
    are split, products run in xfuse's threads, and no BLAS thread spins beside the loops."""
    return any(parts_of(a, b) for a, b in itertools.pairwise(steps))


def beside_loop(steps: list[Step], loop: Step, part_of: bool) -> Step:
    """`loop`, or, when it and the step before are parts of one loop split by rows (`part_of`),
    one step running the parts at once (`parts_step`). The step before is taken off `steps`.
    Other loops run one after another: a small loop would lose more to the hand-off."""
    if not part_of:
        return loop
    last = steps.pop()
    members = [*getattr(last.run, "parts", [(last.run, len(last.inputs))]), (loop.run, len(loop.inputs))]
    return parts_step(f"{last.name}+{loop.name}", members, (*last.inputs, *loop.inputs),
                       (*last.outputs, *loop.outputs), f"{last.label} | {loop.label}")


def parts_step(name: str, members: list, inputs: tuple, outputs: tuple, label: str,
                gather: tuple | None = None) -> Step:
    """One alias step running the parts of a split loop at once (`run_each`), each part
    `(run, count of its inputs)`. `gather`: (element, axis, offsets, dims, dtype, slot) where
    the concatenation of the parts' final states' `element` along `axis` (part k's from
    offsets[k]) is the value `slot` (`gathered`): each part copies its own into that array's
    window on its own thread, as it ends, and the step gives the array after the parts'
    results."""
    starts = [sum(n for _, n in members[:k]) for k in range(len(members))]
    if gather is not None:
        element, axis, offsets, dims, kind, slot = gather
        outputs = (*outputs, slot)

    def run(inputs: list) -> list:
        results: list = [None] * len(members)
        whole = POOL.empty(dims, kind) if gather is not None else None

        def part(k: int) -> Callable[[], None]:
            def go() -> None:
                member, n = members[k]
                results[k] = member(inputs[starts[k]:starts[k] + n])
                if whole is not None:
                    mine = results[k][0][element]
                    np.copyto(cut_rows(whole, axis, offsets[k], offsets[k] + mine.shape[axis]), mine)
            return go

        run_each([part(k) for k in range(len(members))])
        return [out for each in results for out in each] + ([] if whole is None else [whole])

    run.parts = members
    run.gather = gather
    return Step(name, "alias", run, inputs, outputs, label=label)


def gathered(program: dict, at: int, built: list[Step]) -> tuple[int, tuple] | None:
    """(position in `built`, gather) where program step `at` is a concatenation of one element
    of the final states of a split loop's parts (a step of `built` running parts), one after
    another in the parts' order, each element read by the concatenation alone and no result:
    the parts then write it themselves (`parts_step`)."""
    steps, s = program["steps"], program["steps"][at]
    if s["op"] != "library" or s["fn"] != "concatenate" or len(s["outputs"]) != 1:
        return None
    made = {slot: k for k, step in enumerate(built) for slot in step.outputs}
    by_output = {slot: step for step in steps for slot in step["outputs"]}
    operands = [s["inputs"][k] for k in s["attrs"]["operands"]]
    elements = [by_output.get(slot) for slot in operands]
    if any(e is None or e["op"] != "alias" or e["kind"] != "element" for e in elements):
        return None
    states = [e["inputs"][0] for e in elements]
    where = {made.get(slot) for slot in states}
    if len(where) != 1 or None in where:
        return None
    (k,) = where
    step = built[k]
    if getattr(step.run, "parts", None) is None or step.run.gather is not None or list(step.outputs) != states \
            or len({e["index"] for e in elements}) != 1:
        return None
    readers = [slot for other in steps for slot in other["inputs"]]
    if any(readers.count(slot) != 1 for slot in operands) or set(operands) & set(program["results"]):
        return None
    (dims, name), axis, element = s["specs"][0], s["attrs"]["axis"], elements[0]["index"]
    sizes = [by_output[slot]["body"]["param_specs"][element][0][axis] for slot in states]
    offsets = [sum(sizes[:j]) for j in range(len(sizes))]
    if sum(sizes) != dims[axis]:
        return None
    return k, (element, axis, offsets, tuple(dims), dtype(name), s["outputs"][0])


__all__ = ["beside_loop", "gathered", "loops_side_by_side", "parts_of", "parts_step", "read_by_parts_alone"]
