"""What the kernel of a fused computation will be, read from the computation alone: its outputs,
its iteration space (a reduction's, or the output's), whether its loops flatten to one or walk
an operand across its rows, whether its dot can live in its output, and how much work it is
(from which the runtime splits it across threads). `kernels.py` writes the kernel from these.
"""

from __future__ import annotations

import numpy as np

from xfuse.hlo import Computation, DType, Instruction, Kind, Op, Shape, TupleShape

# A kernel is split across threads when its estimated work (`work_estimate`, in units of about
# 0.1 ns on one core) reaches PARALLEL_MIN_WORK: handing a chunk to a pool thread and waiting for
# it costs some 20-40 us (runtime/parallel.py), so a split pays from about 100 us of work.
# Measured on one core and split over two (2 cores, 2 MiB of L2 each): x * 2 + 1 over 2**19 f32
# 158 -> 104 us (jax.jit 68 us), over 2**18 56 -> 52 us, over 2**16 7 -> 32 us; layer norm over
# 2**18 elements in rows of 12, 125 -> 89 us; a sum over rows of 256, 2**18 elements, 11 -> 25
# us; the tanh/sigmoid chain on 2**16 floats, 34 us either way.
PARALLEL_MIN_WORK = 1 << 20
# From this much work a kernel is split when the threads are at hand (backends/numba/handoff.py:
# a worker that ran a chunk watches for the next one for a while, and taking it costs a few
# microseconds, not the pool's 20-40 us); otherwise it runs on one thread and wakes them for the
# next call. Measured on one thread and split over two watching threads (2 cores): the
# tanh/sigmoid chain over 2**16 floats 38 -> 26 us (work 720,896), over 2**15 18.7 -> 17.3 us;
# x * 2 + 1 over 2**18 floats 51 -> 29 us (786,432), over 2**17 15.8 -> 15.0 us (393,216). Not
# for a light reduction (`kernels.Writer.input`): row sums over 1024x256 (786,432) 11 -> 13 us.
WATCHING_MIN_WORK = 1 << 19
# Each 4 bytes a kernel reads (its parameters, once) or writes counts this many units: past the
# L2 an element moved costs more than an element computed (x * 2 + 1 over 2**19 f32 took 0.30 ns
# an element on one core, 0.11 ns over 2**16).
MEMORY_WORK = 1
TRANSCENDENTAL_WORK = 4
TRANSCENDENTAL_OPS = {
    Op.EXP, Op.EXP2, Op.EXPM1, Op.LOG, Op.LOG1P, Op.TANH, Op.LOGISTIC, Op.SIN, Op.COS, Op.TAN,
    Op.ATAN, Op.ATAN2, Op.ERF, Op.ERFC, Op.CBRT, Op.POW,
}  # fmt: skip
# A kernel's row buffer of at most this many bytes lives in its stack frame
# (`scalar.row_buffer`), a longer one in numba's np.empty.
STACK_ROW_BYTES = 1 << 16
# Steps a loop may walk an operand in that fall in one L1 set (see TILE in kernels.py).
ALIASING = 1024


def output_members(comp: Computation) -> list[str]:
    root = comp.root_instruction
    return list(root.operands) if root.op is Op.TUPLE else [root.name]


def output_shapes(comp: Computation) -> list[Shape]:
    shape = comp.result_shape
    return list(shape.elements) if isinstance(shape, TupleShape) else [shape]


def reduction_space(comp: Computation) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """The input kernel's space: its first reduction's (lowering checks that all agree)."""
    return next((space_of(comp, i) for i in comp.instructions if i.info.kind is Kind.REDUCTION), None)


def space_of(comp: Computation, reduction: Instruction) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(S, A) of a reduction: its operand's dims and the axes it reduces."""
    r = reduction
    axes = (r.attr("axis"),) if r.op in (Op.ARGMAX, Op.ARGMIN) else r.attr("axes")
    return comp[r.operands[0]].array_shape.dims, tuple(sorted(axes))


def flattenable(comp: Computation, dims: tuple[int, ...]) -> bool:
    """True when every member is elementwise over `dims` or a scalar broadcast into it."""
    for inst in comp.instructions:
        if inst.op in (Op.PARAMETER, Op.TUPLE):
            continue
        shape = inst.shape
        if not isinstance(shape, Shape):
            return False
        if inst.op is Op.CONSTANT:
            if shape.dims not in ((), dims) or not inst.attr("value").is_splat():
                return False
            continue
        if inst.op is Op.BROADCAST_IN_DIM:
            if comp[inst.operands[0]].array_shape.rank != 0:
                return False
            continue
        if inst.info.kind is not Kind.ELEMENTWISE or shape.dims not in ((), dims):
            return False
        if any(comp[o].array_shape.dims not in ((), dims) for o in inst.operands):
            return False
    return all(p.array_shape.dims in ((), dims) for p in comp.parameters)


def reads_across(comp: Computation) -> bool:
    """Whether a loop over `comp`'s result walks a transpose's operand across its rows, in steps
    of a multiple of ALIASING bytes: a transpose whose last dimension is an outer one of its
    operand, the elements after that one a multiple of ALIASING bytes."""
    for inst in comp.instructions:
        if inst.op is not Op.TRANSPOSE:
            continue
        perm, operand = inst.attr("permutation"), comp[inst.operands[0]].array_shape
        walked = int(perm[-1])
        if walked == len(perm) - 1:
            continue
        step = int(np.prod(operand.dims[walked + 1:], dtype=np.int64)) * operand.dtype.itemsize
        if step % ALIASING == 0:
            return True
    return False


def dot_in_output(comp: Computation, dot: Instruction | None, space) -> bool:
    """Whether the dot's result can live in the output buffer: one output of the dot's own
    shape and type, the dot read only by elementwise ops of that shape and by reductions over
    trailing axes (so each row is read whole, or at the index being written, before that
    index is written), as XLA writes a dot into its output and runs the epilogue in place."""
    if dot is None or space is not None and 0 in space[1]:
        return False
    outputs = output_shapes(comp)
    if len(outputs) != 1 or outputs[0] != dot.shape or dot.shape.dtype not in (DType.F32, DType.F64):
        return False
    for inst in comp.instructions:
        if dot.name not in inst.operands:
            continue
        if inst.info.kind is Kind.REDUCTION:
            continue
        if inst.info.kind is not Kind.ELEMENTWISE or inst.array_shape.dims != dot.array_shape.dims:
            return False
    return True


_ROW_REDUCTIONS = {Op.REDUCE_SUM, Op.REDUCE_PROD, Op.REDUCE_MAX, Op.REDUCE_MIN, Op.REDUCE_AND, Op.REDUCE_OR}


def row_slices(comp: Computation, dot: Instruction | None) -> list[int] | None:
    """For an output fusion, how to cut each parameter so that its kernel can run over rows
    [0, e - s) of a block [s, e) of its result, the dot's block alone computed (the runtime's
    chains): per parameter, in order, the axis its reads walk with the kernel's outer loop
    (slice it there), or -1 where no read depends on that loop (a dot operand only the dot
    reads, a bias broadcast along the rows). None where the kernel's values depend on the
    row's absolute index otherwise (an iota along it, a slice, a gather, a constant array read
    by row) or its outer loop is not the result's first axis.

    Walks back from the output, which the outer loop indexes at axis 0: elementwise operands
    are read at the same index, a broadcast's operand at the axis mapped to it, a reduction's
    (over other axes) at the matching operand axis, the dot's result at axis 0 (the kernel
    reads it relative to `dot_start`)."""
    root = comp.root_instruction
    if dot is None or isinstance(root.shape, TupleShape) or not root.array_shape.rank \
            or root.array_shape.dims[0] != dot.array_shape.dims[0]:
        return None
    axis: dict[str, int | None] = {root.name: 0}  # where the outer loop's index is in each read

    def reach(name: str, at: int | None) -> bool:
        if name in axis and axis[name] != at:
            return False
        axis[name] = at
        return True

    for inst in reversed(comp.instructions):
        if inst.name not in axis or inst.op is Op.PARAMETER:
            continue
        at = axis[inst.name]
        if inst is dot or inst.name == dot.name:
            if at not in (0, None):
                return None
            continue
        if inst.op is Op.CONSTANT:
            if at is not None and inst.array_shape.rank:
                return None  # an array constant, read by absolute row
            continue
        if at is None:
            targets = [(o, None) for o in inst.operands]
        elif inst.info.kind is Kind.ELEMENTWISE:
            targets = [(o, None if not comp[o].array_shape.rank else at) for o in inst.operands]
        elif inst.op is Op.BROADCAST_IN_DIM:
            (operand,) = inst.operands
            dims = list(inst.attr("dims"))
            j = dims.index(at) if at in dims else None
            targets = [(operand, j if j is not None and comp[operand].array_shape.dims[j] > 1 else None)]
        elif inst.op is Op.IOTA and inst.attr("dimension") != at:
            targets = []  # counts along another axis: the same in every row (a causal mask)
        elif inst.op in _ROW_REDUCTIONS:
            axes = sorted(inst.attr("axes"))
            kept = [d for d in range(inst.array_shape.rank + len(axes)) if d not in axes]
            targets = [(inst.operands[0], kept[at])]
        else:
            return None  # an iota along the rows, a slice, a gather, ...: by absolute row
        if not all(reach(o, a) for o, a in targets):
            return None
    return [-1 if axis.get(p.name) is None else axis[p.name] for p in comp.parameters]


def work_estimate(comp: Computation, space) -> int:
    """Elements of the iteration space, times one pass over them (and one more per reduction
    of an input kernel, each making a pass of its own) plus TRANSCENDENTAL_WORK per
    transcendental op; and MEMORY_WORK per 4 bytes the kernel reads and writes: its outputs,
    its parameters, an output fusion's product, not the product's operands (BLAS reads those:
    softmax(relu(x @ w + b)) at 64x512 @ 512x1024 would count w's 2 MiB, and its 33 us
    epilogue was split at a cost of some 40 us)."""
    passes = 1
    if space is not None:
        size = 1
        for d in space[0]:
            size *= d
        passes += sum(1 for i in comp.instructions if i.info.kind is Kind.REDUCTION)
    else:
        size = max((s.size for s in output_shapes(comp)), default=0)
    transcendental = sum(1 for i in comp.instructions if i.op in TRANSCENDENTAL_OPS)
    dot = next((i for i in comp.instructions if i.op is Op.DOT_GENERAL), None)
    read = [p.array_shape for p in comp.parameters
            if dot is None or any(p.name in i.operands for i in comp.instructions if i is not dot)]
    read += [dot.array_shape] if dot is not None else []
    moved = sum(s.size * s.dtype.numpy.itemsize for s in read + output_shapes(comp))
    return size * (passes + TRANSCENDENTAL_WORK * transcendental) + MEMORY_WORK * moved // 4
