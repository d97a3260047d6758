"""The numba backend: a fused module to a runtime `Executable`.

`lowering` turns the module into a program (kernels, BLAS dots, views) and writes each
kernel's source; here the sources are compiled with numba (or loaded from the disk cache) and
the runtime builds the executable (`xfuse.runtime.program`), where an output fusion runs its
dot through BLAS, or on one thread through `gemm` where that is faster (on CPUs whose kernels
use 512-bit vectors), or, from a few million multiply-adds, split over the hand-off's threads
through `split_gemm` (where oneDNN is there and the CPU has AVX-512; a vector times a matrix of
a few MiB through numba's loops, where kernels use 512-bit vectors), and applies the epilogue
kernel to it. f16 and bf16 values are computed in f32 inside kernels. A loop of kernels only
runs as one numba function (`native_loop`), and so does a whole program of such steps with
small products only (`native_program`).
"""

from __future__ import annotations

from xfuse.hlo import Module
from xfuse.runtime import Executable
from xfuse.runtime.products import BackendProducts
from xfuse.runtime.program import Kernel, build, walk

from .compile import compile_kernel, exact_entry, settle
from . import handoff
from .gemm import ENABLED as GEMM, gemm_f32
from .split_gemm import enabled as split_enabled, split_f32, vector_f32, vectors_enabled
from .lowering import lower
from .native_loop import native_loops
from .native_program import as_one_step, native_program, straight

NAME = "numba"


def compile_module(module: Module) -> Executable:
    lowered = lower(module)
    kernels = {name: Kernel(fn := compile_kernel(source), settle,
                            split=handoff.Splitter(fn) if handoff.ENABLED else None, exact=exact_entry(fn))
               for name, source in lowered.kernels.items()}
    sources = {name: source.source for name, source in lowered.kernels.items()}
    kernels.update(native_loops(lowered.program, kernels, lowered.constants, lowered.bodies))
    program = lowered.program
    # whether oneDNN is installed is looked up (10 ms, once) only for a program with a product
    has_dot = any(s["op"] == "dot" or s.get("dot") for s in walk(lowered.program))
    products = BackendProducts(thread=gemm_f32 if GEMM else None,
                               split=split_f32 if has_dot and split_enabled() else None,
                               vector=vector_f32 if has_dot and vectors_enabled() else None)
    whole = native_program(module, program, kernels, lowered.constants, lowered.bodies)
    if whole is None:
        return build(program, kernels, lowered.constants, sources, backend=products)
    # one native entry a call (the program's own steps where it declines), unless its work
    # buffers would take more memory than the runtime's plan gives the steps
    kernels["native_program"] = whole
    native = build(as_one_step(program, "native_program"), kernels, lowered.constants, sources, backend=products)
    if straight(program):
        stepwise = native.steps[0].run.inner
        if native.plan.temp_bytes > stepwise.plan.temp_bytes:
            return stepwise
    return native
