"""`Literal`: the value of a `constant`, an immutable numpy array compared bit for bit.

Also how literals print (XLA style nested braces, `{{1, 2}, {3, 4}}`) and how one number reads
back; every float prints so that it parses back to the same bits (NaN payloads aside: a NaN
prints as `nan` or `-nan`, keeping only its sign). Imports numpy only.
"""

from __future__ import annotations

import math
import re

import numpy as np

from .dtypes import DType, Shape


class Literal:
    """An immutable array value. Equality and hashing are bitwise, so -0.0 != 0.0 and NaN == NaN."""

    __slots__ = ("_array", "_key", "shape")

    def __init__(self, value: object, dtype: DType | None = None) -> None:
        if dtype is None:
            array = np.asarray(value)
            dtype = DType.from_numpy(array.dtype)
        array = np.array(value, dtype=dtype.numpy, copy=True)
        array.setflags(write=False)
        self._array = array
        self.shape = Shape(dtype, tuple(array.shape))
        self._key = (self.shape, array.tobytes())

    @property
    def array(self) -> np.ndarray:
        """The value (read-only)."""
        return self._array

    @property
    def dtype(self) -> DType:
        return self.shape.dtype

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Literal) and self._key == other._key

    def __hash__(self) -> int:
        return hash(self._key)

    def __repr__(self) -> str:
        return f"Literal({format_literal(self)}, {self.shape})"

    def is_splat(self) -> bool:
        """True if every element has the same bits (scalars included)."""
        if self._array.size <= 1:
            return True
        flat = self._array.reshape(-1).view(np.uint8).reshape(self._array.size, -1)
        return bool((flat == flat[0]).all())


def format_scalar(value: object, dtype: DType) -> str:
    """One element as text that `parse_scalar` reads back to the same bits."""
    if dtype.is_pred:
        return "true" if bool(value) else "false"
    if dtype.is_integer:
        return str(int(value))
    x = float(value)
    if math.isnan(x):
        return "-nan" if np.signbit(value) else "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    short = str(np.asarray(value, dtype=dtype.numpy)[()])
    if _same_bits(parse_scalar(short, dtype), value, dtype):
        return _with_point(short)
    return repr(x)  # exact: every float of these dtypes is a float64


def _with_point(text: str) -> str:
    """Makes an integral float print as a float (`2` -> `2.0`) for readability."""
    if any(c in text for c in ".eEn"):
        return text
    return text + ".0"


def _same_bits(a: object, b: object, dtype: DType) -> bool:
    np_dtype = dtype.numpy
    return np.asarray(a, np_dtype).tobytes() == np.asarray(b, np_dtype).tobytes()


_FLOAT_RE = re.compile(r"-?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?|-?nan|-?inf", re.ASCII)


def parse_scalar(text: str, dtype: DType) -> object:
    """Reads one element of `dtype`; ValueError if the text is not such a value."""
    if dtype.is_pred:
        if text not in ("true", "false"):
            raise ValueError(f"expected true or false for pred, got {text!r}")
        return np.bool_(text == "true")
    if dtype.is_integer:
        info = np.iinfo(dtype.numpy)
        try:
            value = int(text)
        except ValueError:
            raise ValueError(f"expected an integer for {dtype}, got {text!r}") from None
        if not info.min <= value <= info.max:
            raise ValueError(f"{value} is out of range for {dtype}")
        return dtype.numpy.type(value)
    if not _FLOAT_RE.fullmatch(text):  # float() also takes "Infinity", "NAN", " 1_0", ...
        raise ValueError(f"expected a number for {dtype}, got {text!r}")
    value = float(text)
    with np.errstate(over="ignore"):
        result = np.asarray(value, dtype=dtype.numpy)[()]
    if math.isinf(float(result)) and text.lstrip("-") != "inf":  # float("1e999") is inf too
        raise ValueError(f"{text} overflows {dtype}")
    return result


def format_literal(literal: Literal) -> str:
    """The whole value: a scalar bare, an array in nested braces."""
    dtype = literal.dtype
    array = literal.array
    if array.ndim == 0:
        return format_scalar(array[()], dtype)

    def nest(a: np.ndarray) -> str:
        if a.ndim == 1:
            return "{" + ", ".join(format_scalar(v, dtype) for v in a) + "}"
        return "{" + ", ".join(nest(sub) for sub in a) + "}"

    return nest(array)
