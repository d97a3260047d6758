"""What a corpus program is: a name, the library it is written with, and `build(size)`, which
imports that library, defines the program as its users write it and returns a pure function
of arrays with seeded example arguments. Helpers the builders share: `pick` (a value per size)
`as_numpy` (a pytree's leaves as numpy arrays), `key_data` (a key as users pass one) and
`trained` (a training state some steps in).

Imports numpy only; each builder imports its library inside itself.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

SIZES = ("bench", "test")


@dataclass(frozen=True)
class Program:
    """One program of the corpus.

    build: size ("bench": as people run it on a CPU; "test": small widths, batches and step
        counts, the same structure) -> (pure function, example arguments: a tuple of numpy
        arrays or pytrees of them).
    """

    name: str
    library: str
    description: str
    build: Callable[[str], tuple[Callable, tuple]]


def pick(size: str, *, bench, test):
    """The value for `size`."""
    if size == "bench":
        return bench
    if size == "test":
        return test
    raise ValueError(f"unknown size {size!r}; choose one of {', '.join(SIZES)}")


def as_numpy(tree):
    """`tree` with every leaf a numpy array (parameters from a library's init are jax arrays)."""
    import jax

    return jax.tree_util.tree_map(np.asarray, tree)


def key_data(seed: int) -> np.ndarray:
    """A PRNG key as users pass one across jit: its uint32 key data."""
    import jax

    return np.asarray(jax.random.key_data(jax.random.key(seed)))


def trained(train_step: Callable, state: tuple, batches: list[tuple]) -> tuple:
    """`state` after one jitted `train_step(*state, *batch)` per batch; the step returns the new
    state followed by the loss.

    A program times a step in the middle of training, not the first: adam's first update is
    lr * g / (|g| + eps), lr times the sign of each gradient, so a gradient that rounding leaves
    within eps of zero moves its parameter by +lr or -lr depending on the summation order.
    Later updates divide by the running second moment and do not amplify rounding."""
    import jax

    step = jax.jit(train_step)
    for batch in batches:
        state = tuple(step(*state, *batch)[:-1])
    return as_numpy(state)
