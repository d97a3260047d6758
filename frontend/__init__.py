"""xfuse.frontend: JAX functions to `xfuse.hlo` modules, through `jax.make_jaxpr`, one rule per
primitive (`rules.RULES`). May import xfuse.hlo and jax.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

import jax

from xfuse.hlo import Module

from . import control  # noqa: F401  (registers cond, while and scan in RULES)
from .rules import RULES, supported_primitives
from . import indexing  # noqa: F401,E402  (registers the data-op rules into RULES)
from . import random  # noqa: F401,E402  (registers the jax.random rules into RULES)
from . import special  # noqa: F401,E402  (registers erf_inv, lgamma, digamma, nextafter)
from . import elementary  # noqa: F401,E402  (registers asin, sinh, ..., population_count, clz)
from . import windows  # noqa: F401,E402  (registers reduce_window and conv_general_dilated)
from . import host  # noqa: F401,E402  (registers pure_callback)
from .translate import FrontendError, UnsupportedPrimitiveError, jaxpr_to_module


def module_name(fun: Callable) -> str:
    """A module name from a function's name (`<lambda>` -> `lambda`)."""
    name = getattr(fun, "__name__", None) or type(fun).__name__
    name = re.sub(r"[^A-Za-z0-9_.\-]", "_", name).strip("_") or "module"
    return name if re.match(r"[A-Za-z_]", name) else "m_" + name


def trace(
    flat_fun: Callable,
    specs: Sequence[jax.ShapeDtypeStruct],
    param_names: Sequence[str],
    name: str,
) -> Module:
    """Traces `flat_fun` (flat arrays in, a flat list of arrays out) on `specs` into a Module."""
    closed = jax.make_jaxpr(flat_fun)(*specs)
    return jaxpr_to_module(closed, name, param_names, RULES)


__all__ = [
    "FrontendError",
    "RULES",
    "UnsupportedPrimitiveError",
    "jaxpr_to_module",
    "module_name",
    "supported_primitives",
    "trace",
]
