"""The opcode table is closed and complete: every op has every per-op fact."""

import inspect

import pytest

from xfuse.hlo import OPS, Builder, Kind, Op
from xfuse.hlo.ops import OPS_BY_NAME, REQUIRED, AttrKind

INTERPRETED = {Op.PARAMETER, Op.FUSION, Op.CALL, Op.WHILE, Op.CONDITIONAL}  # the interpreter evaluates these itself


@pytest.mark.parametrize("op", list(Op), ids=str)
def test_every_op_has_a_complete_entry(op):
    info = OPS[op]
    assert isinstance(info.kind, Kind)
    assert callable(info.shape)
    assert (info.ref is None) == (op in INTERPRETED)
    assert info.arity is None or info.arity >= 0
    for spec in info.attrs:
        assert isinstance(spec.kind, AttrKind)
        if spec.kind is AttrKind.ENUM:
            assert spec.choices and (spec.default is REQUIRED or spec.default in spec.choices)


def test_names_follow_lax_and_are_unique():
    assert set(OPS) == set(Op)
    assert OPS_BY_NAME == {op.value: op for op in Op}
    assert all(name == name.lower() and " " not in name for name in OPS_BY_NAME)


@pytest.mark.parametrize("op", [op for op in Op if op not in (Op.PARAMETER, Op.CONSTANT)], ids=str)
def test_every_op_is_a_builder_method(op):
    method = getattr(Builder("c"), op.value if op.value not in ("and", "or", "not") else op.value + "_")
    assert callable(method)


def test_fusion_lattice_orders_kinds():
    assert Kind.ELEMENTWISE < Kind.BROADCAST < Kind.INJECTIVE < Kind.REDUCTION < Kind.DOT < Kind.OPAQUE
    assert OPS[Op.ADD].kind is Kind.ELEMENTWISE
    assert OPS[Op.BROADCAST_IN_DIM].kind is Kind.BROADCAST
    assert OPS[Op.TRANSPOSE].kind is Kind.INJECTIVE
    assert OPS[Op.REDUCE_SUM].kind is Kind.REDUCTION
    assert OPS[Op.DOT_GENERAL].kind is Kind.DOT


def test_references_take_operands_attrs_and_shape():
    for op, info in OPS.items():
        if info.ref is not None:
            assert len(inspect.signature(info.ref).parameters) == 3, op
