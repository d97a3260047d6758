"""xfuse.backends.jax: fused modules as `jax.lax` code that XLA compiles, for any device jax runs on.

`compile_module(module, mode="fusions", device=None)` gives an executable (one `jax.jit`
function per fusion, or one for the whole module); `export.serialize(module)` and
`export.deserialize(blob)` are its ahead-of-time form through `jax.export`. May import
xfuse.hlo, jax and numpy; jax is imported on first use of those names.
"""

from importlib import import_module

NAME = "jax"
_LAZY = {"compile_module": ".backend", "JaxExecutable": ".backend", "export": ".export"}


def __getattr__(name: str):
    if name in _LAZY:
        module = import_module(_LAZY[name], __name__)
        value = module if _LAZY[name] == f".{name}" else getattr(module, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["NAME", "JaxExecutable", "compile_module", "export"]
