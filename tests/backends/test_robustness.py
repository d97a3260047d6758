"""Modules the fusion pass never makes but a hand-written or generated module may hold, on the
numba and C backends against the reference interpreter (each once found by random modules): a
loop fusion whose outputs differ in shape (it once wrote past the smaller output), calls, names
that are not Python identifiers, tuples inside a fusion, zero-size values, a scalar-times-vector
dot, a concatenation of empty operands, a fusion with no outputs or with one in a tuple, and
fusions outside one kernel's iteration space (two reduction spaces, two dots, a dot of a
computed value, a reduction or a dot read at another row), which run as nested programs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from xfuse.backends.c.backend import compile_modules as compile_c_modules
from xfuse.backends.numba import compile_module
from xfuse.hlo import interpret, parse, verify

MODULES = {
    "outputs_of_two_shapes": """
HloModule two_shapes

fused (p0: f32[4,2], p1: f32[4,1]) -> (f32[4,2], f32[4,1]) {
  p0 = f32[4,2] parameter(0)
  p1 = f32[4,1] parameter(1)
  exp.0 = f32[4,2] exp(p0)
  neg.1 = f32[4,1] neg(p1)
  ROOT tuple.2 = (f32[4,2], f32[4,1]) tuple(exp.0, neg.1)
}

ENTRY main (x: f32[4,2], y: f32[4,1]) -> (f32[4,2], f32[4,1]) {
  x = f32[4,2] parameter(0)
  y = f32[4,1] parameter(1)
  ROOT fusion.0 = (f32[4,2], f32[4,1]) fusion(x, y), kind=loop, calls=fused
}
""",
    "calls_and_odd_names": """
HloModule odd

callee (ROOT: f32[3], ENTRY.0: f32[3]) -> f32[3] {
  ROOT = f32[3] parameter(0)
  ENTRY.0 = f32[3] parameter(1)
  ROOT if = f32[3] add(ROOT, ENTRY.0)
}

fused (lambda: f32[3], Gv.wc-A: f32[3]) -> f32[3] {
  lambda = f32[3] parameter(0)
  Gv.wc-A = f32[3] parameter(1)
  call.0 = f32[3] call(lambda, Gv.wc-A), calls=callee
  ROOT tanh.1 = f32[3] tanh(call.0)
}

ENTRY main (x: f32[3], y: f32[3]) -> f32[3] {
  x = f32[3] parameter(0)
  y = f32[3] parameter(1)
  call.2 = f32[3] call(x, y), calls=callee
  ROOT fusion.3 = f32[3] fusion(call.2, y), kind=loop, calls=fused
}
""",
    "tuples_inside_a_fusion": """
HloModule tuples

fused (p0: f32[2], p1: f32[2]) -> f32[2] {
  p0 = f32[2] parameter(0)
  p1 = f32[2] parameter(1)
  tuple.0 = (f32[2], f32[2]) tuple(p0, p1)
  get_tuple_element.1 = f32[2] get_tuple_element(tuple.0), index=1
  ROOT mul.2 = f32[2] mul(get_tuple_element.1, p0)
}

ENTRY main (x: f32[2], y: f32[2]) -> f32[2] {
  x = f32[2] parameter(0)
  y = f32[2] parameter(1)
  ROOT fusion.0 = f32[2] fusion(x, y), kind=loop, calls=fused
}
""",
    "zero_size_values": """
HloModule empty

fused (p0: f64[0,3]) -> f64[0,3] {
  p0 = f64[0,3] parameter(0)
  constant.0 = f64[0,3] constant({})
  ROOT add.1 = f64[0,3] add(p0, constant.0)
}

ENTRY main (x: f64[0,3]) -> f64[0,3] {
  x = f64[0,3] parameter(0)
  fusion.0 = f64[0,3] fusion(x), kind=loop, calls=fused
  ROOT neg.1 = f64[0,3] neg(fusion.0)
}
""",
    "update_of_a_constant_hoisted_out_of_its_loop": """
HloModule hoist

fused (p0: f64[2]) -> (f64[2], pred[2]) {
  p0 = f64[2] parameter(0)
  constant.1 = f64[] constant(nan)
  broadcast_in_dim.2 = f64[2] broadcast_in_dim(constant.1), dims={}
  min.3 = f64[2] min(p0, broadcast_in_dim.2)
  constant.6 = u16[] constant(0)
  dynamic_update_slice.7 = f64[2] dynamic_update_slice(broadcast_in_dim.2, broadcast_in_dim.2, constant.6)
  exp.9 = f64[2] exp(p0)
  ge.10 = pred[2] ge(exp.9, min.3)
  ROOT tuple.out = (f64[2], pred[2]) tuple(dynamic_update_slice.7, ge.10)
}

ENTRY main (x: f64[2]) -> (pred[2], f64[2]) {
  x = f64[2] parameter(0)
  fusion.0 = (f64[2], pred[2]) fusion(x), kind=multi_output, calls=fused
  gte.1 = f64[2] get_tuple_element(fusion.0), index=0
  gte.2 = pred[2] get_tuple_element(fusion.0), index=1
  ROOT tuple.3 = (pred[2], f64[2]) tuple(gte.2, gte.1)
}
""",
    "a_tuple_argument_to_a_fusion": """
HloModule tuple_arg

fused (a: f32[3], t: (f32[3], f32[])) -> f32[3] {
  a = f32[3] parameter(0)
  t = (f32[3], f32[]) parameter(1)
  first = f32[3] get_tuple_element(t), index=0
  ROOT add.0 = f32[3] add(a, first)
}

ENTRY main (x: f32[3], s: f32[]) -> f32[3] {
  x = f32[3] parameter(0)
  s = f32[] parameter(1)
  barrier.0 = (f32[3], f32[]) optimization_barrier(x, s)
  ROOT fusion.1 = f32[3] fusion(x, barrier.0), kind=loop, calls=fused
}
""",
    "reduction_fusion_with_unrelated_outputs": """
HloModule unrelated

fused (n: u8[], t: s64[1,3]) -> (u8[], s64[1,3], s32[]) {
  n = u8[] parameter(0)
  t = s64[1,3] parameter(1)
  constant.0 = s32[] constant(-7)
  broadcast_in_dim.1 = s32[4] broadcast_in_dim(constant.0), dims={}
  reduce_or.2 = s32[] reduce_or(broadcast_in_dim.1), axes={0}
  ROOT tuple.3 = (u8[], s64[1,3], s32[]) tuple(n, t, reduce_or.2)
}

ENTRY main (x: s64[1,3], y: u8[]) -> (u8[], s64[1,3], s32[]) {
  x = s64[1,3] parameter(0)
  y = u8[] parameter(1)
  ROOT fusion.2 = (u8[], s64[1,3], s32[]) fusion(y, x), kind=loop, calls=fused
}
""",
    "scalar_times_vector_dot": """
HloModule outer

fused (p0: f32[], p1: f32[3]) -> f32[3] {
  p0 = f32[] parameter(0)
  p1 = f32[3] parameter(1)
  dot_general.0 = f32[3] dot_general(p0, p1), contracting={;}
  ROOT exp.1 = f32[3] exp(dot_general.0)
}

ENTRY main (a: f32[], v: f32[3]) -> f32[3] {
  a = f32[] parameter(0)
  v = f32[3] parameter(1)
  ROOT fusion.0 = f32[3] fusion(a, v), kind=output, calls=fused
}
""",
    "concatenate_of_empty_operands": """
HloModule empty

fused (p0: pred[0], p1: pred[0]) -> pred[0] {
  p0 = pred[0] parameter(0)
  p1 = pred[0] parameter(1)
  ROOT concatenate.0 = pred[0] concatenate(p0, p1), dimension=0
}

ENTRY main (x: pred[0], y: pred[0]) -> pred[0] {
  x = pred[0] parameter(0)
  y = pred[0] parameter(1)
  ROOT fusion.0 = pred[0] fusion(x, y), kind=loop, calls=fused
}
""",
    # A fusion with no outputs (its root `tuple()`): the kernel writer took its loop from the
    # first output (IndexError); it now makes the empty tuple and runs no kernel.
    "a_fusion_with_no_outputs": """
HloModule no_outputs

fused (p0: s8[], p1: s8[]) -> () {
  p0 = s8[] parameter(0)
  p1 = s8[] parameter(1)
  ROOT tuple.0 = () tuple()
}

ENTRY main (x: s8[]) -> () {
  x = s8[] parameter(0)
  ROOT fusion.0 = () fusion(x, x), kind=loop, calls=fused
}
""",
    # One output in a tuple: the runtime makes a kernel's outputs a tuple when it has several,
    # so this fusion's value was the bare array, and its element 0 the array's first element.
    "a_one_element_tuple_from_a_fusion": """
HloModule one_element_tuple

fused (p0: f32[3]) -> (f32[3]) {
  p0 = f32[3] parameter(0)
  neg.0 = f32[3] neg(p0)
  ROOT tuple.1 = (f32[3]) tuple(neg.0)
}

ENTRY main (x: f32[3]) -> f32[3] {
  x = f32[3] parameter(0)
  fusion.0 = (f32[3]) fusion(x), kind=loop, calls=fused
  ROOT get_tuple_element.1 = f32[3] get_tuple_element(fusion.0), index=0
}
""",
    # The same mistake, a kernel's space taken from its first member, with reductions: the
    # input kernel reduced both over the first's axes (a wrong result); a fusion that does not
    # fit one space now runs as a nested program.
    "reductions_over_two_spaces": """
HloModule two_spaces

fused (p0: s32[3,4]) -> s32[3] {
  p0 = s32[3,4] parameter(0)
  reduce_sum.0 = s32[3] reduce_sum(p0), axes={1}
  reduce_max.1 = s32[] reduce_max(p0), axes={0,1}
  broadcast_in_dim.2 = s32[3] broadcast_in_dim(reduce_max.1), dims={}
  ROOT add.3 = s32[3] add(reduce_sum.0, broadcast_in_dim.2)
}

ENTRY main (x: s32[3,4]) -> s32[3] {
  x = s32[3,4] parameter(0)
  ROOT fusion.0 = s32[3] fusion(x), kind=input, calls=fused
}
""",
    # ... and with dots: the kernel took the first to BLAS and could not emit the second.
    "two_dots_in_one_fusion": """
HloModule two_dots

fused (p0: s32[2,3], p1: s32[3,2], p2: s32[2,2]) -> s32[2,2] {
  p0 = s32[2,3] parameter(0)
  p1 = s32[3,2] parameter(1)
  p2 = s32[2,2] parameter(2)
  dot_general.0 = s32[2,2] dot_general(p0, p1), contracting={1;0}
  dot_general.1 = s32[2,2] dot_general(p2, p2), contracting={1;0}
  ROOT add.2 = s32[2,2] add(dot_general.0, dot_general.1)
}

ENTRY main (x: s32[2,3], y: s32[3,2], z: s32[2,2]) -> s32[2,2] {
  x = s32[2,3] parameter(0)
  y = s32[3,2] parameter(1)
  z = s32[2,2] parameter(2)
  ROOT fusion.0 = s32[2,2] fusion(x, y, z), kind=output, calls=fused
}
""",
    # A dot whose operand is computed in the fusion (random modules: a constant's broadcast):
    # BLAS takes parameters only, and lowering found no parameter for it (ValueError).
    "a_dot_of_a_value_computed_in_the_fusion": """
HloModule dot_of_computed

fused (p0: s32[2,3], p1: s32[3,2]) -> s32[2,2] {
  p0 = s32[2,3] parameter(0)
  p1 = s32[3,2] parameter(1)
  neg.0 = s32[2,3] neg(p0)
  dot_general.1 = s32[2,2] dot_general(neg.0, p1), contracting={1;0}
  ROOT mul.2 = s32[2,2] mul(dot_general.1, dot_general.1)
}

ENTRY main (x: s32[2,3], y: s32[3,2]) -> s32[2,2] {
  x = s32[2,3] parameter(0)
  y = s32[3,2] parameter(1)
  ROOT fusion.0 = s32[2,2] fusion(x, y), kind=output, calls=fused
}
""",
    # A reduction's result read at another row (the kernel holds only the current row's sum):
    # reversed, every row got its own sum back (a wrong result).
    "a_reduction_read_across_rows": """
HloModule across_rows

fused (p0: f32[3,4]) -> f32[3] {
  p0 = f32[3,4] parameter(0)
  reduce_sum.0 = f32[3] reduce_sum(p0), axes={1}
  ROOT rev.1 = f32[3] rev(reduce_sum.0), dimensions={0}
}

ENTRY main (x: f32[3,4]) -> f32[3] {
  x = f32[3,4] parameter(0)
  ROOT fusion.0 = f32[3] fusion(x), kind=input, calls=fused
}
""",
    # ... and a dot's: the epilogue transposes it, but past BLOCK_BYTES (16 MiB) the dot comes
    # a block of rows at a time, and the transpose read rows outside the block (garbage, or a
    # crash).
    "a_dot_read_across_rows": """
HloModule transposed_dot

fused (p0: f32[1025,1], p1: f32[1,4096]) -> f32[4096,1025] {
  p0 = f32[1025,1] parameter(0)
  p1 = f32[1,4096] parameter(1)
  dot_general.0 = f32[1025,4096] dot_general(p0, p1), contracting={1;0}
  ROOT transpose.1 = f32[4096,1025] transpose(dot_general.0), permutation={1,0}
}

ENTRY main (x: f32[1025,1], y: f32[1,4096]) -> f32[4096,1025] {
  x = f32[1025,1] parameter(0)
  y = f32[1,4096] parameter(1)
  ROOT fusion.0 = f32[4096,1025] fusion(x, y), kind=output, calls=fused
}
""",
}


@pytest.mark.parametrize("name", list(MODULES))
def test_numba_matches_the_interpreter(name):
    module = parse(MODULES[name])
    verify(module)
    check_against_the_interpreter(module, compile_module(module))


def test_c_matches_the_interpreter():
    """The same modules on the C backend, which lowers them as the numba backend does (its
    kernels rendered as C); all compiled into one library, one compiler run."""
    modules = [parse(text) for text in MODULES.values()]
    for name, module, executable in zip(MODULES, modules, compile_c_modules(modules)):
        try:
            check_against_the_interpreter(module, executable)
        except AssertionError as e:
            raise AssertionError(f"{name}: {e}") from e


def check_against_the_interpreter(module, executable) -> None:
    rng = np.random.default_rng(3)
    args = [(rng.standard_normal(p.shape.dims) * 50).astype(p.shape.dtype.numpy)
            for p in module.entry_computation.parameters]
    want = interpret(module, *args)
    got = executable([a.copy() for a in args])
    wants = list(want) if isinstance(want, tuple) else [want]
    if len(got) == 1 and isinstance(got[0], tuple):  # a root that is a tuple-valued fusion
        got = list(got[0])
    assert len(got) == len(wants)
    for g, w in zip(got, wants):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(g, w, rtol=2e-7, atol=0)  # exp, tanh: mathlib within 1 ulp


def test_no_kernel_reads_or_writes_out_of_bounds():
    """The same modules with numba's bounds checking on (in a process of its own: the flag is
    read when numba starts): an access past an array's end raises instead of corrupting."""
    root = Path(__file__).resolve().parents[2]
    code = (
        "import numpy as np\n"
        "from tests.backends.test_robustness import MODULES, test_numba_matches_the_interpreter\n"
        "for name in MODULES:\n"
        "    test_numba_matches_the_interpreter(name)\n"
        "print('ok')\n"
    )
    env = dict(os.environ, NUMBA_BOUNDSCHECK="1", PYTHONPATH=str(root))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          cwd=root, timeout=600, check=False)
    assert done.returncode == 0 and "ok" in done.stdout, done.stderr[-3000:]
