"""Control-flow steps in the runtime: while and conditional programs built by the numba and C
backends' lowering run the loop and pick the branch in the runtime (also asynchronously),
never hand out or clobber memory they do not own, and travel in AOT artifacts that run with
numpy alone; the C entry refuses them naming the step."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import xfuse
from benchmarks.aot import BLOCKER
from tests.hlo.test_control import counting_loop, three_way
from xfuse.backends.numba.backend import compile_module
from xfuse.backends.numba.lowering import lower
from xfuse.hlo import Builder, DType, Module, Op, Shape, interpret
from xfuse.runtime.asynchronous import call_async
from xfuse.runtime.program import walk

F32 = Shape(DType.F32, (3,))
S32 = Shape(DType.S32, ())


def test_lowering_nests_condition_body_and_branches():
    steps = lower(counting_loop()).program["steps"]
    loop = next(s for s in steps if s["op"] == "while")
    assert loop["flat"] and loop["label"] == "while loop.body"
    assert {s["op"] for s in walk(loop["body"])} >= {"kernel"}
    steps = lower(three_way()).program["steps"]
    branch = next(s for s in steps if s["op"] == "conditional")
    assert len(branch["branches"]) == 3 and branch["tupled"] == [False, False, False]
    kernels = [s["kernel"] for s in walk(lower(three_way()).program) if s["op"] == "kernel"]
    assert len(kernels) == len(set(kernels)) == 3


@pytest.mark.parametrize("limit", [0, 1, 5])
def test_while_step_runs_the_loop(limit):
    module = counting_loop(limit)
    executable = compile_module(module)
    x = np.array([1.0, -2.0, 0.5], np.float32)
    (got,) = executable([x])
    np.testing.assert_array_equal(got, interpret(module, x))
    (again,) = call_async(executable, [x]).result(timeout=60)
    np.testing.assert_array_equal(again, got)


@pytest.mark.parametrize("index", [-4, 0, 1, 2, 3, 99])
def test_conditional_step_picks_the_branch(index):
    module = three_way()
    executable = compile_module(module)
    x, y = np.array([1, 2, 3], np.float32), np.array([3, 4, 5], np.float32)
    (got,) = executable([np.int32(index), x, y])
    np.testing.assert_array_equal(got, interpret(module, np.int32(index), x, y))


def passing_loop(steps: int) -> Module:
    """(i, x, c) -> while i < steps: (i + 1, x, [7, 7, 7]): x passed along, c a constant."""
    cond = Builder("pass.cond")
    i = cond.parameter(S32, "i")
    cond.parameter(F32, "x")
    cond.parameter(F32, "c")
    cond_comp = cond.build(cond.lt(i, cond.constant(np.int32(steps))))
    body = Builder("pass.body")
    i, x, _ = body.parameter(S32, "i"), body.parameter(F32, "x"), body.parameter(F32, "c")
    seven = body.constant(np.full(3, 7, np.float32))
    body_comp = body.build([body.add(i, body.constant(np.int32(1))), x, seven])
    entry = Builder("main")
    x = entry.parameter(F32, "x")
    loop = entry.emit(Op.WHILE, entry.constant(np.int32(0)), x, x, condition="pass.cond", body="pass.body")
    root = [entry.get_tuple_element(loop, index=k) for k in (1, 2)]
    return Module.of(entry.build(root), cond_comp, body_comp, name="passing")


@pytest.mark.parametrize("steps", [0, 2])
def test_results_never_share_memory_with_arguments_or_constants(steps):
    executable = compile_module(passing_loop(steps))
    x = np.array([1.0, 2.0, 3.0], np.float32)
    kept = x.copy()
    first, second = executable([x])
    assert not np.shares_memory(first, x) and not np.shares_memory(second, x)
    first[...] = -1
    second[...] = -1
    np.testing.assert_array_equal(x, kept)
    again = executable([x])
    np.testing.assert_array_equal(again[0], kept)
    np.testing.assert_array_equal(again[1], kept if steps == 0 else np.full(3, 7, np.float32))


def test_state_that_is_also_a_result_is_not_clobbered():
    """A loop state element computed before the loop, read after it and returned."""

    def f(x):
        y = jnp.exp(x)
        _, z = lax.fori_loop(0, 3, lambda i, s: (s[0], s[1] * s[0]), (y, x))
        return y + 1, z, y

    x = np.linspace(-1, 1, 6, dtype=np.float32)
    compiled = xfuse.jit(f).lower(x).compile()
    for _ in range(2):
        got = compiled(x)
        want = jax.jit(f)(x)
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-6)


def test_c_entry_refuses_a_loop_it_cannot_run_naming_its_step(tmp_path):
    from xfuse.aot import emit_c

    def f(x):  # a loop with a branch inside: no C loop driver runs it
        body = lambda c: lax.cond(c[0] > 5, lambda v: v * 3, lambda v: v * 2, c)  # noqa: E731
        return lax.while_loop(lambda c: c.sum() < 100, body, x)

    compiled = xfuse.jit(f, backend="c").lower(np.ones(3, np.float32)).compile()
    with pytest.raises(ValueError, match=r"step '[\w.]+' \(while [\w.]+\.body\) is a loop the C entry "
                                         r"cannot run: .*conditional.* is control flow"):
        emit_c(compiled, tmp_path, "loop")
    assert not any(tmp_path.iterdir())


def rnn(xs, h0, wx, wh, b):
    def cell(h, x):
        h = jnp.tanh(x @ wx + h @ wh + b)
        return h, h * 2

    return lax.scan(cell, h0, xs, reverse=True)


def test_artifact_with_a_scan_runs_with_numpy_alone(tmp_path):
    rng = np.random.default_rng(3)
    shapes = [(6, 4, 3), (4, 5), (3, 5), (5, 5), (5,)]
    args = [(rng.standard_normal(s) * 0.5).astype(np.float32) for s in shapes]
    compiled = xfuse.jit(rnn).lower(*args).compile()
    path = compiled.save(tmp_path / "rnn.xfa")
    np.savez(tmp_path / "in.npz", *args)
    code = BLOCKER + textwrap.dedent(f"""
        import sys
        import numpy as np
        import xfuse.aot
        f = xfuse.aot.load({str(path)!r})
        with np.load({str(tmp_path / 'in.npz')!r}) as d:
            args = [d[f"arr_{{k}}"] for k in range(5)]
        h, ys = f(*args)
        np.savez({str(tmp_path / 'out.npz')!r}, h=h, ys=ys)
        blocked = [m for m in ("jax", "jaxlib", "numba", "llvmlite") if m in sys.modules]
        print("imported:", blocked)
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "imported: []" in done.stdout
    want_h, want_ys = jax.jit(rnn)(*args)
    with np.load(tmp_path / "out.npz") as out:
        np.testing.assert_allclose(out["h"], want_h, rtol=2e-5, atol=2e-5)
        np.testing.assert_allclose(out["ys"], want_ys, rtol=2e-5, atol=2e-5)
    assert "while" in xfuse.aot.inspect(path)


def fill(stack, xs, w):
    """Rows of xs @ w written into the caller's stack, one per step (in reverse)."""
    def step(s, t):
        row = jnp.tanh(xs[t] @ w)
        return lax.dynamic_update_slice(s, row[None], (xs.shape[0] - 1 - t, 0)), None

    return lax.scan(step, stack, jnp.arange(xs.shape[0]))[0]


@pytest.mark.parametrize("backend", ["c", "numba"])
def test_runtime_loops_write_a_stack_one_window_a_step(backend):
    """A loop the runtime runs (the C backend's; numba's built here without its native driver)
    writes each step's row into the stack in place: the body's stack fusion is a window step,
    the loop owns a copy of the initial stack, and the caller's array is never written."""
    from xfuse.backends.numba.compile import compile_kernel, settle
    from xfuse.runtime.program import Kernel, build

    rng = np.random.default_rng(5)
    stack = np.full((5, 4), 7.0, np.float32)
    xs, w = rng.standard_normal((5, 3)).astype(np.float32), rng.standard_normal((3, 4)).astype(np.float32)
    compiled = xfuse.jit(fill, backend=backend).lower(stack, xs, w).compile()
    lowered = lower(compiled.module)
    (loop,) = [s for s in walk(lowered.program) if s["op"] == "while"]
    windows = [s for s in loop["body"]["steps"] if "window" in s]
    assert len(windows) == 1 and loop["owned"] == [windows[0]["window"]["state"]]
    if backend == "c":
        run = compiled
    else:
        kernels = {n: Kernel(compile_kernel(s), settle) for n, s in lowered.kernels.items()}
        executable = build(lowered.program, kernels, lowered.constants)
        run = lambda *args: executable(list(args))[0]  # noqa: E731
    want = jax.jit(fill)(stack, xs, w)
    for _ in range(2):
        np.testing.assert_allclose(run(stack, xs, w), want, rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(stack, np.full((5, 4), 7.0, np.float32))


def test_the_window_step_clamps_its_starts_as_dynamic_update_slice_does():
    from xfuse.runtime.control import window_run
    from xfuse.runtime.executable import Executable

    # parts: the update and both starts are the inputs themselves
    parts = Executable([0, 1, 2, 3], [1, 2, 3], [], {}, 4)
    run = window_run({"target": 0, "dims": [4, 3], "update_dims": [2, 2]}, parts)
    for starts, rows, cols in [((3, 5), slice(2, 4), slice(1, 3)), ((-2, 0), slice(0, 2), slice(0, 2))]:
        target = np.zeros((4, 3), np.float32)
        update = np.array([[1, 2], [3, 4]], np.float32)
        (out,) = run([target, update, np.int32(starts[0]), np.int32(starts[1])])
        want = np.zeros((4, 3), np.float32)
        want[rows, cols] = update
        assert out is target
        np.testing.assert_array_equal(target, want)
