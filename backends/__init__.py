"""xfuse.backends: the backend registry (registry.py, placement.py) and the built-in backends
(numba, c, jax, reference; builtin.py registers them).

May import xfuse.hlo, xfuse.runtime and each backend's own library.
"""

import os
from pathlib import Path


class CacheWarning(UserWarning):
    """A cache entry could not be used (corrupted, truncated, unwritable); it is built again."""


def cache_root() -> Path | None:
    """Where compiled kernels are cached (the numba backend's here, the C backend's in `c/`):
    `XFUSE_CACHE_DIR`, else `$XDG_CACHE_HOME/xfuse` or `~/.cache/xfuse`; None (no cache) when
    `XFUSE_CACHE_DIR` is empty, `off`, `0` or `none`."""
    env = os.environ.get("XFUSE_CACHE_DIR")
    if env is not None:
        return None if env.strip().lower() in ("", "off", "0", "none") else Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "xfuse"


__all__ = ["CacheWarning", "cache_root"]
