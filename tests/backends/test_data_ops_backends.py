"""Random modules of data ops (cumulative ops, sort, top_k, gather, scatter, callbacks) among elementwise
ones, compiled whole (fused, lowered to kernels and library steps) by the numba backend, give
bitwise the reference interpreter's results, and leave their inputs alone."""

from __future__ import annotations

from hypothesis import HealthCheck, assume, given, settings

from xfuse.backends.numba import compile_module
from xfuse.hlo import InterpreterError, Op, TupleShape, interpret

from ..fusion.helpers import same_values
from ..hlo.strategies import modules_with_inputs

OPS = (Op.CUMSUM, Op.CUMPROD, Op.CUMMAX, Op.CUMMIN, Op.SORT, Op.TOP_K, Op.GATHER, Op.SCATTER, Op.CALLBACK,
       Op.ADD, Op.MUL, Op.NEG, Op.GET_TUPLE_ELEMENT)


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(drawn=modules_with_inputs(max_ops=6, calls=False, ops=OPS))
def test_numba_backend_matches_the_interpreter_on_random_data_modules(drawn):
    module, args = drawn
    try:
        want = interpret(module, *args)
    except InterpreterError:
        assume(False)
    if any(isinstance(p.shape, TupleShape) for p in module.entry_computation.parameters):
        assume(False)
    copies = [a.copy() for a in args]
    outputs = compile_module(module)(list(args))
    root = module.entry_computation.root_instruction
    got = tuple(outputs) if root.op is Op.TUPLE else outputs[0]  # a tuple root: one output each
    assert same_values(got, want)
    for before, after in zip(copies, args):
        assert before.tobytes() == after.tobytes()
