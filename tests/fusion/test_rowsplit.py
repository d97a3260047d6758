"""The `rowsplit` pass: a loop whose body keeps the rows of a batch apart runs as one loop per
part of the batch, and the parts run at once. A scanned RNN splits (its state, its stacked
output and its hoisted input products along the batch), and gives the same results on every
backend as unsplit and as jax.jit, with NaN, infinities and -0.0 in its inputs; loops whose rows
mix (a sum over the batch, a roll of the rows, a condition on the state), small loops, and
one-thread runs stay whole; the parts run on two threads."""

from __future__ import annotations

import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import xfuse
from tests.tolerances import ACCUMULATION, assert_close
from xfuse.fusion import RowSplitLoops, parse_pipeline, run_pipeline
from xfuse.compiler import compile_module, make_choice
from xfuse.hlo import DType, Op, interpret, parse, verify
from xfuse.runtime import parallel
from xfuse.runtime import split_loops

BATCH, FEATURES, HIDDEN, STEPS = 16, 32, 128, 6  # 16 x 128 x 128: 2**18 multiply-adds a step


def rnn(xs, wx, wh, b):
    def cell(h, x):
        h = jnp.tanh(x @ wx + h @ wh + b)
        return h, h

    return lax.scan(cell, jnp.zeros((xs.shape[1], wh.shape[0]), xs.dtype), xs)[1]


def rnn_mixing_rows(xs, wx, wh, b):
    def cell(h, x):
        h = jnp.tanh(x @ wx + h @ wh + b + jnp.mean(h, axis=0))  # every row reads every row
        return h, h

    return lax.scan(cell, jnp.zeros((xs.shape[1], wh.shape[0]), xs.dtype), xs)[1]


def rnn_rolling_rows(xs, wx, wh, b):
    def cell(h, x):
        h = jnp.tanh(x @ wx + jnp.roll(h, 1, axis=0) @ wh + b)  # row r reads row r - 1
        return h, h

    return lax.scan(cell, jnp.zeros((xs.shape[1], wh.shape[0]), xs.dtype), xs)[1]


def rnn_until_large(xs, wx, wh, b):
    def cond(state):
        t, h = state
        return (t < xs.shape[0]) & (jnp.max(jnp.abs(h)) < 0.999)  # the condition reads every row

    def body(state):
        t, h = state
        return t + 1, jnp.tanh(xs[t] @ wx + h @ wh + b)

    return lax.while_loop(cond, body, (0, jnp.zeros((xs.shape[1], wh.shape[0]), xs.dtype)))[1]


def arguments(batch=BATCH, hidden=HIDDEN, edges=True):
    rng = np.random.default_rng(7)
    xs = rng.standard_normal((STEPS, batch, FEATURES)).astype(np.float32)
    wx = (rng.standard_normal((FEATURES, hidden)) / 8).astype(np.float32)
    wh = (rng.standard_normal((hidden, hidden)) / 16).astype(np.float32)
    b = rng.standard_normal(hidden).astype(np.float32) / 4
    if edges:  # rows 1, 9 and 14 meet NaN, an infinity and -0.0 (each stays in its own row)
        xs[2, 1, 3], xs[0, 9, 5], xs[4, 14, :] = np.nan, np.inf, -0.0
    return xs, wx, wh, b


def split_of(fn, *args, parts=2):
    """(the module before the pass, after it, the pass)."""
    module = xfuse.jit(fn, passes="none").lower(*args).module
    before = run_pipeline(module, parse_pipeline("simplify,fold,cse,licm")).module
    rowsplit = RowSplitLoops(parts=parts)
    after = rowsplit.run(before)
    verify(after)
    return before, after, rowsplit


def loops(module):
    return [i for i in module.entry_computation.instructions if i.op is Op.WHILE]


def test_an_rnn_runs_as_two_loops_over_half_its_batch_each():
    args = arguments()
    before, after, rowsplit = split_of(rnn, *args)
    (split,) = rowsplit.splits
    assert (split.parts, split.rows) == (2, BATCH)
    assert "runs as 2 loops over 8 of its 16 rows" in str(split)
    first, second = loops(after)
    assert first.attr("body") == second.attr("body")  # one body, of the part's shapes
    body = {c.name: c for c in after.computations}[first.attr("body")]
    h = body.parameters[next(k for k, a in enumerate(split.axes) if a == 0)]
    assert h.shape.dims == (BATCH // 2, HIDDEN)
    want = np.asarray(interpret(before, *args))
    got = np.asarray(interpret(after, *args))
    np.testing.assert_array_equal(got, want)  # the same operations on each row: bit for bit
    assert np.isnan(got[2:, 1]).any() and not np.isnan(np.delete(got, [1, 9, 14], axis=1)).any()


@pytest.mark.parametrize("backend", ["numba", "c", "jax", "reference"])
def test_a_split_rnn_agrees_with_jax_jit(backend):
    """numba and C (xfuse's runtime runs the parts at once) split by default; the jax and
    reference backends run the parts in turn, so only a pipeline naming the pass splits there."""
    args = arguments()
    default = xfuse.jit(rnn, backend=backend).lower(*args).compile()
    splits = any(r.name == "rowsplit" and r.changed for r in default.pass_history())
    assert splits == (backend in ("numba", "c"))
    said = "runs as 2 loops over 8 of its 16 rows each" in str(default.fusion_report())
    assert said == splits  # the report says what the pass did
    compiled = default if splits else xfuse.jit(
        rnn, backend=backend, passes="simplify,fold,cse,licm,rowsplit,dce,fuse").lower(*args).compile()
    assert any(r.name == "rowsplit" and r.changed for r in compiled.pass_history())
    got = np.asarray(compiled(*args))
    want = np.asarray(jax.jit(rnn)(*args))
    assert np.array_equal(np.isnan(got), np.isnan(want))
    assert_close(got, want, DType.F32, f"split rnn on {backend}", ACCUMULATION, scale=np.full(got.shape, 4.0))


@pytest.mark.parametrize("fn", [rnn_mixing_rows, rnn_rolling_rows, rnn_until_large])
def test_a_loop_whose_rows_mix_stays_whole(fn):
    args = arguments(edges=False)
    before, after, rowsplit = split_of(fn, *args)
    assert rowsplit.splits == [] and after is before
    got = np.asarray(xfuse.jit(fn)(*args))
    assert_close(got, np.asarray(jax.jit(fn)(*args)), DType.F32, fn.__name__, ACCUMULATION,
                 scale=np.full(got.shape, 4.0))


def test_a_small_loop_and_one_part_stay_whole():
    _, _, small = split_of(rnn, *arguments(batch=4, hidden=16, edges=False))
    assert small.splits == []
    _, _, alone = split_of(rnn, *arguments(), parts=1)
    assert alone.splits == []


def test_the_parts_run_at_once_on_two_threads(monkeypatch):
    parallel.set_num_threads(2)
    threads, real = [], split_loops.run_each

    def run_each(fns):
        def traced(fn):
            def go():
                threads.append(threading.get_ident())
                fn()
            return go

        real([traced(fn) for fn in fns])

    monkeypatch.setattr(split_loops, "run_each", run_each)
    try:
        args = arguments()
        got = np.asarray(xfuse.jit(rnn)(*args))
    finally:
        parallel.set_num_threads(None)
    assert len(threads) == 2 and len(set(threads)) == 2
    assert_close(got, np.asarray(jax.jit(rnn)(*args)), DType.F32, "rnn", ACCUMULATION,
                 scale=np.full(got.shape, 4.0))


def rnn_transposed_weight(xs, wx, wh, b):
    def cell(h, x):
        h = jnp.tanh(x @ wx + h @ wh.T + b)  # a transpose of a matrix the same in every row
        return h, h

    return lax.scan(cell, jnp.zeros((xs.shape[1], wh.shape[0]), xs.dtype), xs)[1]


def rnn_batch_last(xs, wx, wh, b):
    def cell(h, x):  # h is (hidden, batch): the batch is the right side's free axis
        h = jnp.tanh(wx.T @ x.T + wh @ h + b[:, None])
        return h, h.T

    return lax.scan(cell, jnp.zeros((wh.shape[0], xs.shape[1]), xs.dtype), xs)[1]


def leaky_fori(xs, wx, wh, b):
    h0 = jnp.tanh(xs[0] @ wx)
    return lax.fori_loop(0, 5, lambda i, h: jnp.tanh(h @ wh + b) * 0.5 + h * 0.5, h0)


def lstm(xs, wx, wh, b):
    """flax's OptimizedLSTMCell's shape: one product for the four gates, sliced, and a bias
    kept as a row (1, 4 * hidden) broadcast over the batch."""
    hidden = wh.shape[0]
    wx4, wh4, b4 = jnp.tile(wx, (1, 4)), jnp.tile(wh, (1, 4)) / 2, jnp.tile(b, 4).reshape(1, -1)

    def cell(carry, x):
        c, h = carry
        z = x @ wx4 + h @ wh4 + b4
        i, f, g, o = (z[:, k * hidden:(k + 1) * hidden] for k in range(4))
        c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
        h = jax.nn.sigmoid(o) * jnp.tanh(c)
        return (c, h), h

    zeros = jnp.zeros((xs.shape[1], hidden), xs.dtype)
    return lax.scan(cell, (zeros, zeros), xs)[1]


@pytest.mark.parametrize("fn, hidden", [(rnn_transposed_weight, HIDDEN), (rnn_batch_last, HIDDEN),
                                        (leaky_fori, HIDDEN), (lstm, 64)])
def test_other_loops_that_keep_rows_apart_split(fn, hidden):
    """The LSTM splits through its gates' slices and its bias row (16 x 64 by 64 x 256: 2**18
    multiply-adds a step)."""
    args = arguments(hidden=hidden)
    before, after, rowsplit = split_of(fn, *args)
    assert len(rowsplit.splits) == 1 and len(loops(after)) == 2
    np.testing.assert_array_equal(np.asarray(interpret(after, *args)), np.asarray(interpret(before, *args)))
    got = np.asarray(xfuse.jit(fn)(*args))
    want = np.asarray(jax.jit(fn)(*args))
    assert np.array_equal(np.isnan(got), np.isnan(want))
    assert_close(got, want, DType.F32, fn.__name__, ACCUMULATION, scale=np.full(got.shape, 4.0))


def test_an_aot_artifact_of_a_split_rnn_runs_its_parts_at_once(tmp_path):
    from xfuse import aot

    args = arguments()
    compiled = xfuse.jit(rnn, backend="c").lower(*args).compile()
    loaded = aot.load(compiled.save(tmp_path / "rnn.xfa"))
    assert any("+" in s.name and "while" in s.label for s in loaded.executable.steps)  # one step, both loops
    got = np.asarray(loaded(*args))
    np.testing.assert_array_equal(got, np.asarray(compiled(*args)))
    assert_close(got, np.asarray(jax.jit(rnn)(*args)), DType.F32, "aot rnn", ACCUMULATION,
                 scale=np.full(got.shape, 4.0))


def _loop_text(suffix: str, bound: int, fn: str) -> str:
    """A condition `i < bound` and a body `(i + 1, fn(v))` over (s32[], f32[8])."""
    params = "  p0 = s32[] parameter(0)\n  p1 = f32[8] parameter(1)\n"
    return (f"cond_{suffix} (p0: s32[], p1: f32[8]) -> pred[] {{\n{params}  c = s32[] constant({bound})\n"
            f"  ROOT lt = pred[] lt(p0, c)\n}}\n\n"
            f"body_{suffix} (p0: s32[], p1: f32[8]) -> (s32[], f32[8]) {{\n{params}  one = s32[] constant(1)\n"
            f"  n = s32[] add(p0, one)\n  s = f32[8] {fn}(p1)\n  ROOT t = (s32[], f32[8]) tuple(n, s)\n}}\n\n")


TWO_LOOPS = "HloModule two\n\n" + _loop_text("a", 3, "sin") + _loop_text("b", 4, "cos") + """\
ENTRY main (x: f32[8], i: s32[]) -> ((s32[], f32[8]), (s32[], f32[8])) {
  x = f32[8] parameter(0)
  i = s32[] parameter(1)
  wa = (s32[], f32[8]) while(i, x), condition=cond_a, body=body_a
  wb = (s32[], f32[8]) while(i, x), condition=cond_b, body=body_b
  ROOT r = ((s32[], f32[8]), (s32[], f32[8])) tuple(wa, wb)
}
"""


def test_two_different_loops_run_one_after_the_other():
    """Only the parts of one split loop run at once: two unrelated loops, side by side and
    independent, run in turn (small ones would lose more to the hand-off than they gain)."""
    module = parse(TWO_LOOPS)
    executable = compile_module(module, make_choice("numba"), "none").executable
    loops = [s for s in executable.steps if "while" in s.label]
    assert len(loops) == 2 and not any("+" in s.name for s in loops)
    x = np.linspace(-1, 1, 8, dtype=np.float32)
    (_, a), (_, b) = executable([x, np.array(0, np.int32)])
    want_a, want_b = x, x
    for _ in range(3):
        want_a = np.sin(want_a)
    for _ in range(4):
        want_b = np.cos(want_b)
    assert_close(np.asarray(a), want_a, DType.F32, "loop a", ACCUMULATION, scale=1.0)
    assert_close(np.asarray(b), want_b, DType.F32, "loop b", ACCUMULATION, scale=1.0)


@pytest.mark.parametrize("backend", ["numba", "c"])
def test_a_split_rnns_parts_copy_their_own_inputs_and_write_their_own_results(monkeypatch, backend):
    """The slices of the hoisted input product and the zeros the parts start from run as views,
    each part copying what it reads on its own thread, and each part writes its rows of the
    stacked result into the whole (no concatenation after the parts): the same numbers, bit for
    bit, as with the copies and the concatenation as steps of their own."""
    parallel.set_num_threads(2)
    try:
        args = arguments()
        kept = [a.copy() for a in args]
        compiled = xfuse.jit(rnn, backend=backend).lower(*args).compile()
        steps = compiled.executable.steps
        assert not any(s.kind == "library" and s.label in ("fusion", "broadcast_in_dim", "concatenate")
                       for s in steps), [(s.name, s.kind, s.label) for s in steps]
        (parts,) = [s for s in steps if "while" in s.label]
        assert "by each part" in parts.label and parts.run.gather is not None
        got = [np.asarray(compiled(*args)) for _ in range(2)]
        monkeypatch.setattr(split_loops, "read_by_parts_alone", lambda program: set())
        monkeypatch.setattr(split_loops, "gathered", lambda program, at, built: None)
        plain = xfuse.jit(rnn, backend=backend).lower(*args).compile()
        assert any(s.label == "concatenate" for s in plain.executable.steps)
        want = np.asarray(plain(*args))
    finally:
        parallel.set_num_threads(None)
    for g in got:
        np.testing.assert_array_equal(g, want)
        assert g.flags.c_contiguous and g.shape == (STEPS, BATCH, HIDDEN)
    for a, k in zip(args, kept):
        np.testing.assert_array_equal(a, k)  # the arguments untouched
    assert_close(got[0], np.asarray(jax.jit(rnn)(*args)), DType.F32, "rnn", ACCUMULATION,
                 scale=np.full(got[0].shape, 4.0))


def test_the_runtimes_own_loop_runs_parts_given_views(monkeypatch):
    """Where the numba backend has no driver for the loop, the runtime runs it (`while_run`),
    a part given views of the hoisted product and of the zeros it starts from."""
    from xfuse.backends.numba import backend as numba_backend

    monkeypatch.setattr(numba_backend, "native_loops", lambda *a, **k: {})
    parallel.set_num_threads(2)
    try:
        args = arguments()
        got = np.asarray(xfuse.jit(rnn).lower(*args).compile()(*args))
    finally:
        parallel.set_num_threads(None)
    want = np.asarray(jax.jit(rnn)(*args))
    assert np.array_equal(np.isnan(got), np.isnan(want))
    assert_close(got, want, DType.F32, "rnn", ACCUMULATION, scale=np.full(got.shape, 4.0))


def _loop_step(name: str, inputs: list[int], output: int) -> dict:
    return {"op": "while", "name": name, "inputs": inputs, "outputs": [output], "computations": ["cond", "body"]}


def test_only_views_the_parts_alone_read_are_left_views():
    slice_step = {"op": "library", "fn": "slice", "name": "s", "inputs": [0], "outputs": [1]}
    zeros = {"op": "library", "fn": "broadcast", "name": "z", "inputs": [9], "outputs": [2]}
    sort = {"op": "library", "fn": "sort", "name": "o", "inputs": [0], "outputs": [8]}
    elements = [{"op": "alias", "kind": "element", "index": k, "name": f"e{k}", "inputs": [1], "outputs": [3 + k]}
                for k in range(2)]
    loops = [_loop_step("a", [3, 2, 8], 5), _loop_step("b", [4, 2, 8], 6)]
    program = {"steps": [slice_step, zeros, sort, *elements, *loops], "results": [5, 6]}
    assert split_loops.read_by_parts_alone(program) == {0, 1}  # never the sort: it makes no views
    other = {"op": "kernel", "name": "k", "inputs": [4], "outputs": [7]}
    assert split_loops.read_by_parts_alone({**program, "steps": [*program["steps"], other]}) == {1}
    assert split_loops.read_by_parts_alone({**program, "results": [5, 6, 2]}) == {0}
    alone = [slice_step, zeros, *elements, _loop_step("a", [3, 2], 5), _loop_step("b", [4, 2], 6)]
    alone[-1]["computations"] = ["cond2", "body2"]  # two loops, not the parts of one
    assert split_loops.read_by_parts_alone({"steps": alone, "results": [5, 6]}) == set()


def test_a_loop_of_products_large_enough_for_blas_threads_stays_whole():
    """64 x 512 by 512 x 512 a step: BLAS's threads run the whole product faster than two
    threads each run half of it."""
    args = arguments(batch=64, hidden=512, edges=False)
    _, after, rowsplit = split_of(rnn, *args)
    assert rowsplit.splits == [] and len(loops(after)) == 1


def weight_gradient_loop(xs, wx, wh, b):
    """A loop accumulating `x.T @ g` (the shape of a scanned cell's weight gradient): it splits
    along x's features only, and each part would then do the step's `h @ wh` in full."""
    def cell(carry, x):
        h, dw = carry
        g = jnp.tanh(h @ wh + b)
        return (g, dw + x.T @ g), None

    h0 = jnp.zeros((xs.shape[1], wh.shape[0]), xs.dtype)
    return lax.scan(cell, (h0, jnp.zeros((xs.shape[2], wh.shape[0]), xs.dtype)), xs)[0][1]


def test_a_split_that_repeats_more_products_than_it_splits_is_not_made():
    rng = np.random.default_rng(3)
    xs = rng.standard_normal((STEPS, BATCH, 256)).astype(np.float32)  # x.T @ g: 2**19 a step
    _, wx, wh, b = arguments(edges=False)  # h @ wh: 2**18 a step, repeated by each part
    _, after, rowsplit = split_of(weight_gradient_loop, xs, wx, wh, b)
    assert rowsplit.splits == [] and len(loops(after)) == 1
    got = np.asarray(xfuse.jit(weight_gradient_loop)(xs, wx, wh, b))
    assert_close(got, np.asarray(jax.jit(weight_gradient_loop)(xs, wx, wh, b)), DType.F32, "weight gradient",
                 ACCUMULATION, scale=np.full(got.shape, 16.0))
