"""Helpers for pass tests: `assert_pass` (a before module in HLO text, a pass, the expected
module in HLO text; it also checks the interpreter agrees before and after), inputs for a
module (random ones, and edge values: NaN, +-inf, -0.0, integer extremes) and a bitwise,
NaN-aware comparison of results.

"NaN-aware": two NaNs are equal whatever their sign and payload (the text format keeps neither,
and which NaN an op returns when both operands are NaN is not specified); every other float
must have the same bits, so -0.0 != 0.0.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from xfuse.hlo import DType, Module, Shape, TupleShape, interpret, parse, verify
from xfuse.hlo.dtypes import finfo


# ---------------------------------------------------------------------------- comparing results
def same_values(a: object, b: object) -> bool:
    """Bitwise equality of results (arrays or nested tuples of them), NaN equal to any NaN."""
    if isinstance(a, tuple) or isinstance(b, tuple):
        return (
            isinstance(a, tuple)
            and isinstance(b, tuple)
            and len(a) == len(b)
            and all(same_values(x, y) for x, y in zip(a, b))
        )
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if not DType.from_numpy(a.dtype).is_float:
        return bool(np.array_equal(a, b))
    bits = np.dtype(f"u{a.dtype.itemsize}")
    same_bits = a.view(bits) == b.view(bits)
    both_nan = np.isnan(a) & np.isnan(b)  # ml_dtypes' bf16 has isnan too
    return bool(np.all(same_bits | both_nan))


def describe(value: object) -> str:
    if isinstance(value, tuple):
        return "(" + ", ".join(describe(v) for v in value) + ")"
    array = np.asarray(value)
    return f"{array.dtype}{list(array.shape)} {array.tolist()!r}"


# ---------------------------------------------------------------------------- inputs
def edge_values(dtype: DType) -> list[object]:
    """The values most likely to expose an inexact rewrite."""
    if dtype.is_pred:
        return [True, False]
    if dtype.is_integer:
        info = np.iinfo(dtype.numpy)
        values = [0, 1, int(info.max), int(info.min), 2, int(info.max) - 1]
        return values + ([-1, int(info.min) + 1] if dtype.is_signed else [])
    info = finfo(dtype)
    return [
        math.nan,
        -math.nan,
        math.inf,
        -math.inf,
        -0.0,
        0.0,
        1.0,
        -1.0,
        float(info.max),
        -float(info.max),
        float(info.tiny),
        float(info.smallest_subnormal),
        0.5,
        -3.0,
    ]


def edge_array(shape: Shape, offset: int = 0) -> np.ndarray:
    """`shape` filled with the edge values of its dtype, cycled from `offset`."""
    values = edge_values(shape.dtype)
    flat = [values[(i + offset) % len(values)] for i in range(shape.size)]
    return np.array(flat, dtype=shape.dtype.numpy).reshape(shape.dims)


def random_array(shape: Shape, rng: np.random.Generator) -> np.ndarray:
    dtype = shape.dtype
    if dtype.is_pred:
        return rng.integers(0, 2, shape.dims).astype(bool)
    if dtype.is_integer:
        info = np.iinfo(dtype.numpy)
        wide = rng.integers(info.min, info.max, shape.dims, dtype=dtype.numpy, endpoint=True)
        small = rng.integers(-3 if dtype.is_signed else 0, 4, shape.dims).astype(dtype.numpy)
        return np.where(rng.random(shape.dims) < 0.5, small, wide)
    values = rng.standard_normal(shape.dims) * 4
    edges = edge_array(shape, offset=int(rng.integers(0, 14))).astype(np.float64)
    return np.where(rng.random(shape.dims) < 0.3, edges, values).astype(dtype.numpy)


def _argument(shape, make) -> object:
    if isinstance(shape, TupleShape):
        return tuple(_argument(e, make) for e in shape.elements)
    return make(shape)


def input_sets(module: Module, random_sets: int = 2, seed: int = 0) -> list[tuple[object, ...]]:
    """Edge-value inputs (two alignments) and `random_sets` random ones for the entry."""
    shapes = module.entry_computation.parameter_shapes
    sets = [
        tuple(_argument(s, lambda sh, k=k + i: edge_array(sh, k)) for i, s in enumerate(shapes))
        for k in (0, 5)
    ]
    rng = np.random.default_rng(seed)
    for _ in range(random_sets):
        sets.append(tuple(_argument(s, lambda sh: random_array(sh, rng)) for s in shapes))
    return sets


# ---------------------------------------------------------------------------- checking passes
def assert_same_results(
    before: Module, after: Module, inputs: Sequence[tuple[object, ...]]
) -> None:
    """The interpreter gives bitwise the same results (NaN-aware) on both modules."""
    for args in inputs:
        expected = interpret(before, *args)
        got = interpret(after, *args)
        assert same_values(expected, got), (
            f"results differ on inputs {describe(tuple(args))}:\n"
            f"  before: {describe(expected)}\n  after:  {describe(got)}\n{after}"
        )


def run_passes(passes, module: Module) -> Module:
    for p in passes if isinstance(passes, (list, tuple)) else [passes]:
        module = p.run(module)
        verify(module)
    return module


def assert_pass(pass_, before_text: str, expected_text: str) -> Module:
    """Runs `pass_` (or a list of passes) on the module `before_text`; the result must equal
    the module `expected_text`, verify, and compute what the original computes."""
    before = parse(before_text)
    verify(before)
    expected = parse(expected_text)
    after = run_passes(pass_, before)
    assert str(after) == str(expected), f"got:\n{after}\nexpected:\n{expected}"
    assert after == expected, f"same text, different modules:\n{after}"
    assert_same_results(before, after, input_sets(before))
    return after


def assert_unchanged(pass_, text: str) -> None:
    """`pass_.run` returns the very module it was given."""
    module = parse(text)
    assert pass_.run(module) is module, f"{pass_.name} changed:\n{pass_.run(module)}"
