"""The numba backend: a fused module to a runtime `Executable`.

Fusions become numba kernels; dots go to BLAS through numpy's matmul; an output fusion runs
its dot a block of rows at a time and applies the epilogue kernel to each block while it is
in cache. Reshapes and tuple elements are views. Any other instruction left unfused is
compiled as a kernel of its own. f16 and bf16 values are computed in f32 inside kernels.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from xfuse.hlo import Computation, DType, Instruction, Module, Op, Shape, TupleShape
from xfuse.runtime import BufferSpec, Executable, Step
from xfuse.runtime.pool import POOL
from xfuse.runtime.parallel import run_rows

from .compile import compile_kernel, settle
from .kernels import KernelSource, flattenable, reduction_space, write_kernel
from .prepare import canonical, inline_calls

NAME = "numba"
# An output fusion's dot result is produced in blocks of about this many bytes. Measured here,
# one BLAS call over all rows then the epilogue beat 1 MiB blocks (OpenBLAS's threads spin
# between calls and slow the epilogue's), so only results past 16 MiB are split.
BLOCK_BYTES = 1 << 24


def compute_numpy(dtype: DType) -> np.dtype:
    return np.dtype(np.float32) if dtype in (DType.F16, DType.BF16) else dtype.numpy


# ---------------------------------------------------------------------------- dots
def dot_plan(lhs: Shape, rhs: Shape, contracting, batch):
    """Transposes that turn a dot_general into a batched matmul (B, M, K) @ (B, K, N)."""
    (lc, rc), (lb, rb) = contracting, batch
    lf = [i for i in range(lhs.rank) if i not in lc and i not in lb]
    rf = [i for i in range(rhs.rank) if i not in rc and i not in rb]
    size = lambda shape, axes: int(np.prod([shape.dims[a] for a in axes])) if axes else 1  # noqa: E731
    b, m, k, n = size(lhs, lb), size(lhs, lf), size(lhs, lc), size(rhs, rf)
    return (list(lb) + lf + list(lc), (b, m, k)), (list(rb) + list(rc) + rf, (b, k, n)), (b, m, n)


def make_dot(lhs: Shape, rhs: Shape, contracting, batch, out_dtype: DType) -> Callable:
    """dot(lhs, rhs, out) for arrays of these shapes (out: the result's dims, contiguous)."""
    (lperm, lshape), (rperm, rshape), oshape = dot_plan(lhs, rhs, contracting, batch)
    work = compute_numpy(out_dtype)

    def dot(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
        a3 = np.transpose(a, lperm).reshape(lshape)
        b3 = np.transpose(b, rperm).reshape(rshape)
        if a3.dtype != work:
            a3, b3 = a3.astype(work), b3.astype(work)
        with np.errstate(all="ignore"):  # inf * 0 is NaN, as in XLA: no warning
            np.matmul(a3, b3, out=out.reshape(a3.shape[0], a3.shape[1], b3.shape[2]))

    return dot


def dot_step(inst: Instruction, comp: Computation, slots: dict, slot: int) -> Step:
    lhs, rhs = (comp[o].array_shape for o in inst.operands)
    fn = make_dot(lhs, rhs, inst.attr("contracting"), inst.attr("batch"), inst.shape.dtype)
    work = compute_numpy(inst.shape.dtype)
    target = inst.shape.dtype.numpy

    def run(inputs, outputs):
        if work == target:
            fn(inputs[0], inputs[1], outputs[0])
        else:
            tmp = np.empty(inst.shape.dims, work)
            fn(inputs[0], inputs[1], tmp)
            outputs[0][...] = tmp.astype(target)

    spec = BufferSpec(inst.shape.dims, target)
    return Step(inst.name, "blas", run, tuple(slots[o] for o in inst.operands), (slot,), (spec,), "dot_general")


# ---------------------------------------------------------------------------- kernels
def kernel_runner(source: KernelSource, comp: Computation) -> Callable:
    """run(inputs, outputs) for a loop or input kernel (no dot)."""
    fn = compile_kernel(source)
    prepare = [_preparer(comp[p].array_shape) for p in source.params]
    finish = [_finisher(s) for s in source.outputs]
    rows, split = source.rows, source.parallel
    first = [True]
    if not split and all(f is _same for f in prepare) and all(f is _AS_IS for f in finish):

        def serial(inputs, outputs):  # the common small case: no conversion, one thread
            fn(0, rows, *inputs, *outputs)
            if first[0]:
                first[0] = False
                settle(fn)

        serial.dispatcher = fn
        return serial

    def run(inputs, outputs):
        args = [f(a) for f, a in zip(prepare, inputs)]
        outs = [f[0](o) for f, o in zip(finish, outputs)]
        run_rows(lambda start, end: fn(start, end, *args, *outs), rows, split)
        for f, o, tmp in zip(finish, outputs, outs):
            f[1](o, tmp)
        if first[0]:  # the first call compiled the kernel or loaded it from the disk cache
            first[0] = False
            settle(fn)

    run.dispatcher = fn
    return run


def _same(a):
    return a


def _preparer(shape: Shape) -> Callable:
    convert = shape.dtype in (DType.F16, DType.BF16)
    scalar = shape.rank == 0
    if not convert and not scalar:
        return _same
    return lambda a: (a.astype(np.float32) if convert else a).reshape(-1) if scalar else a.astype(np.float32)


def _finisher(shape: Shape) -> tuple[Callable, Callable]:
    """(the buffer the kernel writes, copy it into the real output)."""
    convert = shape.dtype in (DType.F16, DType.BF16)
    if convert:
        return (lambda o: np.empty(o.shape, np.float32).reshape(-1) if o.ndim == 0 else np.empty(o.shape, np.float32),
                _narrow)
    if shape.rank == 0:
        return (lambda o: o.reshape(-1), lambda o, tmp: None)
    return _AS_IS


_AS_IS = (_same, lambda o, tmp: None)


def _narrow(out: np.ndarray, wide: np.ndarray) -> None:
    """f32 results into an f16/bf16 output: rounding to nearest, overflow to inf as in XLA."""
    with np.errstate(over="ignore"):
        out[...] = wide.reshape(out.shape).astype(out.dtype)


def output_runner(source: KernelSource, comp: Computation) -> Callable:
    """run(inputs, outputs) for an output fusion: BLAS a block of rows, then the epilogue."""
    fn = compile_kernel(source)
    dot = source.dot
    lhs, rhs = (comp[o].array_shape for o in dot.operands)
    li, ri = (source.params.index(o) for o in dot.operands)
    contracting, batch = dot.attr("contracting"), dot.attr("batch")
    dims = dot.array_shape.dims
    prepare = [_preparer(comp[p].array_shape) for p in source.params]
    finish = [_finisher(s) for s in source.outputs]
    work = compute_numpy(dot.shape.dtype)
    row_bytes = max(1, int(np.prod(dims[1:])) * work.itemsize) if dims else 1
    rows = dims[0] if dims else 1
    block = rows if not source.row_blocked else max(1, min(rows, BLOCK_BYTES // row_bytes))
    split = source.parallel
    (lb, rb) = batch
    lhs_axis = lb[0] if lb else next((i for i in range(lhs.rank) if i not in contracting[0]), None)
    if lhs_axis is None:  # no row axis on the left (a scalar times a vector): one block
        block = rows
    full_dot = make_dot(lhs, rhs, contracting, batch, dot.shape.dtype)
    first = [True]
    in_out = source.dot_in_out and block >= rows and finish[0] is _AS_IS

    def run(inputs, outputs):
        args = [f(a) for f, a in zip(prepare, inputs)]
        outs = [f[0](o) for f, o in zip(finish, outputs)]
        a, b = inputs[li], inputs[ri]
        if block >= rows:
            buf = outs[0] if in_out else POOL.empty(tuple(dims), work)
            full_dot(a, b, buf)
            flat = buf.reshape(-1) if not dims else buf
            run_rows(lambda s, e: fn(s, e, 0, flat, *args, *outs), source.rows, split)
        else:
            buf = POOL.empty((block,) + tuple(dims[1:]), work)
            for start in range(0, rows, block):
                end = min(rows, start + block)
                part = buf[: end - start]
                b_rows = _rows(b, rb[0], start, end) if lb else b
                _block_dot(_rows(a, lhs_axis, start, end), b_rows, part, lhs, rhs, contracting, batch, work)
                run_rows(
                    lambda s, e, start=start, part=part: fn(start + s, start + e, start, part, *args, *outs),
                    end - start,
                    split,
                )
        for f, o, tmp in zip(finish, outputs, outs):
            f[1](o, tmp)
        if first[0]:
            first[0] = False
            settle(fn)

    run.dispatcher = fn
    run.scratch_bytes = 0 if in_out else min(block, rows) * row_bytes
    return run


def _rows(array: np.ndarray, axis: int, start: int, end: int) -> np.ndarray:
    index = [slice(None)] * array.ndim
    index[axis] = slice(start, end)
    return array[tuple(index)]


def _block_dot(a, b, out, lhs, rhs, contracting, batch, work) -> None:
    (lperm, _), (rperm, _), _ = dot_plan(lhs, rhs, contracting, batch)
    (lc, rc), (lb, _) = contracting, batch
    a_t = np.transpose(a, lperm)
    b_t = np.transpose(b, rperm)
    nb = len(lb)
    lf = a.ndim - len(lc) - nb
    bsize = int(np.prod(a_t.shape[:nb])) if nb else 1
    m = int(np.prod(a_t.shape[nb : nb + lf])) if lf else 1
    k = int(np.prod(a_t.shape[nb + lf :])) if len(lc) else 1
    n = int(np.prod(b_t.shape[nb + len(rc) :])) if b_t.ndim > nb + len(rc) else 1
    a3 = a_t.reshape(bsize, m, k)
    b3 = b_t.reshape(bsize, k, n)
    if a3.dtype != work:
        a3, b3 = a3.astype(work), b3.astype(work)
    with np.errstate(all="ignore"):
        np.matmul(a3, b3, out=out.reshape(bsize, m, n))


# ---------------------------------------------------------------------------- module
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


def compile_module(module: Module) -> Executable:
    entry = inline_calls(module, module.entry_computation)
    slots: dict[str, int] = {}
    steps: list[Step] = []
    constants: dict[int, np.ndarray] = {}
    sources: dict[str, str] = {}
    params = []
    for p in entry.parameters:
        slots[p.name] = len(slots)
        params.append(slots[p.name])
    for inst in entry.instructions:
        if inst.op is Op.PARAMETER:
            continue
        slot = slots[inst.name] = len(slots)
        inputs = tuple(slots[o] for o in inst.operands)
        if inst.op is Op.CONSTANT:
            constants[slot] = np.array(inst.attr("value").array)
        elif inst.op in (Op.TUPLE, Op.OPTIMIZATION_BARRIER):
            steps.append(Step(inst.name, "alias", lambda xs: [tuple(xs)], inputs, (slot,),
                              element=-1 if inst.op is Op.TUPLE else None))
        elif inst.op is Op.GET_TUPLE_ELEMENT:
            i = inst.attr("index")
            steps.append(Step(inst.name, "alias", lambda xs, i=i: [xs[0][i]], inputs, (slot,), element=i))
        elif inst.op is Op.RESHAPE:
            dims = inst.shape.dims
            steps.append(Step(inst.name, "alias", lambda xs, d=dims: [xs[0].reshape(d)], inputs, (slot,)))
        elif inst.op is Op.DOT_GENERAL:
            steps.append(dot_step(inst, entry, slots, slot))
        else:
            steps.append(kernel_step(module, entry, inst, inputs, slot, sources))
    results = _results(entry, slots)
    specs = [None if isinstance(p.shape, TupleShape) else BufferSpec(p.shape.dims, p.shape.dtype.numpy)
             for p in entry.parameters]  # a tuple argument (nested executables) has no buffer
    return Executable(params, results, steps, constants, len(slots), sources, specs)


def kernel_step(module: Module, entry: Computation, inst: Instruction, inputs, slot, sources) -> Step:
    if inst.op is Op.FUSION and _plumbing(module[inst.attr("calls")]):
        return nested_step(module, inst, inputs, slot)
    if inst.op is Op.FUSION:
        body = canonical(inline_calls(module, module[inst.attr("calls")]))
        kind = inst.attr("kind")
        label = f"{kind} fusion {body.name}"
    else:
        body = single_op_computation(inst, entry)
        inputs = tuple(dict.fromkeys(inputs))
        kind = "loop"
        label = str(inst.op)
    source = write_kernel(body, kernel_name(inst.name), kind)
    runner = output_runner(source, body) if source.dot is not None else kernel_runner(source, body)
    shapes = list(inst.shape.elements) if isinstance(inst.shape, TupleShape) else [inst.shape]
    specs = tuple(BufferSpec(s.dims, s.dtype.numpy) for s in shapes)
    sources[inst.name] = source.source
    # A loop kernel whose every access is at the index it writes may write over an input.
    in_place = source.dot is None and kind == "loop" and flattenable(body, shapes[0].dims) \
        and all(s.dims == shapes[0].dims for s in shapes)
    return Step(inst.name, "kernel", runner, inputs, (slot,), specs, label, in_place,
                getattr(runner, "scratch_bytes", 0))


def _plumbing(body: Computation) -> bool:
    """A fusion no single kernel can hold (tuples passed around inside it, or a loop fusion
    whose outputs differ in shape): it runs as a nested executable, each op on its own. The
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


def nested_step(module: Module, inst: Instruction, inputs, slot) -> Step:
    body = module[inst.attr("calls")]
    others = tuple(c for c in module.computations if c.name != body.name)
    inner = compile_module(Module(module.name, (*others, body), body.name))
    tupled = isinstance(body.root_instruction.shape, TupleShape)

    def run(xs):
        results = inner(list(xs))
        return [tuple(results) if tupled else results[0]]

    # An alias step to the planner: what it returns was allocated by the inner executable.
    return Step(inst.name, "alias", run, inputs, (slot,), label=f"nested fusion {body.name}")


def _results(entry: Computation, slots: dict[str, int]) -> list[int]:
    root = entry.root_instruction
    if root.op is Op.TUPLE:
        return [slots[o] for o in root.operands]
    return [slots[root.name]]
