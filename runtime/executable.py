"""`Executable`: what a backend hands the runtime. A sequence of steps over numbered values:
kernels and library calls write into output buffers the runtime allocates (destination
passing); aliases (reshape views, tuple elements) make new names for existing buffers.
Imports numpy and the standard library only.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial

import numpy as np

from .pool import MIN_BYTES, POOL


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

    def __post_init__(self) -> None:
        # After each step, the values no later step reads: dropping them lets the pool hand
        # their memory to the next step (a buffer plan made at run time by reference counts).
        last: dict[int, int] = {}
        for i, step in enumerate(self.steps):
            for v in step.inputs:
                last[v] = i
        keep = set(self.params) | set(self.constants) | set(self.results)
        self.release_after: list[tuple[int, ...]] = [() for _ in self.steps]
        for v, i in last.items():
            if v not in keep:
                self.release_after[i] += (v,)
        self.pool = POOL
        # Results that may be an argument or constant itself, or a view of one (through alias
        # steps): those are copied on the way out, so a caller never shares their memory.
        borrowed = set(self.params) | set(self.constants)
        for step in self.steps:
            if step.kind == "alias" and borrowed.intersection(step.inputs):
                borrowed.update(step.outputs)
        self.may_borrow = any(r in borrowed for r in self.results)

        # Each step as a flat tuple, so the call loop does no attribute lookups.
        self.plan = [
            (step.kind == "alias", step.run, step.inputs, step.outputs,
             tuple(self._allocator(spec) for spec in step.out_specs),
             len(step.outputs) == 1 and len(step.out_specs) > 1, release)
            for step, release in zip(self.steps, self.release_after)
        ]

    def runner(self) -> Callable[[Sequence[np.ndarray]], list[np.ndarray]]:
        """The cheapest callable equal to `self(arrays)`: for one kernel reading the arguments
        in order and returning its outputs, a closure with no step loop (the dispatch fast
        path); otherwise `self`."""
        if len(self.plan) != 1 or self.constants:
            return self
        alias, run, ins, outs, allocate, packed, _ = self.plan[0]
        if alias or packed or list(ins) != list(self.params) or list(outs) != list(self.results):
            return self
        step = self.steps[0]

        def call(arrays):
            outputs = [a() for a in allocate]
            try:
                run(arrays, outputs)
            except Exception as e:
                raise KernelError(f"{step.name} ({step.label or step.kind}) failed: {type(e).__name__}: {e}") from e
            return outputs

        return call

    def _allocator(self, spec: BufferSpec) -> Callable[[], np.ndarray]:
        shape, dtype = tuple(spec.shape), np.dtype(spec.dtype)
        if spec.nbytes < MIN_BYTES:
            return partial(np.empty, shape, dtype)
        return partial(self.pool.empty, shape, dtype)

    def __call__(self, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        values: list = [None] * self.n_values
        for slot, array in zip(self.params, arrays):
            values[slot] = array
        for slot, array in self.constants.items():
            values[slot] = array
        for n, (alias, run, ins, outs, allocate, packed, release) in enumerate(self.plan):
            try:
                if alias:
                    outputs = run([values[i] for i in ins])
                else:
                    outputs = [a() for a in allocate]
                    run([values[i] for i in ins], outputs)
            except KernelError:
                raise
            except Exception as e:
                step = self.steps[n]
                raise KernelError(f"{step.name} ({step.label or step.kind}) failed: {type(e).__name__}: {e}") from e
            if packed:  # a multi-output kernel: one tuple value
                outputs = [tuple(outputs)]
            for slot, out in zip(outs, outputs):
                values[slot] = out
            for slot in release:
                values[slot] = None
        if not self.may_borrow:
            return [values[r] for r in self.results]
        kept = {id(_root(values[s])) for s in self.params} | {id(_root(a)) for a in self.constants.values()}
        return [np.array(v, copy=True) if id(_root(v)) in kept else v for v in (values[r] for r in self.results)]


def _root(array: np.ndarray) -> np.ndarray:
    """The array that owns the memory of `array` (itself, or the base of a view)."""
    while isinstance(array.base, np.ndarray):
        array = array.base
    return array
