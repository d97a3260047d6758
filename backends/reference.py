"""The reference backend: runs a module on `xfuse.hlo`'s numpy interpreter. Slow and exact;
the oracle the other backends are checked against. May import xfuse.hlo and numpy.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from xfuse.hlo import Module, TupleShape, interpret

NAME = "reference"


class ReferenceExecutable:
    """Flat arrays in, a flat list of arrays out (a tuple root gives one array per element)."""

    def __init__(self, module: Module) -> None:
        self.module = module
        self.tuple_root = isinstance(module.entry_computation.result_shape, TupleShape)

    def __call__(self, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        result = interpret(self.module, *arrays)
        return list(result) if self.tuple_root else [result]


def compile(module: Module) -> ReferenceExecutable:  # noqa: A001 - the backend entry point
    return ReferenceExecutable(module)
