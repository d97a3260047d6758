"""Per-dtype tolerances and `assert_close`, shared by every test that compares numbers.

Integers and pred are always compared exactly. Floats are compared under a `Tolerance`: EXACT
(bitwise) for exactly rounded ops, TRANSCENDENTAL (a few ulps) and ACCUMULATION (relative to the
sum of magnitudes: summation order). NaN matches NaN, an infinity only the same infinity, a zero
only a zero of the same sign (except under ACCUMULATION). Every float comparison also allows an
absolute error of the dtype's smallest normal number: XLA:CPU flushes subnormal results to zero
(and reads subnormal inputs as zero, see `flush_subnormals`), the reference interpreter keeps
IEEE gradual underflow. Imports numpy and xfuse.hlo only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from xfuse.hlo import DType
from xfuse.hlo.dtypes import finfo

F16, BF16, F32, F64 = DType.F16, DType.BF16, DType.F32, DType.F64

# XLA:CPU runs with denormals-are-zero and flush-to-zero. f16 arithmetic is done in f32, where
# every f16 subnormal is normal, so f16 keeps its subnormals; bf16 is done in f32 and does not.
FLUSHED_DTYPES = frozenset({BF16, F32, F64})


@dataclass(frozen=True, slots=True)
class Tolerance:
    """How far a float result may be from the expected one.

    ulps: the error allowed in units in the last place of the expected value, per dtype.
    relative: the error allowed as a fraction of a scale (by default the expected magnitude;
        for accumulations the sum of the magnitudes of the terms), per dtype.
    signed_zeros: a zero must have the expected sign.
    With neither ulps nor relative, results must match bit for bit (NaN payloads aside).
    """

    name: str
    ulps: Mapping[DType, float] = field(default_factory=dict)
    relative: Mapping[DType, float] = field(default_factory=dict)
    signed_zeros: bool = True


EXACT = Tolerance("exact")
# XLA evaluates f16 and bf16 transcendentals in f32 and rounds once more; its f32 and f64
# functions are its own polynomial approximations, good to a few ulps.
TRANSCENDENTAL = Tolerance("transcendental", ulps={F16: 2, BF16: 2, F32: 4, F64: 4})
# Reductions and dots: XLA accumulates in another order (f16 and bf16 in f32, rounding once),
# the reference in f64 rounded once. Bounds relative to the sum of |terms|: 2 eps for f16 and
# bf16, 8 eps for f32 and 64 for f64, for the sums of up to 64 terms tested.
# The sign of a zero sum is left free: XLA adds the +0.0 initial value in some of its reduction
# loops and starts from the first term in others (or drops a one-term reduction altogether).
ACCUMULATION = Tolerance(
    "accumulation",
    relative={F16: 2**-9, BF16: 2**-6, F32: 2**-20, F64: 2**-46},
    signed_zeros=False,
)


def smallest_normal(dtype: DType) -> float:
    return float(finfo(dtype).smallest_normal)


def flush_subnormals(array: np.ndarray) -> np.ndarray:
    """`array` with subnormal floats replaced by zeros of the same sign, as XLA:CPU reads them."""
    dtype = DType.from_numpy(array.dtype)
    if dtype not in FLUSHED_DTYPES:
        return array
    with np.errstate(invalid="ignore"):  # ml_dtypes warns on casting a bf16 NaN
        wide = array.astype(np.float64)
    subnormal = (wide != 0) & (np.abs(wide) < smallest_normal(dtype))
    if not subnormal.any():
        return array
    return np.where(subnormal, np.copysign(0.0, wide), wide).astype(array.dtype)


def _ulp(want: np.ndarray, dtype: DType) -> np.ndarray:
    """The spacing of `dtype` numbers at each (finite) value of `want`."""
    info = finfo(dtype)
    _, exponent = np.frexp(np.maximum(np.abs(want), float(info.smallest_normal)))
    return np.ldexp(1.0, exponent - 1 - int(info.nmant))


def _close(got: np.ndarray, want: np.ndarray, dtype: DType, tolerance: Tolerance, scale):
    """Elementwise: is `got` within `tolerance` of `want`? Both float64 arrays."""
    both_nan = np.isnan(got) & np.isnan(want)
    finite = np.isfinite(got) & np.isfinite(want)
    with np.errstate(invalid="ignore", over="ignore"):
        error = np.where(finite, np.abs(got - want), 0.0)
        allowed = np.full(want.shape, smallest_normal(dtype))
        if dtype in tolerance.ulps:
            allowed = allowed + tolerance.ulps[dtype] * _ulp(np.where(finite, want, 0.0), dtype)
        if dtype in tolerance.relative:
            size = np.abs(want) if scale is None else np.maximum(np.abs(want), scale)
            allowed = allowed + tolerance.relative[dtype] * np.where(finite, size, 0.0)
    ok = finite & (error <= allowed)
    if tolerance.signed_zeros:
        zeros = (got == 0) & (want == 0)
        ok &= ~zeros | (np.signbit(got) == np.signbit(want))
    return both_nan | ((got == want) & ~finite) | ok


def assert_close(
    got: object,
    want: object,
    dtype: DType,
    what: str,
    tolerance: Tolerance = EXACT,
    *,
    scale: np.ndarray | None = None,
    flushed: object | None = None,
    inputs: Sequence[np.ndarray] = (),
    also: Sequence[object] = (),
) -> None:
    """Asserts `got` (from XLA) matches `want` (from the reference) as `dtype` values.

    scale: per-element magnitude that ACCUMULATION-style relative errors are measured against.
    flushed: the reference's result on inputs with subnormals flushed; an element may match it
        instead of `want` (XLA:CPU reads subnormal inputs as zero).
    inputs: elementwise operands, shown next to each mismatch.
    also: other results an element may equal bit for bit instead: XLA's own on the device `got`
        was computed on (a backend that emits jax code is held to what XLA does there: XLA:GPU,
        for one, divides and takes square roots of f32 to within an ulp, not correctly rounded),
        or a rounding that XLA versions differ on.
    """
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, f"{what}: shape {got.shape}, expected {want.shape}"
    if not dtype.is_float:
        ok = got.astype(want.dtype) == want
        if flushed is not None:
            ok |= got.astype(want.dtype) == np.asarray(flushed)
    else:
        with np.errstate(invalid="ignore"):  # ml_dtypes warns on casting a bf16 NaN
            g, w = got.astype(np.float64), want.astype(np.float64)
            f = None if flushed is None else np.asarray(flushed).astype(np.float64)
        ok = _close(g, w, dtype, tolerance, scale)
        if f is not None:
            ok |= _close(g, f, dtype, tolerance, scale)
    for other in also:
        ok |= same_bits(got, np.asarray(other))
    if ok.all():
        return
    bad = np.argwhere(~ok)
    lines = [f"{what}: {len(bad)} of {ok.size} elements differ ({tolerance.name}, {dtype})"]
    for index in (tuple(int(i) for i in row) for row in bad[:12]):
        line = f"  at {list(index)}: got {got[index]!r}, want {want[index]!r}"
        if flushed is not None:
            line += f" (or {np.asarray(flushed)[index]!r} from flushed inputs)"
        shown = [repr(a[index]) for a in inputs if np.shape(a) == want.shape]
        lines.append(line + (f" for inputs {', '.join(shown)}" if shown else ""))
    raise AssertionError("\n".join(lines))


def same_bits(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Per element: whether `a` and `b` hold the same bits (any NaN equal to any NaN)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return np.zeros(a.shape, bool)
    if a.dtype == np.bool_:
        return a == b
    unsigned = np.dtype(f"u{a.dtype.itemsize}")
    same = np.ascontiguousarray(a).view(unsigned) == np.ascontiguousarray(b).view(unsigned)
    if a.dtype.kind in "fV":  # V: ml_dtypes' bfloat16
        with np.errstate(invalid="ignore"):
            same |= np.isnan(a.astype(np.float64)) & np.isnan(b.astype(np.float64))
    return same
