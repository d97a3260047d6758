"""xfuse.backends: the backend registry and the built-in backends (numba, jax, reference).

May import xfuse.hlo, xfuse.runtime and each backend's own library.
"""
