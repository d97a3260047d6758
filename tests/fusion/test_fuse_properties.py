"""Fusion never changes meaning: on random well-typed modules and on every function of the
frontend corpus, the interpreter gives bitwise the same results (NaN-aware) before and after
the whole default pipeline, and what it makes verifies."""

import functools

import jax
import numpy as np
import pytest
from hypothesis import assume, given, settings

import xfuse
from xfuse.fusion import Fuse, parse_pipeline, run_pipeline
from xfuse.hlo import InterpreterError, Op, interpret, verify

from ..frontend.test_corpus import CORPUS, _rng
from ..hlo.strategies import modules_with_inputs
from .helpers import assert_same_results, input_sets


def runnable(module, inputs):
    kept = []
    for args in inputs:
        try:
            interpret(module, *args)
        except InterpreterError:
            continue
        kept.append(args)
    return kept


@settings(max_examples=60)
@given(drawn=modules_with_inputs(max_ops=12))
def test_default_pipeline_keeps_meaning_on_random_modules(drawn):
    module, args = drawn
    inputs = runnable(module, [args, *input_sets(module, random_sets=1)])
    assume(inputs)
    after = run_pipeline(module, parse_pipeline(None), verify_passes=True).module
    verify(after)
    assert_same_results(module, after, inputs)


@settings(max_examples=60)
@given(drawn=modules_with_inputs(max_ops=12))
def test_fuse_alone_keeps_meaning_and_every_fusion_has_a_kind(drawn):
    module, args = drawn
    inputs = runnable(module, [args, *input_sets(module, random_sets=1)])
    assume(inputs)
    fuse = Fuse()
    after = fuse.run(module)
    verify(after)
    assert_same_results(module, after, inputs)
    given = {(i.name, i.attr("calls")) for i in module.entry_computation if i.op is Op.FUSION}
    made = [i for i in after.entry_computation if i.op is Op.FUSION and (i.name, i.attr("calls")) not in given]
    assert {i.attr("kind") for i in made} <= {"loop", "input", "output", "multi_output", "scan"}

    def fusions(m):
        return sum(1 for c in m.computations for i in c.instructions if i.op is Op.FUSION)

    assert len(fuse.reports[-1].fusions) == fusions(after) - fusions(module)


def flat_arguments(lowered, args):
    leaves = jax.tree_util.tree_leaves((args, {}))
    return [np.asarray(leaf, spec.shape.dtype.numpy) for leaf, spec in zip(leaves, lowered.info.leaves)]


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_pipeline_keeps_meaning_on_the_corpus(name):
    case = CORPUS[name]
    fun = functools.partial(case.fun, **case.static)
    for kind in ("random", "edge"):
        args = case.inputs(_rng(name, kind), kind == "edge")
        lowered = xfuse.jit(fun, passes="none").lower(*args)
        after = run_pipeline(lowered.module, parse_pipeline(None), verify_passes=True).module
        assert_same_results(lowered.module, after, [flat_arguments(lowered, args)])
