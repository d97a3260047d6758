"""xfuse.backends: the backend registry (registry.py, placement.py) and the built-in backends
(numba, c, jax, reference; builtin.py registers them).

May import xfuse.hlo, xfuse.runtime and each backend's own library.
"""


class CacheWarning(UserWarning):
    """A cache entry could not be used (corrupted, truncated, unwritable); it is built again."""


__all__ = ["CacheWarning"]
