"""A fused module to a runtime program (`xfuse.runtime.program`): plain data naming its
kernels, whose sources `kernels.write_kernel` writes. Shared by the numba backend (which
compiles the kernel sources with numba) and the C backend (which renders them as C). Fusions
become kernels (one that no kernel's single iteration space holds, a nested program; one with
no outputs, just the empty tuple); dots go to BLAS; reshapes and tuple elements are views; any
other instruction left unfused becomes a kernel of its own. Imports neither numba nor the C
toolchain.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from xfuse.hlo import Computation, Instruction, Kind, Module, Op, TupleShape

from .library_steps import LIBRARY_OPS, callback_step, library_step, library_step_of
from .control import control_step, entry, kernel_name, window
from .analysis import flattenable, output_shapes, row_slices, space_of
from .kernels import KernelSource, write_kernel
from .scan import ScanForm, scan_form, write_scan_kernel
from .prepare import canonical, inline_calls


@dataclass
class Lowered:
    """A program, its constants (key -> array) and its kernels (name -> source)."""

    program: dict
    constants: dict[str, np.ndarray] = field(default_factory=dict)
    kernels: dict[str, KernelSource] = field(default_factory=dict)
    bodies: dict[str, Computation] = field(default_factory=dict)  # kernel name -> computation
    fills: bool = True  # lone broadcasts, slices and concatenations as library steps (see `lower`)
    loops: int = 0  # while loops around the program being lowered


def single_op_computation(inst: Instruction, comp: Computation) -> Computation:
    """A one-instruction computation, so an unfused op compiles like a fusion."""
    params = []
    names = {}
    for i, o in enumerate(dict.fromkeys(inst.operands)):
        names[o] = f"p{i}"
        params.append(Instruction(f"p{i}", Op.PARAMETER, comp[o].shape, (), (("index", i),)))
    body = inst.replace(name="single", operands=tuple(names[o] for o in inst.operands))
    return Computation(f"single_{inst.op.value}", (*params, body), "single")


def lower(module: Module, prefix: str = "", fills: bool = True) -> Lowered:
    """The program of `module`; its kernel names start with `k_` and `prefix`. `fills`: a
    broadcast, slices or a concatenation standing alone outside loops is a numpy library step
    (off: a kernel, as the C entry of `aot.emit_c`, which makes no library calls, needs)."""
    out = Lowered({}, fills=fills)
    out.program = _lower(module, module.entry_computation, out, prefix)
    return out


def _lower(module: Module, comp: Computation, out: Lowered, prefix: str, loop_body: bool = False) -> dict:
    body = inline_calls(module, comp)
    slots: dict[str | tuple, int] = {}  # names, and (name, 0) for the array in a 1-tuple
    steps: list[dict] = []
    scans: dict[str, ScanForm] = {}  # scan fusions that run as one kernel, by instruction
    constants: dict[str, str] = {}
    params = []
    for p in body.parameters:
        slots[p.name] = len(slots)
        params.append(slots[p.name])
    for inst in body.instructions:
        if inst.op is Op.PARAMETER:
            continue
        slot = slots[inst.name] = len(slots)
        common = {"name": inst.name, "inputs": [slots[o] for o in inst.operands], "outputs": [slot]}
        if inst.op is Op.CONSTANT:
            key = f"c{len(out.constants)}"
            out.constants[key] = np.array(inst.attr("value").array)
            constants[str(slot)] = key
        elif inst.op in (Op.TUPLE, Op.OPTIMIZATION_BARRIER):
            steps.append({"op": "alias", "kind": "tuple" if inst.op is Op.TUPLE else "barrier", **common})
        elif inst.op is Op.GET_TUPLE_ELEMENT:
            steps.append({"op": "alias", "kind": "element", "index": inst.attr("index"), **common})
        elif inst.op is Op.RESHAPE:
            steps.append({"op": "alias", "kind": "reshape", "dims": list(inst.shape.dims), **common})
        elif inst.op is Op.DOT_GENERAL:
            lhs, rhs = (body[o].array_shape for o in inst.operands)
            dims, dtype = entry(inst.shape)
            steps.append({"op": "dot", **common, "lhs": list(lhs.dims), "rhs": list(rhs.dims),
                          "contracting": _pairs(inst.attr("contracting")), "batch": _pairs(inst.attr("batch")),
                          "dims": dims, "dtype": dtype})
        elif inst.op in LIBRARY_OPS:
            steps.append(library_step(inst, common))
        elif inst.op is Op.CALLBACK:
            operands = [body[o].array_shape for o in inst.operands]
            if isinstance(inst.shape, TupleShape) and len(inst.shape.elements) == 1:
                array = slots[(inst.name, 0)] = len(slots)  # one result: packed as kernels' are, below
                steps.append(callback_step(inst, operands, {**common, "outputs": [array]}))
                steps.append({"op": "alias", "kind": "tuple", **common, "inputs": [array]})
            else:
                steps.append(callback_step(inst, operands, common))
        elif inst.op in (Op.WHILE, Op.CONDITIONAL):
            loop = int(inst.op is Op.WHILE)
            out.loops += loop
            steps.append(control_step(module, inst, common, lambda c, p, b: _lower(module, c, out, p, b), prefix))
            out.loops -= loop
        elif inst.shape == TupleShape(()):
            # No outputs (a fusion whose root is `tuple()`): a kernel writes at least one, and
            # nothing here can be seen, so the step only makes the empty tuple.
            steps.append({"op": "alias", "kind": "tuple", **common, "inputs": []})
        elif out.fills and not out.loops and (fill := _fill(module, body, inst)) is not None:
            # only a broadcast: numpy fills the buffer, no kernel is compiled (inside a loop,
            # its condition and branches included, it stays a kernel, which a native loop calls)
            steps.append(library_step_of("broadcast", fill, inst, common))
        elif out.fills and not out.loops and (copy := _copy(module, inst)) is not None:
            # only slices or a concatenation: numpy copies, no kernel is compiled (as above)
            steps.append(library_step_of(*copy, inst, common))
        elif inst.op is Op.FUSION and _nested(module, inst, scans):
            called = module[inst.attr("calls")]
            inner = _lower(module, called, out, f"{prefix}{inst.name}.")
            tupled = isinstance(called.root_instruction.shape, TupleShape)
            steps.append({"op": "nested", **common, "program": inner, "tupled": tupled,
                          "label": f"nested fusion {called.name}"})
        elif isinstance(inst.shape, TupleShape) and len(inst.shape.elements) == 1:
            # One output in a tuple: the runtime packs a kernel's outputs into a tuple only when
            # there are several, so the kernel writes a slot of its own and a step wraps it.
            array = slots[(inst.name, 0)] = len(slots)
            steps.append(_kernel_step(module, body, inst, {**common, "outputs": [array]}, out, prefix,
                                      scans.get(inst.name)))
            steps.append({"op": "alias", "kind": "tuple", **common, "inputs": [array]})
        else:
            step = _kernel_step(module, body, inst, common, out, prefix, scans.get(inst.name))
            if loop_body and inst.op is Op.FUSION and step["dot"] is None:
                made = window(body, inst, out.bodies[step["kernel"]], step["kernel"], out)
                if made is not None:
                    step["window"] = made
            steps.append(step)
    return {
        "params": params,
        "results": _results(body, slots),
        "n_values": len(slots),
        "steps": steps,
        "constants": constants,
        # a tuple argument (nested programs) has no buffer of its own
        "param_specs": [None if isinstance(p.shape, TupleShape) else entry(p.shape) for p in body.parameters],
    }


def _pairs(value) -> list:
    return [list(v) for v in value]


def _kernel_step(module: Module, comp: Computation, inst: Instruction, common: dict, out: Lowered,
                 prefix: str, scan: ScanForm | None = None) -> dict:
    """A kernel step: a fusion's (a scan fusion's of form `scan`) or an unfused op's."""
    if inst.op is Op.FUSION:
        body = canonical(inline_calls(module, module[inst.attr("calls")]))
        kind = inst.attr("kind")
        label = f"{kind} fusion {body.name}"
    else:
        body = single_op_computation(inst, comp)
        common = {**common, "inputs": list(dict.fromkeys(common["inputs"]))}
        kind = "loop"
        label = str(inst.op)
    name = kernel_name(prefix + inst.name)
    while name in out.kernels:
        name += "_"
    source = write_scan_kernel(module, body, name, scan) if scan is not None else write_kernel(body, name, kind)
    out.kernels[name] = source
    out.bodies[name] = body
    shapes = list(inst.shape.elements) if isinstance(inst.shape, TupleShape) else [inst.shape]
    # A loop kernel whose every access is at the index it writes may write over an input.
    in_place = source.dot is None and kind == "loop" and flattenable(body, shapes[0].dims) \
        and all(s.dims == shapes[0].dims for s in shapes)
    step = {"op": "kernel", **common, "kernel": name, "label": label, "specs": [entry(s) for s in shapes],
            "params": [entry(body[p].array_shape) for p in source.params], "rows": source.rows,
            "parallel": source.parallel, "watching": source.watching, "in_place": in_place, "dot": None,
            "leading": _leading(source, kind, shapes) if scan is None else 0}
    dot = source.dot
    if dot is not None:
        lhs, rhs = (body[o].array_shape for o in dot.operands)
        dims, dtype = entry(dot.shape)
        step["dot"] = {"lhs": list(lhs.dims), "rhs": list(rhs.dims), "contracting": _pairs(dot.attr("contracting")),
                       "batch": _pairs(dot.attr("batch")), "dims": dims, "dtype": dtype,
                       "operands": [source.params.index(o) for o in dot.operands],
                       "row_blocked": source.row_blocked, "in_out": source.dot_in_out,
                       "row_slices": row_slices(body, dot) if source.row_blocked else None}
    return step


def _leading(source, kind: str, shapes: list) -> int:
    """How many rows of a loop kernel make one row of its one result, in order from the first
    (a block of result rows is then a block of kernel rows: `runtime.program.fed`): 1 for a
    loop nest over the result, the row's size for a flattened loop; 0 for any other kernel."""
    if kind != "loop" or source.dot is not None or source.by_rows or len(shapes) != 1 or not shapes[0].dims:
        return 0
    dims = shapes[0].dims
    row = math.prod(dims[1:])
    if source.flat:
        return row if source.rows == dims[0] * row else 0
    return 1 if source.rows == dims[0] else 0


def _fill(module: Module, comp: Computation, inst: Instruction) -> dict | None:
    """The attributes of a `broadcast` library step when `inst` only broadcasts its one operand
    (an unfused broadcast_in_dim, or a fusion holding nothing else), else None."""
    if isinstance(inst.shape, TupleShape) or len(inst.operands) != 1:
        return None
    broadcast = inst
    if inst.op is Op.FUSION:  # a body holding a call holds more than the broadcast: no inlining
        work = [i for i in module[inst.attr("calls")].instructions if i.op is not Op.PARAMETER]
        if len(work) != 1:
            return None
        broadcast = work[0]
    operand = comp[inst.operands[0]].shape
    if broadcast.op is not Op.BROADCAST_IN_DIM or isinstance(operand, TupleShape) \
            or operand.dtype != broadcast.shape.dtype:
        return None
    return {"operand": list(operand.dims), "dims": [int(d) for d in broadcast.attr("dims")],
            "out": list(broadcast.shape.dims)}


def _copy(module: Module, inst: Instruction) -> tuple[str, dict] | None:
    """(library function, attributes) when `inst` only copies its operands: an unfused slice
    or concatenate, or a fusion of slices of its parameters (each output one) or of one
    concatenate of them (the rowsplit's parts of a loop's state, and their results put back
    together), else None. Each saves a kernel's compile (0.15-0.3 s)."""
    if isinstance(inst.shape, TupleShape) and len(inst.shape.elements) < 2:
        return None  # a value in a 1-tuple is a kernel's (see `_lower`)
    if inst.op is Op.FUSION:
        called = inline_calls(module, module[inst.attr("calls")])
        index = {p.name: p.attr("index") for p in called.parameters}
        root = called.root_instruction
        outputs = [called[o] for o in root.operands] if root.op is Op.TUPLE else [root]
        made = {id(i) for i in outputs}
        work = [i for i in called.instructions if i.op is not Op.PARAMETER and i is not root]
        if len(made) != len(outputs) or any(id(i) not in made for i in work):
            return None
    else:
        index = {o: inst.operands.index(o) for o in inst.operands}
        outputs = [inst]
    if any(any(o not in index for o in i.operands) for i in outputs):
        return None  # an output reads something other than a parameter
    if all(i.op is Op.SLICE for i in outputs):
        return "slice", {"slices": [[index[i.operands[0]], list(i.attr("start")), list(i.attr("limit")),
                                     list(i.attr("strides"))] for i in outputs]}
    if len(outputs) == 1 and outputs[0].op is Op.CONCATENATE:
        (concat,) = outputs
        return "concatenate", {"axis": concat.attr("dimension"), "operands": [index[o] for o in concat.operands]}
    return None


def _nested(module: Module, inst: Instruction, scans: dict) -> bool:
    """Whether fusion `inst` runs as a nested program: a scan fusion whose loop the scan
    writer does not run (one it does goes into `scans`), or any other `_plumbing` fusion."""
    called = inline_calls(module, module[inst.attr("calls")])
    if inst.attr("kind") != "scan":
        return _plumbing(called)
    form = scan_form(module, canonical(called))
    if form is not None:
        scans[inst.name] = form
    return form is None


def _plumbing(body: Computation) -> bool:
    """A fusion no single kernel can hold (tuples passed around inside it, or members outside
    the one iteration space a kernel has): it runs as a nested program, each op on its own.
    The fusion pass makes none of these; hand-written or generated modules may."""
    root = body.root_instruction
    if any(isinstance(i.shape, TupleShape) for i in body.instructions if i is not root):
        return True
    if any(i.op in LIBRARY_OPS for i in body.instructions):  # steps of their own, not kernel code
        return True
    if isinstance(root.shape, TupleShape) and (
            root.op is not Op.TUPLE or any(isinstance(e, TupleShape) for e in root.shape.elements)):
        return True
    return not _one_space(body)


def _one_space(body: Computation) -> bool:
    """Whether `body` fits the kernel writer's one iteration space (S, A), which it takes from
    the first reduction, the dot or the first output. The rules the fusion pass keeps
    (`xfuse.fusion.space.check_group`, not imported here): at most one dot, reading
    parameters (BLAS takes them as they are); every reduction over the same (S, A), S the
    dot's result and A among its column axes when there are both; every output on S, on
    K = S without A or on K with unit dims (a loop kernel writes them all at one index); values
    computed from a reduction or the dot kept in their row (the kernel holds one row of them)."""
    dots = [i for i in body.instructions if i.op is Op.DOT_GENERAL]
    reductions = [i for i in body.instructions if i.info.kind is Kind.REDUCTION]
    spaces = {space_of(body, r) for r in reductions}
    outputs = {s.dims for s in output_shapes(body)}
    if len(dots) > 1 or len(spaces) > 1:
        return False
    if not dots and not spaces:
        return len(outputs) <= 1
    if dots and any(body[o].op is not Op.PARAMETER for o in dots[0].operands):
        return False
    full, axes = spaces.pop() if spaces else (dots[0].array_shape.dims, ())
    if dots and (dots[0].array_shape.dims != full or not set(axes) <= _column_axes(body, dots[0])):
        return False
    kept = tuple(d for i, d in enumerate(full) if i not in axes)
    units = tuple(1 if i in axes else d for i, d in enumerate(full))
    row = {full, kept, units}
    if not outputs <= row:
        return False
    reached = {i.name for i in dots + reductions}
    for inst in body.instructions:
        if inst.name not in reached and not reached.intersection(inst.operands):
            continue
        reached.add(inst.name)
        if inst.op in (Op.DOT_GENERAL, Op.TUPLE) or inst.info.kind is Kind.REDUCTION:
            continue
        dims = inst.array_shape.dims
        if dims not in row:
            return False
        if inst.op is Op.BROADCAST_IN_DIM:
            source = body[inst.operands[0]].array_shape.dims
            if not _row_broadcast(source, dims, tuple(inst.attr("dims")), full, axes, row):
                return False
        elif inst.info.kind is not Kind.ELEMENTWISE and inst.op is not Op.RESHAPE:
            return False
    return True


def _column_axes(body: Computation, dot: Instruction) -> set[int]:
    """The axes of a dot's result that come from the rhs free dimensions."""
    rhs = body[dot.operands[1]].array_shape
    (_, contracting), (_, batch) = dot.attr("contracting"), dot.attr("batch")
    free = rhs.rank - len(contracting) - len(batch)
    return set(range(dot.array_shape.rank - free, dot.array_shape.rank))


def _row_broadcast(source, target, dims, full, axes, row) -> bool:
    """A broadcast within a row: from K (or K with unit dims) to S along the kept axes, or
    between row shapes."""
    if target != full:
        return source == target or source in row
    if source == tuple(d for i, d in enumerate(full) if i not in axes):
        return dims == tuple(i for i in range(len(full)) if i not in axes)
    if source == tuple(1 if i in axes else d for i, d in enumerate(full)):
        return dims == tuple(range(len(full)))
    return False


def _results(comp: Computation, slots: dict) -> list[int]:
    root = comp.root_instruction
    if root.op is Op.TUPLE:
        return [slots[o] for o in root.operands]
    return [slots[root.name]]
