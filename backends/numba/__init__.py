"""xfuse.backends.numba: fused kernels as numba-compiled native CPU code (the default on CPU).

`compile_module(module)` turns a fused module into a runtime `Executable`; `initialize()` does
numba's one-time set-up ahead of the first compile; `cache` is the on-disk kernel cache. May
import xfuse.hlo, xfuse.runtime, numba and numpy.
"""

from .backend import NAME, compile_module
from .compile import initialize

__all__ = ["NAME", "compile_module", "initialize"]
