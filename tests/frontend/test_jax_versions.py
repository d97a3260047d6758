"""What the frontend reads from jaxprs that differ between jax versions, checked on the jax
installed here by giving the rules the form the other versions use:

- scan: up to jax 0.10 its equation counts its constants and carry (`num_consts`,
  `num_carry`) and holds a ClosedJaxpr; jax 0.11 describes its operands as trees instead and
  holds a plain Jaxpr, so the counts come from the shapes;
- one_minus_square: jax 0.11's primitive in tanh's derivative, 1 - x*x, which jax 0.10 wrote
  out as products.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.extend import core as jax_core
from jax.interpreters import mlir

import xfuse
from tests.frontend.test_corpus import CORPUS, _rng
from xfuse.frontend import RULES
from xfuse.frontend.control import _scan_counts
from xfuse.frontend.translate import shape_of_aval

SCANS = ["rnn_scan", "reverse_scan", "cond_inside_scan", "scan_of_no_steps", "fori_loops"]


def _scan_equations(jaxpr):
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "scan":
            yield eqn
        for value in eqn.params.values():
            for sub in value if isinstance(value, (tuple, list)) else (value,):
                inner = getattr(sub, "jaxpr", sub)
                if isinstance(inner, jax_core.Jaxpr):
                    yield from _scan_equations(inner)


def _as_jax_011(params: dict) -> dict:
    """A scan's params as jax 0.11 gives them: no counts, a plain Jaxpr (its consts, if any,
    are operands, so only a ClosedJaxpr without consts converts)."""
    params = {k: v for k, v in params.items() if k not in ("num_consts", "num_carry")}
    closed = params["jaxpr"]
    assert not closed.consts
    return params | {"jaxpr": closed.jaxpr}


def _more_scans():
    """Scans the corpus lacks: several constants, a pytree carry beside stacked outputs of
    several ranks, no xs, no ys, a scalar carry."""
    w, xs = np.eye(3, dtype=np.float32), np.arange(12, dtype=np.float32).reshape(4, 3)

    def many(xs, w, b):
        def step(carry, x):
            h, n = carry
            h = jnp.tanh(h @ w + x + b)
            return (h, n + 1), (h, jnp.outer(h, x), n)
        return lax.scan(step, (jnp.zeros(3), jnp.int32(0)), xs)

    def no_xs(w):
        return lax.scan(lambda c, _: (c @ w, c.sum()), jnp.ones(3), None, length=5)

    def no_ys(xs):
        return lax.scan(lambda c, x: (c + x.sum(), None), jnp.float32(0), xs)[0]

    return [(many, (xs, w, np.ones(3, np.float32))), (no_xs, (w,)), (no_ys, (xs,))]


def _corpus_scans():
    for name in SCANS:
        c = CORPUS[name]
        yield functools.partial(c.fun, **c.static), c.inputs(_rng(name, "random"), False)


@pytest.mark.parametrize("k", range(len(SCANS) + 3))
def test_scan_counts_from_shapes_are_jaxs_own(k):
    fun, args = ([*_corpus_scans()] + _more_scans())[k]
    eqns = list(_scan_equations(jax.make_jaxpr(fun)(*args).jaxpr))
    assert eqns
    for eqn in eqns:
        want = _jaxs_counts(eqn.params)
        params = {k: v for k, v in eqn.params.items() if k not in ("num_consts", "num_carry")}
        operands = [Operand(shape_of_aval(v.aval)) for v in eqn.invars]
        outs = [shape_of_aval(v.aval) for v in eqn.outvars]
        jaxpr = getattr(params["jaxpr"], "jaxpr", params["jaxpr"])
        assert _scan_counts(params, jaxpr, operands, outs) == want


def _jaxs_counts(params: dict) -> tuple[int, int]:
    """The scan's (consts, carry) counts as jax states them: its `num_consts` and `num_carry`,
    or (jax 0.11) the leaves of the first two parts of its `ft_in` (a jax FlatTree of consts,
    carry and xs, whose `len` counts leaves)."""
    if "num_consts" in params:
        return params["num_consts"], params["num_carry"]
    consts, carry, _ = params["ft_in"].unpack()
    return len(consts), len(carry)


class Operand(NamedTuple):  # what the count reads of an operand
    array_shape: object


@pytest.mark.parametrize("name", ["rnn_scan", "reverse_scan", "fori_loops"])
def test_scans_without_counts_run_as_jax_does(name, monkeypatch):
    rule = RULES["scan"]
    monkeypatch.setitem(RULES, "scan", lambda ctx, params, operands: rule(ctx, _as_jax_011(params), operands))
    c = CORPUS[name]
    args = c.inputs(_rng(name, "edge"), True)
    got = xfuse.jit(c.fun, static_argnames=tuple(c.static))(*args, **c.static)
    want = jax.jit(c.fun, static_argnames=tuple(c.static))(*args, **c.static)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=2e-5, atol=1e-6, equal_nan=True)


# ---------------------------------------------------------------------------- one_minus_square
one_minus_square_p = jax_core.Primitive("one_minus_square")  # jax 0.11's name, defined here
one_minus_square_p.def_impl(lambda x: (1 - x) * (1 + x))
one_minus_square_p.def_abstract_eval(lambda x: jax.core.ShapedArray(x.shape, x.dtype))
mlir.register_lowering(
    one_minus_square_p, mlir.lower_fun(lambda x: (1 - x) * (1 + x), multiple_results=False)
)


def tanh_grad_as_jax_011(x):
    t = jnp.tanh(x)
    return t, one_minus_square_p.bind(t) * 2.0, one_minus_square_p.bind(x.astype(jnp.float64))


@pytest.mark.parametrize("backend", ["numba", "c", "jax"])
def test_one_minus_square_is_one_minus_the_square(backend):
    x = np.array([0.0, -0.0, 0.5, -1.0, 1.0, 0.9999999, 3.0, np.inf, -np.inf, np.nan], np.float32)
    with jax.enable_x64(True):
        t, grad, wide = map(np.asarray, xfuse.jit(tanh_grad_as_jax_011, backend=backend)(x))
    np.testing.assert_array_equal(grad, (1 - t) * (1 + t) * np.float32(2))
    x64 = x.astype(np.float64)
    np.testing.assert_array_equal(wide, (1 - x64) * (1 + x64))
    assert grad.dtype == np.float32 and wide.dtype == np.float64
