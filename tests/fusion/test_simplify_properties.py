"""Property tests: on random well-typed modules (`tests/hlo/strategies.py`), each simplification
pass and the pipeline "simplify,fold,cse,dce" keep the module verifying and the interpreter's
results bitwise the same (NaN-aware) on the drawn inputs and on edge inputs; running a pass
again on its own result changes nothing."""

import pytest
from hypothesis import assume, given, settings

from xfuse.fusion.algebraic import AlgebraicSimplifier
from xfuse.fusion.constant_folding import ConstantFolding
from xfuse.fusion.cse import CommonSubexpressionElimination
from xfuse.fusion.dce import DeadCodeElimination
from xfuse.fusion.pipeline import parse_pipeline
from xfuse.hlo import InterpreterError, Op, interpret, verify

from ..hlo.strategies import modules_with_inputs
from .helpers import assert_same_results, input_sets
from .rule_strategies import rule_modules

PASSES = {
    "dce": DeadCodeElimination(),
    "cse": CommonSubexpressionElimination(),
    "fold": ConstantFolding(),
    "simplify": AlgebraicSimplifier(),
}
PIPELINE = "simplify,fold,cse,dce"

# The ops the simplifier's rules look at, and what feeds them: random modules drawn from these
# alone hit the rules far more often than modules drawn from the whole table.
SIMPLIFIABLE_OPS = (
    Op.PARAMETER,
    Op.CONSTANT,
    Op.ADD,
    Op.SUB,
    Op.MUL,
    Op.DIV,
    Op.NEG,
    Op.NOT,
    Op.MAX,
    Op.MIN,
    Op.AND,
    Op.OR,
    Op.RESHAPE,
    Op.TRANSPOSE,
    Op.BROADCAST_IN_DIM,
    Op.CONVERT_ELEMENT_TYPE,
    Op.SELECT_N,
    Op.SLICE,
    Op.CONCATENATE,
    Op.PAD,
    Op.REV,
    Op.INTEGER_POW,
    Op.REDUCE_SUM,
    Op.REDUCE_MAX,
    Op.REDUCE_PROD,
    Op.REDUCE_OR,
)


def runnable(module, inputs):
    """The input sets the interpreter runs `module` on without an error. (An error in the
    reference itself, such as erf of a rank-0 array, is not the passes' to answer for.)"""
    kept = []
    for args in inputs:
        try:
            interpret(module, *args)
        except InterpreterError:
            continue
        kept.append(args)
    return kept


def check_passes(module, args, passes) -> None:
    drawn = [] if args is None else [args]
    inputs = runnable(module, [*drawn, *input_sets(module, random_sets=1)])
    assume(inputs)
    after = module
    for p in passes:
        after = p.run(after)
        verify(after)
    assert_same_results(module, after, inputs)
    if len(passes) == 1:
        assert passes[0].run(after) is after, f"{passes[0].name} is not idempotent:\n{after}"


@pytest.mark.parametrize("name", [*PASSES, PIPELINE])
@settings(max_examples=40)
@given(drawn=modules_with_inputs(max_ops=10))
def test_passes_keep_meaning_on_random_modules(name, drawn):
    module, args = drawn
    passes = [PASSES[name]] if name in PASSES else parse_pipeline(name)
    check_passes(module, args, passes)


@pytest.mark.parametrize("name", ["simplify", PIPELINE])
@settings(max_examples=60)
@given(drawn=modules_with_inputs(max_ops=12, calls=False, ops=SIMPLIFIABLE_OPS))
def test_simplifier_keeps_meaning_where_its_rules_apply(name, drawn):
    module, args = drawn
    passes = [PASSES[name]] if name in PASSES else parse_pipeline(name)
    check_passes(module, args, passes)


@pytest.mark.parametrize("name", ["simplify", PIPELINE])
@settings(max_examples=200)
@given(module=rule_modules())
def test_rules_keep_meaning_on_their_own_patterns(name, module):
    passes = [PASSES[name]] if name in PASSES else parse_pipeline(name)
    check_passes(module, None, passes)
