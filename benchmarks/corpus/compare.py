"""Agreement of two pytrees of results, leaf by leaf: the same structure, and per leaf the
same shape and dtype, integers and booleans equal, floats within a float32 tolerance.

A float element passes when |got - want| <= RTOL * |want| + ATOL * scale, where scale is the
largest |want| among the float leaves of the same output (one element of a returned tuple,
list or dict; the whole result otherwise): relative to the element, with an absolute floor
relative to its output, so that what summation order leaves of a cancelling sum is not held
to a relative bound. A gradient that is zero in exact arithmetic (a bias before a
normalisation, an attention key's bias) is such a sum: float32 rounding leaves 1e-8 there,
in either engine, beside gradients of 1e-1. NaN matches NaN and an infinity the same
infinity. Imports numpy (and jax's pytree functions inside `compare`).
"""

from __future__ import annotations

import numpy as np

RTOL = 2e-3
ATOL = 1e-4


def _leaf(got: np.ndarray, want: np.ndarray, scale: float) -> dict:
    """One leaf's verdict: ok, and the error against the tolerance for float leaves."""
    verdict = {"dtype": str(want.dtype), "shape": list(want.shape)}
    if got.shape != want.shape or got.dtype != want.dtype:
        return dict(verdict, ok=False, got=f"{got.dtype}{list(got.shape)}")
    if want.size == 0:
        return dict(verdict, ok=True)
    if not np.issubdtype(want.dtype, np.inexact):
        equal = got == want
        return dict(verdict, ok=bool(equal.all()), mismatches=int((~equal).sum()))
    g, w = got.astype(np.float64), want.astype(np.float64)
    finite = np.isfinite(w)
    with np.errstate(invalid="ignore"):
        error = np.where(finite, np.abs(g - w), 0.0)
        allowed = RTOL * np.abs(np.where(finite, w, 0.0)) + ATOL * scale
        same_special = (np.isnan(g) & np.isnan(w)) | (~finite & (g == w))
        ok = (finite & np.isfinite(g) & (error <= allowed)) | same_special
    worst = int(np.argmax(np.where(ok, -1.0, error)))
    return dict(
        verdict,
        ok=bool(ok.all()),
        mismatches=int((~ok).sum()),
        max_abs_err=float(error.max()),
        scale=scale,
        worst_got=float(g.flat[worst]),
        worst_want=float(w.flat[worst]),
    )


def _magnitude(leaf: np.ndarray) -> float:
    """The largest finite |element| of a float leaf; 0 for other leaves."""
    if not np.issubdtype(leaf.dtype, np.inexact) or leaf.size == 0:
        return 0.0
    finite = np.abs(leaf[np.isfinite(leaf)].astype(np.float64))
    return float(finite.max()) if finite.size else 0.0


def compare(got, want) -> dict:
    """Whether `got` matches `want` (pytrees of arrays); the first mismatching leaf's details."""
    import jax

    got_leaves, got_tree = jax.tree_util.tree_flatten_with_path(got)
    want_leaves, want_tree = jax.tree_util.tree_flatten_with_path(want)
    result = {"ok": False, "leaves": len(want_leaves), "structure_ok": got_tree == want_tree}
    if not result["structure_ok"]:
        result["structure"] = f"got {got_tree}, want {want_tree}"
        return result
    scales: dict = {}  # output (the first key of a leaf's path) -> its largest magnitude
    for path, w in want_leaves:
        output = path[:1]
        scales[output] = max(scales.get(output, 0.0), _magnitude(np.asarray(w)))
    bad = []
    for (path, g), (_, w) in zip(got_leaves, want_leaves):
        verdict = _leaf(np.asarray(g), np.asarray(w), scales[path[:1]])
        if not verdict["ok"]:
            bad.append(dict(verdict, path=jax.tree_util.keystr(path)))
    result.update(ok=not bad, mismatched_leaves=len(bad), first_mismatch=bad[0] if bad else None)
    return result
