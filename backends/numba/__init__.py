"""xfuse.backends.numba: fused kernels as numba-compiled native CPU code (the default on CPU).

`compile_module(module)` turns a fused module into a runtime `Executable`. May import
xfuse.hlo, xfuse.runtime, numba and numpy.
"""

from .backend import NAME, compile_module

__all__ = ["NAME", "compile_module"]
