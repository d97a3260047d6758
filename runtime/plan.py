"""Buffer planning: where each temporary of an executable lives, from liveness.

Every buffer a step writes is either bound to a result (it, or a view of it, is returned: it
gets memory of its own, handed to the caller) or a temporary. Temporaries live from the step
that writes them to the last step that reads them or any view of them (reshapes, tuples and
tuple elements are views); two temporaries share memory when those intervals do not overlap.
A kernel that may write in place (an elementwise loop reading each input at the index it
writes) takes the buffer of an input that dies at that step, when shape and dtype match; a
donated argument can be taken the same way. Offsets come from first fit over the temporaries
by decreasing size, 64-byte aligned. Standard library only (the plan is numbers).
"""

from __future__ import annotations

ALIGN = 64


class BufferPlan:
    """offsets[(step, k)]: byte offset of step's k-th output in the arena; in_place[(step, k)]:
    the value slot whose buffer that output reuses instead (a dead input or donated argument)."""

    def __init__(self, argument_bytes: int = 0) -> None:
        self.offsets: dict[tuple[int, int], int] = {}
        self.in_place: dict[tuple[int, int], int] = {}
        self.arena_bytes = 0
        self.argument_bytes = argument_bytes
        self.output_bytes = 0
        self.alias_bytes = 0  # donated argument bytes reused for outputs
        self.scratch_bytes = 0  # the largest working buffer a step allocates for itself
        self.unplanned_bytes = 0  # what the temporaries would take without sharing

    @property
    def temp_bytes(self) -> int:
        return self.arena_bytes + self.scratch_bytes


def _aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def make_plan(executable, donated: frozenset[int] = frozenset()) -> BufferPlan:
    """The plan for `executable` (runtime.Executable); `donated`: positions of the parameters
    whose buffers the caller gives up (their contents are undefined after a call)."""
    steps = executable.steps
    params = list(executable.params)
    # The buffers each value slot may refer to: ("param", slot), ("const", slot) or (step, k).
    refers: dict[int, set] = {slot: {("param", slot)} for slot in params}
    refers.update({slot: {("const", slot)} for slot in executable.constants})
    parts: dict[int, list[set]] = {}  # a tuple value's elements, each as the buffers it refers to
    for i, step in enumerate(steps):
        if step.kind == "alias":
            covered = set().union(*(refers.get(v, set()) for v in step.inputs))
            if step.element == -1:
                parts[step.outputs[0]] = [refers.get(v, set()) for v in step.inputs]
            elif step.element is not None and step.inputs[0] in parts:
                covered = parts[step.inputs[0]][step.element]
            for slot in step.outputs:
                refers[slot] = covered
        elif len(step.outputs) == 1 and len(step.out_specs) > 1:  # one tuple of buffers
            refers[step.outputs[0]] = {(i, k) for k in range(len(step.out_specs))}
            parts[step.outputs[0]] = [{(i, k)} for k in range(len(step.out_specs))]
        else:
            for k, slot in enumerate(step.outputs):
                refers[slot] = {(i, k)}
    result_bound = set().union(*(refers.get(r, set()) for r in executable.results))
    last: dict = {}  # buffer -> the last step reading it or a view of it
    for i, step in enumerate(steps):
        for v in step.inputs:
            for buf in refers.get(v, ()):
                last[buf] = i
    specs = executable.param_specs
    plan = BufferPlan(argument_bytes=sum(spec.nbytes for spec in specs if spec is not None))
    donors = {params[p]: specs[p] for p in sorted(donated) if p < len(specs) and specs[p] is not None}
    root: dict = {}  # a buffer written in place -> the buffer whose memory it uses
    temps: list = []
    for i, step in enumerate(steps):
        if step.kind == "alias":
            continue
        plan.scratch_bytes = max(plan.scratch_bytes, step.scratch_bytes)
        for k, spec in enumerate(step.out_specs):
            buf = (i, k)
            if buf in result_bound:
                plan.output_bytes += spec.nbytes
                slot = _donor(step, spec, i, donors, last, result_bound, root)
                if slot is not None:
                    plan.in_place[buf] = slot
                    plan.alias_bytes += spec.nbytes
                    root[buf] = ("param", slot)
                continue
            plan.unplanned_bytes += spec.nbytes
            slot = _dead_input(executable, step, spec, i, refers, last, result_bound, root)
            if slot is not None:
                (source,) = refers[slot]
                plan.in_place[buf] = slot
                root[buf] = root.get(source, source)
                continue
            temps.append(buf)
    # A temporary's memory is busy until the last read of it or of any buffer written into it.
    busy_until = {buf: last.get(buf, buf[0]) for buf in temps}
    for buf, base in root.items():
        if base in busy_until:
            busy_until[base] = max(busy_until[base], last.get(buf, buf[0]))
    intervals = {buf: (buf[0], busy_until[buf], steps[buf[0]].out_specs[buf[1]].nbytes) for buf in temps}
    plan.offsets, plan.arena_bytes = first_fit(intervals)
    for step in steps:  # a step running a whole program natively plans its own buffers
        memory = getattr(step.run, "memory", None) if step.kind == "alias" else None
        if memory is not None:
            plan.output_bytes += memory.output_bytes
            plan.scratch_bytes = max(plan.scratch_bytes, memory.temp_bytes)
            plan.unplanned_bytes += memory.unplanned_bytes
    return plan


def first_fit(intervals: dict) -> tuple[dict, int]:
    """(offset of each buffer, arena bytes) for `intervals`: buffer -> (first step, last step,
    bytes); buffers whose steps overlap never share memory. First fit by decreasing size,
    each buffer 64-byte aligned."""
    offsets, arena = {}, 0
    placed: list[tuple[int, int, int, int]] = []  # (first step, last step, offset, size)
    for buf in sorted(intervals, key=lambda b: (-_aligned(intervals[b][2]), b)):
        start, stop, nbytes = intervals[buf]
        size = _aligned(nbytes)
        offset = 0
        for lo, hi in sorted((o, o + n) for a, b, o, n in placed if a <= stop and start <= b):
            if offset + size <= lo:
                break
            offset = max(offset, hi)
        placed.append((start, stop, offset, size))
        offsets[buf] = offset
        arena = max(arena, offset + size)
    return offsets, arena


class NativeMemory:
    """What a step running a whole program natively holds during a call: its results' bytes,
    its work buffers' arena, and what those buffers would take unshared."""

    def __init__(self, output_bytes: int, temp_bytes: int, unplanned_bytes: int) -> None:
        self.output_bytes, self.temp_bytes, self.unplanned_bytes = output_bytes, temp_bytes, unplanned_bytes


def _same(a, b) -> bool:
    return tuple(a.shape) == tuple(b.shape) and str(a.dtype) == str(b.dtype)


def _dead_input(executable, step, spec, i, refers, last, result_bound, root) -> int | None:
    """The slot of an input of `step` whose temporary buffer dies here and can hold `spec`."""
    if not step.in_place:
        return None
    for slot in step.inputs:
        bufs = refers.get(slot, set())
        if len(bufs) != 1:
            continue
        (buf,) = bufs
        if not isinstance(buf[0], int) or buf in result_bound or last.get(buf) != i:
            continue
        if buf in root.values() or buf in root:
            continue  # one reuse per buffer
        if _same(executable.steps[buf[0]].out_specs[buf[1]], spec):
            return slot
    return None


def _donor(step, spec, i, donors, last, result_bound, root) -> int | None:
    """A donated parameter slot whose buffer can hold this result, or None: read by no later
    step (nor by this one, unless it writes in place), returned by no result, same type."""
    for slot, param_spec in donors.items():
        buf = ("param", slot)
        if buf in root.values() or buf in result_bound:
            continue
        read = last.get(buf, -1)
        if read > i or (read == i and not step.in_place) or not _same(param_spec, spec):
            continue
        return slot
    return None
