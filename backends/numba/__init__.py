"""xfuse.backends.numba: fused kernels as numba-compiled native CPU code (the default on CPU).

`compile_module(module)` turns a fused module into a runtime `Executable`; `initialize()` does
numba's one-time set-up ahead of the first compile; `cache` is the on-disk kernel cache. May
import xfuse.hlo, xfuse.runtime, numba and numpy. numba is imported on first use of those
names: the kernel writer (`kernels`, `lowering`) serves the C backend too, without numba.
"""

import os
import sys
from importlib import import_module

# numba raises and catches many of its own errors while it types and lowers a function, and
# formats the message of each; where colorama is installed it highlights every message, each
# through colorama's terminal set-up and tear-down, a third of some compiles. Unless the user
# set it, numba's messages stay plain: numba reads the setting when it is imported, and where it
# was imported before xfuse, its color scheme is replaced by a plain one.
if "NUMBA_DISABLE_ERROR_MESSAGE_HIGHLIGHTING" not in os.environ:
    os.environ["NUMBA_DISABLE_ERROR_MESSAGE_HIGHLIGHTING"] = "1"
    _errors = sys.modules.get("numba.core.errors")
    if _errors is not None and hasattr(_errors, "_DummyColorScheme"):

        class _Plain(_errors._DummyColorScheme):
            def code(self, msg):
                return msg

            errmsg = filename = indicate = highlight = reset = code

        _errors._termcolor_inst = _Plain()

NAME = "numba"
_LAZY = {"compile_module": ".backend", "initialize": ".compile"}


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(import_module(_LAZY[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["NAME", "compile_module", "initialize"]
