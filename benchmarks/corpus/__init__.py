"""The real-program corpus: programs written with the libraries JAX users use (flax, flax.nnx,
equinox, optax, numpyro, blackjax, diffrax) as their documentation writes them, each a pure
function of arrays with seeded arguments at a benchmark size and a small test size.

`python -m benchmarks --corpus real` times them under xfuse.jit and jax.jit. Imports numpy and
the corpus modules only: every library is imported inside a program's `build`.
"""

from __future__ import annotations

from . import equinox_programs, flax_programs, optimizers, probabilistic, recurrent
from .compare import compare
from ..workloads import named
from .program import SIZES, Program

PROGRAMS: tuple[Program, ...] = (
    *flax_programs.PROGRAMS,
    *recurrent.PROGRAMS,
    *equinox_programs.PROGRAMS,
    *probabilistic.PROGRAMS,
    *optimizers.PROGRAMS,
)

BY_NAME: dict[str, Program] = {p.name: p for p in PROGRAMS}


def select(patterns: list[str] | None) -> list[Program]:
    """The programs whose name contains any of `patterns` (all when none given)."""
    return named(PROGRAMS, patterns, "program")


__all__ = ["BY_NAME", "PROGRAMS", "SIZES", "Program", "compare", "select"]
