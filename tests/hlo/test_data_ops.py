"""The data ops in the IR: cumsum/cumprod/cummax/cummin, sort, top_k, gather and scatter.

Their text round-trips; the verifier rejects bad dimension numbers, modes and shapes, naming the
instruction; the reference interpreter follows lax's semantics at the edges (NaN and signed
zeros in sort, top_k and the scans; out-of-bounds and duplicate indices in gather and scatter).
The comparisons against `jax.lax` on every dtype are in test_ops_vs_jax.py (data_specs.py).
Pure IR: needs neither JAX nor numba.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from xfuse.hlo import (
    Builder,
    BuilderError,
    DType,
    HloParseError,
    HloVerifyError,
    Instruction,
    Module,
    Op,
    Shape,
    TupleShape,
    interpret,
    parse,
    print_module,
    verify,
)
from xfuse.hlo.ops import Kind

F32, S32 = DType.F32, DType.S32
ROWS = {"offset_dims": (1,), "collapsed_slice_dims": (0,), "start_index_map": (0,), "slice_sizes": (1, 5)}
SCATTER_ROWS = {"update_window_dims": (1,), "inserted_window_dims": (0,), "scatter_dims_to_operand_dims": (0,)}
DATA_OPS = [Op.CUMSUM, Op.CUMPROD, Op.CUMMAX, Op.CUMMIN, Op.SORT, Op.TOP_K, Op.GATHER, Op.SCATTER]


def run(build, *arrays):
    """`build(builder, *parameters)`'s result on `arrays`, through the printed text."""
    b = Builder("main")
    params = [b.parameter(Shape.of(a), f"p{i}") for i, a in enumerate(arrays)]
    module = Module.of(b.build(build(b, *params)))
    text = print_module(module)
    again = parse(text)
    verify(again)
    assert again == module and print_module(again) == text
    return interpret(again, *arrays)


@pytest.mark.parametrize("op", [op for op in DATA_OPS if op is not Op.GATHER], ids=str)
def test_data_ops_are_opaque_to_fusion(op):
    assert op.info.kind is Kind.OPAQUE


def test_a_gather_is_injective():  # each result element reads one operand element: it fuses
    assert Op.GATHER.info.kind is Kind.INJECTIVE


# ---------------------------------------------------------------------------- text
def test_every_data_op_prints_and_parses_back():
    x = np.arange(20, dtype=np.float32).reshape(4, 5)
    rows = np.array([[1], [9], [-2]], np.int32)

    def build(b, x, rows):
        fill = b.constant(np.float32(-1.0))
        return [
            b.cumsum(x, axis=1),
            b.cumprod(x, axis=0, reverse="true"),
            b.cummax(x, axis=1),
            b.cummin(x, axis=1, reverse="true"),
            b.sort(x, dimension=0),
            b.sort(x, x, dimension=1, is_stable="true", num_keys=2),
            b.top_k(x, k=3, axis=1),
            b.gather(x, rows, mode="clip", **ROWS),
            b.gather(x, rows, fill, mode="fill_or_drop", **ROWS),
            b.scatter(x, rows, b.gather(x, rows, mode="clip", **ROWS), mode="clip", combine="max",
                      **SCATTER_ROWS),
        ]

    results = run(build, x, rows)
    assert len(results) == 10
    np.testing.assert_array_equal(results[8][1], np.full(5, -1.0, np.float32))  # row 9: filled
    np.testing.assert_array_equal(results[7][1], x[3])  # clamped to the last row


def test_defaults_are_left_out_of_the_text():
    b = Builder("main")
    x = b.parameter(Shape(F32, (3,)), "x")
    module = Module.of(b.build(b.sort(x, dimension=0)))
    assert "sort(x), dimension=0\n" in print_module(module)


def test_an_unknown_mode_is_a_parse_error_at_its_column():
    text = (
        "HloModule m\n\nENTRY main (x: f32[4,5], i: s32[3,1]) -> f32[3,5] {\n"
        "  x = f32[4,5] parameter(0)\n  i = s32[3,1] parameter(1)\n"
        "  ROOT g = f32[3,5] gather(x, i), offset_dims={1}, collapsed_slice_dims={0}, "
        "start_index_map={0}, slice_sizes={1,5}, mode=wrap\n}\n"
    )
    with pytest.raises(HloParseError, match="mode must be one of clip, fill_or_drop, promise_in_bounds"):
        parse(text)


# ---------------------------------------------------------------------------- verifier
def module_with(inst: Instruction, *params: Shape) -> Module:
    ps = [Instruction(f"p{i}", Op.PARAMETER, s, attrs=(("index", i),)) for i, s in enumerate(params)]
    inst = inst.replace(operands=tuple(p.name for p in ps[: len(inst.operands)]) if not inst.operands
                        else inst.operands)
    from xfuse.hlo import Computation

    return Module.of(Computation("main", (*ps, inst), inst.name))


def attrs_of(op: Op, **given) -> tuple:
    return tuple((s.name, given.get(s.name, s.default)) for s in op.info.attrs)


X, I, U = Shape(F32, (4, 5)), Shape(S32, (3, 1)), Shape(F32, (3, 5))
GATHER = dict(ROWS, operand_batching_dims=(), start_indices_batching_dims=(), mode="clip")
SCATTER = dict(SCATTER_ROWS, operand_batching_dims=(), scatter_indices_batching_dims=(), mode="clip",
               combine="add")
BAD = {
    "sort dimension": (Op.SORT, X, ("p0",), {"dimension": 2}, (X,), "dimension (2,) out of range"),
    "num_keys": (Op.SORT, TupleShape((X, X)), ("p0", "p1"), {"dimension": 0, "num_keys": 3}, (X, X),
                 "num_keys=3 must be in 1..2"),
    "sort dims differ": (Op.SORT, TupleShape((X, U)), ("p0", "p1"), {"dimension": 0}, (X, U),
                         "differ in dimensions"),
    "top_k k": (Op.TOP_K, TupleShape((X, X)), ("p0",), {"k": 6, "axis": 1}, (X,), "k=6 out of range"),
    "cumsum of pred": (Op.CUMSUM, Shape(DType.PRED, (3,)), ("p0",), {"axis": 0}, (Shape(DType.PRED, (3,)),),
                       "expected a numeric type"),
    "slice sizes": (Op.GATHER, U, ("p0", "p1"), dict(GATHER, slice_sizes=(1,)), (X, I),
                    "slice_sizes (1,) need one entry per dimension"),
    "fill without its mode": (Op.GATHER, U, ("p0", "p1", "p2"), GATHER, (X, I, Shape(F32, ())),
                              "fill value operand is given exactly in mode fill_or_drop"),
    "float indices": (Op.GATHER, U, ("p0", "p1"), GATHER, (X, Shape(F32, (3, 1))), "must be integers"),
    "collapsed size": (Op.GATHER, Shape(F32, (3, 2, 5)), ("p0", "p1"), dict(GATHER, slice_sizes=(2, 5)), (X, I),
                       "needs slice size 1"),
    "index vector": (Op.GATHER, U, ("p0", "p1"), GATHER, (X, Shape(S32, (3, 2))), "needs 2 entries"),
    "updates": (Op.SCATTER, X, ("p0", "p1", "p2"), SCATTER, (X, I, Shape(F32, (2, 5))), "do not match the index"),
    "update dtype": (Op.SCATTER, X, ("p0", "p1", "p2"), SCATTER, (X, I, Shape(S32, (3, 5))), "differ in dtype"),
    "window dims": (Op.SCATTER, X, ("p0", "p1", "p2"), dict(SCATTER, update_window_dims=(0, 1)), (X, I, U),
                    "need 1 entries"),
}


@pytest.mark.parametrize("case", list(BAD), ids=str)
def test_bad_data_ops_are_rejected_naming_the_instruction(case):
    op, shape, operands, given, params, message = BAD[case]
    inst = Instruction("bad.1", op, shape, operands, attrs_of(op, **given))
    with pytest.raises(HloVerifyError, match="bad.1: .*" + message.replace("(", r"\(").replace(")", r"\)")):
        verify(module_with(inst, *params))


def test_a_mode_outside_its_choices_is_rejected():
    inst = Instruction("g.1", Op.GATHER, U, ("p0", "p1"), attrs_of(Op.GATHER, **dict(GATHER, mode="wrap")))
    with pytest.raises(HloVerifyError, match="g.1: attribute mode='wrap' is not a valid enum"):
        verify(module_with(inst, X, I))


def test_the_builder_names_the_op_and_shapes():
    b = Builder("main")
    x = b.parameter(X)
    with pytest.raises(BuilderError, match=r"top_k\(f32\[4,5\]\): k=9 out of range"):
        b.top_k(x, k=9, axis=1)


# ---------------------------------------------------------------------------- semantics
def bits(a: np.ndarray) -> list:
    return [(float(v), bool(np.signbit(v))) for v in a]


def test_sort_puts_nans_last_and_keeps_signed_zeros_in_input_order():
    x = np.array([0.0, -0.0, math.nan, -math.nan, 1.0, -math.inf, -0.0, 0.0], np.float32)
    got = run(lambda b, x: b.sort(x, dimension=0, is_stable="true"), x)
    want = [-math.inf, 0.0, -0.0, -0.0, 0.0, 1.0]
    assert bits(got[:6]) == [(v, bool(np.signbit(v))) for v in want]
    assert np.isnan(got[6:]).all() and list(np.signbit(got[6:])) == [False, True]


def test_sort_by_two_keys_is_lexicographic_and_stable():
    keys = np.array([2, 1, 2, 1, 0], np.int32)
    second = np.array([5.0, 9.0, 1.0, 9.0, 3.0], np.float32)
    order = np.arange(5, dtype=np.int32)
    got = run(lambda b, k, s, o: b.sort(k, s, o, dimension=0, num_keys=2), keys, second, order)
    assert got[2].tolist() == [4, 1, 3, 2, 0]


def test_top_k_orders_by_bits_with_ties_to_the_lower_index():
    x = np.array([0.0, -0.0, math.nan, -math.nan, 1.0, -math.inf, 1.0], np.float32)
    values, indices = run(lambda b, x: b.top_k(x, k=7, axis=0), x)
    assert indices.tolist() == [2, 4, 6, 0, 1, 5, 3]
    assert np.signbit(values[4]) and not np.signbit(values[3])


def test_cummax_and_cummin_propagate_nan_and_order_signed_zeros():
    x = np.array([-0.0, 0.0, -0.0, math.nan, 5.0], np.float32)
    high = run(lambda b, x: b.cummax(x, axis=0), x)
    low = run(lambda b, x: b.cummin(x, axis=0), x)
    assert bits(high[:3]) == [(0.0, True), (0.0, False), (0.0, False)] and np.isnan(high[3:]).all()
    assert bits(low[:3]) == [(0.0, True), (0.0, True), (0.0, True)] and np.isnan(low[3:]).all()


def test_integer_cumsum_wraps_and_float16_rounds_once_per_output():
    n = np.array([np.iinfo(np.int32).max, 1, 1], np.int32)
    assert run(lambda b, x: b.cumsum(x, axis=0), n).tolist() == [2**31 - 1, -(2**31), -(2**31) + 1]
    h = np.array([2048.0, 1.0, 1.0], np.float16)  # 2049 is not an f16, 2050 is
    assert run(lambda b, x: b.cumsum(x, axis=0), h).tolist() == [2048.0, 2048.0, 2050.0]


def test_gather_fill_defaults_and_clamping():
    x = np.arange(10, dtype=np.int32).reshape(2, 5)
    idx = np.array([[-1], [0], [2], [3]], np.int32)
    numbers = {"offset_dims": (0,), "collapsed_slice_dims": (1,), "start_index_map": (1,), "slice_sizes": (2, 2)}
    clip = run(lambda b, x, i: b.gather(x, i, mode="promise_in_bounds", **dict(numbers, offset_dims=(0, 2),
                                                                              collapsed_slice_dims=())), x, idx)
    assert clip[0, :, 0].tolist() == [0, 0, 2, 3]  # -1 clamps to 0; a window of 2 ends at 3
    fill = run(lambda b, x, i: b.gather(x, i, b.constant(np.int32(-7)), mode="fill_or_drop",
                                        **dict(numbers, offset_dims=(0, 2), collapsed_slice_dims=())), x, idx)
    assert fill[0, :, 0].tolist() == [-7, 0, 2, 3]
    idx5 = np.array([[4]], np.int32)  # the window [4, 6) is not wholly inside: filled
    fill5 = run(lambda b, x, i: b.gather(x, i, b.constant(np.int32(-7)), mode="fill_or_drop",
                                         **dict(numbers, offset_dims=(0, 2), collapsed_slice_dims=())), x, idx5)
    assert (fill5 == -7).all()


def test_scatter_combines_duplicates_and_drops_or_clamps_out_of_bounds():
    x = np.zeros(5, np.float32)
    idx = np.array([[1], [1], [3], [1], [9], [-1]], np.int32)
    u = np.array([1.0, 2.0, 3.0, 4.0, 5.0, 6.0], np.float32)
    numbers = {"update_window_dims": (), "inserted_window_dims": (0,), "scatter_dims_to_operand_dims": (0,)}

    def scatter(mode, combine):
        return run(lambda b, x, i, u: b.scatter(x, i, u, mode=mode, combine=combine, **numbers), x, idx, u)

    assert scatter("fill_or_drop", "set").tolist() == [0, 4, 0, 3, 0]  # the last wins
    assert scatter("promise_in_bounds", "add").tolist() == [0, 7, 0, 3, 0]
    assert scatter("clip", "set").tolist() == [6, 4, 0, 3, 5]
    assert scatter("clip", "add").tolist() == [6, 7, 0, 3, 5]
    assert scatter("fill_or_drop", "max").tolist() == [0, 4, 0, 3, 0]
    assert scatter("fill_or_drop", "min").tolist() == [0, 0, 0, 0, 0]


def test_scatter_min_max_of_signed_zeros_and_nan():
    x = np.array([0.0, -0.0, 1.0], np.float32)
    idx = np.array([[0], [1], [2]], np.int32)
    u = np.array([-0.0, 0.0, math.nan], np.float32)
    numbers = {"update_window_dims": (), "inserted_window_dims": (0,), "scatter_dims_to_operand_dims": (0,)}
    low = run(lambda b, x, i, u: b.scatter(x, i, u, mode="clip", combine="min", **numbers), x, idx, u)
    high = run(lambda b, x, i, u: b.scatter(x, i, u, mode="clip", combine="max", **numbers), x, idx, u)
    assert list(np.signbit(low[:2])) == [True, True] and np.isnan(low[2])
    assert list(np.signbit(high[:2])) == [False, False] and np.isnan(high[2])


def test_pred_scatter_set_and_integer_min_max():
    x = np.array([False, True, False])
    idx = np.array([[2], [0], [2]], np.int32)
    u = np.array([True, True, False])
    numbers = {"update_window_dims": (), "inserted_window_dims": (0,), "scatter_dims_to_operand_dims": (0,)}
    got = run(lambda b, x, i, u: b.scatter(x, i, u, mode="clip", combine="set", **numbers), x, idx, u)
    assert got.tolist() == [True, True, False]
    n = np.array([0, 5, -3], np.int32)
    m = np.array([np.iinfo(np.int32).min, 7, 1], np.int32)
    got = run(lambda b, x, i, u: b.scatter(x, i, u, mode="clip", combine="min", **numbers), n, idx, m)
    assert got.tolist() == [0, 5, np.iinfo(np.int32).min]
