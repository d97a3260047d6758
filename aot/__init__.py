"""xfuse.aot: ahead-of-time artifacts, as tfcompile makes them for XLA.

    compiled.save("mlp.xfa")                        # or:
    xfuse.aot.compile(fn, x, w, b, path="mlp.xfa")  # arrays or jax.ShapeDtypeStruct specs
    f = xfuse.aot.load("mlp.xfa")                   # numpy only: no jax, no numba, no compiler
    f(x, w, b)

An artifact holds native code for every kernel (C built by the system compiler at save time),
and a C driver for each while loop of kernels and small products (`aot/loop.py`: the loop
never returns to Python), the program and its buffer plan, the constants and a manifest
(`runtime/artifact.py` has the layout). `emit_c` writes a C library and header with one entry function instead, for C
programs. `xfuse aot compile|run|inspect` is the command line (`aot/cli.py`).
`load` imports numpy alone for native artifacts (`runtime/artifact.py` runs them); a jax
backend artifact holds a `jax.export` module instead and needs jax. The rest imports jax.
"""

from importlib import import_module

_LAZY = {
    "load": "xfuse.aot.loading",
    "ArtifactError": "xfuse.runtime.artifact",
    "Loaded": "xfuse.runtime.artifact",
    "compile": "xfuse.aot.writer",
    "save": "xfuse.aot.writer",
    "inspect": "xfuse.aot.writer",
    "emit_c": "xfuse.aot.emit",
}


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'xfuse.aot' has no attribute {name!r}")


__all__ = ["ArtifactError", "Loaded", "compile", "emit_c", "inspect", "load", "save"]
