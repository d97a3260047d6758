"""Scans that one kernel can run: a while that is a counted loop whose every step is
elementwise over one space S, so each element of S can be carried through all the steps on
its own (the time loop inside the element loop) instead of one kernel launch per step.

`scan_loop(module, parent, loop)` returns the `ScanLoop` of `loop` (an instruction of
`parent`) or a string saying why it is not one. The loop is such a scan when:

- the condition is `counter < bound` for an integer state element whose initial value is a
  constant and which the body advances by one: the trip count is known;
- every other state element is invariant (returned as it came), a stack (a
  dynamic_update_slice of itself at one row, [R, *S], read nowhere else: a scan's ys), a
  carry with dims S, or a scalar carry computed from step scalars alone (no f16/bf16: a
  step's result is rounded through memory);
- every value of the body is either a step scalar (from the counter, scalar carries,
  constants and invariant scalars) or elementwise over S: carries, invariants with dims S,
  rows of an invariant [R, *S] at a step-scalar row (a scan's xs[t]), splat constants,
  broadcasts of step scalars and of invariants (a per-feature coefficient), and elementwise
  ops of those.

Imports numpy and xfuse.hlo only.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .dtypes import DType, Shape
from .ir import Computation, Instruction, Module
from .ops import Kind, Op

HALF = (DType.F16, DType.BF16)
# Loops of more steps are taken to leave rows unwritten (the kernel copies the initial stack).
MAX_CHECKED = 1 << 20
# Ops whose value at every step the row check (`_step_values`) computes at once.
STEP_OPS = {Op.ADD, Op.SUB, Op.MUL, Op.NEG, Op.CONVERT_ELEMENT_TYPE, Op.MAX, Op.MIN, Op.CLAMP}


@dataclass(frozen=True)
class Stack:
    """A state element written one row per step: `update` (a body value with dims (1, *S))
    goes to row `row` (a step scalar of the body) of an [R, *S] array."""

    state: int
    update: str
    row: str
    covered: bool  # every row is written by some step (the initial value is never seen)


@dataclass(frozen=True)
class ScanLoop:
    counter: int  # the state element counting the steps
    start: int  # its initial value
    trips: int  # the number of steps
    dims: tuple[int, ...]  # S
    carries: tuple[int, ...]
    invariants: tuple[int, ...]
    stacks: tuple[Stack, ...]
    classes: dict  # body value -> "step", "elem", "row" (dims (1, *S)) or "array"
    scalars: tuple[int, ...] = ()  # scalar carries beside carries over S: step scalars

    @property
    def final_counter(self) -> int:
        return self.start + self.trips

    @property
    def kept(self) -> tuple[int, ...]:
        """The state elements a scan fusion returns: carries and stacks, in state order."""
        return tuple(sorted(self.carries + self.scalars + tuple(s.state for s in self.stacks)))


def scan_loop(module: Module, parent: Computation, loop: Instruction) -> ScanLoop | str:
    """`loop`'s scan, or why it is none (a phrase: "its body computes ...")."""
    cond, body = module[loop.attr("condition")], module[loop.attr("body")]
    counted = _counted(parent, loop, cond, body)
    if isinstance(counted, str):
        return counted
    k, start, trips = counted
    if trips <= 0:
        return "it runs no step"
    params = body.parameters
    root = body.root_instruction
    roles: dict[int, str] = {k: "counter"}
    stacks: list[tuple[int, Instruction]] = []
    for j, (param, result) in enumerate(zip(params, root.operands)):
        if j == k:
            continue
        shape = param.shape
        if not isinstance(shape, Shape):
            return f"state element {j} is a tuple"
        if result == param.name:
            roles[j] = "invariant"
            continue
        if shape.dtype in HALF:
            return f"state element {j} is {shape.dtype.value}, which a step rounds through memory"
        new = body[result]
        if new.op is Op.DYNAMIC_UPDATE_SLICE and new.operands[0] == param.name and shape.rank >= 1:
            roles[j] = "stack"
            stacks.append((j, new))
        else:
            roles[j] = "carry"
    carry_dims = {params[j].array_shape.dims for j, r in roles.items() if r == "carry"}
    stack_dims = {params[j].array_shape.dims[1:] for j, _ in stacks}
    spaces = carry_dims | stack_dims
    if len(spaces) > 1 and () in carry_dims:  # scalar carries beside arrays: step scalars
        spaces.discard(())
        for j, r in roles.items():
            if r == "carry" and params[j].array_shape.rank == 0:
                roles[j] = "scalar"
    if len(spaces) > 1:
        return "its carries and stacked rows differ in shape"
    if not spaces:
        return "it carries nothing from step to step"
    dims = spaces.pop()
    for j, dus in stacks:
        update = body[dus.operands[1]].array_shape
        if update.dims != (1, *dims):
            return f"state element {j} is written {update.dims} at a time, not one row"
    classes = _classify(body, roles, dims, {j: dus.name for j, dus in stacks})
    if isinstance(classes, str):
        return classes
    for j, role in roles.items():
        if role == "carry" and classes[root.operands[j]] not in ("elem", "step"):
            return f"carry {j} is not elementwise"
        if role == "scalar" and classes[root.operands[j]] != "step":
            return f"scalar carry {j} is computed from values that change along S"
    if any(not isinstance(parent[o].shape, Shape) for o in loop.operands):
        return "its initial state holds a tuple"
    counter_values = np.arange(start, start + min(trips, MAX_CHECKED), dtype=np.int64)
    stack_info = []
    for j, dus in stacks:
        rows = _step_values(body, dus.operands[2], params[k].name, counter_values) if trips <= MAX_CHECKED else None
        extent = params[j].array_shape.dims[0]
        covered = rows is not None and np.unique(np.clip(rows, 0, extent - 1)).size == extent
        stack_info.append(Stack(j, dus.operands[1], dus.operands[2], bool(covered)))
    return ScanLoop(
        k, start, trips, dims,
        tuple(j for j, r in roles.items() if r == "carry"),
        tuple(j for j, r in roles.items() if r == "invariant"),
        tuple(stack_info), classes,
        tuple(j for j, r in roles.items() if r == "scalar"),
    )


def _counted(parent: Computation, loop: Instruction, cond: Computation, body: Computation):
    """(counter index, start, trips) of `counter < bound` loops, or why the loop is not one."""
    test = cond.root_instruction
    if test.op is not Op.LT or cond[test.operands[0]].op is not Op.PARAMETER \
            or cond[test.operands[1]].op is not Op.CONSTANT:
        return "its condition is not `counter < constant`"
    k = cond[test.operands[0]].attr("index")
    bound = int(cond[test.operands[1]].attr("value").array)
    root = body.root_instruction
    if root.op is not Op.TUPLE:
        return "its body does not return a tuple"
    counter = body.parameters[k]
    if not isinstance(counter.shape, Shape) or counter.shape.rank or not counter.shape.dtype.is_integer:
        return "its counter is not an integer"
    step = body[root.operands[k]]
    one = [o for o in step.operands if o != counter.name]
    if step.op is not Op.ADD or counter.name not in step.operands or len(one) != 1 \
            or body[one[0]].op is not Op.CONSTANT or int(body[one[0]].attr("value").array) != 1:
        return "its body does not add one to the counter"
    init = parent[loop.operands[k]]
    if init.op is not Op.CONSTANT:
        return "its counter does not start at a constant"
    start = int(init.attr("value").array)
    return k, start, max(bound - start, 0)


def _classify(body: Computation, roles: dict, dims: tuple, stack_writes: dict) -> dict | str:
    """Each body value's class, or why one fits none."""
    classes: dict[str, str] = {}
    writes = set(stack_writes.values())
    root = body.root_instruction
    row = (1, *dims)
    for inst in body.instructions:
        name, op = inst.name, inst.op
        if inst is root:
            continue
        what = f"its body computes {op.value} ({name})"
        if op is Op.PARAMETER:
            j = inst.attr("index")
            role = roles[j]
            shape = inst.array_shape
            if role in ("counter", "scalar") or role == "invariant" and shape.rank == 0:
                classes[name] = "step"
            elif role == "carry" or role == "invariant" and shape.dims == dims:
                classes[name] = "elem"
            elif role == "invariant" and shape.dims[1:] == dims:
                classes[name] = "array"
            elif role == "stack":
                classes[name] = "stack"
            else:
                classes[name] = "other"  # fine while nothing reads it
            continue
        kinds = [classes.get(o) for o in inst.operands]
        if "stack" in kinds and name not in writes:
            return f"a stack is read by {op.value} ({name})"
        if name in writes:
            if kinds[1] != "row" or any(c != "step" for c in kinds[2:]):
                return f"a row is written at an index that changes within the step ({name})"
            classes[name] = "write"
            continue
        if "other" in kinds and op is not Op.BROADCAST_IN_DIM:
            return f"{what} from an invariant that is not over S"
        if "array" in kinds and op is not Op.DYNAMIC_SLICE:
            return f"an invariant array is read by {op.value} ({name})"
        shape = inst.shape
        if not isinstance(shape, Shape):
            return what
        if op is Op.CONSTANT:
            splat = inst.attr("value").is_splat()
            if shape.rank == 0:
                classes[name] = "step"
            elif shape.dims == dims and splat:
                classes[name] = "elem"
            else:
                return f"its body holds a constant of {shape} that is not a splat of S"
        elif op is Op.DYNAMIC_SLICE:
            if kinds[0] != "array" or shape.dims != row or any(c != "step" for c in kinds[1:]):
                return f"{what}, which is not a row of an invariant at the step's index"
            classes[name] = "row"
        elif op is Op.RESHAPE:
            source = body[inst.operands[0]].array_shape.dims
            if kinds[0] == "row" and shape.dims == dims or kinds[0] == "elem" and source == dims and shape.dims == row:
                classes[name] = "elem" if kinds[0] == "row" else "row"
            elif kinds[0] == "step" and dims == () and shape.dims == row:
                classes[name] = "row"  # S = (): a step scalar is the one element's value
            elif kinds[0] == "step" and shape.rank == 0:
                classes[name] = "step"
            else:
                return f"{what} from {source} to {shape.dims}"
        elif op is Op.BROADCAST_IN_DIM:
            source = body[inst.operands[0]]
            if shape.dims != dims or kinds[0] not in ("step", "other") or kinds[0] == "other" and (
                    source.op is not Op.PARAMETER or roles[source.attr("index")] != "invariant"):
                return f"{what} of a value that changes along S"
            classes[name] = "elem"  # a step scalar, or an invariant read at its own index
        elif inst.info.kind is Kind.ELEMENTWISE:
            if shape.dtype in HALF:
                return f"{what} in {shape.dtype.value}, which a kernel computes in f32"
            if all(c == "step" for c in kinds) and shape.rank == 0:
                classes[name] = "step"
            elif all(c in ("elem", "step") for c in kinds) and shape.dims == dims:
                classes[name] = "elem"
            else:
                return f"{what}, which mixes rows or arrays into an elementwise op"
        else:
            return f"{what}, which is not elementwise"
    for j, role in roles.items():
        if role == "stack" and stack_writes.get(j) != root.operands[j]:
            return f"stack {j} is not written in place"
    return classes


def _step_values(body: Computation, name: str, counter: str, values: np.ndarray) -> np.ndarray | None:
    """The value of step scalar `name` at every counter value, or None when it depends on
    anything but the counter and constants through `STEP_OPS`."""
    memo: dict[str, np.ndarray] = {}

    def value(n: str) -> np.ndarray | None:
        if n in memo:
            return memo[n]
        inst = body[n]
        if n == counter:
            result = values.astype(inst.shape.dtype.numpy)
        elif inst.op is Op.CONSTANT:
            result = np.asarray(inst.attr("value").array)
        elif inst.op in STEP_OPS:
            args = [value(o) for o in inst.operands]
            if any(a is None for a in args):
                return None
            with np.errstate(all="ignore"):
                result = np.asarray(inst.info.ref(args, inst.attributes, inst.shape), inst.shape.dtype.numpy)
        else:
            return None
        memo[n] = result
        return result

    result = value(name)
    return None if result is None else np.broadcast_to(result, values.shape).astype(np.int64)
