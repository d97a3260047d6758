"""xfuse.runtime: executables, buffer plans, asynchronous execution, AOT artifact loading.

Imports numpy and the standard library only: never jax or numba, so artifacts run anywhere.
"""

from .executable import BufferSpec, Executable, KernelError, Step

__all__ = ["BufferSpec", "Executable", "KernelError", "Step"]
