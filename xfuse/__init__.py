"""xfuse: an XLA-style fusion compiler for JAX functions.

`xfuse.jit(f)` traces a JAX function into HLO (`xfuse.hlo`), compiles it once per signature and
runs it; `f.lower(*args)` and `.compile()` give the stages, as in `jax.stages`. The IR:
`xfuse.hlo.parse(text)`, `str(module)`, `xfuse.hlo.verify(module)`,
`xfuse.hlo.interpret(module, *arrays)`. This package is the public API and may import every
other part of xfuse.
"""

from importlib.metadata import PackageNotFoundError, version

from . import hlo
from .api import Jitted, jit
from .stages import Compiled, Lowered

try:
    __version__ = version("xfuse")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0.0.0"

__all__ = ["Compiled", "Jitted", "Lowered", "hlo", "jit", "__version__"]
