"""Whole-row reductions that kernels call on a contiguous row (a row of an input, or a buffer
the kernel filled). compile.py compiles the sums with numba's `reassoc` flag alone, so LLVM may
reorder their additions into vector lanes (as XLA's vectorised reductions do) while every other
operation in a kernel keeps IEEE order; NaN and infinities propagate as in any order of the same
sum. max and min are exact and vectorise without any flag: they reduce integer keys that order
floats as jax does (-0.0 below +0.0), and a NaN anywhere gives NaN. Imports numpy and the
bit-cast intrinsics of mathlib.core.
"""

from __future__ import annotations

import numpy as np

from .mathlib.core import _bits32, _bits64, _float32, _float64

I32, I64 = np.int32, np.int64
MAG32, MAG64 = I32(0x7FFFFFFF), I64(0x7FFFFFFFFFFFFFFF)


def sum_f32(a):
    s = np.float32(0.0)
    for i in range(a.shape[0]):
        s += a[i]
    return s


def sum_f64(a):
    s = np.float64(0.0)
    for i in range(a.shape[0]):
        s += a[i]
    return s


# A float's bits as a signed integer, negative ones with the magnitude bits flipped: integer
# order is then float order (NaNs aside), and the map is its own inverse.
def max_f32(a):
    k = I32(-0x7FFFFFFF - 1)  # the smallest key (a negative NaN's): below -inf
    nan = False
    for i in range(a.shape[0]):
        b = _bits32(a[i])
        key = b ^ ((b >> 31) & MAG32)
        k = key if key > k else k
        nan |= a[i] != a[i]
    return np.float32(np.nan) if nan else _float32(k ^ ((k >> 31) & MAG32))


def min_f32(a):
    k = MAG32  # the largest key (a positive NaN's): above +inf
    nan = False
    for i in range(a.shape[0]):
        b = _bits32(a[i])
        key = b ^ ((b >> 31) & MAG32)
        k = key if key < k else k
        nan |= a[i] != a[i]
    return np.float32(np.nan) if nan else _float32(k ^ ((k >> 31) & MAG32))


def max_f64(a):
    k = I64(-0x7FFFFFFFFFFFFFFF - 1)
    nan = False
    for i in range(a.shape[0]):
        b = _bits64(a[i])
        key = b ^ ((b >> 63) & MAG64)
        k = key if key > k else k
        nan |= a[i] != a[i]
    return np.float64(np.nan) if nan else _float64(k ^ ((k >> 63) & MAG64))


def min_f64(a):
    k = MAG64
    nan = False
    for i in range(a.shape[0]):
        b = _bits64(a[i])
        key = b ^ ((b >> 63) & MAG64)
        k = key if key < k else k
        nan |= a[i] != a[i]
    return np.float64(np.nan) if nan else _float64(k ^ ((k >> 63) & MAG64))


SUMS = ("sum_f32", "sum_f64")
EXTREMES = ("max_f32", "min_f32", "max_f64", "min_f64")
