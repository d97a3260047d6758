"""The passes and the data ops (cumulative ops, sort, top_k, gather, scatter): on random modules
of them and elementwise ops, the default pipeline keeps meaning and never puts an opaque data op
in a fusion (a gather fuses: it is injective); constant folding evaluates a small one on constants; CSE merges equal ones."""

from hypothesis import assume, given, settings

from xfuse.fusion import parse_pipeline, run_pipeline
from xfuse.fusion.constant_folding import ConstantFolding
from xfuse.fusion.cse import CommonSubexpressionElimination
from xfuse.hlo import Op, parse, verify

from ..hlo.strategies import modules_with_inputs
from .helpers import assert_same_results
from .test_fuse_properties import runnable

DATA_OPS = (Op.CUMSUM, Op.CUMPROD, Op.CUMMAX, Op.CUMMIN, Op.SORT, Op.TOP_K, Op.GATHER, Op.SCATTER)
OPAQUE = tuple(op for op in DATA_OPS if op is not Op.GATHER)
AROUND = (Op.ADD, Op.MUL, Op.NEG, Op.EXP, Op.REDUCE_SUM, Op.BROADCAST_IN_DIM, Op.TUPLE,
          Op.GET_TUPLE_ELEMENT, Op.CONVERT_ELEMENT_TYPE)


@settings(max_examples=60, deadline=None)
@given(drawn=modules_with_inputs(max_ops=10, ops=DATA_OPS + AROUND))
def test_default_pipeline_keeps_meaning_and_leaves_opaque_data_ops_unfused(drawn):
    module, args = drawn
    inputs = runnable(module, [args])
    assume(inputs)
    after = run_pipeline(module, parse_pipeline(None), verify_passes=True).module
    verify(after)
    assert_same_results(module, after, inputs)
    for comp in after.computations:
        if comp.name != after.entry:
            assert not any(i.op in OPAQUE for i in comp.instructions), comp.name


TEXT = """
HloModule m

ENTRY main (x: f32[4]) -> (f32[2], f32[4], f32[4]) {
  x = f32[4] parameter(0)
  table = f32[4] constant({3.0, -0.0, nan, 1.0})
  idx = s32[2,1] constant({{2}, {7}})
  rows = f32[2] gather(table, idx), offset_dims={}, collapsed_slice_dims={0}, start_index_map={0}, slice_sizes={1}, mode=clip
  c1 = f32[4] cumsum(x), axis=0
  c2 = f32[4] cumsum(x), axis=0
  ROOT t = (f32[2], f32[4], f32[4]) tuple(rows, c1, c2)
}
"""


def test_constant_folding_evaluates_a_gather_of_constants():
    module = parse(TEXT)
    folded = ConstantFolding().run(module)
    rows = folded.entry_computation["rows"]
    assert rows.op is Op.CONSTANT
    values = rows.attr("value").array
    assert values[1] == 1.0 and values[0] != values[0]  # 7 clamps to the last element; NaN kept


def test_cse_merges_equal_scans():
    module = parse(TEXT)
    merged = CommonSubexpressionElimination().run(module)
    root = merged.entry_computation.root_instruction
    assert root.operands[1] == root.operands[2]
