"""xfuse.fusion: the pass manager, simplification and fusion passes, cost model, fusion report.

`run_pipeline(module, parse_pipeline("simplify,cse,dce,fuse"))` optimises a module; the `fuse`
pass keeps its `FusionReport`s. May import xfuse.hlo and networkx.
"""

from .algebraic import AlgebraicSimplifier
from .analysis import cost_analysis
from .constant_folding import ConstantFolding
from .cost import DEFAULT_MACHINE, Machine
from .cse import CommonSubexpressionElimination
from .dce import DeadCodeElimination
from .fuse import Fuse, kernel_count
from .licm import LoopInvariantCodeMotion
from .rowsplit import RowSplitLoops
from .pipeline import (
    DEFAULT_PIPELINE,
    REGISTRY,
    PassError,
    PassRecord,
    PipelineResult,
    parse_pipeline,
    register,
    run_pipeline,
)
from .report import DecisionInfo, FusionReport

__all__ = [
    "AlgebraicSimplifier",
    "CommonSubexpressionElimination",
    "ConstantFolding",
    "DeadCodeElimination",
    "DEFAULT_MACHINE",
    "DEFAULT_PIPELINE",
    "DecisionInfo",
    "Fuse",
    "FusionReport",
    "LoopInvariantCodeMotion",
    "RowSplitLoops",
    "Machine",
    "PassError",
    "PassRecord",
    "PipelineResult",
    "REGISTRY",
    "cost_analysis",
    "kernel_count",
    "parse_pipeline",
    "register",
    "run_pipeline",
]
