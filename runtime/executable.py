"""`Executable`: what a backend hands the runtime. A sequence of steps over numbered values:
kernels and library calls write into output buffers the runtime allocates (destination
passing); aliases (reshape views, tuple elements) make new names for existing buffers.
Imports numpy and the standard library only.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class BufferSpec:
    shape: tuple[int, ...]
    dtype: np.dtype

    @property
    def nbytes(self) -> int:
        size = 1
        for d in self.shape:
            size *= d
        return size * np.dtype(self.dtype).itemsize


class KernelError(RuntimeError):
    """A step failed; names the step (the kernel and its fusion)."""


@dataclass(frozen=True)
class Step:
    """One unit of work. `run(inputs, outputs)` fills `outputs` (kernels, BLAS, copies);
    an alias step's `run(inputs)` returns its outputs instead (views, no work)."""

    name: str
    kind: str  # "kernel", "blas", "copy", "alias"
    run: Callable
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    out_specs: tuple[BufferSpec, ...] = ()
    label: str = ""  # what the step computes, for errors and reports


@dataclass
class Executable:
    """Values 0..n-1: parameters first, then what the steps produce; `results` are returned."""

    params: list[int]
    results: list[int]
    steps: list[Step]
    constants: dict[int, np.ndarray] = field(default_factory=dict)
    n_values: int = 0
    kernel_sources: dict[str, str] = field(default_factory=dict)  # step name -> source

    def __call__(self, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        values: list = [None] * self.n_values
        for slot, array in zip(self.params, arrays):
            values[slot] = array
        for slot, array in self.constants.items():
            values[slot] = array
        for step in self.steps:
            inputs = [values[i] for i in step.inputs]
            try:
                if step.kind == "alias":
                    outputs = step.run(inputs)
                else:
                    outputs = [np.empty(s.shape, s.dtype) for s in step.out_specs]
                    step.run(inputs, outputs)
            except KernelError:
                raise
            except Exception as e:
                raise KernelError(f"{step.name} ({step.label or step.kind}) failed: {type(e).__name__}: {e}") from e
            if len(step.outputs) == 1 and len(outputs) > 1:  # a multi-output kernel: one tuple
                outputs = [tuple(outputs)]
            for slot, out in zip(step.outputs, outputs):
                values[slot] = out
        kept = {id(_root(values[s])) for s in self.params} | {id(_root(a)) for a in self.constants.values()}
        return [np.array(v, copy=True) if id(_root(v)) in kept else v for v in (values[r] for r in self.results)]


def _root(array: np.ndarray) -> np.ndarray:
    """The array that owns the memory of `array` (itself, or the base of a view)."""
    while isinstance(array.base, np.ndarray):
        array = array.base
    return array
