"""Native kernels in a shared library, called through ctypes (which releases the GIL for the
call, so the runtime's threads run them in parallel).

A C kernel is `int name(int64_t row_start, int64_t row_end, [int64_t dot_start,] T *arrays...)`
over C-ordered arrays of known shape; it returns 0, or 1 when it could not allocate its row
buffers. `kernels(library, program)` gives each kernel of a program as a runtime `Kernel`
taking numpy arrays. Imports numpy and the standard library only.

ctypes converting each argument costs more than a small kernel: 2.8 us a call for two arrays,
against 0.25 us for a call with one pointer. So each kernel has a twin, `name__objects(const
int64_t *a)`, taking [data offset, the integers, the arrays' object addresses] in one per-thread
buffer; it reads each array's data pointer from the ndarray object at the offset measured here
at import (`DATA_OFFSET`). Plain C-contiguous ndarrays take the twin; anything else, and
libraries without twins, take the pointer entry.

A while step marked with `native_state` has a C loop driver in the library (`aot/loop.py`):
`kernels` gives it too, as a runtime `Kernel` running the whole loop (`loop_driver`).
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Callable

import numpy as np

from .pool import c_ordered
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


OBJECT_ENTRY = "__objects"  # backends/c/render.py names each kernel's twin so


def _data_offset() -> int | None:
    """Where an ndarray object keeps its data pointer: numpy's PyArrayObject puts it right
    after the object header, whose size depends on the Python build. Found by comparing
    against `ndarray.ctypes.data` over several arrays (None where no offset fits them all)."""
    probes = [np.empty(3), np.arange(12, dtype=np.int32)[5:], np.zeros((4, 2), np.float32).T, np.empty(0)]
    for offset in range(8, 72, 8):
        if all(ctypes.c_void_p.from_address(id(p) + offset).value == p.ctypes.data for p in probes):
            return offset
    return None


DATA_OFFSET = _data_offset()


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
        call = adapt(cfn, name, ints, arrays - outputs)
        twin = getattr(library, name + OBJECT_ENTRY, None)  # absent from older libraries
        if twin is not None and DATA_OFFSET is not None:
            call = adapt_objects(twin, call, ints, arrays - outputs, arrays)
        found[name] = Kernel(call, pointers=True)
    for step in walk(program):
        if step["op"] == "while" and "native_state" in step and step["native"] not in found:
            cfn = getattr(library, step["native"], None)
            if cfn is not None:  # else the runtime runs the loop
                found[step["native"]] = Kernel(loop_driver(cfn, step))
    return found


def loop_driver(cfn, step: dict) -> Callable:
    """run(state) -> the final state, through a C loop driver (`aot/loop.py`): a "new" element
    gets a fresh buffer for its final value, an "owned" one (written in place by the body) a
    copy of its initial value, and a "pass" one is handed back as it came."""
    cfn.restype = ctypes.c_int
    cfn.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    kinds = step["native_state"]
    specs = [(tuple(dims), np.dtype(dtype)) for dims, dtype in step["body"]["param_specs"]]
    pointers = ctypes.c_void_p * max(1, len(kinds))

    def run(state: list) -> list:
        init, final = [], []
        for x, kind, (dims, dtype) in zip(state, kinds, specs):
            x, copied = c_ordered(x)
            a = np.ascontiguousarray(x, dtype).reshape(dims)
            if kind == "owned" and not copied:  # a copy made just now is the loop's to write
                a = a.copy()
            init.append(a)
            final.append(np.empty(dims, dtype) if kind == "new" else a)
        if cfn(pointers(*[a.ctypes.data for a in init]), pointers(*[a.ctypes.data for a in final])):
            raise MemoryError(f"loop {step['name']!r} could not allocate its buffers")
        return final

    run.__name__ = step["native"]
    return run


def adapt(cfn, name: str, ints: int, inputs: int) -> Callable:
    """fn(*ints, *arrays) over numpy arrays: inputs made C-contiguous and native-endian where
    they are not (outputs always are: the runtime allocates them). A writable array's address
    is read through ctypes' buffer view (a third of the time of `ndarray.ctypes.data`), which
    also refuses an array that is not C-contiguous: the common case costs one view an array."""
    view, address = ctypes.c_char.from_buffer, ctypes.addressof

    def pointer(a) -> int:
        try:
            return address(view(a))
        except (TypeError, ValueError, BufferError):  # read-only or empty
            return a.ctypes.data

    def slow(args) -> tuple[list, list[int]]:
        """(the arrays, kept alive through the call, and their addresses)."""
        arrays = list(args[ints:])
        for k in range(inputs):
            a = arrays[k]
            if not isinstance(a, np.ndarray):  # a numpy scalar for a 0-d input
                arrays[k] = np.asarray(a)
            elif not (a.flags.c_contiguous and a.dtype.isnative):
                arrays[k] = np.ascontiguousarray(a, a.dtype.newbyteorder("="))
        return arrays, [pointer(a) for a in arrays]

    def call(*args):
        _kept = None  # arrays made here live until the call returns
        try:  # writable and C-contiguous, or it raises
            pointers = [address(view(a)) for a in args[ints:]]
        except (TypeError, ValueError, BufferError):
            _kept, pointers = slow(args)
        else:
            for k in range(ints, ints + inputs):
                if not args[k].dtype.isnative:
                    _kept, pointers = slow(args)
                    break
        if cfn(*args[:ints], *pointers):
            raise MemoryError(f"kernel {name} could not allocate its row buffers")

    call.__name__ = name
    return call


def adapt_objects(twin, general: Callable, ints: int, inputs: int, arrays: int) -> Callable:
    """fn(*ints, *arrays) through the kernel's twin taking array objects: when every array is a
    plain C-contiguous ndarray (and every input native-endian), the twin reads their data
    pointers itself from one buffer holding [DATA_OFFSET, the integers, the objects' addresses]
    (one buffer a thread: kernels of one program run on several threads at once); anything
    else goes through `general`, the pointer-taking call. The function is written out for its
    arity, so that a call is a few attribute tests and stores."""
    twin.restype = ctypes.c_int
    twin.argtypes = [ctypes.c_void_p]
    params = [f"i{k}" for k in range(ints)] + [f"a{k}" for k in range(arrays)]
    tests = [f"type(a{k}) is not ndarray or not a{k}.flags.c_contiguous" for k in range(arrays)]
    tests += [f"not a{k}.dtype.isnative" for k in range(inputs)]
    stores = [f"buffer[{k + 1}] = i{k}" for k in range(ints)]
    stores += [f"buffer[{ints + k + 1}] = id(a{k})" for k in range(arrays)]
    text = "\n".join([
        f"def call({', '.join(params)}):",
        f"    if {' or '.join(tests) or 'False'}:",
        f"        return general({', '.join(params)})",
        "    try:",
        "        buffer, address = local.buffer",
        "    except AttributeError:",
        "        buffer, address = local_buffer()",
        *[f"    {line}" for line in stores],
        "    if twin(address):",
        "        raise MemoryError(f'kernel {general.__name__} could not allocate its row buffers')",
    ])
    local = threading.local()

    def local_buffer():
        buffer = (ctypes.c_int64 * (1 + ints + arrays))(DATA_OFFSET)
        local.buffer = buffer, ctypes.addressof(buffer)
        return local.buffer

    scope = {"ndarray": np.ndarray, "general": general, "twin": twin, "local": local,
             "local_buffer": local_buffer, "id": id, "type": type, "MemoryError": MemoryError}
    exec(compile(text, f"<xfuse kernel entry {general.__name__}>", "exec"), scope)
    call = scope["call"]
    call.__name__ = general.__name__
    return call


__all__ = ["adapt", "adapt_objects", "kernel_arity", "kernels", "loop_driver", "open_library", "open_library_bytes"]
