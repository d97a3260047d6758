"""From a lowered module to an executable: kernels registered for the chosen backend are
outlined, the optimisation pipeline runs (`passes=`), each top-level instruction is placed on
the chosen backend or its fallback, and the backend compiles. Keeps what the stages show: the
pass history and the fusion report (with the placement decisions).

The backend in effect is the one `xfuse.jit(backend=...)` names, else the innermost
`with xfuse.default_backend(...)`, else numba.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

from xfuse.backends import placement
from xfuse.backends.registry import REGISTRY
from xfuse.fusion import Fuse, FusionReport, PassRecord, parse_pipeline, run_pipeline
from xfuse.fusion.report import PlacementInfo
from xfuse.hlo import Module, verify

DEFAULT_BACKEND = "numba"


@dataclass(frozen=True)
class BackendChoice:
    """A backend by name, the backend that runs what it cannot (None: an error), its options."""

    name: str = DEFAULT_BACKEND
    fallback: str | None = None
    options: tuple[tuple[str, object], ...] = ()

    @property
    def option_dict(self) -> dict[str, object]:
        return dict(self.options)


_DEFAULT: ContextVar[BackendChoice | None] = ContextVar("xfuse_default_backend", default=None)


def current_choice() -> BackendChoice:
    return _DEFAULT.get() or BackendChoice()


def make_choice(
    backend: str | None, fallback: str | None = None, options: Mapping[str, object] | None = None
) -> BackendChoice:
    """Checks the options now, naming the one that is wrong (ValueError)."""
    name = check_backend(backend)
    if fallback is not None:
        if check_backend(fallback, "fallback") == name:
            raise ValueError(f"fallback={fallback!r} is the backend itself")
    if options is not None and not isinstance(options, Mapping):
        raise ValueError(f"backend_options must be a dict, got {type(options).__name__}")
    items = tuple(sorted((options or {}).items()))
    if items:
        accepted = REGISTRY.get(name).options
        for key, _ in items:
            if key not in accepted:
                takes = ", ".join(accepted) or "none"
                raise ValueError(
                    f"backend_options: {key!r} is not an option of backend {name!r} (it takes: {takes})"
                )
    return BackendChoice(name, fallback, items)


@contextmanager
def default_backend(
    backend: str, *, fallback: str | None = None, options: Mapping[str, object] | None = None
) -> Iterator[BackendChoice]:
    """`with xfuse.default_backend("jax"):` compiles functions that name no backend of their
    own on `backend` inside the block (this thread or task only)."""
    token = _DEFAULT.set(make_choice(backend, fallback, options))
    try:
        yield _DEFAULT.get()
    finally:
        _DEFAULT.reset(token)


def check_backend(name: str | None, option: str = "backend") -> str:
    """The backend to use for `name` (None: the default); ValueError naming the option."""
    if name is None:
        return DEFAULT_BACKEND
    if not isinstance(name, str):
        raise ValueError(f"{option} must be a backend's name, got {name!r}")
    if name not in REGISTRY.names():
        raise ValueError(
            f"{option}={name!r} is not available; choose one of {', '.join(REGISTRY.names())}"
        )
    return name


def check_passes(passes: str | Sequence | None) -> str | Sequence | None:
    """Validates `passes=` early, so a bad pipeline fails at `xfuse.jit`, naming the option."""
    parse_pipeline(passes)
    return passes


@dataclass
class CompileResult:
    module: Module  # optimised
    executable: object
    history: list[PassRecord]
    report: FusionReport
    backend_s: float = 0.0  # placement and the backend's compile (its code generation)


def compile_module(
    module: Module,
    backend: str | BackendChoice,
    passes: str | Sequence | None = None,
) -> CompileResult:
    choice = backend if isinstance(backend, BackendChoice) else make_choice(backend)
    verify(module)
    primary = REGISTRY.get(choice.name)
    second = REGISTRY.get(choice.fallback) if choice.fallback else None
    module, custom, outlined = placement.outline_kernels(module, REGISTRY.kernels_for(primary.name))
    pipeline = parse_pipeline(passes)
    if passes is None and not getattr(primary, "loops_at_once", False):
        pipeline = [p for p in pipeline if p.name != "rowsplit"]  # its parts would run in turn
    result = run_pipeline(module, pipeline)
    optimized = result.module
    reports = [r for p in pipeline if isinstance(p, Fuse) for r in p.reports]
    report = reports[-1] if reports else FusionReport(module.name)
    if not reports:
        from xfuse.fusion import kernel_count

        report.kernels = kernel_count(optimized)
    report.loops = [str(done) for p in pipeline for done in (*getattr(p, "hoisted", ()), *getattr(p, "splits", ()))]
    started = time.perf_counter()
    segments, placed = placement.place(optimized, primary, second, custom)
    report.placements = [PlacementInfo(d.instruction, d.what, d.target, d.reason) for d in outlined + placed]
    options = choice.option_dict
    if segments is None:
        executable = primary.compile(optimized, **options)
    else:

        def compile_on(name: str, sub: Module):
            chosen = primary if name == primary.name else second
            return chosen.compile(sub, **(options if chosen is primary else {})), chosen.host_arrays

        executable = placement.build(optimized, segments, compile_on)
    return CompileResult(optimized, executable, result.history, report, time.perf_counter() - started)
