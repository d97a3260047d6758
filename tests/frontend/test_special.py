"""The special functions XLA expands into elementwise ops (`xfuse.frontend.special`): lgamma,
digamma and erf_inv against jax.jit over a grid that crosses the poles, zeros and reflection
points, in float32 and float64. The corpus runs them on every backend; test_random.py has
erf_inv's float64 tail and nextafter."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from jax import lax

import xfuse


def grid(dtype) -> np.ndarray:
    rng = np.random.default_rng(5)
    points = [0.0, -0.0, -1.0, -2.0, -7.0, 1.0, 2.0, 1.4616321449683622, 0.5, -0.5, -2.5, 1e-20, -1e-20,
              3e4, -3e4 + 0.25, np.inf, -np.inf, np.nan]
    return np.concatenate([rng.uniform(-12, 12, 4000), rng.uniform(0, 3, 2000), np.linspace(-6, 6, 1201),
                           points]).astype(dtype)


@pytest.mark.parametrize("name", ["lgamma", "digamma"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_matches_jax_jit_on_a_grid(name: str, dtype) -> None:
    """NaN, +-inf and finite values in the same places; finite values within a relative error
    of max(|value|, 1) (both functions lose relative precision only near their zeros, where
    the value is small): 4e-6 in float32, 1e-13 in float64. The float32 bound: 1.4e-6 from
    jax 0.10's XLA, which computes as xfuse; 3.3e-6 from jax 0.12's more accurate lgamma (within
    1.5e-7 of the float64 value, where xfuse's reflection loses 3.3e-6 at -3.87)."""
    fn = getattr(lax, name)
    x = grid(dtype)
    with jax.enable_x64(dtype == np.float64):
        want = np.asarray(jax.jit(fn)(x))
        got = np.asarray(xfuse.jit(fn)(x))
    assert got.dtype == want.dtype == dtype
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(np.isposinf(got), np.isposinf(want))
    np.testing.assert_array_equal(np.isneginf(got), np.isneginf(want))
    finite = np.isfinite(want)
    error = np.abs(got[finite].astype(np.float64) - want[finite]) / np.maximum(np.abs(want[finite]), 1.0)
    assert error.max() <= (4e-6 if dtype == np.float32 else 1e-13)
