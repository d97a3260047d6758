"""xfuse: an XLA-style fusion compiler for JAX functions.

The IR lives in `xfuse.hlo`: `xfuse.hlo.parse(text)`, `str(module)`, `xfuse.hlo.verify(module)`
and `xfuse.hlo.interpret(module, *arrays)`. This package is the public API and may import
every other part of xfuse.
"""

from importlib.metadata import PackageNotFoundError, version

from . import hlo

try:
    __version__ = version("xfuse")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0.0.0"

__all__ = ["hlo", "__version__"]
