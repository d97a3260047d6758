"""numba pipelines of xfuse's own: numba's nopython pipeline with another lowering pass (the
pass that lowers to LLVM, optimises and makes machine code).

`KernelCompiler`, for generated kernels: while LLVM optimises the kernel's own module, its
loop vectoriser interleaves `INTERLEAVE` vector iterations. LLVM's cost model interleaves only
small loop bodies. A fused kernel's loop is long (a tanh and a logistic are some 60
instructions per eight floats) and each iteration is one long chain of dependent
instructions, so one vector iteration at a time leaves the cores' out-of-order windows short
of independent work. Four at a time, the chain `tanh(x) * sigmoid(1.5 x) + 0.5 x` on 2^16
floats took 75 us against 89 us, and a row softmax of 4096x1024 was 1.22x faster. The option
is LLVM's (`-force-vector-interleave`), process-wide, so it is set around the kernel's
lowering pass alone: numba compiles under its global compiler lock, and a kernel's callees
were compiled before (type inference compiles them). Hand-written helpers keep LLVM's choice:
forced on the eight accumulators of `native_loop.small_matmul_t`, it spills registers (the
scanned RNN took 12 ms against 7.3 ms). LLVM before 15 refuses an option given twice, so there
kernels compile as with numba's own pipeline.

`DriverCompiler`, for native loop drivers: the module that links in the kernels (each already
optimised when it compiled) is not optimised again at numba's `-O3`, only by its cheap pass.
The driver's own code is still optimised function by function; the kernels stay calls. That
saved 0.3 s of the scanned RNN's cold compile (2.75-2.85 s against 3.03-3.16 s, its run time
unchanged) and costs some 25 ns an iteration where bodies are tiny (5000 steps of tanh of a
4x4 product: 1.48 ms against 1.35 ms). numba before 0.61 builds its pass managers once, ahead,
and there drivers compile as before.

Every compile through these pipelines runs with Python's cyclic garbage collector paused
(`collector_paused`). A compile makes some hundred thousand objects, few of them in cycles,
and the two or three full collections they set off each walk every object of the process,
jax's and numba's included: the scanned RNN's cold compile took 1.8-1.9 s with the collector
paused against 2.3-3.7 s with it running (alternating processes).

Vector width: on a CPU with AVX-512, LLVM's x86 tuning still prefers 256-bit vectors for most
models (Skylake-SP's cores slowed their clocks under 512-bit work), so kernels and their
helpers are marked `"prefer-vector-width"="512"` where that slowdown is not known
(`vector_width`): on a Xeon of the Sapphire Rapids kind here, the 2^16 tanh/sigmoid chain
took 34.9 us against 42.5 us, the 2^24 chain 5.3 against 6.6 ms, the row softmax and layer
norm of 4096x1024 1.03 and 0.66 ms against 1.20 and 0.78 ms (the same vector operations, each
on 16 floats instead of 8; the sums' lanes add in another order). `XFUSE_VECTOR_WIDTH=256` or
`512` chooses; either way only the host's own instructions are used.

`callee_form(fn)`, for functions only other compiled functions call (the math and row helpers
kernels call, the kernels and product helpers a driver calls): compiled without numba's
wrappers for calls from Python and C, and finalised without machine code. numba would
otherwise translate each such function to machine code on its own, and each caller again with
its own module; only the caller's copy ever runs.
"""

from __future__ import annotations

import contextlib
import gc
import os

import llvmlite.binding as llvm
import numba
from numba.core import config
from numba.core.compiler import CompilerBase, DefaultPassBuilder
from numba.core.compiler_machinery import register_pass
from numba.core.typed_passes import NativeLowering

INTERLEAVE = 4 if llvm.llvm_version_info >= (15,) else 0
# LLVM's CPU models with AVX-512 whose cores lower their clocks under 512-bit work
# (Skylake-SP and its successors of the same core, and Xeon Phi): there LLVM's preference stays.
SLOW_512 = {"skylake-avx512", "cascadelake", "cooperlake", "knl", "knm"}


def target_cpu() -> tuple[str, set[str]]:
    """The CPU numba compiles for, as LLVM names it, and its features ("+avx512f", ...): the
    host's, or the one numba is told to compile for (NUMBA_CPU_NAME / NUMBA_CPU_FEATURES)."""
    name = config.CPU_NAME if config.CPU_NAME not in (None, "host") else llvm.get_host_cpu_name()
    features = config.CPU_FEATURES if config.CPU_FEATURES is not None else (
        llvm.get_host_cpu_features().flatten() if config.CPU_NAME in (None, "host") else "")
    return name, set(features.split(","))


def vector_width() -> int | None:
    """512 where kernels should use 512-bit vectors (the module's docstring), else None (LLVM's
    choice): `XFUSE_VECTOR_WIDTH` (256 or 512) where set, else 512 on a CPU with AVX-512 (F, BW,
    DQ and VL) not in `SLOW_512` (`target_cpu`)."""
    setting = os.environ.get("XFUSE_VECTOR_WIDTH", "").strip()
    if setting:
        if setting not in ("256", "512"):
            raise ValueError(f"XFUSE_VECTOR_WIDTH={setting!r}: give 256 or 512")
        return 512 if setting == "512" else None
    name, features = target_cpu()
    wide = {"+avx512f", "+avx512bw", "+avx512dq", "+avx512vl"} <= features
    return 512 if wide and name not in SLOW_512 else None


VECTOR_WIDTH = vector_width()


@contextlib.contextmanager
def _vector_width_marked(state):
    """Every function the lowering adds to the library marked with `VECTOR_WIDTH` (where it is
    set): LLVM's loop vectoriser and code generator read the attribute function by function."""
    if VECTOR_WIDTH is None:
        yield
        return
    library = _library(state)
    add = library.add_ir_module
    attribute = f'"prefer-vector-width"="{VECTOR_WIDTH}"'

    def add_marked(module):
        for fn in module.functions:
            if not fn.is_declaration:
                set.add(fn.attributes, attribute)  # llvmlite's add() knows enum attributes only
        return add(module)

    library.add_ir_module = add_marked
    try:
        yield
    finally:
        del library.add_ir_module


def _interleave(count: int) -> None:
    llvm.set_option("", f"-force-vector-interleave={count}")  # 0: LLVM's own choice


@register_pass(mutates_CFG=True, analysis_only=False)
class InterleavedLowering(NativeLowering):
    """numba's lowering (which optimises and finalises the module) with interleaved loops;
    without machine code for a kernel compiled as a callee only (`callee_form`)."""

    _name = "xfuse_interleaved_lowering"

    def run_pass(self, state):
        with _vector_width_marked(state), _WithoutMachineCode(state):
            if not INTERLEAVE:
                return super().run_pass(state)
            _interleave(INTERLEAVE)
            try:
                return super().run_pass(state)
            finally:
                _interleave(0)


def _library(state):
    """The library the lowering fills, made as numba's own lowering makes it."""
    if state.library is None:
        state.library = state.targetctx.codegen().create_library(state.func_id.func_qualname)
        state.library.enable_object_caching()
    return state.library


class _WithoutMachineCode:
    """For a function only ever called by other compiled functions (no Python or C wrapper):
    its library is finalised (linked and optimised) without machine code, which each caller's
    module, linking it in, makes for itself. numba would otherwise translate it to machine code
    on its own, for nothing. Such a function has no address, so numba's setting of its
    environment's address (read only to make Python objects, which these functions never do)
    is skipped too: the environment is kept with the library."""

    NEEDED = ("_finalize_final_module", "_finalize_dynamic_globals", "_verify_declare_only_symbols")

    def __init__(self, state) -> None:
        self.library = None
        if state.flags.no_cpython_wrapper and state.flags.no_cfunc_wrapper:
            library = _library(state)
            if all(hasattr(library, name) for name in self.NEEDED):  # numba 0.60-0.68 have them
                self.library = library

    def __enter__(self):
        library = self.library
        if library is None:
            return self

        def finalize_without_code():
            library._finalize_dynamic_globals()
            library._verify_declare_only_symbols()
            library._finalized = True

        def keep_env(env_name, env):
            if _defines(library._final_module, env_name):  # this function's own environment
                library._xfuse_environment = env
            else:
                type(codegen).set_env(codegen, env_name, env)

        codegen = library.codegen
        library._finalize_final_module = finalize_without_code
        codegen.set_env = keep_env  # numba compiles under its global lock: no one else sees it
        return self

    def __exit__(self, *exc) -> None:
        if self.library is not None:
            del self.library.codegen.set_env


def _defines(module, name: str) -> bool:
    try:
        module.get_global_variable(name)
    except NameError:
        return False
    return True


@register_pass(mutates_CFG=True, analysis_only=False)
class CalleeLowering(NativeLowering):
    """numba's lowering, without machine code for a function that has no wrappers."""

    _name = "xfuse_callee_lowering"

    def run_pass(self, state):
        with _vector_width_marked(state), _WithoutMachineCode(state):
            return super().run_pass(state)


_paused = [0, False]  # compiles under way, whether the collector was on before the first


@contextlib.contextmanager
def collector_paused():
    """The cyclic garbage collector off until the outermost compile ends, then as it was (a
    user who turned it off keeps it off). numba compiles under its global compiler lock, so
    the count needs no lock of its own."""
    if _paused[0] == 0:
        _paused[1] = gc.isenabled()
        gc.disable()
    _paused[0] += 1
    try:
        yield
    finally:
        _paused[0] -= 1
        if _paused[0] == 0 and _paused[1]:
            gc.enable()


class _OwnLowering(CompilerBase):
    """numba's nopython pipeline with `lowering` in place of its lowering pass, run with the
    garbage collector paused."""

    lowering = NativeLowering

    def compile_extra(self, func):
        with collector_paused():
            return super().compile_extra(func)

    def compile_ir(self, func_ir, lifted=(), lifted_from=None):
        with collector_paused():
            return super().compile_ir(func_ir, lifted, lifted_from)

    def define_pipelines(self):
        pm = DefaultPassBuilder.define_nopython_pipeline(self.state)
        pm.passes = [(self.lowering if cls is NativeLowering else cls, text)
                     for cls, text in pm.passes]
        pm.finalize()
        return [pm]


class KernelCompiler(_OwnLowering):
    """For generated kernels: their loops interleaved."""

    lowering = InterleavedLowering


class CalleeCompiler(_OwnLowering):
    """For helpers compiled as callees only."""

    lowering = CalleeLowering


@register_pass(mutates_CFG=True, analysis_only=False)
class LinkingLowering(NativeLowering):
    """numba's lowering for a function whose callees were optimised when they compiled: the
    module that links them in gets numba's full module pass at `-O0`, not `-O3`, which would
    optimise every callee again."""

    _name = "xfuse_linking_lowering"

    def run_pass(self, state):
        library = _library(state)
        optimize = getattr(library, "_optimize_final_module", None)  # numba 0.60-0.68 have it
        if optimize is None:  # a numba without it: its own lowering as it is
            return super().run_pass(state)

        def cheaply():
            saved = config.OPT  # numba builds the full pass's manager from it as it runs
            config.OPT = type(saved)(0)
            try:
                optimize()
            finally:
                config.OPT = saved

        library._optimize_final_module = cheaply
        return super().run_pass(state)


class DriverCompiler(_OwnLowering):
    """For native loop drivers: their kernels not optimised again."""

    lowering = LinkingLowering


WITHOUT_WRAPPERS = {"no_cpython_wrapper": True, "no_cfunc_wrapper": True}


def callee_form(fn, compiler: type = CalleeCompiler):
    """numba function `fn` again, with its options, compiled to be called by other compiled
    functions only: without wrappers or machine code of its own. Called from Python, such a
    function would crash the process, so it is never handed out."""
    options = {key: value for key, value in fn.targetoptions.items() if key != "nopython"}
    options.update(WITHOUT_WRAPPERS)
    return numba.njit(**options, pipeline_class=compiler)(fn.py_func)
