"""Native kernels in a shared library, called through ctypes (which releases the GIL for the
call, so the runtime's threads run them in parallel).

A C kernel is `int name(int64_t row_start, int64_t row_end, [int64_t dot_start,] T *arrays...)`
over C-ordered arrays of known shape; it returns 0, or 1 when it could not allocate its row
buffers. `kernels(library, program)` gives each kernel of a program as a runtime `Kernel`
taking numpy arrays. Imports numpy and the standard library only.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable

import numpy as np

from .program import Kernel, walk


def open_library(path: str) -> ctypes.CDLL:
    return ctypes.CDLL(os.fspath(path))


_OPEN_FILES: list[int] = []  # memory files of loaded libraries, open for the process's life


def open_library_bytes(data: bytes, name: str = "xfuse-kernels") -> ctypes.CDLL:
    """A shared library from its bytes, through an anonymous memory file where the system has
    them (Linux), else a private temporary file. The loader reuses a library already loaded
    under the same path (or the same inode), so neither is ever reused while loaded: the
    memory file stays open, the temporary folder stays."""
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create(name, 0)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        library = ctypes.CDLL(f"/proc/self/fd/{fd}")
        _OPEN_FILES.append(fd)
        return library
    import tempfile

    path = os.path.join(tempfile.mkdtemp(prefix="xfuse-aot-"), f"{name}.so")
    with open(path, "wb") as f:
        f.write(data)
    return ctypes.CDLL(path)


def kernel_arity(step: dict) -> tuple[int, int, int]:
    """(leading integers, arrays, of which outputs) of a kernel step's C function."""
    dot = step.get("dot") is not None
    outputs = len(step["specs"])
    return (3 if dot else 2), int(dot) + len(step["params"]) + outputs, outputs


def kernels(library: ctypes.CDLL, program: dict) -> dict[str, Kernel]:
    """Every kernel a program (and its nested programs) calls, from `library`."""
    found: dict[str, Kernel] = {}
    for step in walk(program):
        if step["op"] != "kernel" or step["kernel"] in found:
            continue
        name = step["kernel"]
        try:
            cfn = getattr(library, name)
        except AttributeError:
            raise KeyError(f"the kernel library has no function {name!r} (step {step['name']!r})") from None
        ints, arrays, outputs = kernel_arity(step)
        cfn.restype = ctypes.c_int
        cfn.argtypes = [ctypes.c_int64] * ints + [ctypes.c_void_p] * arrays
        found[name] = Kernel(adapt(cfn, name, ints, arrays - outputs))
    return found


def adapt(cfn, name: str, ints: int, inputs: int) -> Callable:
    """fn(*ints, *arrays) over numpy arrays: inputs made C-contiguous and native-endian where
    they are not (outputs always are: the runtime allocates them). A writable array's address
    is read through ctypes' buffer view (a third of the time of `ndarray.ctypes.data`)."""
    view, address = ctypes.c_char.from_buffer, ctypes.addressof

    def pointer(a) -> int:
        try:
            return address(view(a))
        except (TypeError, ValueError, BufferError):  # read-only or empty
            return a.ctypes.data

    def call(*args):
        arrays = args[ints:]
        for k in range(inputs):
            a = arrays[k]
            if not (a.flags.c_contiguous and a.dtype.isnative):
                arrays = list(arrays)
                arrays[k] = np.ascontiguousarray(a, a.dtype.newbyteorder("="))
        if cfn(*args[:ints], *[pointer(a) for a in arrays]):
            raise MemoryError(f"kernel {name} could not allocate its row buffers")

    call.__name__ = name
    return call


__all__ = ["adapt", "kernel_arity", "kernels", "open_library", "open_library_bytes"]
