"""The opcode table: `Op`, its fusion `Kind`, and one `OpInfo` per op holding every per-op fact.

Op names follow `jax.lax` primitives. Each entry gives the arity, fusion kind, attribute schema,
shape rule and numpy reference; `tests/hlo/test_ops_table.py` checks every op has all of them.
Imports numpy-free modules of this package only (the references import numpy).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from . import reference as R
from . import reference_data as RD
from . import shape_rules as S
from . import shape_rules_data as SD
from .dtypes import DType


class Kind(enum.IntEnum):
    """The fusion lattice (TVM's op patterns, XLA's fusion kinds): lower fuses more freely."""

    ELEMENTWISE = 0
    BROADCAST = 1
    INJECTIVE = 2
    REDUCTION = 3
    DOT = 4
    OPAQUE = 5

    def __str__(self) -> str:
        return self.name.lower()


class AttrKind(enum.Enum):
    INT = "int"  # 3
    INTS = "ints"  # {1,0}
    INTS_PAIR = "ints_pair"  # {1;0}: two int lists (lhs;rhs)
    ENUM = "enum"  # a word from `choices`
    NAME = "name"  # a computation's name
    NAMES = "names"  # {branch0,branch1}: computation names, in order
    LITERAL = "literal"  # a constant's value


REQUIRED = object()


@dataclass(frozen=True, slots=True)
class AttrSpec:
    name: str
    kind: AttrKind
    default: object = REQUIRED
    choices: tuple[str, ...] = ()


class Op(enum.Enum):
    # leaves
    PARAMETER = "parameter"
    CONSTANT = "constant"
    IOTA = "iota"
    # elementwise unary
    NEG = "neg"
    ABS = "abs"
    SIGN = "sign"
    FLOOR = "floor"
    CEIL = "ceil"
    ROUND = "round"
    EXP = "exp"
    EXP2 = "exp2"
    EXPM1 = "expm1"
    LOG = "log"
    LOG1P = "log1p"
    SQRT = "sqrt"
    RSQRT = "rsqrt"
    CBRT = "cbrt"
    TANH = "tanh"
    LOGISTIC = "logistic"
    SIN = "sin"
    COS = "cos"
    TAN = "tan"
    ATAN = "atan"
    ERF = "erf"
    ERFC = "erfc"
    IS_FINITE = "is_finite"
    NOT = "not"
    INTEGER_POW = "integer_pow"
    # elementwise binary
    ADD = "add"
    SUB = "sub"
    MUL = "mul"
    DIV = "div"
    REM = "rem"
    POW = "pow"
    MAX = "max"
    MIN = "min"
    ATAN2 = "atan2"
    AND = "and"
    OR = "or"
    XOR = "xor"
    SHIFT_LEFT = "shift_left"
    SHIFT_RIGHT_LOGICAL = "shift_right_logical"
    SHIFT_RIGHT_ARITHMETIC = "shift_right_arithmetic"
    EQ = "eq"
    NE = "ne"
    LT = "lt"
    LE = "le"
    GT = "gt"
    GE = "ge"
    # elementwise, other
    SELECT_N = "select_n"
    CLAMP = "clamp"
    CONVERT_ELEMENT_TYPE = "convert_element_type"
    BITCAST_CONVERT = "bitcast_convert"
    # data movement
    BROADCAST_IN_DIM = "broadcast_in_dim"
    RESHAPE = "reshape"
    TRANSPOSE = "transpose"
    SLICE = "slice"
    DYNAMIC_SLICE = "dynamic_slice"
    DYNAMIC_UPDATE_SLICE = "dynamic_update_slice"
    CONCATENATE = "concatenate"
    PAD = "pad"
    REV = "rev"
    # reductions
    REDUCE_SUM = "reduce_sum"
    REDUCE_MAX = "reduce_max"
    REDUCE_MIN = "reduce_min"
    REDUCE_PROD = "reduce_prod"
    REDUCE_AND = "reduce_and"
    REDUCE_OR = "reduce_or"
    ARGMAX = "argmax"
    ARGMIN = "argmin"
    # contraction
    DOT_GENERAL = "dot_general"
    # structure
    TUPLE = "tuple"
    GET_TUPLE_ELEMENT = "get_tuple_element"
    FUSION = "fusion"
    CALL = "call"
    OPTIMIZATION_BARRIER = "optimization_barrier"
    # control flow
    WHILE = "while"
    CONDITIONAL = "conditional"
    # data ops: scans, sorting, indexing
    CUMSUM = "cumsum"
    CUMPROD = "cumprod"
    CUMMAX = "cummax"
    CUMMIN = "cummin"
    SORT = "sort"
    TOP_K = "top_k"
    GATHER = "gather"
    SCATTER = "scatter"
    CALLBACK = "callback"

    def __str__(self) -> str:
        return self.value

    @property
    def info(self) -> OpInfo:
        return OPS[self]


FUSION_KINDS = ("loop", "input", "output", "multi_output", "scan", "custom")  # custom: a plugin kernel
ROUNDING_METHODS = ("away_from_zero", "to_nearest_even")


@dataclass(frozen=True, slots=True)
class OpInfo:
    """Everything known about one op.

    arity: the operand count, or None when variadic (at least `min_arity`).
    result_given: the result shape (or, for dot_general, its dtype) is declared, not derived.
    """

    arity: int | None
    kind: Kind
    shape: S.ShapeRule
    ref: Callable | None  # None: the interpreter evaluates it (parameter, fusion, call, control flow)
    attrs: tuple[AttrSpec, ...] = ()
    commutative: bool = False
    min_arity: int = 0
    result_given: bool = False
    attr_index: dict[str, AttrSpec] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "attr_index", {a.name: a for a in self.attrs})


E, B, I, RED, DOT, OPQ = Kind.ELEMENTWISE, Kind.BROADCAST, Kind.INJECTIVE, Kind.REDUCTION, Kind.DOT, Kind.OPAQUE


def _ints(name: str, default: object = REQUIRED) -> AttrSpec:
    return AttrSpec(name, AttrKind.INTS, default)


def _int(name: str, default: object = REQUIRED) -> AttrSpec:
    return AttrSpec(name, AttrKind.INT, default)


def _unary(allowed: str, ref, result: DType | None = None, **kw) -> OpInfo:
    return OpInfo(1, E, S.unary(allowed, result), ref, **kw)


def _binary(allowed: str, ref, result: DType | None = None, commutative=False, **kw) -> OpInfo:
    return OpInfo(2, E, S.binary(allowed, result, **kw), ref, commutative=commutative)


def _f64(fn):
    return R.via_f64(fn)


def _native(fn):
    return R.native(fn)


def _flag(name: str) -> AttrSpec:
    return AttrSpec(name, AttrKind.ENUM, "false", ("false", "true"))


AXES = (_ints("axes"),)
SCAN = (_int("axis"), _flag("reverse"))

OPS: dict[Op, OpInfo] = {
    Op.PARAMETER: OpInfo(0, OPQ, S.parameter, None, (_int("index"),), result_given=True),
    Op.CONSTANT: OpInfo(0, E, S.constant, R.constant, (AttrSpec("value", AttrKind.LITERAL),)),
    Op.IOTA: OpInfo(0, I, S.iota, R.iota, (_int("dimension"),), result_given=True),
    Op.NEG: _unary("numeric", _native(np.negative)),
    Op.ABS: _unary("numeric", _native(np.abs)),
    Op.SIGN: _unary("numeric", R.sign),
    Op.FLOOR: _unary("float", _native(np.floor)),
    Op.CEIL: _unary("float", _native(np.ceil)),
    Op.ROUND: _unary(
        "float",
        R.round_,
        attrs=(AttrSpec("rounding_method", AttrKind.ENUM, "away_from_zero", ROUNDING_METHODS),),
    ),
    Op.EXP: _unary("float", _f64(np.exp)),
    Op.EXP2: _unary("float", R.exp2),
    Op.EXPM1: _unary("float", _f64(np.expm1)),
    Op.LOG: _unary("float", _f64(np.log)),
    Op.LOG1P: _unary("float", _f64(np.log1p)),
    Op.SQRT: _unary("float", _f64(np.sqrt)),
    Op.RSQRT: _unary("float", _f64(lambda x: 1.0 / np.sqrt(x))),
    Op.CBRT: _unary("float", _f64(np.cbrt)),
    Op.TANH: _unary("float", _f64(np.tanh)),
    Op.LOGISTIC: _unary("float", _f64(R.logistic)),
    Op.SIN: _unary("float", _f64(np.sin)),
    Op.COS: _unary("float", _f64(np.cos)),
    Op.TAN: _unary("float", _f64(np.tan)),
    Op.ATAN: _unary("float", _f64(np.arctan)),
    Op.ERF: _unary("float", _f64(R.erf)),
    Op.ERFC: _unary("float", _f64(R.erfc)),
    Op.IS_FINITE: _unary("float", _native(np.isfinite), DType.PRED),
    Op.NOT: _unary("int_or_pred", R.not_),
    Op.INTEGER_POW: OpInfo(1, E, S.integer_pow, R.integer_pow, (_int("y"),)),
    Op.ADD: _binary("numeric", _native(np.add), commutative=True),
    Op.SUB: _binary("numeric", _native(np.subtract)),
    Op.MUL: _binary("numeric", _native(np.multiply), commutative=True),
    Op.DIV: _binary("numeric", R.div),
    Op.REM: _binary("numeric", R.rem),
    Op.POW: _binary("float", R.pow_, rhs_int_ok=True),
    Op.MAX: _binary("any", _native(R.maximum), commutative=True),
    Op.MIN: _binary("any", _native(R.minimum), commutative=True),
    Op.ATAN2: _binary("float", _f64(np.arctan2)),
    Op.AND: _binary("int_or_pred", _native(np.bitwise_and), commutative=True),
    Op.OR: _binary("int_or_pred", _native(np.bitwise_or), commutative=True),
    Op.XOR: _binary("int_or_pred", _native(np.bitwise_xor), commutative=True),
    Op.SHIFT_LEFT: _binary("integer", R.SHIFT_LEFT),
    Op.SHIFT_RIGHT_LOGICAL: _binary("integer", R.SHIFT_RIGHT_LOGICAL),
    Op.SHIFT_RIGHT_ARITHMETIC: _binary("integer", R.SHIFT_RIGHT_ARITHMETIC),
    Op.EQ: _binary("any", _native(np.equal), DType.PRED, commutative=True),
    Op.NE: _binary("any", _native(np.not_equal), DType.PRED, commutative=True),
    Op.LT: _binary("any", _native(np.less), DType.PRED),
    Op.LE: _binary("any", _native(np.less_equal), DType.PRED),
    Op.GT: _binary("any", _native(np.greater), DType.PRED),
    Op.GE: _binary("any", _native(np.greater_equal), DType.PRED),
    Op.SELECT_N: OpInfo(None, E, S.select_n, R.select_n, min_arity=2),
    Op.CLAMP: OpInfo(3, E, S.clamp, R.clamp),
    Op.CONVERT_ELEMENT_TYPE: OpInfo(1, E, S.convert, R.convert, result_given=True),
    # The same bits read as another dtype of the same width (jax.lax.bitcast_convert_type).
    Op.BITCAST_CONVERT: OpInfo(1, E, S.bitcast_convert, R.bitcast_convert, result_given=True),
    Op.BROADCAST_IN_DIM: OpInfo(
        1, B, S.broadcast_in_dim, R.broadcast_in_dim, (_ints("dims"),), result_given=True
    ),
    Op.RESHAPE: OpInfo(1, I, S.reshape, R.reshape, result_given=True),
    Op.TRANSPOSE: OpInfo(1, I, S.transpose, R.transpose, (_ints("permutation"),)),
    Op.SLICE: OpInfo(
        1, I, S.slice_, R.slice_, (_ints("start"), _ints("limit"), _ints("strides"))
    ),
    Op.DYNAMIC_SLICE: OpInfo(
        None, I, S.dynamic_slice, R.dynamic_slice, min_arity=1, result_given=True
    ),
    Op.DYNAMIC_UPDATE_SLICE: OpInfo(
        None, I, S.dynamic_update_slice, R.dynamic_update_slice, min_arity=2
    ),
    Op.CONCATENATE: OpInfo(
        None, I, S.concatenate, R.concatenate, (_int("dimension"),), min_arity=1
    ),
    Op.PAD: OpInfo(2, I, S.pad, R.pad, (_ints("low"), _ints("high"), _ints("interior"))),
    Op.REV: OpInfo(1, I, S.rev, R.rev, (_ints("dimensions"),)),
    Op.REDUCE_SUM: OpInfo(1, RED, S.reduce("numeric"), R.reduce_sum, AXES),
    Op.REDUCE_MAX: OpInfo(1, RED, S.reduce("any"), R.REDUCE_MAX, AXES),
    Op.REDUCE_MIN: OpInfo(1, RED, S.reduce("any"), R.REDUCE_MIN, AXES),
    Op.REDUCE_PROD: OpInfo(1, RED, S.reduce("numeric"), R.reduce_prod, AXES),
    Op.REDUCE_AND: OpInfo(1, RED, S.reduce("int_or_pred"), R.REDUCE_AND, AXES),
    Op.REDUCE_OR: OpInfo(1, RED, S.reduce("int_or_pred"), R.REDUCE_OR, AXES),
    Op.ARGMAX: OpInfo(1, RED, S.arg_reduce, R.ARGMAX, (_int("axis"),), result_given=True),
    Op.ARGMIN: OpInfo(1, RED, S.arg_reduce, R.ARGMIN, (_int("axis"),), result_given=True),
    Op.DOT_GENERAL: OpInfo(
        2,
        DOT,
        S.dot_general,
        R.dot_general,
        (
            AttrSpec("contracting", AttrKind.INTS_PAIR),
            AttrSpec("batch", AttrKind.INTS_PAIR, ((), ())),
        ),
    ),
    Op.TUPLE: OpInfo(None, OPQ, S.tuple_, R.tuple_),
    Op.GET_TUPLE_ELEMENT: OpInfo(1, OPQ, S.get_tuple_element, R.get_tuple_element, (_int("index"),)),
    Op.FUSION: OpInfo(
        None,
        OPQ,
        S.called,
        None,
        (AttrSpec("kind", AttrKind.ENUM, choices=FUSION_KINDS), AttrSpec("calls", AttrKind.NAME)),
        result_given=True,
    ),
    Op.CALL: OpInfo(None, OPQ, S.called, None, (AttrSpec("calls", AttrKind.NAME),), result_given=True),
    # Values pass through unchanged, but nothing is fused or moved across it.
    Op.OPTIMIZATION_BARRIER: OpInfo(None, OPQ, S.tuple_, R.tuple_, min_arity=1),
    # The state is the operands; the result, always a tuple, is the state when condition is false.
    Op.WHILE: OpInfo(
        None,
        OPQ,
        S.while_,
        None,
        (AttrSpec("condition", AttrKind.NAME), AttrSpec("body", AttrKind.NAME)),
    ),
    # Operand 0 is the s32[] index (out of range: the last branch); the rest go to the branch.
    Op.CONDITIONAL: OpInfo(
        None,
        OPQ,
        S.conditional,
        None,
        (AttrSpec("branches", AttrKind.NAMES),),
        min_arity=1,
        result_given=True,
    ),
    # Data ops are opaque: no fusion pass moves them or fuses anything into them. A gather is
    # injective: each element of its result reads one element of its operand, as XLA's loop
    # fusion reads it.
    **{op: OpInfo(1, OPQ, SD.cumulative(allowed), ref, SCAN) for op, allowed, ref in (
        (Op.CUMSUM, "numeric", RD.CUMSUM), (Op.CUMPROD, "numeric", RD.CUMPROD),
        (Op.CUMMAX, "numeric", RD.CUMMAX), (Op.CUMMIN, "numeric", RD.CUMMIN))},
    Op.SORT: OpInfo(None, OPQ, SD.sort, RD.sort, (_int("dimension"), _flag("is_stable"), _int("num_keys", 1)),
                    min_arity=1),
    Op.TOP_K: OpInfo(1, OPQ, SD.top_k, RD.top_k, (_int("k"), _int("axis"))),
    Op.GATHER: OpInfo(None, I, SD.gather, RD.gather, (
        _ints("offset_dims"), _ints("collapsed_slice_dims"), _ints("start_index_map"),
        _ints("operand_batching_dims", ()), _ints("start_indices_batching_dims", ()), _ints("slice_sizes"),
        AttrSpec("mode", AttrKind.ENUM, choices=SD.GATHER_MODES)), min_arity=2),
    Op.SCATTER: OpInfo(3, OPQ, SD.scatter, RD.scatter, (
        _ints("update_window_dims"), _ints("inserted_window_dims"), _ints("scatter_dims_to_operand_dims"),
        _ints("operand_batching_dims", ()), _ints("scatter_indices_batching_dims", ()),
        AttrSpec("mode", AttrKind.ENUM, choices=SD.GATHER_MODES),
        AttrSpec("combine", AttrKind.ENUM, choices=SD.SCATTER_COMBINERS))),
    # A host callback (jax.pure_callback): `callback` numbers a Python function
    # (`callbacks.register`); the result (an array, or a tuple of them) is what it returns.
    Op.CALLBACK: OpInfo(None, OPQ, SD.callback, RD.callback, (_int("callback"),), result_given=True),
}

OPS_BY_NAME: dict[str, Op] = {op.value: op for op in Op}
