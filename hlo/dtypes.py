"""Element types and shapes of the IR: `DType`, `Shape` (an array) and `TupleShape`.

Imports numpy only, plus `ml_dtypes` for bfloat16 (numpy has no bf16 of its own; ml_dtypes is
a small numpy extension that jax itself depends on). Without ml_dtypes everything but bf16 works.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

import numpy as np

try:  # bfloat16 as a numpy dtype
    import ml_dtypes as _ml_dtypes

    _BF16: np.dtype | None = np.dtype(_ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover - ml_dtypes ships with jax
    _ml_dtypes = None
    _BF16 = None


class DType(enum.Enum):
    """An element type, named as in XLA's HLO text."""

    PRED = "pred"
    S8 = "s8"
    S16 = "s16"
    S32 = "s32"
    S64 = "s64"
    U8 = "u8"
    U16 = "u16"
    U32 = "u32"
    U64 = "u64"
    F16 = "f16"
    BF16 = "bf16"
    F32 = "f32"
    F64 = "f64"

    def __str__(self) -> str:
        return self.value

    @property
    def is_pred(self) -> bool:
        return self is DType.PRED

    @property
    def is_float(self) -> bool:
        return self in _FLOATS

    @property
    def is_integer(self) -> bool:
        return self in _SIGNED or self in _UNSIGNED

    @property
    def is_signed(self) -> bool:
        return self in _SIGNED

    @property
    def is_unsigned(self) -> bool:
        return self in _UNSIGNED

    @property
    def bits(self) -> int:
        return 8 if self is DType.PRED else int(self.value[1:] if self is not DType.BF16 else 16)

    @property
    def itemsize(self) -> int:
        return max(1, self.bits // 8)

    @property
    def numpy(self) -> np.dtype:
        """The numpy dtype holding this type's values."""
        if self is DType.BF16:
            if _BF16 is None:
                raise TypeError("bf16 needs the ml_dtypes package")
            return _BF16
        return np.dtype(_NUMPY_NAMES[self])

    @staticmethod
    def from_numpy(dtype: object) -> DType:
        """The DType of a numpy dtype (or anything np.dtype() accepts); TypeError if none."""
        dt = np.dtype(dtype)
        if _BF16 is not None and dt == _BF16:
            return DType.BF16
        for member, name in _NUMPY_NAMES.items():
            if dt == np.dtype(name):
                return member
        raise TypeError(f"no xfuse dtype for numpy dtype {dt}")

    @staticmethod
    def parse(text: str) -> DType:
        try:
            return DType(text)
        except ValueError:
            raise ValueError(f"unknown dtype {text!r}") from None


_SIGNED = frozenset({DType.S8, DType.S16, DType.S32, DType.S64})
_UNSIGNED = frozenset({DType.U8, DType.U16, DType.U32, DType.U64})
_FLOATS = frozenset({DType.F16, DType.BF16, DType.F32, DType.F64})
_NUMPY_NAMES = {
    DType.PRED: "bool",
    DType.S8: "int8",
    DType.S16: "int16",
    DType.S32: "int32",
    DType.S64: "int64",
    DType.U8: "uint8",
    DType.U16: "uint16",
    DType.U32: "uint32",
    DType.U64: "uint64",
    DType.F16: "float16",
    DType.F32: "float32",
    DType.F64: "float64",
}


def finfo(dtype: DType):
    """numpy's finfo for a float DType (ml_dtypes' for bf16)."""
    if dtype is DType.BF16:
        return _ml_dtypes.finfo(_ml_dtypes.bfloat16)
    return np.finfo(dtype.numpy)


@dataclass(frozen=True, slots=True)
class Shape:
    """A dense array type: element type and static dimensions; rank 0 is a scalar."""

    dtype: DType
    dims: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.dtype, DType):
            raise TypeError(f"Shape dtype must be a DType, got {self.dtype!r}")
        dims = tuple(self.dims)
        for d in dims:
            if isinstance(d, bool) or not isinstance(d, (int, np.integer)) or d < 0:
                raise ValueError(f"Shape dimensions must be non-negative integers, got {dims}")
        object.__setattr__(self, "dims", tuple(int(d) for d in dims))

    def __str__(self) -> str:
        return f"{self.dtype.value}[{','.join(map(str, self.dims))}]"

    @property
    def rank(self) -> int:
        return len(self.dims)

    @property
    def size(self) -> int:
        return math.prod(self.dims)

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    def with_dtype(self, dtype: DType) -> Shape:
        return Shape(dtype, self.dims)

    def with_dims(self, dims: tuple[int, ...]) -> Shape:
        return Shape(self.dtype, dims)

    @staticmethod
    def of(array: np.ndarray) -> Shape:
        """The Shape of a numpy array."""
        return Shape(DType.from_numpy(array.dtype), tuple(array.shape))


@dataclass(frozen=True, slots=True)
class TupleShape:
    """The type of a tuple of values (the result of `tuple`, multi-output fusions, ...)."""

    elements: tuple[Shape | TupleShape, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "elements", tuple(self.elements))

    def __str__(self) -> str:
        return "(" + ", ".join(map(str, self.elements)) + ")"

    @property
    def nbytes(self) -> int:
        return sum(e.nbytes for e in self.elements)


AnyShape = Shape | TupleShape
