"""Whole-row reductions that kernels call on a contiguous row (a row of an input, or a buffer
the kernel filled). compile.py compiles the sums with numba's `reassoc` flag alone, so LLVM may
reorder their additions into vector lanes (as XLA's vectorised reductions do) while every other
operation in a kernel keeps IEEE order; NaN and infinities propagate as in any order of the same
sum. max and min are exact and vectorise without any flag: they reduce integer keys that order
floats as jax does (-0.0 below +0.0), and a NaN anywhere gives NaN. argmax and argmin find the
extreme so, then the first element equal to it (or the first NaN). Imports numpy and the
bit-cast intrinsics of mathlib.core (so numba).
"""

from __future__ import annotations

import numpy as np

from .mathlib.core import _bits32, _bits64, _float32, _float64, _inline

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
# order is then float order, and the map is its own inverse. NaNs land outside the keys of
# [-inf, +inf], so one pass finds both extreme keys (two integer reductions, which vectorise)
# and a NaN shows as a key beyond an infinity's.
KEY_INF32, KEY_NEG_INF32 = I32(0x7F800000), I32(-0x7F800001)
KEY_INF64, KEY_NEG_INF64 = I64(0x7FF0000000000000), I64(-0x7FF0000000000001)


@_inline
def _keys32(a):
    # numba widens int32 arithmetic to int64; the casts back keep the keys 32 bits wide, so the
    # loop compares eight of them per AVX2 vector instead of four (3x faster on a row in cache)
    hi, lo = I32(-0x7FFFFFFF - 1), MAG32
    for i in range(a.shape[0]):
        b = _bits32(a[i])
        key = I32(b ^ (I32(b >> 31) & MAG32))
        hi = key if key > hi else hi
        lo = key if key < lo else lo
    return hi, lo


@_inline
def _keys64(a):
    hi, lo = I64(-0x7FFFFFFFFFFFFFFF - 1), MAG64
    for i in range(a.shape[0]):
        b = _bits64(a[i])
        key = b ^ ((b >> 63) & MAG64)
        hi = key if key > hi else hi
        lo = key if key < lo else lo
    return hi, lo


@_inline
def _max_f32(a):
    hi, lo = _keys32(a)
    nan = (hi > KEY_INF32) | (lo < KEY_NEG_INF32)
    return np.float32(np.nan) if nan else _float32(I32(hi ^ (I32(hi >> 31) & MAG32)))


@_inline
def _min_f32(a):
    hi, lo = _keys32(a)
    nan = (hi > KEY_INF32) | (lo < KEY_NEG_INF32)
    return np.float32(np.nan) if nan else _float32(I32(lo ^ (I32(lo >> 31) & MAG32)))


@_inline
def _max_f64(a):
    hi, lo = _keys64(a)
    nan = (hi > KEY_INF64) | (lo < KEY_NEG_INF64)
    return np.float64(np.nan) if nan else _float64(hi ^ ((hi >> 63) & MAG64))


@_inline
def _min_f64(a):
    hi, lo = _keys64(a)
    nan = (hi > KEY_INF64) | (lo < KEY_NEG_INF64)
    return np.float64(np.nan) if nan else _float64(lo ^ ((lo >> 63) & MAG64))


def max_f32(a):
    return _max_f32(a)


def min_f32(a):
    return _min_f32(a)


def max_f64(a):
    return _max_f64(a)


def min_f64(a):
    return _min_f64(a)


# The first index of a row's max (min), or of its first NaN, as jax's argmax (argmin): the
# extreme through the vectorised keys, then a search that stops at it. An in-order loop carrying
# both the extreme and its index does not vectorise (argmax over 21845x24: 1.6 ms on one thread).
@_inline
def _first(a, value):
    if value != value:
        for i in range(a.shape[0]):
            if a[i] != a[i]:
                return i
    for i in range(a.shape[0]):
        if a[i] == value:
            return i
    return 0


def argmax_f32(a):
    return _first(a, _max_f32(a))


def argmin_f32(a):
    return _first(a, _min_f32(a))


def argmax_f64(a):
    return _first(a, _max_f64(a))


def argmin_f64(a):
    return _first(a, _min_f64(a))


SUMS = ("sum_f32", "sum_f64")
EXTREMES = ("max_f32", "min_f32", "max_f64", "min_f64", "argmax_f32", "argmin_f32", "argmax_f64", "argmin_f64")
