"""Modules the fusion pass never makes but a hand-written or generated module may hold, on the
numba backend against the reference interpreter (each once found by random modules): a loop
fusion whose outputs differ in shape (it once wrote past the smaller output), calls, names that
are not Python identifiers, tuples inside a fusion, zero-size values, a scalar-times-vector dot,
a concatenation of empty operands."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

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
}


@pytest.mark.parametrize("name", list(MODULES))
def test_numba_matches_the_interpreter(name):
    module = parse(MODULES[name])
    verify(module)
    rng = np.random.default_rng(3)
    args = [(rng.standard_normal(p.shape.dims) * 50).astype(p.shape.dtype.numpy)
            for p in module.entry_computation.parameters]
    want = interpret(module, *args)
    got = compile_module(module)([a.copy() for a in args])
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
