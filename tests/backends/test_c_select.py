"""Selects in C kernels read both arms when an arm reads memory (`XF_SELECT`).

A C `?:` reads only the arm it picks; in a loop gcc if-converts that read into an AVX masked
load, and gcc 12's vectoriser miscompiled one such loop nest at -march=x86-64-v3 and up (the case
tests/regressions/7e0856f5869a). These tests pin the rendering and run the kernels: the select
of that case's loop nest built for every x86-64 level this CPU runs, against numpy, with NaN,
infinities and -0.0 in both arms; and an arm that divides integers keeps the `?:`, so the arm
not picked never divides by zero."""

from __future__ import annotations

import ctypes
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from xfuse.backends.c import toolchain
from xfuse.backends.c.backend import build_library
from xfuse.backends.c.render import library_source, render_kernel


class Source:
    """What `render_kernel` takes: a kernel's Python source, its name and its globals."""

    def __init__(self, text: str) -> None:
        self.name, self.source, self.globals = "k", textwrap.dedent(text), {}


# The loop nest of the miscompiled case: a select between two reads, 7x3x2 per row.
NEST = Source("""
    def k(row_start, row_end, p0, p1, p2, p3, p4, out0):
        v1 = p0[0]
        v4 = p2[0]
        for i0 in range(row_start, row_end):
            for i1 in range(7):
                for i2 in range(3):
                    row2 = p1[i1, i2]
                    row6 = p3[i0, i1, i2]
                    row7 = p4[i0, i1, i2]
                    row9 = out0[i0, i1, i2]
                    for i3 in range(2):
                        v3 = scalar.fmin(v1, row2[i3])
                        v5 = v3 >= v4
                        row9[i3] = row7[i3] if v5 else row6[i3]
""")
NEST_ARGS = [((1,), np.float32), ((7, 3, 2), np.float32), ((1,), np.float32),
             ((2, 7, 3, 2), np.float32), ((2, 7, 3, 2), np.float32), ((2, 7, 3, 2), np.float32)]

DIVIDE = Source("""
    def k(row_start, row_end, p0, p1, p2, out0):
        for i in range(row_start, row_end):
            out0[i] = (p1[i] // p2[i]) if p0[i] else p1[i]
""")
DIVIDE_ARGS = [((8,), np.bool_), ((8,), np.int32), ((8,), np.int32), ((8,), np.int32)]


def runnable_targets() -> list[str]:
    """native, and each x86-64 level whose features this CPU has."""
    from numpy._core._multiarray_umath import __cpu_features__ as have

    levels = [t for t in ("x86-64-v2", "x86-64-v3", "x86-64-v4") if "x86_64" in toolchain.machine()
              and all(have.get(f, False) for f in toolchain.features(t))]
    return ["native", *levels]


def pointer(a: np.ndarray) -> ctypes.c_void_p:
    return ctypes.c_void_p(a.ctypes.data)


def test_a_select_between_reads_reads_both_arms():
    text = render_kernel(NEST, NEST_ARGS)
    assert "XF_SELECT(v5, row7[i3], row6[i3])" in text
    assert "?" not in text.split("XF_EXPORT int k(")[1].split("#ifndef")[0]


@pytest.mark.parametrize("target", runnable_targets())
def test_the_miscompiled_loop_nest_selects_right(target):
    library = ctypes.CDLL(str(build_library(library_source([render_kernel(NEST, NEST_ARGS)]), target)))
    rng = np.random.default_rng(0)
    specials = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0], np.float32)
    p1, p3, p4 = (rng.standard_normal(shape).astype(np.float32) for shape in ((7, 3, 2), (2, 7, 3, 2), (2, 7, 3, 2)))
    for k, a in enumerate((p1, p3, p4)):
        a.reshape(-1)[k::6] = np.resize(specials, a.reshape(-1)[k::6].shape)
    for v1, v4 in [(0.5, -0.25), (np.nan, 0.0), (np.inf, 1.0), (-0.0, 0.0)]:
        p0, p2 = np.array([v1], np.float32), np.array([v4], np.float32)
        out = np.full((2, 7, 3, 2), 7.0, np.float32)
        assert library.k(ctypes.c_int64(0), ctypes.c_int64(2), *map(pointer, (p0, p1, p2, p3, p4, out))) == 0
        want = np.where(np.minimum(p0, p1) >= p2, p4, p3)  # np.minimum propagates NaN, as jax's
        np.testing.assert_array_equal(out, want, err_msg=f"target {target}, v1={v1}, v4={v4}")
        assert np.array_equal(np.signbit(out), np.signbit(want))


def test_an_arm_that_divides_integers_keeps_the_conditional():
    """The dividing arm is read only where it is picked, so its zero divisors are never used: run
    in a child process, as a division by zero would kill it (SIGFPE)."""
    text = render_kernel(DIVIDE, DIVIDE_ARGS)
    assert "out0[i] = (p0[i] ? XF_FLOORDIV(p1[i], p2[i]) : p1[i]);" in text
    path = build_library(library_source([text]))
    script = textwrap.dedent(f"""
        import ctypes, numpy as np
        lib = ctypes.CDLL({str(path)!r})
        p0 = np.array([1, 0, 1, 0, 1, 0, 0, 1], np.bool_)
        p1 = np.array([7, -7, 9, 5, -9, 3, 2, -2**31], np.int32)
        p2 = np.array([2, 0, -4, 0, 4, 0, 0, 1], np.int32)
        out = np.zeros(8, np.int32)
        lib.k(ctypes.c_int64(0), ctypes.c_int64(8), *[ctypes.c_void_p(a.ctypes.data) for a in (p0, p1, p2, out)])
        print(*out)
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["3", "-7", "-3", "5", "-3", "3", "2", str(-2**31)]
