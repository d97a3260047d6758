"""Control-flow steps of a program, run by the runtime itself:

- `while`: {"condition": program, "body": program, "flat": bool, "native"?: name}. The state
  is the step's inputs; while the condition's one result is true, the body maps the state to
  the next one (`flat`: the body returns the elements; otherwise one tuple). The result is the
  final state, one tuple value. `native` names a function among the kernels that runs the
  whole loop (the numba backend compiles some loops so); absent from the kernels, the runtime
  runs the loop.
  `owned`: state elements the body writes in place (a kernel step's `window`: {"target":
  input index, "parts": program computing (update, *starts), "dims", "update_dims"}), which
  the loop copies once before its first iteration.
- `conditional`: {"branches": [program, ...], "tupled": [bool, ...]}. Input 0 is the branch
  index (out of range: the last branch); the other inputs go to the branch. `tupled[k]`: branch
  k returns the elements of a tuple result rather than one value.

Both run as alias steps (their outputs are new values the planner treats as views of their
inputs, which keeps those alive as long as the result). Inside, the nested executables run
with their results borrowed: a state element passed along unchanged is not copied each
iteration. Arrays the body never writes (its parameters) may be passed along that way; only a
nested program's own constants are copied before they leave the step, so no caller ever
writes into them. Imports numpy and the standard library only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np

from .executable import Executable, _root
from .pool import c_ordered


def nested_programs(step: dict) -> Iterator[dict]:
    """The programs a step runs inside itself."""
    if step["op"] in ("nested", "native"):
        yield step["program"]
    elif step["op"] == "while":
        yield step["condition"]
        yield step["body"]
    elif step["op"] == "conditional":
        yield from step["branches"]
    elif "window" in step:
        yield step["window"]["parts"]


def _constant_roots(*executables: Executable) -> set[int]:
    return {id(_root(a)) for ex in executables for a in ex.constants.values()}


def unshared(value, constants: set[int]):
    """`value` with every array over a nested program's constant copied (tuples element-wise)."""
    if isinstance(value, tuple):
        return tuple(unshared(v, constants) for v in value)
    if id(_root(value)) in constants:
        return np.array(value, copy=True)
    return value


def while_run(
    condition: Executable, body: Executable, flat: bool, native: Callable | None = None, owned=()
) -> Callable:
    """run(state) -> [final state as one tuple], for an alias step. `native(state)`, when
    given, runs the whole loop itself (a backend's compiled loop), or returns None to leave it
    to the runtime. `owned`: the state elements the body writes in place (windows), copied
    once before the loop so no caller's array is written. A state element that is a strided
    view (a slice a split loop's part reads, `split_loops.read_by_parts_alone`) is copied into a
    C-ordered array once, not converted by the body's kernels at every iteration."""
    constants = _constant_roots(body)

    def run(state: list) -> list:
        if native is not None:
            final = native(list(state))
            if final is not None:
                return [tuple(final)]
        ordered = [c_ordered(x) for x in state]
        state = [x for x, _ in ordered]
        for k in owned:
            if not ordered[k][1]:  # not a copy made just now
                state[k] = np.array(state[k], copy=True)
        while bool(condition.borrowing_call(state)[0]):
            results = body.borrowing_call(state)
            state = results if flat else list(results[0])
        return [tuple(unshared(v, constants) for v in state)]

    return run


def conditional_run(branches: list[Executable], tupled: list[bool]) -> Callable:
    """run([index, *operands]) -> [the chosen branch's result], for an alias step."""
    constants = _constant_roots(*branches)
    last = len(branches) - 1

    def run(inputs: list) -> list:
        index = int(np.asarray(inputs[0]))
        if not 0 <= index <= last:
            index = last
        results = branches[index].borrowing_call(list(inputs[1:]))
        value = tuple(results) if tupled[index] else results[0]
        return [unshared(value, constants)]

    return run


def window_run(window: dict, parts: Executable) -> Callable:
    """run(inputs) -> [the target input], its window at the (clamped) starts replaced by the
    update, in place; `parts` computes (update, *starts) from the inputs."""
    target, dims, update_dims = window["target"], window["dims"], tuple(window["update_dims"])

    def run(inputs: list) -> list:
        update, *starts = parts.borrowing_call(inputs)
        at = []
        for s, d, u in zip(starts, dims, update_dims):
            first = min(max(int(s), 0), d - u)  # s: a 0-d array or a numpy scalar
            at.append(slice(first, first + u))
        array = inputs[target]
        array[tuple(at)] = update.reshape(update_dims)
        return [array]

    return run


__all__ = ["conditional_run", "nested_programs", "unshared", "while_run", "window_run"]
