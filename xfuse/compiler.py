"""From a lowered module to an executable: verification, the optimisation pipeline and the
chosen backend. The fusion pipeline plugs in here.
"""

from __future__ import annotations

from collections.abc import Callable

from xfuse.hlo import Module, verify

BACKENDS = ("reference",)
DEFAULT_BACKEND = "reference"


def check_backend(name: str | None) -> str:
    """The backend to use for `name` (None: the default); ValueError naming the option."""
    if name is None:
        return DEFAULT_BACKEND
    if name not in BACKENDS:
        raise ValueError(f"backend={name!r} is not available; choose one of {', '.join(BACKENDS)}")
    return name


def compile_module(module: Module, backend: str) -> tuple[Module, Callable]:
    """(the optimised module, its executable) for `backend`."""
    verify(module)
    optimized = module
    from xfuse.backends import reference

    return optimized, reference.compile(optimized)
