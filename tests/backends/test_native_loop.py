"""The numba backend's native loops: a while of kernels and matrix products runs as one numba
function, with the runtime's results (any trip count, scalars and constants in the state,
results that own their memory); a scan's stacked outputs are written a window at a time into
a buffer the loop owns, never into the caller's array; batched products run there too. The
pipeline here leaves out scan fusion, which would make the elementwise loops
one kernel each (tests/fusion/test_scan.py)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from tests.hlo.test_control import counting_loop
from tests.runtime.test_control import passing_loop
from xfuse.backends.numba.backend import compile_module
from xfuse.backends.numba.compile import compile_kernel, settle
from xfuse.backends.numba.lowering import lower
from xfuse.backends.numba.native_loop import _contiguous, eligible, native_loops
from xfuse.frontend import trace
from xfuse.fusion import Fuse, parse_pipeline, run_pipeline
from xfuse.hlo import interpret
from xfuse.runtime.program import Kernel, walk


STEP_BY_STEP = [*parse_pipeline("simplify,fold,cse,licm,dce"), Fuse(scan=False)]


def drivers_of(module):
    lowered = lower(module)
    kernels = {n: Kernel(compile_kernel(s), settle) for n, s in lowered.kernels.items()}
    return lowered, native_loops(lowered.program, kernels, lowered.constants, lowered.bodies)


@pytest.mark.parametrize("limit", [0, 1, 6])
def test_a_kernel_loop_runs_natively(limit):
    module = run_pipeline(counting_loop(limit), STEP_BY_STEP).module
    lowered, drivers = drivers_of(module)
    (step,) = [s for s in walk(lowered.program) if s["op"] == "while"]
    assert step["native"] in drivers
    assert "while True:" in drivers[step["native"]].fn.source
    x = np.array([1.0, -2.0, 0.5], np.float32)
    count, final = drivers[step["native"]].fn([np.int32(0), x])
    assert count.shape == () and int(count) == limit
    np.testing.assert_array_equal(final, x * 2.0**limit)
    (got,) = compile_module(module)([x])
    np.testing.assert_array_equal(got, interpret(module, x))


@pytest.mark.parametrize("steps", [0, 3])
def test_native_results_own_their_memory(steps):
    module = passing_loop(steps)
    lowered, drivers = drivers_of(module)
    assert any("native" in s for s in walk(lowered.program))
    executable = compile_module(module)
    x = np.array([1.0, 2.0, 3.0], np.float32)
    first, second = executable([x])
    first[...] = -1
    second[...] = -1
    again = executable([x])
    np.testing.assert_array_equal(again[0], [1, 2, 3])
    np.testing.assert_array_equal(again[1], [1, 2, 3] if steps == 0 else [7, 7, 7])


def traced(fn, *args, passes=STEP_BY_STEP):
    import jax

    specs = [jax.ShapeDtypeStruct(np.shape(a), np.asarray(a).dtype) for a in args]
    flat = lambda *a: jax.tree_util.tree_leaves(fn(*a))  # noqa: E731
    module = trace(flat, specs, [f"a{k}" for k in range(len(args))], fn.__name__)
    return run_pipeline(module, passes).module


def test_a_loop_with_a_matrix_product_runs_natively():
    def matrix_power(m):
        return lax.fori_loop(0, 3, lambda i, p: p @ m, jnp.eye(4, dtype=m.dtype))

    m = (np.arange(16, dtype=np.float32).reshape(4, 4) - 8) / 10
    module = traced(matrix_power, m)
    lowered, drivers = drivers_of(module)
    (driver,) = drivers.values()
    assert "small_matmul_t(" in driver.fn.source  # m is invariant: transposed once, before the loop
    assert "small_matmul_t_rest(" not in driver.fn.source  # 4x4: whole blocks of 4x2
    (got,) = compile_module(module)([m])
    np.testing.assert_allclose(got, np.linalg.matrix_power(m, 3), rtol=1e-5, atol=1e-6)


def test_loops_that_repeat_a_computation_compile_their_kernels_and_driver_once(tmp_path, monkeypatch):
    """Three loops the same but for their names (as jax.random.gamma's sampler is, once for each
    gamma): one driver, and one compiled kernel for each text; the results stay each loop's own.
    A fourth loop computing otherwise (another constant) gets kernels and a driver of its own."""
    monkeypatch.setenv("XFUSE_CACHE_DIR", str(tmp_path))

    def loop(x, scale):
        return lax.fori_loop(0, 4, lambda i, c: jnp.tanh(c * scale + i.astype(c.dtype)), x)

    def four(a, b, c):
        return loop(a, 1.5), loop(b, 1.5), loop(c, 1.5), loop(a, 0.5)

    x = np.linspace(-2, 2, 12, dtype=np.float32).reshape(3, 4)
    args = (x, x[::-1].copy(), -x)
    module = traced(four, *args)
    lowered, drivers = drivers_of(module)
    loops = [s for s in walk(lowered.program) if s["op"] == "while"]
    assert len(loops) == 4 and all("native" in s for s in loops)
    assert len({s["native"] for s in loops}) == 2 and len(drivers) == 2
    made = {}
    for name, source in lowered.kernels.items():
        made.setdefault(compile_kernel(source), []).append(name)
    assert len(made) < len(lowered.kernels)
    assert any(len(names) == 3 for names in made.values())
    got = compile_module(module)(list(args))
    for g, want in zip(got, interpret(module, *args)):
        np.testing.assert_allclose(g, want, rtol=2e-6, atol=1e-6)


def test_a_loop_of_batched_and_higher_rank_products_runs_natively():
    """Products no matrix or vector form takes (batch dimensions, a vector by a rank-3
    operand: an ODE solver's tableau times its stages) run in the driver as batched matrix
    products of permuted operands."""
    def solver_like(m, tableau, stages):
        def body(i, carry):
            p, s = carry
            p = jnp.einsum("bij,bjk->bik", p, m) * 0.5
            s = s + jnp.einsum("k,bkd->bd", tableau, stages) * 0.1 + jnp.einsum("bd,bd->b", s, s)[:, None] * 1e-3
            return p, s + jnp.einsum("kb,bkd->bd", tableau[:, None] * s[:, :1].T, stages)
        return lax.fori_loop(0, 4, body, (m, stages[:, 0]))

    rng = np.random.default_rng(1)
    m = rng.standard_normal((2, 3, 3)).astype(np.float32)
    tableau = rng.standard_normal(7).astype(np.float32)
    stages = rng.standard_normal((5, 7, 4)).astype(np.float32)
    stages[0, 1, 2] = np.nan
    module = traced(solver_like, m, tableau, stages)
    lowered, drivers = drivers_of(module)
    (loop,) = [s for s in walk(lowered.program) if s["op"] == "while"]
    assert eligible(loop) and loop["native"] in drivers
    assert "batched_matmul(" in drivers[loop["native"]].fn.source
    got = compile_module(module)([m, tableau, stages])
    want = interpret(module, m, tableau, stages)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(np.isnan(g), np.isnan(w))
        np.testing.assert_allclose(g, w, rtol=2e-5, atol=1e-6)


def rnn(xs, wx, wh, b):
    def cell(h, x):
        h = jnp.tanh(x @ wx + h @ wh + b)
        return h, h

    return lax.scan(cell, jnp.zeros((xs.shape[1], wh.shape[0]), xs.dtype), xs)


def rnn_inputs(steps=5, batch=3, hidden=8):
    rng = np.random.default_rng(2)
    xs = rng.standard_normal((steps, batch, hidden)).astype(np.float32)
    wx, wh = (rng.standard_normal((hidden, hidden)).astype(np.float32) / hidden for _ in range(2))
    return xs, wx, wh, rng.standard_normal(hidden).astype(np.float32)


def test_a_scanned_rnn_runs_natively_writing_each_step_in_place():
    import jax

    args = rnn_inputs()
    module = traced(rnn, *args)
    lowered, drivers = drivers_of(module)
    (driver,) = drivers.values()
    source = driver.fn.source
    assert source.count("small_matmul_t(") == 1  # h @ wh; x_t @ wx was hoisted out of the loop
    # The stack is the loop's own copy (made before the call), written a window a step; the
    # invariant wh is transposed before the call too, so numba compiles neither.
    # The step's window is one run of the stack: a copy loop in the driver, no put_window.
    assert driver.fn.driver.owned and "put_window(" not in source and "_to[np.uint64(" in source
    assert driver.fn.driver.transposed and ".copy()" not in source and ".T" not in source
    run = compile_module(module)
    want = jax.tree_util.tree_leaves(jax.jit(rnn)(*args))
    for _ in range(2):  # the second call starts from the same state: nothing the first wrote stays
        got = run([np.copy(a) for a in args])
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("dims, update, expected", [
    ((128, 16, 256), (1, 16, 256), True), ((5, 3), (1, 3), True), ((5, 3), (5, 3), True),
    ((5, 3), (1, 1), True), ((4, 6, 2), (1, 3, 2), True), ((5, 3), (5, 1), False),
    ((4, 6, 2), (2, 6, 1), False), ((4, 6, 2), (1, 3, 1), False),
])
def test_which_windows_are_one_run_of_the_buffer(dims, update, expected):
    assert _contiguous(dims, update) is expected


def test_a_column_window_goes_through_put_window():
    """A window that is not one run of the buffer (a column a step) is written by put_window."""
    import jax

    def columns(m):
        def body(i, m):
            column = jnp.full((m.shape[0], 1), i.astype(m.dtype) * 2 + 1)
            return lax.dynamic_update_slice(m, column, (0, i))

        return lax.fori_loop(0, m.shape[1], body, m)

    m = np.arange(12, dtype=np.float32).reshape(4, 3)
    module = traced(columns, m)
    _, drivers = drivers_of(module)
    (driver,) = drivers.values()
    assert "put_window(" in driver.fn.source and "_to[np.uint64(" not in driver.fn.source
    run = compile_module(module)
    for _ in range(2):
        (got,) = run([m.copy()])
        np.testing.assert_array_equal(got, jax.jit(columns)(m))


def test_a_window_across_a_partial_axis_is_copied_as_one_run():
    """A (1, 3, 2) block of a (4, 6, 2) buffer starts anywhere along the middle axis, clamped
    into range as XLA clamps it (a start of 5 writes rows 3 to 5)."""
    import jax

    def blocks(m):
        def body(i, m):
            block = jnp.full((1, 3, 2), i.astype(m.dtype) + 0.5)
            return lax.dynamic_update_slice(m, block, (i, (i % 2) * 5, 0))

        return lax.fori_loop(0, m.shape[0], body, m)

    m = np.arange(48, dtype=np.float32).reshape(4, 6, 2)
    module = traced(blocks, m)
    _, drivers = drivers_of(module)
    (driver,) = drivers.values()
    assert "put_window(" not in driver.fn.source and "_to[np.uint64(" in driver.fn.source
    run = compile_module(module)
    for _ in range(2):
        (got,) = run([m.copy()])
        np.testing.assert_array_equal(got, jax.jit(blocks)(m))


def test_a_stack_read_in_the_body_is_not_written_in_place():
    """A body that reads the stacked output it updates (here its running sum) copies it."""

    def running(xs):
        def step(carry, t):
            stack, total = carry
            stack = lax.dynamic_update_slice(stack, xs[t][None] * 2.0, (t, 0))
            return (stack, total + jnp.sum(stack)), None

        init = (jnp.zeros_like(xs), jnp.float32(0))
        return lax.scan(step, init, jnp.arange(xs.shape[0]))[0]

    xs = np.arange(12, dtype=np.float32).reshape(4, 3)
    module = traced(running, xs)
    lowered, drivers = drivers_of(module)
    for driver in drivers.values():
        assert ".copy()" not in driver.fn.source
    stack, total = compile_module(module)([xs])
    np.testing.assert_array_equal(stack, xs * 2)
    assert float(total) == float(sum((xs[: t + 1] * 2).sum() for t in range(4)))


def test_the_callers_initial_stack_is_left_alone():
    def fill(stack, xs):
        def step(s, t):
            return lax.dynamic_update_slice(s, xs[t][None], (t, 0)), None

        return lax.scan(step, stack, jnp.arange(xs.shape[0]))[0]

    stack = np.full((3, 2), 7.0, np.float32)
    xs = np.arange(6, dtype=np.float32).reshape(3, 2)
    module = traced(fill, stack, xs)
    lowered, drivers = drivers_of(module)
    assert any(d.fn.driver.owned for d in drivers.values())
    executable = compile_module(module)
    (got,) = executable([stack, xs])
    np.testing.assert_array_equal(got, xs)
    np.testing.assert_array_equal(stack, np.full((3, 2), 7.0, np.float32))


def test_newton_iterations_match_the_interpreter():
    def newton(x):
        a = jnp.abs(x) + 0.5
        state = (jnp.int32(0), a)
        cond = lambda s: (s[0] < 40) & jnp.any(jnp.abs(s[1] * s[1] - a) > 1e-6 * a)  # noqa: E731
        return lax.while_loop(cond, lambda s: (s[0] + 1, 0.5 * (s[1] + a / s[1])), state)

    x = np.random.default_rng(5).standard_normal((4, 6)).astype(np.float32) * 50
    module = traced(newton, x)
    lowered, drivers = drivers_of(module)
    assert drivers
    got = compile_module(module)([x])
    want = interpret(module, x)
    assert int(got[0]) == int(want[0])
    np.testing.assert_allclose(got[1], want[1], rtol=1e-6)


def test_branches_inside_a_loop_run_natively():
    import jax

    def piecewise_walk(x):
        def step(carry, t):
            branch = lax.switch(t % 4 - 1, [lambda v: v * 0.5, lambda v: v + 1.0, lambda v: -v], carry)
            kept = lax.cond(jnp.sum(branch) > 0, lambda v: (v, v * 2), lambda v: (v - 1, v), branch)
            return kept[0], kept[1]

        return lax.scan(step, x, jnp.arange(7))

    x = np.array([0.5, -1.5, 2.0], np.float32)
    module = traced(piecewise_walk, x)
    lowered, drivers = drivers_of(module)
    (driver,) = drivers.values()
    assert "_index == 1:" in driver.fn.source and "else:" in driver.fn.source
    got = compile_module(module)([x])
    want = jax.tree_util.tree_leaves(jax.jit(piecewise_walk)(x))
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_loop_of_small_products_runs_them_in_blas_on_one_thread(dtype, monkeypatch):
    """Products past BLAS_DOT_MIN and BLAS_ROWS_MIN in a loop whose products are all small go
    to BLAS (np.dot), which runs on one thread while the driver runs; special values flow as
    in jax.jit."""
    import contextlib

    import jax

    from xfuse.runtime import blas

    from xfuse.backends.numba.loop_kernels import PANEL
    from xfuse.backends.numba.native_loop import BLAS_DOT_MIN, BLAS_ROWS_MIN, THREADED_DOT

    # 64x60 @ 60x60: past BLAS_DOT_MIN and BLAS_ROWS_MIN whatever the CPU, small, and not
    # columns in whole panels of 32 (`_packs`: those go through packed_matmul)
    xs, wx, wh, b = (a.astype(dtype) for a in rnn_inputs(steps=6, batch=64, hidden=60))
    assert BLAS_DOT_MIN <= 64 * 60 * 60 <= THREADED_DOT and BLAS_ROWS_MIN <= 64 and 60 % PANEL
    xs[1, 2, 3], xs[2, 0, 0], xs[3, 1, 1], xs[4, 5, :] = np.nan, np.inf, -np.inf, -0.0
    with jax.enable_x64(dtype == np.float64):
        module = traced(rnn, xs, wx, wh, b)
        want = jax.tree_util.tree_leaves(jax.jit(rnn)(xs, wx, wh, b))
    lowered, drivers = drivers_of(module)
    (driver,) = drivers.values()
    assert "np.dot(" in driver.fn.source and "small_matmul" not in driver.fn.source
    assert driver.fn.driver.one_thread and not driver.fn.driver.transposed

    inside = []
    original = blas.single_threaded

    @contextlib.contextmanager
    def recording():
        with original():
            inside.append((blas.threads(), len(blas.controls()), len(blas._loaded_openblas())))
            yield

    monkeypatch.setattr(blas, "single_threaded", recording)
    executable = compile_module(module)
    got = executable([xs, wx, wh, b])
    # every OpenBLAS loaded is on one thread: numpy's, and scipy's, which numba's np.dot calls
    assert inside and all(counts == [1] * known and known == loaded for counts, known, loaded in inside)
    tol = 1e-5 if dtype == np.float32 else 1e-12
    for g, w in zip(got, want):
        assert g.dtype == dtype
        np.testing.assert_allclose(g, np.asarray(w), rtol=tol, atol=tol)  # NaN where jax has NaN


@pytest.mark.parametrize("rows_min", [1, 64])
def test_where_small_products_go_follows_the_cpus_rule(rows_min, monkeypatch):
    """BLAS_ROWS_MIN depends on the CPU (1 with AVX-512, 64 without); both settings are tried
    here whatever the host: 8x48 @ 48x48 (columns not in whole panels of 32: not packed_matmul's)
    goes to BLAS at the first and to the driver's loops at the second, and the results agree
    with jax.jit either way."""
    import jax

    from xfuse.backends.numba import native_loop

    monkeypatch.setattr(native_loop, "BLAS_ROWS_MIN", rows_min)
    xs, wx, wh, b = rnn_inputs(steps=6, batch=8, hidden=48)
    xs[2, 1, 5] = np.nan
    module = traced(rnn, xs, wx, wh, b)
    lowered, drivers = drivers_of(module)
    (driver,) = drivers.values()
    in_blas = rows_min <= 8
    assert ("np.dot(" in driver.fn.source) == in_blas
    assert ("small_matmul_t(" in driver.fn.source) == (not in_blas)
    got = compile_module(module)([xs, wx, wh, b])
    want = jax.tree_util.tree_leaves(jax.jit(rnn)(xs, wx, wh, b))
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, np.asarray(w), rtol=1e-5, atol=1e-5)


def test_a_loop_with_a_large_product_keeps_its_small_ones_in_its_own_loops():
    """A large product needs BLAS's threads, so the loop does not set BLAS to one thread, and
    its small products stay in the driver's loops (BLAS would thread them too)."""
    import jax

    def two_products(h, wh, p, m):
        def body(i, state):
            h, p = state
            return jnp.tanh(h @ wh), p @ m  # 8x48 @ 48x48 (small, not packed), 256x256 @ 256x256 (large)

        return lax.fori_loop(0, 3, body, (h, p))

    rng = np.random.default_rng(7)
    h, wh = rng.standard_normal((8, 48)).astype(np.float32), rng.standard_normal((48, 48)).astype(np.float32) / 8
    p, m = rng.standard_normal((256, 256)).astype(np.float32), rng.standard_normal((256, 256)).astype(np.float32) / 16
    module = traced(two_products, h, wh, p, m)
    lowered, drivers = drivers_of(module)
    (driver,) = drivers.values()
    assert driver.fn.source.count("np.dot(") == 1 and "small_matmul_t(" in driver.fn.source
    assert not driver.fn.driver.one_thread
    got = compile_module(module)([h, wh, p, m])
    want = jax.tree_util.tree_leaves(jax.jit(two_products)(h, wh, p, m))
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, np.asarray(w), rtol=1e-4, atol=1e-4)


def test_the_parts_of_a_split_loop_run_every_product_on_their_own_thread(monkeypatch):
    """32x200 @ 200x200 a step is past THREADED_DOT: whole, the loop runs it on BLAS's threads;
    split by rows (`fusion.rowsplit`), each part runs its half on its own thread, BLAS set to
    one: two parts each calling a threaded BLAS would fight over the cores."""
    import jax

    from xfuse.backends.numba.native_loop import THREADED_DOT

    monkeypatch.setenv("XFUSE_NUM_THREADS", "2")
    xs, wx, wh, b = rnn_inputs(steps=4, batch=32, hidden=200)
    xs[1, 3, 2], xs[2, 20, :] = np.nan, -0.0
    assert 32 * 200 * 200 > THREADED_DOT
    whole = traced(rnn, xs, wx, wh, b)
    rowsplit = [*parse_pipeline("simplify,fold,cse,licm,rowsplit,dce"), Fuse(scan=False)]
    split = traced(rnn, xs, wx, wh, b, passes=rowsplit)
    for module, parts in ((whole, 1), (split, 2)):
        lowered, drivers = drivers_of(module)
        loops = [s for s in walk(lowered.program) if s["op"] == "while"]
        assert len(loops) == parts and all(s["native"] in drivers for s in loops)
        for d in drivers.values():  # whole: BLAS with its threads; a part: none but its own
            threaded = "np.dot(" in d.fn.source and not d.fn.driver.one_thread
            assert threaded == (parts == 1)
        got = compile_module(module)([xs, wx, wh, b])
        want = jax.tree_util.tree_leaves(jax.jit(rnn)(xs, wx, wh, b))
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, np.asarray(w), rtol=2e-5, atol=2e-5)  # NaN where jax has NaN


@pytest.mark.parametrize("m, k, n", [(8, 256, 256), (16, 37, 64), (24, 1, 32), (8, 300, 96), (8, 0, 32)])
def test_packed_products_match_float64_with_special_values(m, k, n):
    """packed_matmul through its tiles (rows in eights, columns in panels of 32, any contracting
    length, the contracting dimension in one block): within k roundings of the float64 product;
    NaN, infinities and signed zeros as IEEE has them."""
    from xfuse.backends.numba.loop_kernels import packed_matmul, panels

    rng = np.random.default_rng(m * 1000 + k)
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    if k > 3:
        a[1, 2], a[2, 0], b[3, 5], a[3, :] = np.nan, np.inf, -np.inf, -0.0
        b[:, 7] = -0.0  # with a[3] all -0.0: -0.0 * -0.0 sums to +0.0; a row of zeros times finite: +-0
    out = np.full((m, n), 7.0, np.float32)
    packed_matmul(a, b, panels(b), out)
    with np.errstate(invalid="ignore", over="ignore"):
        want = a.astype(np.float64) @ b.astype(np.float64)
        size = np.abs(a).astype(np.float64) @ np.abs(b).astype(np.float64)
    finite = np.isfinite(want)
    assert np.array_equal(np.isnan(out), np.isnan(want)) and np.array_equal(out[~finite & ~np.isnan(want)],
                                                                          want[~finite & ~np.isnan(want)])
    bound = (k + 1) * 2.0**-24 * size[finite] + 2.0**-126
    assert (np.abs(out[finite] - want[finite]) <= bound).all()
    zeros = (want == 0) & finite
    assert np.array_equal(np.signbit(out[zeros]), np.signbit(want[zeros]))  # as numpy's BLAS, in float64


def test_packed_products_fall_back_where_the_tiles_do_not_take_them():
    """Operands not C-ordered (the left side's rows or the result's strided) or float64: one sum
    at a time (`_plain_matmul`), the same numbers as numpy's product up to rounding. Rows not a
    multiple of 8 in C-ordered float32 (the driver never passes them): ValueError, nothing written
    past the result."""
    from xfuse.backends.numba.loop_kernels import packed_matmul, panels

    rng = np.random.default_rng(3)
    b = rng.standard_normal((16, 64)).astype(np.float32)
    cases = [(rng.standard_normal((8, 32)).astype(np.float32)[:, ::2], np.zeros((8, 64), np.float32)),
             (rng.standard_normal((8, 16)).astype(np.float32), np.zeros((8, 128), np.float32)[:, ::2])]
    for a, out in cases:
        packed_matmul(a, b, panels(b), out)
        np.testing.assert_allclose(out, a @ b, rtol=1e-5, atol=1e-5)
    a64, b64 = rng.standard_normal((8, 16)), rng.standard_normal((16, 64))
    out64 = np.zeros((8, 64))
    packed_matmul(a64, b64, panels(b64), out64)
    np.testing.assert_allclose(out64, a64 @ b64, rtol=1e-12)
    whole = np.zeros((6, 64), np.float32)
    with pytest.raises(ValueError, match="packed_matmul"):
        packed_matmul(rng.standard_normal((5, 16)).astype(np.float32), b, panels(b), whole[:5])
    assert not whole.any()


@pytest.mark.parametrize("enabled", [True, False])
def test_a_loop_packs_its_right_side_once_where_kernels_use_512_bit_vectors(enabled, monkeypatch):
    """An invariant right side of a float32 product with rows in eights and columns in panels
    of 32 is packed before the loop and multiplied by packed_matmul (gemm.ENABLED: where
    kernels use 512-bit vectors; set either way here, as the tile computes the same anywhere);
    elsewhere the products stay where they went. Special values flow as in jax.jit."""
    import jax

    from xfuse.backends.numba import gemm

    monkeypatch.setattr(gemm, "ENABLED", enabled)
    xs, wx, wh, b = rnn_inputs(steps=6, batch=16, hidden=64)
    xs[1, 2, 3], xs[2, 0, 0], xs[3, 1, 1], xs[4, 5, :] = np.nan, np.inf, -np.inf, -0.0
    module = traced(rnn, xs, wx, wh, b)
    lowered, drivers = drivers_of(module)
    (driver,) = drivers.values()
    assert ("packed_matmul(" in driver.fn.source) == enabled
    assert (len(driver.fn.driver.packed) == 1) == enabled and not driver.fn.driver.transposed
    got = compile_module(module)([xs, wx, wh, b])
    want = jax.tree_util.tree_leaves(jax.jit(rnn)(xs, wx, wh, b))
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, np.asarray(w), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("m, k, n", [(5, 7, 3), (4, 16, 2), (1, 1, 1), (9, 3, 6)])
def test_small_products_match_numpy_with_special_values(m, k, n):
    """Both of the driver's own matrix products, at sizes that leave row and column tails:
    `small_matmul_t` computes whole blocks of 4x2 results, `small_matmul_t_rest` the rest
    (called, as the driver calls it, only when there is a rest)."""
    from xfuse.backends.numba.native_loop import small_matmul, small_matmul_t, small_matmul_t_rest

    def transposed(a, bt, out):
        small_matmul_t(a, bt, out)
        if m % 4 or n % 2:
            small_matmul_t_rest(a, bt, out)

    rng = np.random.default_rng(m * 100 + k * 10 + n)
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    a[0, 0], b[-1, -1] = np.nan, np.inf
    want = a.astype(np.float64) @ b.astype(np.float64)
    for product, rhs in ((small_matmul, b), (transposed, np.ascontiguousarray(b.T))):
        out = np.full((m, n), 7.0, np.float32)
        product(a, rhs, out)
        np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)


def test_a_loop_multiplying_by_an_invariant_matrix_transposes_it_once():
    import jax

    def powers(x, m):
        return lax.scan(lambda h, _: (h @ m, h), x, None, length=5)

    rng = np.random.default_rng(4)
    x, m = rng.standard_normal((6, 5)).astype(np.float32), rng.standard_normal((5, 5)).astype(np.float32) / 3
    module = traced(powers, x, m)
    lowered, drivers = drivers_of(module)
    (driver,) = drivers.values()
    # m (state element 1) is transposed once, before the driver is called; x has 6 rows, so
    # two are left over from the blocks of four.
    assert "small_matmul_t(" in driver.fn.source and driver.fn.driver.transposed == [1]
    assert "small_matmul_t_rest(" in driver.fn.source
    got = compile_module(module)([x, m])
    want = jax.tree_util.tree_leaves(jax.jit(powers)(x, m))
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
