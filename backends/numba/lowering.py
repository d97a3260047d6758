"""A fused module to a runtime program (`xfuse.runtime.program`): plain data naming its
kernels, whose sources `kernels.write_kernel` writes. Shared by the numba backend (which
compiles the kernel sources with numba) and the C backend (which renders them as C). Fusions
become kernels; dots go to BLAS; reshapes and tuple elements are views; any other instruction
left unfused becomes a kernel of its own. Imports neither numba nor the C toolchain.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from xfuse.hlo import Computation, Instruction, Module, Op, Shape, TupleShape

from .kernels import KernelSource, flattenable, reduction_space, write_kernel
from .prepare import canonical, inline_calls


@dataclass
class Lowered:
    """A program, its constants (key -> array) and its kernels (name -> source)."""

    program: dict
    constants: dict[str, np.ndarray] = field(default_factory=dict)
    kernels: dict[str, KernelSource] = field(default_factory=dict)
    bodies: dict[str, Computation] = field(default_factory=dict)  # kernel name -> computation


def entry(shape: Shape) -> list:
    return [list(shape.dims), shape.dtype.numpy.name]


def single_op_computation(inst: Instruction, comp: Computation) -> Computation:
    """A one-instruction computation, so an unfused op compiles like a fusion."""
    params = []
    names = {}
    for i, o in enumerate(dict.fromkeys(inst.operands)):
        names[o] = f"p{i}"
        params.append(Instruction(f"p{i}", Op.PARAMETER, comp[o].shape, (), (("index", i),)))
    body = inst.replace(name="single", operands=tuple(names[o] for o in inst.operands))
    return Computation(f"single_{inst.op.value}", (*params, body), "single")


def kernel_name(name: str) -> str:
    return "k_" + "".join(c if c.isalnum() else "_" for c in name)


def lower(module: Module, prefix: str = "") -> Lowered:
    """The program of `module`; its kernel names start with `k_` and `prefix`."""
    out = Lowered({})
    out.program = _lower(module, module.entry_computation, out, prefix)
    return out


def _lower(module: Module, comp: Computation, out: Lowered, prefix: str) -> dict:
    body = inline_calls(module, comp)
    slots: dict[str, int] = {}
    steps: list[dict] = []
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
        elif inst.op is Op.FUSION and _plumbing(module[inst.attr("calls")]):
            called = module[inst.attr("calls")]
            inner = _lower(module, called, out, f"{prefix}{inst.name}.")
            tupled = isinstance(called.root_instruction.shape, TupleShape)
            steps.append({"op": "nested", **common, "program": inner, "tupled": tupled,
                          "label": f"nested fusion {called.name}"})
        else:
            steps.append(_kernel_step(module, body, inst, common, out, prefix))
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
                 prefix: str) -> dict:
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
    source = write_kernel(body, name, kind)
    out.kernels[name] = source
    out.bodies[name] = body
    shapes = list(inst.shape.elements) if isinstance(inst.shape, TupleShape) else [inst.shape]
    # A loop kernel whose every access is at the index it writes may write over an input.
    in_place = source.dot is None and kind == "loop" and flattenable(body, shapes[0].dims) \
        and all(s.dims == shapes[0].dims for s in shapes)
    step = {"op": "kernel", **common, "kernel": name, "label": label, "specs": [entry(s) for s in shapes],
            "params": [entry(body[p].array_shape) for p in source.params], "rows": source.rows,
            "parallel": source.parallel, "in_place": in_place, "dot": None}
    dot = source.dot
    if dot is not None:
        lhs, rhs = (body[o].array_shape for o in dot.operands)
        dims, dtype = entry(dot.shape)
        step["dot"] = {"lhs": list(lhs.dims), "rhs": list(rhs.dims), "contracting": _pairs(dot.attr("contracting")),
                       "batch": _pairs(dot.attr("batch")), "dims": dims, "dtype": dtype,
                       "operands": [source.params.index(o) for o in dot.operands],
                       "row_blocked": source.row_blocked, "in_out": source.dot_in_out}
    return step


def _plumbing(body: Computation) -> bool:
    """A fusion no single kernel can hold (tuples passed around inside it, or a loop fusion
    whose outputs differ in shape): it runs as a nested program, each op on its own. The
    fusion pass makes none of these; hand-written or generated modules may."""
    root = body.root_instruction
    if any(isinstance(i.shape, TupleShape) for i in body.instructions if i is not root):
        return True
    if not isinstance(root.shape, TupleShape):
        return False
    if root.op is not Op.TUPLE or any(isinstance(e, TupleShape) for e in root.shape.elements):
        return True
    # A loop kernel writes every output at one index: outputs of other shapes cannot share it;
    # an input kernel writes its outputs over its whole space or once per row.
    dims = {e.dims for e in root.shape.elements}
    space = reduction_space(body)
    if space is None:
        return len(dims) > 1
    full, axes = space
    kept = tuple(d for i, d in enumerate(full) if i not in axes)
    units = tuple(1 if i in axes else d for i, d in enumerate(full))
    return not dims <= {tuple(full), kept, units}


def _results(comp: Computation, slots: dict[str, int]) -> list[int]:
    root = comp.root_instruction
    if root.op is Op.TUPLE:
        return [slots[o] for o in root.operands]
    return [slots[root.name]]
