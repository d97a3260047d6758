"""The C backend: a fused module lowered to a program (as the numba backend does), its kernels
rendered as one C file, built by the system C compiler into a shared library and called
through ctypes. Built libraries are cached on disk under the kernel cache's folder
(`XFUSE_CACHE_DIR`, `off` to disable), keyed by the C text, the flags and the compiler: the
library is named by its own hash, and a small index file `<key>.entry`, written last, names it.
Every write goes to a file of its own renamed into place, so threads and processes building
one library at once all succeed; an entry whose library is missing, truncated or altered
gives a `CacheWarning` and is built again (nothing unchecked is ever loaded).
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
import warnings
from contextlib import suppress
from pathlib import Path

from xfuse.backends import CacheWarning, cache_root
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
    root = cache_root()
    return None if root is None else root / "c"


def build_library(source: str, target: str = "native", *, openmp: bool = False) -> Path:
    """The shared library of `source`: from the cache, or built now (and cached)."""
    key = hashlib.sha256("\0".join([source, target, str(openmp), *toolchain.compiler(),
                                    *toolchain.build_flags(target, openmp), toolchain.machine()]).encode())
    digest = key.hexdigest()[:32]
    folder = cache_dir()
    if folder is not None:
        found = _cached(folder, digest)
        if found is not None:
            return found
        try:
            return _build_into(folder, digest, source, target, openmp)
        except OSError:
            pass  # an unwritable cache: build in a private folder instead
    path = Path(tempfile.mkdtemp(prefix="xfuse-c-")) / f"{digest}.so"
    toolchain.compile_shared(source, path, target, openmp=openmp)
    return path


def _cached(folder: Path, digest: str) -> Path | None:
    """The library the entry `digest` names, when its bytes still have the hash in its name."""
    index = folder / f"{digest}.entry"
    try:
        name = index.read_text()
    except (FileNotFoundError, NotADirectoryError):  # no entry (or no cache folder) yet
        return None
    except (OSError, UnicodeDecodeError) as e:
        problem = f"unreadable ({e})"
    else:
        match = re.fullmatch(rf"{digest}-([0-9a-f]{{32}})\.so", name)
        if match is None:
            problem = "names no library of its own"
        else:
            try:
                data = (folder / name).read_bytes()
            except OSError as e:
                problem = f"its library is unreadable ({e.strerror or e})"
            else:
                if hashlib.sha256(data).hexdigest()[:32] == match[1]:
                    return folder / name
                problem = "its library is truncated or altered"
                with suppress(OSError):
                    (folder / name).unlink()
    warnings.warn(f"xfuse C library cache: {index}: {problem}; building it again", CacheWarning,
                  stacklevel=4)
    return None


def _build_into(folder: Path, digest: str, source: str, target: str, openmp: bool) -> Path:
    """Builds into a file of this call's own, renamed into place (atomic: another thread or
    process sees all of it or nothing); then the entry names it."""
    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{digest}.", suffix=".tmp")
    os.close(fd)
    try:
        toolchain.compile_shared(source, Path(tmp), target, openmp=openmp)
        name = f"{digest}-{hashlib.sha256(Path(tmp).read_bytes()).hexdigest()[:32]}.so"
        os.replace(tmp, folder / name)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{digest}.", suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            f.write(name)
        os.replace(tmp, folder / f"{digest}.entry")
    finally:
        with suppress(OSError):
            os.unlink(tmp)
    return folder / name


def compile_module(module: Module) -> Executable:
    return compile_modules([module])[0]


def compile_modules(modules: list[Module]) -> list[Executable]:
    """Executables for several modules from one library (one compiler run)."""
    from xfuse.aot.loop import loop_drivers  # the drivers are written by the AOT entry's code

    lowered = [lower(m, f"m{i}_" if len(modules) > 1 else "") for i, m in enumerate(modules)]
    texts = [kernel_texts(low) for low in lowered]
    drivers = [loop_drivers(low, f"xf_m{i}_loop") for i, low in enumerate(lowered)]
    library = open_library(build_library(library_source([t for each in texts for t in each.values()] + drivers)))
    executables = []
    for low, sources in zip(lowered, texts):
        found = library_kernels(library, low.program)
        executable = build(low.program, found, low.constants, sources)
        executable.library = library  # kept alive with the executable
        executables.append(executable)
    return executables


__all__ = ["NAME", "build_library", "c_source", "compile_module", "compile_modules", "kernel_args", "kernel_texts"]
