"""Native loops for the numba backend: a while whose condition and body are kernels, matrix
products (either operand transposed; a vector by a matrix too: a sampler's gradient), a row
scattered into an array, a scalar fill, branches of those and loops of those (written inline:
a sampler's tree building), with no f16/bf16 and no other nested programs, runs as one
generated `numba.njit` function that calls the kernels itself, so an iteration does not return
to Python; a conditional becomes an if/elif chain. A product of two matrices (a dot, or the
dot of an output fusion) runs in BLAS through numba's `np.dot`, with BLAS's threads when large
(`THREADED_DOT`; never in a part of a loop split by rows); where every product of the loop is
small, BLAS runs them on one thread, and the tiniest (`BLAS_DOT_MIN`), and those of few rows
where the CPU has no AVX-512 (`BLAS_ROWS_MIN`), run in the driver's own loops, as do the small
ones of a loop that has a large one too. A kernel the runtime would split over threads runs on
one thread in a driver: a backward scan's weight-gradient epilogues and bias sums lose less
there than each iteration's return to Python cost. Other loops, and any loop numba fails to
type on its first call, run in the runtime (`xfuse.runtime.control`).

A scan's stacked outputs are written as XLA writes them: a fusion that is only a
dynamic_update_slice of a state element, which the body passes to nothing else and returns in
the same place, writes just the update's window into that element's buffer, which the loop
owns (it copies the initial value once). Otherwise each iteration would copy the whole stack.

`native_loops(program, kernels, constants, bodies)` marks each such while step with `"native": name` and returns
the drivers by name, to be passed to `runtime.program.build` with the kernels. Inside a
driver, every value is an array: a scalar is a one-element vector (as kernels take them), and
each kernel output is a fresh array, so no iteration writes over a value another still reads.
"""

from __future__ import annotations

import hashlib
import itertools
import linecache
import math
import threading
from collections.abc import Callable
from contextlib import nullcontext
from typing import NamedTuple

import numba
import numpy as np
from numba.core.errors import NumbaError

from xfuse.hlo import Computation, Op
from xfuse.runtime import blas, split_loops
from xfuse.runtime.control import unshared
from xfuse.runtime.library import callback_run
from xfuse.runtime.pool import c_ordered
from xfuse.runtime.products import HALF, macs
from xfuse.runtime.program import Kernel, walk

from . import cache, gemm
from .compile import CALLED_SCALAR, HEADER, compile_kernel, settle
from .loop_kernels import (PANEL, ROWS, batched_matmul, matrix_vector, packed_matmul, panels, put_window, scatter_row,
                           small_matmul, small_matmul_t, small_matmul_t_rest, vector_matrix, vector_vector)
from .kernels import write_kernel
from .mathlib.core import SCALEF as AVX512
from .pipeline import DriverCompiler, KernelCompiler, callee_form
from .emitter import clamp_text
from .control import kernel_name, part

# Products up to this many multiply-adds are small: BLAS's threads cost more than such a
# product on these machines (16x256 by 256x256: 39 us on one thread, 0.3 ms with two BLAS
# threads on a busy machine); larger ones go to BLAS through np.dot, with its threads.
SMALL_DOT = 1 << 22
# In a loop, products of more multiply-adds than THREADED_DOT run in BLAS with its threads: a
# training step scanned by optax (128x256 by 256x256, 128x64 by 64x256 a step) 12.0 ms with
# SMALL_DOT there, 9.0 ms with 2**18, an equinox GRU 11.2 against 9.4. The parts of a loop
# split by rows (`fusion.rowsplit`) run every product on their own thread: two parts each
# calling BLAS with its threads fight over the cores (a split GRU: 4.1 ms against 13.2).
THREADED_DOT = 1 << 18
# In a driver whose products are all small, those from BLAS_DOT_MIN multiply-adds and
# BLAS_ROWS_MIN rows go to BLAS too (np.dot), with BLAS set to one thread while the driver runs
# (`blas.single_threaded`). Where numba compiles for AVX-512 (znver4 here), a call costs about
# 0.1 us more than the driver's own loops and BLAS's kernels are faster from 2**12 on (float32,
# one thread: 8x256 by 256x256 in 9.6 us against 16.5 us for `small_matmul_t`, 4x32 by 32x32
# in 0.13 us against 0.29; 1x16 by 16x16 in 0.10 us against 0.04). On an AVX2 EPYC here
# (OpenBLAS runs its Haswell kernels on both), BLAS is slow for a few rows: the driver's loops
# are faster up to 32 rows (8x256 by 256x256 in 15-17 us against 38-45 us for numba's np.dot,
# 16x512 by 512x512 in 140 us against 198, 32x256 by 256x256 in 63 against 73) and slower from
# 64 (64x128 by 128x128 in 37 us against 29, 64x256 by 256x256 in 123 against 107). Where a
# driver has a large product too, BLAS keeps its threads for it, and the small ones stay in
# the driver's loops.
BLAS_DOT_MIN = 1 << 12
BLAS_ROWS_MIN = 1 if AVX512 else 64


ALIASES = ("tuple", "element", "reshape")


def _matrix_product(d: dict) -> bool:
    """A dot the driver can hand to numba's np.dot: matrix times matrix, float32 or float64,
    either operand read transposed (a backward pass's A.T @ B and A @ B.T)."""
    return len(d["lhs"]) == 2 and len(d["rhs"]) == 2 and len(d["contracting"][0]) == 1 \
        and d["batch"] == [[], []] and d["dtype"] in ("float32", "float64")


def _transposed(d: dict) -> tuple[bool, bool]:
    """Whether a matrix product reads its lhs, and its rhs, transposed: A.T @ B contracts the
    lhs's first dimension, A @ B.T the rhs's second."""
    (lc,), (rc,) = d["contracting"]
    return lc == 0, rc == 1


def _vector_product(d: dict) -> str | None:
    """How the driver computes a product with a vector operand (float32 or float64, no batch
    dimensions), the matrix read as it is stored: "matrix_vector" (a @ x, either operand
    order), "vector_matrix" (x @ a) or "vector_vector"; None for any other product."""
    lhs, rhs, (lc, rc) = d["lhs"], d["rhs"], d["contracting"]
    if len(lc) != 1 or d["batch"] != [[], []] or d["dtype"] not in ("float32", "float64"):
        return None
    lc, rc = lc[0], rc[0]
    ranks = (len(lhs), len(rhs))
    if ranks == (1, 1):
        return "vector_vector"
    if ranks == (2, 1):
        return "matrix_vector" if lc == 1 else "vector_matrix"
    if ranks == (1, 2):
        return "vector_matrix" if rc == 0 else "matrix_vector"
    return None


def _batched(d: dict) -> tuple | None:
    """(lhs permutation, rhs permutation, (B, M, K, N)) of a float product no other form
    takes (batch dimensions, operands of rank 3 or more: an ODE solver's tableau times its
    stages), computed as B products of (M, K) by (K, N) after the operands are permuted to
    batch, free, contracting (lhs) and batch, contracting, free (rhs) order; else None."""
    if d["dtype"] not in ("float32", "float64"):
        return None
    (lc, rc), (lb, rb) = d["contracting"], d["batch"]
    lf = [i for i in range(len(d["lhs"])) if i not in lc and i not in lb]
    rf = [i for i in range(len(d["rhs"])) if i not in rc and i not in rb]
    size = lambda dims, axes: math.prod(dims[i] for i in axes)  # noqa: E731
    sizes = (size(d["lhs"], lb), size(d["lhs"], lf), size(d["lhs"], lc), size(d["rhs"], rf))
    return [*lb, *lf, *lc], [*rb, *rc, *rf], sizes


def _driver_product(d: dict) -> bool:
    """Whether a driver computes product `d`: a matrix or vector product of any size, or a
    small one (`SMALL_DOT`) of another form in `batched_matmul`'s plain loops (a large one
    keeps the loop in the runtime, whose BLAS and split products run it faster)."""
    if _matrix_product(d) or _vector_product(d) is not None:
        return True
    form = _batched(d)
    return form is not None and math.prod(form[2]) <= SMALL_DOT


def _packs(d: dict) -> bool:
    """Whether a small product by a right side the loop keeps goes through `packed_matmul`: where
    kernels use 512-bit vectors (`gemm.ENABLED`), neither operand transposed, float32, rows a
    multiple of 8 and columns of 32 (the scanned RNN's parts, 8x256 @ 256x256)."""
    (m, _), n = d["lhs"], d["rhs"][1]
    return gemm.ENABLED and _transposed(d) == (False, False) and d["dtype"] == "float32" \
        and m % ROWS == 0 and n % PANEL == 0


def _contiguous(dims, update_dims) -> bool:
    """Whether a window of `update_dims` is one run of a C-ordered array of `dims` wherever it
    starts: ones, then at most one partial axis, then whole axes (a scan's step of its stack)."""
    for j, u in enumerate(update_dims):
        if u != 1:
            return all(v == d for v, d in zip(update_dims[j + 1:], dims[j + 1:]))
    return True


def _eligible_program(program: dict) -> bool:
    if any(spec is None or spec[1] in HALF for spec in program["param_specs"]):
        return False
    produced = {}
    for step in program["steps"]:
        if step["op"] == "dot":
            if not _driver_product(step):
                return False
            produced[step["outputs"][0]] = "array"
        elif step["op"] == "kernel":
            d = step.get("dot")
            if d is not None and not _driver_product(d):
                return False
            if any(d in HALF for _, d in step["specs"] + step["params"]):
                return False
            for slot in step["outputs"]:
                produced[slot] = "packed" if len(step["specs"]) > 1 else "array"
        elif step["op"] == "conditional":
            if len(set(step["tupled"])) != 1 or not all(_eligible_program(b) for b in step["branches"]):
                return False
            if len({len(b["results"]) for b in step["branches"]}) != 1:
                return False
            produced[step["outputs"][0]] = "packed" if step["tupled"][0] else "array"
        elif step["op"] == "while":
            if not _nested_loop(step):
                return False
            produced[step["outputs"][0]] = "packed"
        elif step["op"] == "library" and (_row_scatter(step) is not None or _scalar_fill(step)):
            produced[step["outputs"][0]] = "array"
        elif step["op"] == "callback":
            produced[step["outputs"][0]] = "packed" if len(step["specs"]) > 1 else "array"
        elif step["op"] == "alias" and step["kind"] in ALIASES:
            kind = step["kind"]
            if kind == "element" and produced.get(step["inputs"][0]) != "packed":
                return False
            if kind == "reshape" and produced.get(step["inputs"][0], "array") != "array":
                return False
            for slot in step["outputs"]:
                produced[slot] = "tuple" if kind == "tuple" else "array"
        else:
            return False
    return all(produced.get(r, "array") == "array" for r in program["results"])


def _nested_loop(step: dict) -> bool:
    """Whether a while inside a driver's program runs inline there: its condition and body
    eligible, and none of its kernels a window (those are the outermost loop's own)."""
    windowed = any(s.get("window") for program in (step["condition"], step["body"]) for s in walk(program))
    return step["flat"] and not windowed and _eligible_program(step["condition"]) \
        and _eligible_program(step["body"])


def _row_scatter(step: dict) -> tuple[bool, bool] | None:
    """(add, clip) of a scatter the driver writes itself (`loop_kernels.scatter_row`): one
    index into the operand's first dimension, the update a whole row of it (x.at[i].set(row),
    as a sampler's trajectory records its momenta), set or added; None for any other."""
    if step["fn"] != "scatter":
        return None
    attrs, (dims, _) = step["attrs"], step["specs"][0]
    whole_row = attrs["update_window_dims"] == list(range(len(dims) - 1))
    if not dims or attrs["inserted_window_dims"] != [0] or attrs["scatter_dims_to_operand_dims"] != [0] \
            or not whole_row or attrs["operand_batching_dims"] or attrs["combine"] not in ("set", "add"):
        return None
    return attrs["combine"] == "add", attrs["mode"] == "clip"


def _scalar_fill(step: dict) -> bool:
    """Whether a library step broadcasts a scalar (a fill the lowering left to numpy)."""
    return step["fn"] == "broadcast" and step["attrs"]["operand"] == []


def eligible(step: dict) -> bool:
    """Whether a while step can run as one numba function."""
    return step["op"] == "while" and step["flat"] and _eligible_program(step["condition"]) \
        and _eligible_program(step["body"])


def _int(value: int) -> str:
    """An int argument of a kernel call typed as the runtime passes it (int64), not as a
    literal: numba compiles a kernel again for each literal signature."""
    return f"np.int64({value})"


def _dims(dims: list) -> str:
    shape = tuple(dims) if dims else (1,)
    return repr(shape)


def _escaping(body: dict) -> tuple[set, bool]:
    """The slots of `body` whose values may become state (the results, and the values they
    are elements or reshapes of), and whether each iteration's new state is only ever values it
    computed, constants, or a slot's own state, so two work buffers by turns suffice: not when
    a result is another slot's state, or a branch's output (a branch may pass a state through),
    which could keep a value past the next iteration."""
    source = {step["outputs"][0]: step["inputs"][0] for step in body["steps"]
              if step["op"] == "alias" and step["kind"] in ("element", "reshape")}
    branched = {slot for step in body["steps"] if step["op"] in ("conditional", "while")
                for slot in step["outputs"]}
    params = body["params"]
    escaping, by_turns = set(), True
    for k, slot in enumerate(body["results"]):
        escaping.add(slot)
        while slot in source:
            slot = source[slot]
            escaping.add(slot)
        if slot in branched or slot in params and params.index(slot) != k:
            by_turns = False
    return escaping, by_turns


def _window(step: dict) -> tuple | None:
    """(state index, update, starts) of a kernel step the lowering made a window
    (`control.window`), else None. `update` is the update's name in the fused computation and
    its dims; `starts` the names of the start indices."""
    w = step.get("window")
    return None if w is None else (w["state"], (w["update"], tuple(w["update_dims"])), w["starts"])


def _permuted(value: str, axes: list[int], dims: tuple) -> str:
    """`value` with its axes in `axes` order, C-ordered, as an array of `dims`."""
    if axes == sorted(axes):
        return f"{value}.reshape({dims})"
    return f"np.ascontiguousarray(np.transpose({value}, {tuple(axes)})).reshape({dims})"


class _Writer:
    """The driver's source: `s<k>` the state, `c<k>` the constants, `<p><slot>` a program's
    values (p: "a" for the condition, "b" for the body). `owned`: the state elements the body
    updates in place, which the driver copies before the loop."""

    def __init__(self, kernels: dict, bodies: dict) -> None:
        self.lines: list[str] = []
        self.constants: list[np.ndarray] = []
        self.kernels = kernels
        self.bodies = bodies
        self.used: dict[str, object] = {}
        self.owned: set[int] = set()
        self.identity: list[str] = []  # what each called kernel computes, for the cache key
        self.invariant: dict[str, int] = {}  # body values that are loop-invariant state: index
        self.transposed: set[int] = set()  # invariant state the driver transposes before the loop
        self.packed: set[int] = set()  # invariant state packed into panels before the loop
        self.scratch: list[tuple] = []  # the work buffers w<k>: (dims, dtype, two of them)
        self.scratch_names: list[str] = []  # the value each work buffer holds, by its name
        self.escaping: set[str] = set()  # body values that may become state (see buffer)
        self.by_turns = True  # whether those may use two buffers by turns
        self.in_branch = 0
        self.one_thread = False  # every product is small: BLAS runs them on one thread
        self.threaded = THREADED_DOT  # products of more multiply-adds run on BLAS's threads
        self.blas_dots = 0  # small products handed to BLAS

    def emit(self, indent: str, line: str) -> None:
        self.lines.append(indent + line)

    def program(self, program: dict, prefix: str, constants: dict, indent: str, body: bool = False,
                args: list[str] | None = None) -> None:
        """The statements of `program` with its parameters bound to `args` (the state)."""
        var = lambda slot: f"{prefix}{slot}"  # noqa: E731
        if body:
            escaping, self.by_turns = _escaping(program)
            self.escaping = {var(slot) for slot in escaping}
        for k, slot in enumerate(program["params"]):
            self.emit(indent, f"{var(slot)} = {args[k] if args is not None else f's{k}'}")
            if body and k < len(program["results"]) and program["results"][k] == slot:
                self.invariant[var(slot)] = k
        for slot, key in program["constants"].items():
            array = np.array(constants[key], order="C")  # writable, as the state it may become
            self.constants.append(array.reshape(1) if array.ndim == 0 else array)
            self.emit(indent, f"{var(slot)} = c{len(self.constants) - 1}")
        for step in program["steps"]:
            ins = [var(i) for i in step["inputs"]]
            window = _window(step) if body else None
            if window is not None:
                self.window(window, step, ins, var(step["outputs"][0]), indent)
            elif step["op"] == "dot":
                self.dot(step, ins[0], ins[1], var(step["outputs"][0]), indent)
            elif step["op"] == "conditional":
                self.conditional(step, ins, var(step["outputs"][0]), constants, indent)
            elif step["op"] == "while":
                self.nested_loop(step, ins, var(step["outputs"][0]), constants, indent)
            elif step["op"] == "library":
                out = var(step["outputs"][0])
                self.buffer(out, *step["specs"][0], indent)
                if _scalar_fill(step):
                    self.emit(indent, f"{out}.reshape(-1)[:] = {ins[0]}[0]")
                else:
                    add, clip = _row_scatter(step)
                    self.emit(indent, f"scatter_row({', '.join(ins)}, {out}, {add}, {clip})")
            elif step["op"] == "callback":
                self.host(step, ins, var(step["outputs"][0]), indent)
            elif step["op"] == "kernel":
                name = f"kernel_{len(self.used)}"
                self.used[name] = kernel = self.kernels[step["kernel"]]
                # the kernel's key (compile.compile_kernel): loops that repeat a computation
                # under other names share their kernels, so their drivers are compiled once
                self.identity.append(f"{name}: {getattr(kernel.fn, '_xfuse_key', None)}")
                packed = len(step["specs"]) > 1
                outs = [f"{var(step['outputs'][0])}_{k}" if packed else var(step["outputs"][k])
                        for k in range(len(step["specs"]))]
                for out, (dims, dtype) in zip(outs, step["specs"]):
                    self.buffer(out, dims, dtype, indent, var(step["outputs"][0]))
                lead = [_int(0), _int(step["rows"])]
                if step.get("dot") is not None:  # an output fusion: the dot first, then the epilogue
                    d = step["dot"]
                    li, ri = d["operands"]
                    self.dot(d, ins[li], ins[ri], f"{outs[0]}_dot", indent)
                    lead += [_int(0), f"{outs[0]}_dot"]
                self.emit(indent, f"{name}({', '.join(lead + ins + outs)})")
            elif step["kind"] == "element":
                self.emit(indent, f"{var(step['outputs'][0])} = {ins[0]}_{step['index']}")
            elif step["kind"] == "reshape":
                self.emit(indent, f"{var(step['outputs'][0])} = {ins[0]}.reshape({_dims(step['dims'])})")
            # a tuple is the body's root: its elements are read as the results

    def buffer(self, name: str, dims, dtype, indent: str, value: str | None = None) -> None:
        """`name` bound to a buffer for a value computed in the loop (`value`: the slot it
        belongs to, if not `name` itself). Work buffers are made by `Driver.prepare` for each
        call, rather than by numba's np.empty in every iteration, which costs a compile of its
        own for each shape's rank and dtype (0.05-0.14 s each, once a process). A value that
        may become state has two, used by turns: an iteration's new state is written into the
        one the state it replaces does not hold. Values inside a branch, and every value of a
        body that could keep a state value longer than an iteration, use np.empty."""
        escapes = (value or name) in self.escaping
        dtype = np.dtype(dtype).name
        if self.in_branch or escapes and not self.by_turns:
            self.emit(indent, f"{name} = np.empty({_dims(dims)}, np.{dtype})")
            return
        self.scratch.append((tuple(dims) or (1,), dtype, escapes))
        self.scratch_names.append(name)
        k = len(self.scratch) - 1
        self.emit(indent, f"{name} = w{k}_1 if turn else w{k}_0" if escapes else f"{name} = w{k}")

    def host(self, step: dict, ins: list[str], out: str, indent: str) -> None:
        """A host callback: numba's object mode calls the runtime's run of the step (about 2 us
        a call), which writes the outputs, made here; the driver is then not cached, as its
        globals are this process's functions, and holds the GIL (`_compile`)."""
        name = f"host_{len(self.used)}"
        self.used[name] = Host(callback_run(step))
        self.identity.append(f"{name}: None")
        outs = [f"{out}_{k}" for k in range(len(step["specs"]))] if len(step["specs"]) > 1 else [out]
        for value, (dims, dtype) in zip(outs, step["specs"]):
            self.buffer(value, dims, dtype, indent, out)
        self.emit(indent, "with numba.objmode():")
        self.emit(indent + "    ", f"{name}(({''.join(i + ', ' for i in ins)}), ({''.join(o + ', ' for o in outs)}))")

    def conditional(self, step: dict, ins: list[str], out: str, constants: dict, indent: str) -> None:
        """An if/elif chain over the branches (an index out of range takes the last); each
        assigns the same names, `out` or `out_<k>` for the elements of a tuple."""
        branches = step["branches"]
        last = len(branches) - 1
        self.emit(indent, f"{out}_index = np.int64({ins[0]}[0])")
        for k, branch in enumerate(branches):
            test = "else:" if k == last else f"{'if' if k == 0 else 'elif'} {out}_index == {k}:"
            self.emit(indent, test)
            inner = indent + "    "
            prefix = f"{out}_b{k}_"
            self.in_branch += 1
            self.program(branch, prefix, constants, inner, args=ins[1:])
            self.in_branch -= 1
            results = branch["results"]
            names = [f"{out}_{j}" for j in range(len(results))] if step["tupled"][k] else [out]
            for name, slot in zip(names, results):
                self.emit(inner, f"{name} = {prefix}{slot}")

    def nested_loop(self, step: dict, ins: list[str], out: str, constants: dict, indent: str) -> None:
        """A while inside the program, inline: its state `out_<k>` (the elements of the
        step's one tuple value), its condition and body with buffers of their own each
        iteration (as a branch's), so no iteration writes over a value another reads."""
        state = [f"{out}_{k}" for k in range(len(ins))]
        self.emit(indent, f"{', '.join(state)}{',' if len(state) == 1 else ''} = {', '.join(ins)}")
        self.emit(indent, "while True:")
        inner = indent + "    "
        self.in_branch += 1
        self.program(step["condition"], f"{out}_a", constants, inner, args=state)
        (flag,) = step["condition"]["results"]
        self.emit(inner, f"if not {out}_a{flag}[0]:")
        self.emit(inner + "    ", "break")
        self.program(step["body"], f"{out}_b", constants, inner, args=state)
        results = ", ".join(f"{out}_b{r}" for r in step["body"]["results"])
        self.emit(inner, f"{', '.join(state)}{',' if len(state) == 1 else ''} = {results}")
        self.in_branch -= 1

    def dot(self, d: dict, lhs: str, rhs: str, out: str, indent: str) -> None:
        self.buffer(out, d["dims"], d["dtype"], indent)
        vector = _vector_product(d)
        if vector is None and not _matrix_product(d):
            lhs_axes, rhs_axes, (b, m, k, n) = _batched(d)
            a = _permuted(lhs, lhs_axes, (b, m, k))
            self.emit(indent, f"batched_matmul({a}, {_permuted(rhs, rhs_axes, (b, k, n))}, {out}.reshape({(b, m, n)}))")
            return
        if vector is not None:
            matrix, other = (lhs, rhs) if len(d["lhs"]) == 2 else (rhs, lhs)
            if vector == "vector_vector":
                self.emit(indent, f"vector_vector({lhs}, {rhs}, {out})")
            elif vector == "matrix_vector":
                self.emit(indent, f"matrix_vector({matrix}, {other}, {out})")
            else:
                self.emit(indent, f"vector_matrix({other}, {matrix}, {out})")
            return
        lhs_t, rhs_t = _transposed(d)
        m, k = reversed(d["lhs"]) if lhs_t else d["lhs"]
        n = d["rhs"][0] if rhs_t else d["rhs"][1]
        a, b = f"{lhs}.T" if lhs_t else lhs, f"{rhs}.T" if rhs_t else rhs  # views, no copies
        packs = rhs in self.invariant and _packs(d)  # packed once: faster than BLAS's threads
        if m * n * k > SMALL_DOT or m * n * k > self.threaded and not packs:
            self.emit(indent, f"np.dot({a}, {b}, {out})")
        elif packs:
            state = self.invariant[rhs]
            self.packed.add(state)
            self.emit(indent, f"packed_matmul({lhs}, {rhs}, p{state}, {out})")
        elif self.one_thread and m * n * k >= BLAS_DOT_MIN and m >= BLAS_ROWS_MIN:
            self.blas_dots += 1
            self.emit(indent, f"np.dot({a}, {b}, {out})")
        elif rhs in self.invariant or rhs_t:
            # a @ bt.T: bt is the invariant right side transposed once before the loop, or the
            # right side itself where the product reads it transposed
            bt = rhs if rhs_t else f"t{self.invariant[rhs]}"
            if not rhs_t:
                self.transposed.add(self.invariant[rhs])
            self.emit(indent, f"small_matmul_t({a}, {bt}, {out})")
            if m % 4 or n % 2:
                self.emit(indent, f"small_matmul_t_rest({a}, {bt}, {out})")
        else:
            self.emit(indent, f"small_matmul({a}, {b}, {out})")

    def window(self, window: tuple, step: dict, ins: list[str], out: str, indent: str) -> None:
        """The update computed (or read) and copied into the state element's own buffer."""
        k, (update, update_dims), starts = window
        body = self.bodies[step["kernel"]]
        index = {p.name: j for j, p in enumerate(body.parameters)}
        dims = step["specs"][0][0]
        self.owned.add(k)
        values = {}
        computed = [name for name in dict.fromkeys(starts) if name not in index and body[name].op is not Op.CONSTANT]
        for name in dict.fromkeys(starts):
            if name in index:
                values[name] = f"{ins[index[name]]}[0]"
            elif body[name].op is Op.CONSTANT:
                values[name] = str(int(body[name].attr("value").array))
        if computed:
            outs = [f"{out}_i{j}" for j in range(len(computed))]
            for o, name in zip(outs, computed):
                self.buffer(o, (1,), body[name].array_shape.dtype.numpy, indent)
                values[name] = f"{o}[0]"
            self.call(part(body, computed, f"{step['kernel']}_starts"), ins + outs, indent)
        if body[update].op is Op.RESHAPE and body[update].operands[0] in index:
            update = body[update].operands[0]  # the same elements in the same order
        if update in index:
            source = ins[index[update]]
        else:
            source = f"{out}_update"
            dtype = body[update].array_shape.dtype.numpy.name
            self.buffer(source, update_dims, dtype, indent)
            self.call(part(body, [update], f"{step['kernel']}_update"), ins + [source], indent)
        for j, (name, d, u) in enumerate(zip(starts, dims, update_dims)):
            self.emit(indent, f"{out}_st{j} = {clamp_text(f'np.int64({values[name]})', 0, d - u)}")
        self.emit(indent, f"{out} = s{k}")
        if _contiguous(dims, update_dims):  # one run of the flat buffer: copied in place
            strides = [math.prod(dims[j + 1:]) for j in range(len(dims))]
            at = " + ".join(f"{out}_st{j} * {stride}" for j, stride in enumerate(strides)) or "0"
            self.emit(indent, f"{out}_to, {out}_from, {out}_at = {out}.reshape(-1), {source}.reshape(-1), {at}")
            self.emit(indent, f"for {out}_j in range({math.prod(update_dims)}):")
            self.emit(indent + "    ", f"{out}_to[np.uint64({out}_at + {out}_j)] = {out}_from[np.uint64({out}_j)]")
            return
        starts_text = ", ".join(f"{out}_st{j}" for j in range(len(starts)))
        self.emit(indent, f"put_window({out}.reshape(-1), {source}.reshape(-1), np.array([{starts_text}]), "
                          f"{tuple(dims)}, {tuple(update_dims)})")

    def call(self, part: Computation, args: list[str], indent: str) -> None:
        """A kernel of its own for part of a fusion, compiled now."""
        source = write_kernel(part, kernel_name(part.name), "loop")
        name = f"kernel_{len(self.used)}"
        self.used[name] = Kernel(fn := compile_kernel(source), settle)
        self.identity.append(f"{name}: {fn._xfuse_key}")
        self.emit(indent, f"{name}({_int(0)}, {_int(source.rows)}, {', '.join(args)})")


def write_driver(step: dict, kernels: dict, constants: dict, name: str,
                 bodies: dict | None = None, part: bool = False) -> Driver:
    """The driver of a while step; `bodies` (kernel name -> fused computation) lets windows
    be written in place and the driver be cached. `part`: the step is a part of a loop split
    by rows, run beside the others: its products run on its own thread."""
    n = len(step["inputs"])
    writer = _Writer(kernels, bodies or {})
    writer.threaded = math.inf if part else THREADED_DOT
    writer.one_thread = all(macs(d) <= writer.threaded for d in products(step["condition"], step["body"]))
    writer.lines.append("    while True:")
    writer.program(step["condition"], "a", constants, "        ")
    (flag,) = step["condition"]["results"]
    writer.lines.append(f"        if not a{flag}[0]:")
    writer.lines.append("            break")
    writer.program(step["body"], "b", constants, "        ", body=True)
    results = ", ".join(f"b{r}" for r in step["body"]["results"])
    writer.lines.append(f"        {', '.join(f's{k}' for k in range(n))} = {results}{',' if n == 1 else ''}")
    if any(turns for _, _, turns in writer.scratch):
        writer.lines.insert(0, "    turn = 0")
        writer.lines.append("        turn = 1 - turn")
    state = ", ".join(f"s{k}" for k in range(n))
    # The copies of the state the body writes in place and the transposes of invariant right
    # sides are made by numpy before the call (`prepare`): in numba they cost a compile each
    # (a transposed array's ascontiguousarray, 0.3-0.5 s) for work done once.
    owned, transposed, packed = sorted(writer.owned), sorted(writer.transposed), sorted(writer.packed)
    arguments = ", ".join([f"s{k}" for k in range(n)] + [f"c{k}" for k in range(len(writer.constants))]
                          + [f"t{k}" for k in transposed] + [f"p{k}" for k in packed]
                          + [w for k, (_, _, turns) in enumerate(writer.scratch)
                             for w in ([f"w{k}_0", f"w{k}_1"] if turns else [f"w{k}"])])
    header = f"def {name}({arguments}):"
    footer = f"    return ({state}{',' if n == 1 else ''})"
    source = "\n".join([header, *writer.lines, footer]) + "\n"
    return Driver(source, writer.used, writer.constants, writer.identity, owned, transposed, writer.scratch,
                  writer.blas_dots > 0, packed)


def products(*programs: dict) -> list[dict]:
    """Every product a driver of `programs` computes: their dots and the dots of their output
    fusions, nested programs' included."""
    return [d for program in programs for s in walk(program)
            if (d := s if s["op"] == "dot" else s.get("dot") if s["op"] == "kernel" else None) is not None]


class Host(NamedTuple):
    """A host callback a driver calls from object mode: run(inputs, outputs)."""

    run: Callable


class Driver(NamedTuple):
    """A loop's driver: its source, the kernels it calls by global name, the constant arrays
    it takes, what each of those kernels computes, the state elements `prepare` copies (the
    body writes them in place), transposes and packs (invariant right sides of products), and
    its work buffers (`_Writer.buffer`)."""

    source: str
    used: dict
    constants: list
    identity: list
    owned: list
    transposed: list
    scratch: list
    one_thread: bool = False  # runs with BLAS on one thread (its small products are BLAS's)
    packed: list = []  # invariant right sides packed into panels (`loop_kernels.panels`)

    def prepare(self, flat: list, fresh: list) -> list:
        """The driver's arguments from the loop state (C-contiguous, writable; `fresh`: which
        are copies made for this call, the driver's to write), with fresh work buffers: the
        final state may be in them, and goes to the caller (each buffer an array of its own, so
        a result keeps no other buffer alive)."""
        flat = [x.copy() if k in self.owned and not fresh[k] else x for k, x in enumerate(flat)]
        work = [np.empty(dims, dtype) for dims, dtype, turns in self.scratch for _ in range(1 + turns)]
        return flat + self.constants + [np.ascontiguousarray(flat[k].T) for k in self.transposed] \
            + [panels(flat[k]) for k in self.packed] + work


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:24]


# A driver calls each kernel, and the helpers above, through copies compiled as callees only:
# without the wrappers numba makes for calls from Python and from C, and without machine code
# of their own, which would be made for nothing (`pipeline.callee_form`; the scanned RNN
# compiled cold in 0.15-0.2 s less without the wrappers). The kernel itself stays for the
# runtime, should the loop fall back to it. The driver is called from Python only.
DRIVER = {"error_model": "numpy", "nogil": True, "no_cfunc_wrapper": True}
HELPERS = {fn.py_func.__name__: callee_form(fn)
           for fn in (small_matmul, small_matmul_t, small_matmul_t_rest, packed_matmul, put_window,
                      matrix_vector, vector_matrix, vector_vector, scatter_row, batched_matmul)}


def _identified(identity: list[str]) -> bool:
    """Whether every kernel a driver calls is known by what it computes (see `_Writer`)."""
    return not any(line.endswith(": None") for line in identity)


def _compile(source: str, name: str, used: dict, identity: list[str]) -> Callable:
    """The driver's numba function. Compiling it takes seconds (numba types and lowers every
    kernel call again), so it goes through the kernel cache when every kernel it calls is
    known by what it computes: the entry's text names them."""
    callees = {key: kernel.run if isinstance(kernel, Host) else callee_form(kernel.fn, KernelCompiler)
               for key, kernel in used.items()}
    namespace = {"np": np, "numba": numba, **HELPERS, "scalar": CALLED_SCALAR, **callees}
    # a driver that calls back into Python holds the GIL, as the callback needs it
    options = dict(DRIVER, nogil=not any(isinstance(kernel, Host) for kernel in used.values()))
    text = HEADER + "".join(f"# {line}\n" for line in identity) + source
    entry = cache.open_entry(name, text) if _identified(identity) else None
    if entry is not None:
        try:
            loaded = cache.load_module(entry, namespace)
        except (OSError, SyntaxError):
            entry = None
        else:
            fn = numba.njit(**options, cache=True, pipeline_class=DriverCompiler)(loaded[name])
            fn._xfuse_entry = entry
            return fn
    filename = f"<xfuse-native-loop {name} {_digest(source)[:12]}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    exec(compile(source, filename, "exec"), namespace)
    return numba.njit(**options, cache=False, pipeline_class=DriverCompiler)(namespace[name])


_SETTLING = threading.Lock()


def _load_np_dot_blas() -> None:
    """Loads the BLAS that numba's np.dot calls, scipy's (through scipy.linalg.cython_blas),
    before the driver's first call, and has `blas` find it: it is another OpenBLAS than numpy's,
    and `blas.single_threaded` sets only those it knows to one thread."""
    try:
        import scipy.linalg.cython_blas  # noqa: F401
    except ImportError:  # numba's np.dot needs scipy: without it the loop runs in the runtime
        return
    blas.rescan()


def _driver(step: dict, driver: Driver, name: str) -> Callable:
    """run(state) -> the final state (a list), or None when numba cannot compile the loop;
    `driver`: the loop's, written as `name`."""
    source, used, arrays, identity = driver.source, driver.used, driver.constants, driver.identity
    specs = step["body"]["param_specs"]
    state_dims = [tuple(dims) for dims, _ in specs]
    fn = _compile(source, name, used, identity)
    if driver.one_thread:
        _load_np_dot_blas()
    owned = {id(a) for a in arrays}
    first, failed = [True], [False]

    def run(state: list) -> list | None:
        if failed[0]:
            return None
        # C-ordered and writable, as numba types every value of the loop; a copy made here (of
        # a view that a part of a split loop reads) is the driver's to write
        arrays = [c_ordered(x, writable=True) for x in state]
        flat = [np.ascontiguousarray(x).reshape(dims or (1,)) for (x, _), dims in zip(arrays, state_dims)]
        try:
            with blas.single_threaded() if driver.one_thread else nullcontext():
                final = fn(*driver.prepare(flat, [copied for _, copied in arrays]))
        except NumbaError:  # a loop numba cannot type: the runtime runs it instead
            failed[0] = True
            return None
        if first[0]:  # compiled (with its callees) or loaded from the disk cache
            with _SETTLING:  # the parts of a split loop share the driver: one of them settles it
                if first[0]:
                    first[0] = False
                    settle(fn)
        return [unshared(x, owned).reshape(dims) for x, dims in zip(final, state_dims)]

    run.source, run.driver = source, driver
    return run


def native_loops(program: dict, kernels: dict, constants: dict, bodies: dict | None = None) -> dict[str, Kernel]:
    """Drivers for every eligible while step of `program` (nested ones too), each step marked
    with its driver's name. `bodies`: the lowering's fused computation of each kernel."""
    drivers: dict[str, Kernel] = {}
    seen: dict[str, str] = {}  # what a driver is (`key` below) -> its name
    top = program["steps"]  # loops split by rows are the program's own (`fusion.rowsplit`)
    parts = {id(s) for a, b in itertools.pairwise(top) if split_loops.parts_of(a, b) for s in (a, b)}
    for step in walk(program):
        if not eligible(step):
            continue
        name = "loop_" + "".join(c if c.isalnum() else "_" for c in step["name"]) + f"_{len(drivers)}"
        # Loops whose drivers are the same text (but for their names) calling kernels that
        # compute the same (the parts of a loop split by rows) share one: it is compiled once.
        driver = write_driver(step, kernels, constants, name, bodies, part=id(step) in parts)
        known = _identified(driver.identity)
        text = "\n".join([driver.source.replace(f"def {name}(", "def loop(", 1), *driver.identity])
        key = cache.kernel_key(text, {str(k): a for k, a in enumerate(driver.constants)})
        if known and key in seen:
            step["native"] = seen[key]
            continue
        drivers[name] = Kernel(_driver(step, driver, name))
        step["native"] = name
        if known:
            seen[key] = name
    return drivers
