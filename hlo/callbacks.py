"""Host callbacks: the Python functions a `callback` instruction calls (from
`jax.pure_callback`, and so `equinox.error_if`). A module refers to a callback by the number
`register` gives it, so it prints and parses back within the process that traced it; a
function is kept as long as the process lives. Imports the standard library only.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

_FUNCTIONS: list[Callable] = []
_NUMBERS: dict[int, int] = {}  # id(function) -> number, for functions already registered
_LOCK = threading.Lock()


def register(fn: Callable) -> int:
    """The number of `fn` (the same number for the same function object)."""
    with _LOCK:
        number = _NUMBERS.get(id(fn))
        if number is None or _FUNCTIONS[number] is not fn:
            number = _NUMBERS[id(fn)] = len(_FUNCTIONS)
            _FUNCTIONS.append(fn)
        return number


def lookup(number: int) -> Callable:
    """The function registered as `number`; KeyError naming it when this process has none."""
    if not 0 <= number < len(_FUNCTIONS):
        raise KeyError(f"no host callback {number} in this process (callbacks are Python functions: "
                       "a module that calls one runs only in the process that traced it)")
    return _FUNCTIONS[number]


def call(number: int, operands, shapes) -> tuple:
    """Runs callback `number` on numpy `operands`; its results as arrays of `shapes`
    ((dims, numpy dtype) pairs), checked."""
    import numpy as np

    results = lookup(number)(*operands)
    results = tuple(results) if isinstance(results, (tuple, list)) else (results,)
    if len(results) != len(shapes):
        raise TypeError(f"host callback {number} returned {len(results)} values, expected {len(shapes)}")
    out = []
    for k, (value, (dims, dtype)) in enumerate(zip(results, shapes)):
        array = np.asarray(value)
        if array.shape != tuple(dims):
            raise TypeError(f"host callback {number} result {k} has shape {array.shape}, expected {tuple(dims)}")
        out.append(array.astype(dtype, copy=False))
    return tuple(out)
