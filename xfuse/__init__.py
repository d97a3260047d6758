"""xfuse: an XLA-style fusion compiler for JAX functions.

`xfuse.jit(f)` traces a JAX function into HLO (`xfuse.hlo`), compiles it once per signature and
runs it; `f.lower(*args)` and `.compile()` give the stages, as in `jax.stages`. The IR:
`xfuse.hlo.parse(text)`, `str(module)`, `xfuse.hlo.verify(module)`,
`xfuse.hlo.interpret(module, *arrays)`. This package is the public API and may import every
other part of xfuse; it does so lazily, so `import xfuse.hlo` or `import xfuse.runtime` loads
neither jax nor numba.
"""

from importlib import import_module

_LAZY = {
    "jit": ".api",
    "Jitted": ".api",
    "Lowered": ".stages",
    "Compiled": ".stages",
    "default_backend": ".compiler",
}


def _version() -> str:
    """The installed version (looked up on first use: importlib.metadata is slow to import,
    and an AOT artifact's loader imports this package)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("xfuse")
    except PackageNotFoundError:  # running from a source tree that is not installed
        return "0.0.0"


def devices(backend: str | None = None) -> list:
    """Every device of every backend that loads (numba CPU, jax CPU, jax GPU when present,
    plugins), as `tf.config.list_physical_devices()`; or of one backend."""
    from .backends.registry import devices as registry_devices

    return registry_devices(backend)


def __getattr__(name: str):
    if name == "__version__":
        globals()["__version__"] = value = _version()
        return value
    if name in _LAZY:
        value = getattr(import_module(_LAZY[name], __name__), name)
        globals()[name] = value
        return value
    if name in ("hlo", "runtime", "fusion", "frontend", "backends", "aot"):
        return import_module(f".{name}", __name__)
    raise AttributeError(f"module 'xfuse' has no attribute {name!r}")


__all__ = [
    "Compiled",
    "Jitted",
    "Lowered",
    "default_backend",
    "devices",
    "hlo",
    "jit",
    "__version__",
]
