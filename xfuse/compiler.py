"""From a lowered module to an executable: the optimisation pipeline (`passes=`), then the
chosen backend. Keeps what the stages show: the pass history and the fusion report.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from xfuse.fusion import Fuse, FusionReport, PassRecord, parse_pipeline, run_pipeline
from xfuse.hlo import Module, verify

BACKENDS = ("numba", "c", "reference")
DEFAULT_BACKEND = "numba"


def backend_compile(name: str) -> Callable:
    """The backend's `compile(module) -> executable` (imported on first use)."""
    if name == "numba":
        from xfuse.backends.numba import compile_module as compile_numba

        return compile_numba
    if name == "c":
        from xfuse.backends.c.backend import compile_module as compile_c

        return compile_c
    from xfuse.backends import reference

    return reference.compile


def check_backend(name: str | None) -> str:
    """The backend to use for `name` (None: the default); ValueError naming the option."""
    if name is None:
        return DEFAULT_BACKEND
    if name not in BACKENDS:
        raise ValueError(f"backend={name!r} is not available; choose one of {', '.join(BACKENDS)}")
    return name


def check_passes(passes: str | Sequence | None) -> str | Sequence | None:
    """Validates `passes=` early, so a bad pipeline fails at `xfuse.jit`, naming the option."""
    parse_pipeline(passes)
    return passes


@dataclass
class CompileResult:
    module: Module  # optimised
    executable: Callable
    history: list[PassRecord]
    report: FusionReport


def compile_module(module: Module, backend: str, passes: str | Sequence | None = None) -> CompileResult:
    verify(module)
    pipeline = parse_pipeline(passes)
    result = run_pipeline(module, pipeline)
    optimized = result.module
    reports = [r for p in pipeline if isinstance(p, Fuse) for r in p.reports]
    report = reports[-1] if reports else FusionReport(module.name)
    if not reports:
        from xfuse.fusion import kernel_count

        report.kernels = kernel_count(optimized)
    executable = backend_compile(backend)(optimized)
    return CompileResult(optimized, executable, result.history, report)
