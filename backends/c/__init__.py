"""xfuse.backends.c: fused kernels as C, built by the system C compiler into a shared library.

The kernels are the numba backend's kernel programs (`backends/numba/kernels.py` writes them in
a small typed subset of Python), rendered as C by `render`; `xfuse_kernels.h` holds the math,
scalar and row helpers they call, ported from the numba backend's. This is the code behind AOT
artifacts (`xfuse.aot`): a library that needs neither Python nor numba to run. As a JIT backend
(`backend="c"`) it compiles at call time and loads the library with ctypes.
May import xfuse.hlo, xfuse.runtime and the numba backend's kernel writer (not numba itself).
"""
