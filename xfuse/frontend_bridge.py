"""Tracing one call signature: rebuilds the call from flat leaves, runs the frontend, and
records the output pytree structure.
"""

from __future__ import annotations

from collections.abc import Callable

import jax

from xfuse.frontend import module_name, trace
from xfuse.hlo import Module


def _param_name(path: str, taken: set[str]) -> str:
    """An HLO-friendly parameter name from an argument path (`params['w']` -> `params.w`)."""
    name = path.replace("['", ".").replace("']", "").replace("[", ".").replace("]", "")
    name = "".join(c if c.isalnum() or c in "_.-" else "_" for c in name).strip(".")
    if not name or not (name[0].isalpha() or name[0] == "_"):
        name = "arg_" + name
    unique, n = name, 1
    while unique in taken:
        unique, n = f"{name}_{n}", n + 1
    taken.add(unique)
    return unique


def trace_call(fun: Callable, info) -> tuple[Module, object]:
    """The module for `fun` at `info`'s signature, and the structure of its outputs."""
    out_tree: list[object] = []

    def flat_fun(*flat):
        dynamic_args, dynamic_kwargs = jax.tree_util.tree_unflatten(info.in_tree, flat)
        args, kwargs = info.splitter.merge(dynamic_args, dynamic_kwargs, info.static)
        result = fun(*args, **kwargs)
        leaves, treedef = jax.tree_util.tree_flatten(result)
        for index, leaf in enumerate(leaves):
            if jax.dtypes.issubdtype(getattr(leaf, "dtype", None), jax.dtypes.prng_key):
                raise TypeError(f"output {index} of {module_name(fun)} is a typed PRNG key array ({leaf.dtype}); "
                                "return its key data (jax.random.key_data(key)), as xfuse returns arrays")
        out_tree.append(treedef)
        return leaves

    taken: set[str] = set()
    names = [_param_name(spec.path, taken) for spec in info.leaves]
    module = trace(flat_fun, [spec.struct for spec in info.leaves], names, module_name(fun))
    return module, out_tree[-1]
