"""Whole programs as one native function: where every step of a module's entry program is one
a native loop's driver runs (kernels, small products, views, branches, loops without windows,
row scatters: `native_loop`), the program is written as one `numba.njit` function the same
way, so a call crosses from Python into native code once, not once a step. A sampler's
transition or a small model's log density and gradient pays for one dispatch instead of dozens.

In a straight line of steps, the work buffers live in one arena placed by their lifetimes
(`runtime.plan.first_fit`); where that arena would outgrow the runtime's own plan (which
writes an output fusion's product into its result), the backend keeps the runtime's steps.
Programs with a product large enough for BLAS's threads, or xfuse's own split products, keep
the runtime's steps (their Python cost is small beside the product), as do programs with a
kernel worth splitting over threads, float16 or bfloat16 values, a scan's windows written in
place and anything else a driver does not run. Where numba cannot type the function at its
first call, the runtime's steps run instead, for good.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from contextlib import nullcontext

import numpy as np
from numba.core.errors import NumbaError

from xfuse.hlo import Module, Shape
from xfuse.runtime.products import HALF, macs
from xfuse.runtime.control import nested_programs
from xfuse.runtime.plan import NativeMemory, first_fit
from xfuse.runtime.program import Kernel, walk

from .compile import settle
from .native_loop import SMALL_DOT, Driver, _compile, _dims, _eligible_program, _Writer, products

NAME = "program"


def _half(step: dict) -> bool:
    """Whether a step computes or reads float16 or bfloat16 values (kernels take them as f32
    through the runtime's conversions, which a driver does not make)."""
    specs = [*step.get("specs", []), *step.get("params", [])]
    return step.get("dtype") in HALF or any(dtype in HALF for _, dtype in specs)


def eligible(program: dict, result_shapes: list, constants: dict) -> bool:
    """Whether `program` runs as one driver: every step one a driver runs, no window (a scan's
    stacked output, which the outermost loop's own driver writes), every product small, no
    float16 or bfloat16 anywhere, and every result an array."""
    if not all(isinstance(shape, Shape) and shape.dtype.numpy.name not in HALF for shape in result_shapes):
        return False
    if not _runs_itself(program) or any(s.get("window") or s.get("parallel") or s.get("watching")
                                        or _half(s) for s in walk(program)):
        return False
    used = {key for p in (program, *(q for s in walk(program) for q in nested_programs(s)))
            for key in p["constants"].values()}
    if any(constants[key].dtype.name in HALF for key in used):
        return False
    return all(macs(d) <= SMALL_DOT for d in products(program)) and _eligible_program(program)


def _fresh_slots(program: dict) -> set[int]:
    """The slots whose value is a buffer the program's own kernels, products or scatters
    write (directly, or as a tuple element or reshape of one)."""
    fresh = set()
    for step in program["steps"]:
        if step["op"] in ("kernel", "dot", "library"):
            fresh.update(step["outputs"])
        elif step["op"] == "alias" and step["kind"] in ("element", "reshape") and step["inputs"][0] in fresh:
            fresh.update(step["outputs"])
    return fresh


def straight(program: dict) -> bool:
    """Whether `program` is a straight line of steps: no loop, no branch."""
    return not any(s["op"] in ("while", "conditional") for s in program["steps"])


def _arena(program: dict, names: list[str], scratch: list) -> tuple[dict, int, int]:
    """For a straight line of steps: (offset in one arena of each work buffer that holds no
    result, the arena's bytes, what those buffers take unshared). A buffer is busy from the
    step that writes it to the last step reading it or a view of it (an output fusion's
    product only during its step), as `runtime.plan` has it."""
    defined, refers, last = {}, {}, {}
    for i, step in enumerate(program["steps"]):
        if step["op"] == "alias":
            roots = set().union(*(refers.get(v, set()) for v in step["inputs"]))
            for slot in step["outputs"]:
                refers[slot] = roots
        else:
            for slot in step["outputs"]:
                refers[slot], defined[slot] = {slot}, i
        for v in step["inputs"]:
            for root in refers.get(v, ()):
                last[root] = i
    results = set().union(*(refers.get(r, set()) for r in program["results"]))
    intervals, unplanned = {}, 0
    for k, (name, (dims, dtype, _)) in enumerate(zip(names, scratch)):
        match = re.fullmatch(r"b(\d+)(?:_\d+)?(_dot)?", name)
        slot = int(match.group(1))
        if slot in results and not match.group(2):
            continue
        start = defined[slot]
        nbytes = math.prod(dims) * np.dtype(dtype).itemsize
        intervals[k] = (start, start if match.group(2) else last.get(slot, start), nbytes)
        unplanned += nbytes
    offsets, size = first_fit(intervals)
    return offsets, size, unplanned


def write_program(program: dict, kernels: dict, constants: dict, bodies: dict) -> tuple[Driver, int, int]:
    """(the program's driver, its arena's bytes, what the arena's buffers take unshared). The
    driver takes `s<k>`, the parameters, and returns the results as a tuple. In a straight
    line of steps, the work buffers that hold no result are views of one arena (`w<last>`),
    placed by their lifetimes as the runtime's buffer plan places them."""
    writer = _Writer(kernels, bodies)
    writer.one_thread = True
    n = len(program["params"])
    writer.program(program, "b", constants, "    ", args=[f"s{k}" for k in range(n)])
    results = [f"b{r}" for r in program["results"]]
    offsets, arena, unplanned = _arena(program, writer.scratch_names, writer.scratch) \
        if straight(program) else ({}, 0, 0)
    own = [k for k in range(len(writer.scratch)) if k not in offsets]
    views = []
    for k, offset in offsets.items():
        dims, dtype, _ = writer.scratch[k]
        nbytes = math.prod(dims) * np.dtype(dtype).itemsize
        views.append(f"    w{k} = arena[{offset}:{offset + nbytes}].view(np.{dtype}).reshape({_dims(dims)})")
    arguments = ", ".join([f"s{k}" for k in range(n)] + [f"c{k}" for k in range(len(writer.constants))]
                          + [f"w{k}" for k in own] + ["arena"] * bool(offsets))
    source = "\n".join([f"def {NAME}({arguments}):", *views, *writer.lines,
                        f"    return ({', '.join(results)}{',' if len(results) == 1 else ''})"]) + "\n"
    scratch = [(writer.scratch[k][0], writer.scratch[k][1], False) for k in own]
    if offsets:
        scratch.append(((arena,), "uint8", False))
    driver = Driver(source, writer.used, writer.constants, writer.identity, [], [], scratch,
                    one_thread=writer.blas_dots > 0)
    return driver, arena, unplanned


def _runs_itself(program: dict) -> bool:
    """Whether the runtime would run several steps of `program` (a lone kernel already goes
    straight to its compiled entry)."""
    working = [s for s in program["steps"] if s["op"] != "alias"]
    return len(working) > 1


def native_program(module: Module, program: dict, kernels: dict, constants: dict,
                   bodies: dict | None = None) -> Kernel | None:
    """The whole entry program as one native function, `run(arrays)` -> its results (None
    where numba cannot compile it: the runtime's steps run instead), or None where the program
    is not one a driver runs."""
    root = module.entry_computation.root_instruction
    shapes = [module.entry_computation[o].shape for o in root.operands] if root.op.value == "tuple" \
        else [root.shape]
    if len(shapes) != len(program["results"]) or not eligible(program, shapes, constants):
        return None
    driver, arena, unplanned = write_program(program, kernels, constants, bodies or {})
    run = _runner(program, driver, [tuple(s.dims) for s in shapes])
    run.memory = NativeMemory(sum(math.prod(s.dims) * s.dtype.numpy.itemsize for s in shapes), arena, unplanned)
    return Kernel(run)


def as_one_step(program: dict, kernel: str) -> dict:
    """`program` as one step that runs the native function `kernel` (the runtime's `native`
    step), the program itself kept inside it for where the function declines."""
    results = list(range(program["n_values"], program["n_values"] + len(program["results"])))
    return {"params": program["params"], "results": results, "n_values": results[-1] + 1,
            "constants": {}, "param_specs": program["param_specs"],
            "steps": [{"op": "native", "name": kernel, "kernel": kernel, "inputs": list(program["params"]),
                       "outputs": results, "program": program, "label": "the whole program, natively"}]}


def _runner(program: dict, driver: Driver, result_dims: list[tuple]) -> Callable:
    from xfuse.runtime import blas

    fn = _compile(driver.source, NAME, driver.used, driver.identity)
    scalars = [not dims for dims, _ in program["param_specs"]]
    # A result the program computes into a buffer of this call is returned as it is; any
    # other (a parameter, a constant, what a branch or loop passed through) is copied, so no
    # result shares memory with an argument, a constant or another call's result.
    fresh = _fresh_slots(program)
    copied = [k for k, slot in enumerate(program["results"]) if slot not in fresh]
    scalar_results = [k for k, dims in enumerate(result_dims) if not dims]
    fixed = [*driver.constants]
    first, failed = [True], [False]

    def run(arrays: list) -> list | None:
        if failed[0]:
            return None
        # C-ordered, as numba types every value of the program; a scalar as one element
        flat = [x.reshape(1) if scalar else x if x.flags.c_contiguous else np.ascontiguousarray(x)
                for x, scalar in zip(arrays, scalars)]
        work = [np.empty(dims, dtype) for dims, dtype, _ in driver.scratch]
        try:
            with blas.single_threaded() if driver.one_thread else nullcontext():
                results = list(fn(*flat, *fixed, *work))
        except NumbaError:
            failed[0] = True
            return None
        except Exception:
            if not first[0]:
                raise
            # the first call compiles: whatever fails there (a type numba lacks), the
            # runtime's steps run instead, and say what fails if anything does
            failed[0] = True
            return None
        if first[0]:
            first[0] = False
            settle(fn)
        for k in copied:
            results[k] = np.array(results[k], copy=True)
        for k in scalar_results:
            results[k] = results[k].reshape(())
        return results

    run.source, run.driver, run.fresh = driver.source, driver, True
    return run


__all__ = ["as_one_step", "eligible", "native_program", "straight", "write_program"]
