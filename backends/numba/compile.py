"""Compiling generated kernel source with numba. The source is registered with `linecache`, so
tracebacks and numba's own errors show the generated lines. With the disk cache on (see
`cache`), the source runs from its cache file instead and numba keeps the machine code there.
"""

from __future__ import annotations

import atexit
import hashlib
import linecache
import re
import weakref
from types import ModuleType

import numba
import numpy as np

from . import cache, gemm, mathlib, rows, scalar
from .kernels import KernelSource
from .pipeline import WITHOUT_WRAPPERS, CalleeCompiler, KernelCompiler

HEADER = "import numpy as np\n\n"

# Kernels call the helpers as separate numba functions that LLVM inlines: as fast as numba's
# own inline="always" (the loops still vectorise) at a quarter of the compile time. Only
# kernels call them, so they are compiled without wrappers or machine code of their own.
helper = numba.njit(error_model="numpy", nogil=True, cache=False, **WITHOUT_WRAPPERS,
                    pipeline_class=CalleeCompiler)
INLINE_ALWAYS = numba.njit(error_model="numpy", nogil=True, cache=False, inline="always")


def _called_forms(module) -> ModuleType:
    """A module holding `module`'s public functions as separately compiled numba functions
    (numba resolves attributes of modules, not of other namespaces)."""
    forms = ModuleType(f"{module.__name__}_called")
    for name, value in vars(module).items():
        if isinstance(value, numba.core.registry.CPUDispatcher) and not name.startswith("_"):
            setattr(forms, name, helper(value.py_func))
        elif not name.startswith("_") and callable(value) and hasattr(value, "_defn"):
            setattr(forms, name, value)  # an @intrinsic
    return forms


CALLED_MATHLIB = _called_forms(mathlib)
CALLED_SCALAR = _called_forms(scalar)
CALLED_GEMM = _called_forms(gemm)  # the product's micro-kernels (intrinsics)
CALLED_ROWS = ModuleType("rows_called")
for _name in rows.SUMS + rows.EXTREMES:
    _flags = {"reassoc"} if _name in rows.SUMS else set()
    setattr(CALLED_ROWS, _name, numba.njit(error_model="numpy", nogil=True, cache=False, fastmath=_flags,
                                           **WITHOUT_WRAPPERS, pipeline_class=CalleeCompiler)(getattr(rows, _name)))


def namespace(source: KernelSource) -> dict:
    return {
        "np": np,
        "U": np.uint64,  # unsigned indices (see emitter.index_text)
        "scalar": CALLED_SCALAR,
        "mathlib": CALLED_MATHLIB,
        "rows": CALLED_ROWS,
        "gemm": CALLED_GEMM,
        "inline": helper,
        "inline_always": INLINE_ALWAYS,
        **source.globals,
    }


def full_text(source: KernelSource) -> str:
    if source.dot_in_out and not source.by_rows:
        return HEADER + _in_place_twin(source)
    return HEADER + source.source


def _in_place_twin(source: KernelSource) -> str:
    """An output fusion's elementwise epilogue, run in place when the runtime computed the
    product into the output: the loop is inlined twice, once reading the product from the
    output array itself. Over two arrays that overlap, LLVM's vectorised loop falls back to
    its scalar one (it checks at run time that they do not); over one array, reading and
    writing each element at the same index, it needs no check (gelu over 256x4096: 10.8 ms
    scalar, 1.6 ms vectorised)."""
    name = source.name
    head = f"def {name}("
    params = source.source[source.source.index(head) + len(head):].split(")", 1)[0]
    args = [a.strip() for a in params.split(",")]
    if args[2:4] != ["dot_start", "dot"] or args[-1] != "out0":
        return source.source
    same = ", ".join([*args[:2], "0", "out0", *args[4:]])
    return "\n".join([
        source.source.replace(head, f"@inline_always\ndef _{name}_loop(", 1),
        f"def {name}({params}):",
        "    if dot_start == 0 and dot.ctypes.data == out0.ctypes.data:  # the product in the output",
        f"        _{name}_loop({same})",
        "    else:",
        f"        _{name}_loop({', '.join(args)})",
        "",
    ])


# The kernels made in this process, by what they compute: the key of their text with their own
# name taken out, and of the arrays they read. A computation a program repeats lowers to
# kernels that differ in their names only: jax.random.gamma's rejection loop, once for each
# gamma (three in a beta and a gamma), made 40 kernels of 15 texts and 3 loop drivers of one;
# the first call took 71 s, 46 s with each text compiled once (2 cores). Weak: a kernel goes
# when its last program does.
_MADE: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


def unnamed_key(source: KernelSource, text: str) -> str:
    """What `source` (whose `full_text` is `text`) computes, as a key: its text with its name
    replaced (the name as a whole word, or inside the in-place twin's name) and the arrays it
    reads."""
    name = re.compile(rf"(?<![A-Za-z0-9]){re.escape(source.name)}(?![A-Za-z0-9])")
    return cache.kernel_key(name.sub(lambda _: "\0", text), source.globals)  # NUL: in no identifier


def compile_kernel(source: KernelSource):
    """The numba dispatcher for one kernel (compiled, or loaded from the disk cache, on the
    first call: call `settle(dispatcher)` after it); the one made before in this process for a
    kernel that computes the same (`unnamed_key`), whatever its name. Its `_xfuse_key` is the
    key of the text it was made from, name included, as its cache entry is: a native loop's
    driver, keyed by its kernels', refers to their cached modules by that key."""
    text = full_text(source)
    made = (unnamed_key(source, text), str(cache.cache_dir()))  # kept where the cache of its time says
    fn = _MADE.get(made)
    if fn is None:
        fn = _compile_kernel(source, text)
        fn._xfuse_key = cache.kernel_key(text, source.globals)
        _MADE[made] = fn
    return fn


def _compile_kernel(source: KernelSource, text: str):
    _record_new_overloads()
    entry = cache.open_entry(source.name, text, source.globals)
    if entry is not None:
        try:
            ns = cache.load_module(entry, namespace(source))
        except (OSError, SyntaxError) as e:
            cache.warnings.warn(f"xfuse kernel cache: cannot load {entry.source_file} ({e}); "
                                "compiling without caching", cache.CacheWarning, stacklevel=2)
            entry = None
        else:
            fn = numba.njit(error_model="numpy", nogil=True, cache=True,
                            pipeline_class=KernelCompiler)(ns[source.name])
            fn._xfuse_entry = entry
            _save_or_warn(fn, entry)
            return fn
    digest = hashlib.sha256(text.encode()).hexdigest()[:12]
    filename = f"<xfuse-kernel {source.name} {digest}>"
    linecache.cache[filename] = (len(text), None, text.splitlines(True), filename)
    ns = namespace(source)
    exec(compile(text, filename, "exec"), ns)
    return numba.njit(error_model="numpy", nogil=True, cache=False,
                      pipeline_class=KernelCompiler)(ns[source.name])


def _save_or_warn(fn, entry) -> None:
    """numba saves a kernel to its cache inside the compile, so a failed save (the directory
    cleared by another process meanwhile: a process that finds an entry with no manifest clears
    its numba files) would fail the call; it warns instead, and the kernel runs uncached."""
    save = fn._cache.save_overload

    def save_overload(sig, data):
        try:
            save(sig, data)
        except OSError as e:
            fn._xfuse_entry = None  # no manifest vouches for what numba may have left
            cache.warnings.warn(f"xfuse kernel cache: cannot save {entry.name} in {entry.path} "
                                f"({e}); it runs uncached", cache.CacheWarning, stacklevel=2)

    fn._cache.save_overload = save_overload


def exact_entry(fn):
    """`Kernel.exact` for the dispatcher `fn`: exact(args) is the machine code's entry that
    numba compiled for the types of `args`, called without the dispatcher's work of typing
    every argument (0.14 us against 0.25 us for a kernel of two ints and two arrays), or None
    where an array is not C-ordered, aligned and writable, or no such overload is compiled.
    The entry reads arrays as the types it was compiled for, whatever is passed: the caller
    checks the types first."""

    def exact(args):
        try:
            types = tuple(numba.typeof(a) for a in args)
        except ValueError:
            return None
        for t in types:
            if isinstance(t, numba.types.Array) and (t.layout != "C" or not t.aligned or not t.mutable):
                return None
        overload = fn.overloads.get(types)
        return None if overload is None else overload.entry_point

    return exact


def settle(fn) -> None:
    """After a kernel's first call: count a cache hit, or record what numba stored."""
    entry = getattr(fn, "_xfuse_entry", None)
    if entry is None:
        return
    fn._xfuse_entry = None
    _SETTLED.append([fn, entry, len(fn.overloads)])
    if sum(fn.stats.cache_hits.values()):
        cache.stats.count("hits")
        return
    cache.stats.count("misses")
    _commit(entry)


def _commit(entry) -> None:
    try:
        entry.commit()
    except OSError as e:
        cache.warnings.warn(f"xfuse kernel cache: cannot record {entry.path} ({e})",
                            cache.CacheWarning, stacklevel=3)


# Kernels settled in this process, with their overload count when last recorded. A kernel later
# called with arrays of another layout (Fortran order, strided) makes numba compile and store
# another overload in the entry, which the manifest does not list yet: such entries are recorded
# again before the next kernel is opened and at exit, or the next user of the entry (in this
# process or another) would reject it and compile again.
_SETTLED: list[list] = []


@atexit.register
def _record_new_overloads() -> None:
    for item in _SETTLED:
        fn, entry, count = item
        if len(fn.overloads) > count:
            item[2] = len(fn.overloads)
            _commit(entry)


def initialize() -> None:
    """numba's one-time set-up, done now rather than inside the first compile: its target
    registries import numba.np (and through it scipy), about 0.6 s here, once per process."""
    from numba.core.registry import cpu_target

    cpu_target.target_context.refresh()
    cpu_target.typing_context.refresh()
