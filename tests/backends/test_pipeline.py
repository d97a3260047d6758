"""The pipeline generated kernels compile with (`backends/numba/pipeline.py`): their loops
interleave vector iterations where LLVM allows resetting its option, and the option does not
leak into code compiled afterwards (the hand-written helpers keep LLVM's own choice)."""

from __future__ import annotations

import gc
import re

import llvmlite.binding as llvm
import numba
import numpy as np
import pytest
from numba.extending import overload

from xfuse.backends.numba import pipeline
from xfuse.backends.numba.compile import compile_kernel, settle
from xfuse.backends.numba.kernels import KernelSource

SOURCE = """
def k_scale_shift(row_start, row_end, p0, out0):
    for i0 in range(row_start, row_end):
        out0[i0] = np.float32(p0[i0] * np.float32(1.5) + np.float32(0.5))
"""


def scale_shift(row_start, row_end, p0, out0):
    for i0 in range(row_start, row_end):
        out0[i0] = np.float32(p0[i0] * np.float32(1.5) + np.float32(0.5))


def vector_multiplies(dispatcher) -> int:
    """The vector multiplies in the machine code (8 floats with AVX2, 16 with AVX-512): one
    per vector iteration of the loop."""
    (signature,) = dispatcher.signatures
    return len(re.findall(r"vmulps\s[^\n]*%[yz]mm", dispatcher.inspect_asm(signature)))


def plain(fn):
    return numba.njit(error_model="numpy", nogil=True, cache=False)(fn)


def test_kernel_loops_interleave_and_the_option_stays_with_them(monkeypatch):
    # compiled here, not loaded: numba cannot show the machine code of a kernel from a disk
    # cache, and a cache given to the session (XFUSE_CACHE_DIR) may already hold this one
    monkeypatch.setenv("XFUSE_CACHE_DIR", "off")
    x = np.linspace(-4, 4, 1000, dtype=np.float32)
    before = plain(scale_shift)
    out_before = np.empty_like(x)
    before(0, x.size, x, out_before)

    source = KernelSource(name="k_scale_shift", source=SOURCE, globals={}, params=["p0"],
                          outputs=[], parallel=False, kind="loop")
    kernel = compile_kernel(source)
    out = np.empty_like(x)
    kernel(0, x.size, x, out)
    settle(kernel)
    np.testing.assert_array_equal(out, x * np.float32(1.5) + np.float32(0.5))

    after = plain(scale_shift)
    out_after = np.empty_like(x)
    after(0, x.size, x, out_after)
    np.testing.assert_array_equal(out_after, out_before)

    base = vector_multiplies(before)
    assert vector_multiplies(after) == base  # compiled after a kernel: LLVM's own choice again
    if pipeline.INTERLEAVE:
        assert base >= 1  # AVX2 or AVX-512 vectorises the plain loop (the CPUs this project runs on have one)
        assert vector_multiplies(kernel) >= base + pipeline.INTERLEAVE - 1
    else:  # LLVM before 15 (numba 0.60's LLVM 14 leaves this loop scalar): numba's own pipeline
        assert vector_multiplies(kernel) == base


def test_a_loop_driver_compiles_with_the_cheap_final_pass_and_restores_the_level():
    """A native loop's driver (which links kernels optimised when they compiled) compiles with
    `DriverCompiler`, and numba's optimisation level is back as it was afterwards."""
    import jax
    import jax.numpy as jnp
    from jax import lax
    from numba.core import config

    from tests.backends.test_native_loop import drivers_of, traced
    from xfuse.backends.numba.backend import compile_module
    from xfuse.backends.numba.pipeline import DriverCompiler

    w = np.eye(4, dtype=np.float32) * 0.5

    def loop(x):
        return lax.fori_loop(0, 7, lambda i, c: jnp.tanh(c @ w) + 1.0, x)

    x = np.linspace(-1, 1, 16, dtype=np.float32).reshape(4, 4)
    module = traced(loop, x)
    _, drivers = drivers_of(module)
    (driver,) = drivers.values()
    level = config.OPT
    (got,) = compile_module(module)([x])  # compiles the driver on its first call
    assert config.OPT == level and type(config.OPT) is type(level)
    np.testing.assert_allclose(got, jax.jit(loop)(x), rtol=2e-6, atol=2e-6)
    cells = dict(zip(driver.fn.__code__.co_freevars, driver.fn.__closure__))
    assert cells["fn"].cell_contents._compiler.pipeline_class is DriverCompiler


def doubled_plus(x, y):
    return x * 2.0 + y


def test_a_callee_form_has_no_machine_code_of_its_own():
    """`callee_form`: the same function and options, compiled without wrappers, its library
    finalised without machine code (numba's object caching hook never fills it); a caller
    links it in and runs it. The plain function makes its own machine code."""
    plain_fn = numba.njit(error_model="numpy", fastmath={"contract"})(doubled_plus)
    callee = pipeline.callee_form(plain_fn)
    assert callee.targetoptions["fastmath"] == plain_fn.targetoptions["fastmath"]
    caller = numba.njit(lambda x, y: callee(x, y) - 1.0)
    x, y = np.linspace(-3, 3, 17), np.arange(17.0)
    np.testing.assert_array_equal(caller(x, y), x * 2.0 + y - 1.0)
    np.testing.assert_array_equal(plain_fn(x, y), x * 2.0 + y)
    (sig,) = callee.signatures
    assert callee.overloads[sig].library._compiled_object is None
    (sig,) = plain_fn.signatures
    assert plain_fn.overloads[sig].library._compiled_object is not None


def run_python(code: str, **env) -> str:
    import os
    import subprocess
    import sys

    environment = {k: v for k, v in os.environ.items() if k != "NUMBA_DISABLE_ERROR_MESSAGE_HIGHLIGHTING"}
    environment.update(env)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=environment,
                          timeout=300, check=True)
    return done.stdout.strip()


def test_numba_messages_stay_plain_unless_the_user_says_otherwise():
    """numba formats every error it raises and catches while it compiles; highlighted (where
    colorama is installed) each costs a terminal set-up. xfuse keeps them plain whether numba
    was imported before it or not, and leaves the user's own setting alone."""
    check = "import numba.core.errors as e; print(repr(e.termcolor().errmsg('x')))"
    assert run_python(f"import xfuse.backends.numba; {check}") == "'x'"
    assert run_python(f"import numba; import numba.core.errors as e; e.termcolor(); "
                      f"import xfuse.backends.numba; {check}") == "'x'"
    user = "import os, xfuse.backends.numba; print(repr(os.environ['NUMBA_DISABLE_ERROR_MESSAGE_HIGHLIGHTING']))"
    assert run_python(user, NUMBA_DISABLE_ERROR_MESSAGE_HIGHLIGHTING="") == "''"


def _collector_while_compiling(pipeline_class) -> tuple[bool, bool]:
    """(whether the collector was on while numba typed a new function, whether it is after)."""
    seen = []

    def probe():  # a function of its own each time: numba keeps what its typing returned
        pass

    @overload(probe)
    def probe_typing():
        seen.append(gc.isenabled())
        return lambda: None

    def probing(p0, out0):
        probe()
        out0[0] = p0[0]

    options = {"pipeline_class": pipeline_class} if pipeline_class else {}
    x = np.ones(2, np.float32)
    numba.njit(**options)(probing)(x, np.empty_like(x))
    (during,) = seen
    return during, gc.isenabled()


def test_the_garbage_collector_rests_while_a_kernel_compiles():
    assert gc.isenabled()
    assert _collector_while_compiling(None) == (True, True)  # numba's own pipeline
    assert _collector_while_compiling(pipeline.KernelCompiler) == (False, True)
    assert _collector_while_compiling(pipeline.DriverCompiler) == (False, True)


def test_a_collector_the_user_turned_off_stays_off():
    gc.disable()
    try:
        assert _collector_while_compiling(pipeline.KernelCompiler) == (False, False)
    finally:
        gc.enable()


def test_the_collector_comes_back_after_the_outermost_compile_only():
    with pipeline.collector_paused():
        with pipeline.collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()
    try:
        with pipeline.collector_paused():
            raise ValueError("a compile that fails")
    except ValueError:
        pass
    assert gc.isenabled()


def test_the_vector_width_setting_and_the_cpus_it_widens(monkeypatch):
    from numba.core import config

    monkeypatch.setenv("XFUSE_VECTOR_WIDTH", "512")
    assert pipeline.vector_width() == 512
    monkeypatch.setenv("XFUSE_VECTOR_WIDTH", "256")
    assert pipeline.vector_width() is None
    monkeypatch.setenv("XFUSE_VECTOR_WIDTH", "1024")
    with pytest.raises(ValueError, match="XFUSE_VECTOR_WIDTH='1024'"):
        pipeline.vector_width()
    monkeypatch.delenv("XFUSE_VECTOR_WIDTH")
    avx512 = "+avx,+avx2,+fma,+avx512f,+avx512bw,+avx512dq,+avx512vl"
    for name, features, width in [("sapphirerapids", avx512, 512), ("znver4", avx512, 512),
                                  ("skylake-avx512", avx512, None), ("cascadelake", avx512, None),
                                  ("znver3", "+avx,+avx2,+fma,-avx512f", None),
                                  ("icelake-server", "+avx2,+avx512f,-avx512bw", None)]:
        monkeypatch.setattr(config, "CPU_NAME", name)
        monkeypatch.setattr(config, "CPU_FEATURES", features)
        assert pipeline.vector_width() == width, name


def test_kernels_and_their_helpers_carry_the_vector_width(monkeypatch):
    monkeypatch.setenv("XFUSE_CACHE_DIR", "off")  # compiled here: its IR is to be read
    monkeypatch.setattr(pipeline, "VECTOR_WIDTH", 512)
    x = np.linspace(-4, 4, 1000, dtype=np.float32)
    kernel = numba.njit(error_model="numpy", nogil=True, cache=False,
                        pipeline_class=pipeline.KernelCompiler)(scale_shift)
    out = np.empty_like(x)
    kernel(0, x.size, x, out)
    np.testing.assert_array_equal(out, x * np.float32(1.5) + np.float32(0.5))
    (signature,) = kernel.signatures
    assert '"prefer-vector-width"="512"' in kernel.inspect_llvm(signature)
    assert "zmm" in kernel.inspect_asm(signature) or "+avx512f" not in llvm.get_host_cpu_features().flatten()

    helper = numba.njit(error_model="numpy", nogil=True, cache=False, **pipeline.WITHOUT_WRAPPERS,
                        pipeline_class=pipeline.CalleeCompiler)(lambda v: v * np.float32(1.5) + np.float32(0.5))

    def calls_helper(row_start, row_end, p0, out0):
        for i0 in range(row_start, row_end):
            out0[i0] = helper(p0[i0])

    caller = numba.njit(error_model="numpy", nogil=True, cache=False,
                        pipeline_class=pipeline.KernelCompiler)(calls_helper)
    caller(0, x.size, x, out)
    np.testing.assert_array_equal(out, x * np.float32(1.5) + np.float32(0.5))
    assert '"prefer-vector-width"="512"' in helper.inspect_llvm(helper.signatures[0])

    monkeypatch.setattr(pipeline, "VECTOR_WIDTH", None)  # LLVM's own choice: no attribute
    plain_kernel = numba.njit(error_model="numpy", nogil=True, cache=False,
                              pipeline_class=pipeline.KernelCompiler)(scale_shift)
    plain_kernel(0, x.size, x, out)
    assert "prefer-vector-width" not in plain_kernel.inspect_llvm(plain_kernel.signatures[0])
