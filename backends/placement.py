"""Placement: which backend (or registered kernel) runs each top-level instruction.

Before fusion, `outline_kernels` turns every match of a kernel registered for the chosen backend
into a `fusion` of kind `custom` (its computation says what it computes, so the interpreter and
the passes still understand it; the fusion passes leave it whole). After fusion, `place` gives
each top-level instruction to the chosen backend when its capabilities allow, else to the
fallback backend, else raises `UnsupportedError` naming the instruction, the op, the backend and
the source line. When everything lands on the chosen backend, the module compiles whole, as
before; otherwise consecutive instructions with one target become a segment, compiled as a
module of its own, and `PlacedExecutable` runs the segments and kernels in order.

May import xfuse.hlo, numpy and the registry.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from xfuse.hlo import Computation, Instruction, Module, Op, Shape, TupleShape, fresh_name, verify

from .registry import STRUCTURAL, Backend, KernelRegistration, UnsupportedError

CUSTOM = "custom"


@dataclass(frozen=True)
class Decision:
    """Where one top-level instruction runs, and why (for the fusion report)."""

    instruction: str
    what: str  # the op, or the fusion's kind and ops
    target: str  # a backend's name, or "kernel <name>"
    reason: str


# ---------------------------------------------------------------------- before fusion
def outline_kernels(
    module: Module, kernels: Sequence[KernelRegistration]
) -> tuple[Module, dict[str, KernelRegistration], list[Decision]]:
    """Replaces each match of a registered kernel in the entry computation by a custom fusion.
    Returns the module, the registration for each custom computation, and what was replaced."""
    if not kernels:
        return module, {}, []
    entry = module.entry_computation
    taken = {c.name for c in module.computations}
    new_instructions: list[Instruction] = []
    bodies: list[Computation] = []
    chosen: dict[str, KernelRegistration] = {}
    decisions: list[Decision] = []
    for inst in entry.instructions:
        found = None
        if inst.op not in STRUCTURAL:
            for registration in kernels:
                members = _match(registration, entry, inst)
                if members is not None:
                    found = registration, members
                    break
        if found is None:
            new_instructions.append(inst)
            continue
        registration, members = found
        name = fresh_name(f"custom.{registration.name}", taken)
        body, inputs = _outline(entry, inst, members, name)
        bodies.append(body)
        chosen[name] = registration
        attrs = (("kind", CUSTOM), ("calls", name))
        new_instructions.append(inst.replace(op=Op.FUSION, operands=inputs, attrs=attrs))
        ops = ", ".join(dict.fromkeys(entry[m].op.value for m in members))
        decisions.append(Decision(inst.name, ops, f"kernel {registration.name}", _origin(registration)))
    if not bodies:
        return module, {}, []
    new_entry = entry.replace(instructions=tuple(new_instructions))
    computations = [c for c in module.computations if c.name != entry.name]
    outlined = module.replace(computations=(*computations, *bodies, new_entry))
    return outlined, chosen, decisions


def _origin(registration: KernelRegistration) -> str:
    return f"registered by {registration.source}" if registration.source else "registered kernel"


def _match(registration: KernelRegistration, comp: Computation, inst: Instruction) -> list[str] | None:
    if not isinstance(inst.shape, Shape):
        return None
    if registration.dtypes is not None and inst.shape.dtype.value not in registration.dtypes:
        return None
    if registration.op is not None:
        return [inst.name] if inst.op.value == registration.op else None
    found = registration.match(comp, inst)
    if not found:
        return None
    members = list(dict.fromkeys(found))
    if inst.name not in members or any(m not in comp for m in members):
        raise ValueError(
            f"kernel {registration.name!r}: its match returned {members}, which must name "
            f"instructions of {comp.name} including the root {inst.name}"
        )
    if any(comp[m].op is Op.PARAMETER for m in members):
        return None
    return members


def _outline(
    comp: Computation, root: Instruction, members: list[str], name: str
) -> tuple[Computation, tuple[str, ...]]:
    """The computation of `members` (in `comp`'s order), its parameters the values they read."""
    member_set = set(members)
    ordered = [i for i in comp.instructions if i.name in member_set]
    inputs: list[str] = []
    for inst in ordered:
        for operand in inst.operands:
            if operand not in member_set and operand not in inputs:
                inputs.append(operand)
    params = [
        Instruction(n, Op.PARAMETER, comp[n].shape, (), (("index", i),), comp[n].loc)
        for i, n in enumerate(inputs)
    ]
    return Computation(name, (*params, *ordered), root.name), tuple(inputs)


# ---------------------------------------------------------------------- after fusion
@dataclass
class _Segment:
    target: str  # backend name, "kernel", or "host"
    instructions: list[Instruction] = field(default_factory=list)
    registration: KernelRegistration | None = None


def describe(module: Module, inst: Instruction) -> str:
    if inst.op is Op.FUSION:
        body = module[inst.attr("calls")]
        ops = [i.op.value for i in body.instructions if i.op not in STRUCTURAL]
        return f"{inst.attr('kind')} fusion of {', '.join(dict.fromkeys(ops))}"
    return inst.op.value


def place(
    module: Module,
    backend: Backend,
    fallback: Backend | None,
    kernels: dict[str, KernelRegistration],
) -> tuple[list[_Segment] | None, list[Decision]]:
    """The segments to run (None: the whole module runs on `backend`) and the decisions."""
    segments: list[_Segment] = []
    decisions: list[Decision] = []
    whole = True
    for inst in module.entry_computation.instructions:
        if inst.op in (Op.PARAMETER, Op.CONSTANT):  # constants: evaluated once, when built
            continue
        if inst.op in STRUCTURAL:
            target = "host"
        elif inst.op is Op.FUSION and inst.attr("kind") == CUSTOM:
            target, whole = "kernel", False
        else:
            reason = backend.capabilities.refusal(module, inst)
            if reason is None:
                target = backend.name
            else:
                target = _fallback_for(module, inst, backend, fallback, reason)
                whole = False
                decisions.append(Decision(inst.name, describe(module, inst), target, f"{backend.name} refused: {reason}"))
        if target == "kernel":
            segments.append(_Segment("kernel", [inst], kernels[inst.attr("calls")]))
        elif segments and segments[-1].target == target:
            segments[-1].instructions.append(inst)
        else:
            segments.append(_Segment(target, [inst]))
    return (None if whole else segments), decisions


def _fallback_for(
    module: Module, inst: Instruction, backend: Backend, fallback: Backend | None, reason: str
) -> str:
    at = f" at {inst.loc}" if inst.loc else ""
    what = describe(module, inst)
    if fallback is None:
        raise UnsupportedError(
            f"backend {backend.name!r} cannot run {inst.name} ({what}){at}: {reason}; "
            "pass fallback='numba' (or another backend) to run it there"
        )
    second = fallback.capabilities.refusal(module, inst)
    if second is not None:
        raise UnsupportedError(
            f"neither backend {backend.name!r} ({reason}) nor its fallback {fallback.name!r} "
            f"({second}) can run {inst.name} ({what}){at}"
        )
    return fallback.name


def submodule(
    module: Module, segment: list[Instruction], outputs: list[str], name: str
) -> tuple[Module, list[str], list[str], list[int]]:
    """A module computing `outputs` (values defined in `segment`) from the values the segment
    reads, which become its parameters (same names; a tuple value enters as its elements).
    Returns it, its inputs, its flat results and how many of them make each output (0: one
    array; n: a tuple of n)."""
    entry = module.entry_computation
    defined = {i.name for i in segment}
    inputs: list[str] = []
    prologue: list[Instruction] = []
    for inst in segment:
        for operand in inst.operands:
            if operand in defined or operand in inputs or any(c.name == operand for c in prologue):
                continue
            source = entry[operand]
            if source.op is Op.CONSTANT:
                prologue.append(source)
            else:
                inputs.append(operand)
    params, index = [], 0
    for n in inputs:
        shape = entry[n].shape
        if isinstance(shape, TupleShape):  # elements in, the tuple rebuilt inside
            parts = []
            for j, element in enumerate(shape.elements):
                parts.append(Instruction(f"{n}.in{j}", Op.PARAMETER, element, (), (("index", index),)))
                index += 1
            params.extend(parts)
            prologue.append(Instruction(n, Op.TUPLE, shape, tuple(p.name for p in parts)))
        else:
            params.append(Instruction(n, Op.PARAMETER, shape, (), (("index", index),), entry[n].loc))
            index += 1
    leaves, rebuild, epilogue = [], [], []
    for o in outputs:
        shape = entry[o].shape
        if isinstance(shape, TupleShape):
            for j, element in enumerate(shape.elements):
                epilogue.append(Instruction(f"{o}.out{j}", Op.GET_TUPLE_ELEMENT, element, (o,), (("index", j),)))
                leaves.append(f"{o}.out{j}")
            rebuild.append(len(shape.elements))
        else:
            leaves.append(o)
            rebuild.append(0)
    root = Instruction(
        f"{name}.outputs", Op.TUPLE, TupleShape(tuple(_shape(entry, epilogue, v) for v in leaves)), tuple(leaves)
    )
    body = Computation(f"{name}.main", (*params, *prologue, *segment, *epilogue, root), root.name)
    used = _called(module, segment)
    called = [c for c in module.computations if c.name in used]
    sub = Module(name, (*called, body), body.name)
    verify(sub)
    return sub, inputs, leaves, rebuild


def _shape(entry: Computation, epilogue: list[Instruction], name: str):
    for inst in epilogue:
        if inst.name == name:
            return inst.shape
    return entry[name].shape


def _called(module: Module, instructions: Sequence[Instruction]) -> set[str]:
    found: set[str] = set()
    stack = [i for i in instructions]
    while stack:
        inst = stack.pop()
        for name in inst.callees:
            if name in module and name not in found:
                found.add(name)
                stack.extend(module[name].instructions)
    return found


# ---------------------------------------------------------------------- running
@dataclass
class _Run:
    inputs: list[str]
    outputs: list[str]
    run: Callable  # list of input values -> list of output values
    label: str
    host_arrays: bool = True


def build(
    module: Module,
    segments: list[_Segment],
    compile_on: Callable[[str, Module], tuple[Callable, bool]],
) -> PlacedExecutable:
    """Compiles each segment (`compile_on(backend_name, module) -> (executable, host_arrays)`)
    and returns the executable running them in order."""
    entry = module.entry_computation
    later: dict[str, int] = {}  # value -> index of the last segment reading it
    for k, segment in enumerate(segments):
        for inst in segment.instructions:
            for operand in inst.operands:
                later[operand] = k
    later[entry.root] = len(segments)
    runs: list[_Run] = []
    sources: dict[str, str] = {}
    for k, segment in enumerate(segments):
        if segment.target == "host":
            for inst in segment.instructions:
                runs.append(_Run(list(inst.operands), [inst.name], host_run(inst), f"{inst.name} ({inst.op})"))
            continue
        if segment.target == "kernel":
            inst = segment.instructions[0]
            label = f"kernel {segment.registration.name} for {inst.name}"
            runs.append(_Run(list(inst.operands), [inst.name], kernel_run(inst, segment.registration), label))
            continue
        outputs = [i.name for i in segment.instructions if later.get(i.name, -1) > k]
        name = f"{module.name}.part{k}"
        sub, inputs, leaves, rebuild = submodule(module, segment.instructions, outputs, name)
        executable, host_arrays = compile_on(segment.target, sub)
        for key, text in (getattr(executable, "kernel_sources", None) or {}).items():
            sources[f"{segment.target}/{name}/{key}"] = text
        split = any(isinstance(entry[n].shape, TupleShape) for n in inputs)
        run = _regrouping(executable, rebuild, split)
        runs.append(_Run(inputs, outputs, run, f"{name} on {segment.target}", host_arrays))
    constants = {
        i.name: host_run(i)([])[0] for i in entry.instructions if i.op is Op.CONSTANT
    }
    return PlacedExecutable(module, runs, sources, constants)


def _regrouping(executable: Callable, rebuild: list[int], split: bool) -> Callable:
    """Passes tuple inputs as their elements (`split`) and regroups a segment's flat outputs:
    `rebuild[j]` elements make output j (0: one array)."""
    if not split and all(n == 0 for n in rebuild):
        return executable

    def run(args: list) -> list:
        if split:
            args = [x for a in args for x in (a if isinstance(a, tuple) else (a,))]
        flat, grouped, at = executable(args), [], 0
        for n in rebuild:
            grouped.append(flat[at] if n == 0 else tuple(flat[at:at + n]))
            at += max(n, 1)
        return grouped

    return run


class PlacedExecutable:
    """Runs the segments, kernels and plumbing of a placed module in order. The arrays of a
    backend that keeps its own (jax) pass on as they are to a backend that takes them, and as
    numpy arrays to one that wants those."""

    def __init__(self, module: Module, runs: list[_Run], sources: dict[str, str], constants: dict) -> None:
        entry = module.entry_computation
        self.params = [p.name for p in entry.parameters]
        self.tuple_root = isinstance(entry.root_instruction.shape, TupleShape)
        self.root = entry.root
        self.runs = runs
        self.kernel_sources = sources
        self.constants = constants

    def __call__(self, arrays: Sequence[object]) -> list:
        values: dict[str, object] = dict(self.constants)
        values.update(zip(self.params, arrays))
        for run in self.runs:
            args = [values[n] for n in run.inputs]
            if run.host_arrays:
                args = [_host(a) for a in args]
            try:
                produced = run.run(args)
            except Exception as error:
                raise RuntimeError(f"{run.label} failed: {type(error).__name__}: {error}") from error
            values.update(zip(run.outputs, produced))
        result = values[self.root]
        return list(result) if self.tuple_root else [result]


def _host(value: object) -> object:
    if isinstance(value, np.ndarray):
        return value
    if isinstance(value, tuple):
        return tuple(_host(v) for v in value)
    return np.asarray(value)


def host_run(inst: Instruction) -> Callable:
    """Constants, tuples and tuple elements, evaluated by the op table's reference."""
    ref, attrs, shape = inst.info.ref, inst.attributes, inst.shape
    if isinstance(shape, TupleShape):
        return lambda args: [tuple(ref(args, attrs, shape))]
    return lambda args: [np.asarray(ref(args, attrs, shape), shape.dtype.numpy).reshape(shape.dims)]


def kernel_run(inst: Instruction, registration: KernelRegistration) -> Callable:
    """Calls a registered kernel and checks what it returns against the instruction's shape."""
    shape = inst.shape
    expected = shape.elements if isinstance(shape, TupleShape) else (shape,)

    def run(args: list) -> list:
        result = registration.kernel(*args)
        items = tuple(result) if isinstance(shape, TupleShape) else (result,)
        if len(items) != len(expected):
            raise ValueError(f"returned {len(items)} values, expected {len(expected)}")
        arrays = []
        for i, (item, want) in enumerate(zip(items, expected)):
            array = np.asarray(item)
            if array.shape != want.dims or array.dtype != want.dtype.numpy:
                raise ValueError(
                    f"returned {array.dtype}{list(array.shape)} for output {i}, expected {want}"
                )
            arrays.append(array)
        return [tuple(arrays)] if isinstance(shape, TupleShape) else arrays

    return run
