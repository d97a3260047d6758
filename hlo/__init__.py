"""xfuse.hlo: the IR. Dtypes and shapes, the opcode table, instructions, computations and
modules, the builder, the text printer and parser, the verifier and the numpy reference
interpreter. Imports numpy (and ml_dtypes for bf16) only: nothing else of xfuse, no jax.
"""

from .builder import Builder
from .dtypes import AnyShape, DType, Shape, TupleShape
from .errors import BuilderError, HloError, HloParseError, HloVerifyError
from .interpreter import InterpreterError, interpret
from .ir import Computation, Instruction, Loc, Module, fresh_name
from .literal import Literal
from .ops import OPS, AttrKind, Kind, Op, OpInfo
from .parser import parse
from .printer import print_module
from .shape_rules import ShapeError
from .verifier import verify

__all__ = [
    "AnyShape",
    "AttrKind",
    "Builder",
    "BuilderError",
    "Computation",
    "DType",
    "HloError",
    "HloParseError",
    "HloVerifyError",
    "Instruction",
    "InterpreterError",
    "Kind",
    "Literal",
    "Loc",
    "Module",
    "OPS",
    "Op",
    "OpInfo",
    "Shape",
    "ShapeError",
    "TupleShape",
    "fresh_name",
    "interpret",
    "parse",
    "print_module",
    "verify",
]
