"""Compiling generated kernel source with numba. The source is registered with `linecache`, so
tracebacks and numba's own errors show the generated lines.
"""

from __future__ import annotations

import hashlib
import linecache

import numba
import numpy as np

from . import mathlib, scalar
from .kernels import KernelSource

HEADER = "import numpy as np\nfrom numba import prange\n\n"


def namespace(source: KernelSource) -> dict:
    return {
        "np": np,
        "prange": numba.prange,
        "scalar": scalar,
        "mathlib": mathlib,
        "inline": scalar.inline,
        **source.globals,
    }


def full_text(source: KernelSource) -> str:
    return HEADER + source.source


def compile_kernel(source: KernelSource):
    """The numba dispatcher for one kernel (compiled lazily on first call by numba)."""
    text = full_text(source)
    digest = hashlib.sha256(text.encode()).hexdigest()[:12]
    filename = f"<xfuse-kernel {source.name} {digest}>"
    linecache.cache[filename] = (len(text), None, text.splitlines(True), filename)
    ns = namespace(source)
    exec(compile(text, filename, "exec"), ns)
    return numba.njit(
        parallel=source.parallel, error_model="numpy", nogil=True, cache=False
    )(ns[source.name])
