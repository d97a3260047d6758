"""The C backend: a fused module lowered to a program (as the numba backend does), its kernels
rendered as one C file, built by the system C compiler into a shared library and called
through ctypes. Built libraries are cached on disk under the kernel cache's folder
(`XFUSE_CACHE_DIR`, `off` to disable), keyed by the C text, the flags and the compiler.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

from xfuse.hlo import Module
from xfuse.runtime import Executable
from xfuse.runtime.native import kernels as library_kernels
from xfuse.runtime.native import open_library
from xfuse.runtime.program import build

from ..numba.lowering import Lowered, lower
from . import toolchain
from .render import library_source, render_kernel

NAME = "c"


def kernel_args(lowered: Lowered, name: str) -> list:
    """(dims, dtype) of a kernel's array arguments: the dot block, the params, the outputs."""
    source, body = lowered.kernels[name], lowered.bodies[name]
    args = []
    if source.dot is not None:
        args.append((source.dot.shape.dims, source.dot.shape.dtype.numpy))
    args += [(body[p].array_shape.dims, body[p].array_shape.dtype.numpy) for p in source.params]
    args += [(s.dims, s.dtype.numpy) for s in source.outputs]
    return args


def kernel_texts(lowered: Lowered) -> dict[str, str]:
    """The C text of each kernel of a lowered module, by name."""
    return {name: render_kernel(source, kernel_args(lowered, name)) for name, source in lowered.kernels.items()}


def c_source(*lowered: Lowered) -> str:
    """One C file with the kernels of every lowered module given."""
    return library_source([text for low in lowered for text in kernel_texts(low).values()])


def cache_dir() -> Path | None:
    setting = os.environ.get("XFUSE_CACHE_DIR", "")
    if setting.lower() == "off":
        return None
    base = Path(setting) if setting else Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "xfuse"
    return base / "c"


def build_library(source: str, target: str = "native", *, openmp: bool = False) -> Path:
    """The shared library of `source`: from the cache, or built now (and cached)."""
    key = hashlib.sha256("\0".join([source, target, str(openmp), *toolchain.compiler(),
                                    *toolchain.build_flags(target, openmp), toolchain.machine()]).encode())
    digest = key.hexdigest()[:32]
    folder = cache_dir()
    if folder is not None:
        path = folder / f"{digest}.so"
        if path.is_file():
            return path
        try:
            folder.mkdir(parents=True, exist_ok=True)
            tmp = folder / f".{digest}.{os.getpid()}.tmp"
            toolchain.compile_shared(source, tmp, target, openmp=openmp)
            os.replace(tmp, path)  # atomic: another process sees all of it or nothing
            return path
        except OSError:
            pass  # an unwritable cache: build in a private folder instead
    path = Path(tempfile.mkdtemp(prefix="xfuse-c-")) / f"{digest}.so"
    toolchain.compile_shared(source, path, target, openmp=openmp)
    return path


def compile_module(module: Module) -> Executable:
    return compile_modules([module])[0]


def compile_modules(modules: list[Module]) -> list[Executable]:
    """Executables for several modules from one library (one compiler run)."""
    lowered = [lower(m, f"m{i}_" if len(modules) > 1 else "") for i, m in enumerate(modules)]
    texts = [kernel_texts(low) for low in lowered]
    library = open_library(build_library(library_source([t for each in texts for t in each.values()])))
    executables = []
    for low, sources in zip(lowered, texts):
        found = library_kernels(library, low.program)
        executable = build(low.program, found, low.constants, sources)
        executable.library = library  # kept alive with the executable
        executables.append(executable)
    return executables


__all__ = ["NAME", "build_library", "c_source", "compile_module", "compile_modules", "kernel_args", "kernel_texts"]
