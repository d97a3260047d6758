"""The on-disk kernel cache: a second process loads compiled kernels instead of compiling them.

Each kernel gets a directory named by its key, a hash of the kernel's text, the values of the
constant arrays it reads (numba compiles them into its code), the xfuse, numba, llvmlite and
Python versions, the host CPU's name and features, and the source of the backend modules the
kernel calls into (so editing mathlib invalidates every kernel). In it:

    kernel.py        the generated source, written once (numba's cache keys on its stamp)
    __pycache__/     numba's own cache files for the kernel (`cache=True`)
    manifest.json    size and sha256 of every file above, written after the first compile

numba trusts its cache files and can crash on a truncated one, so nothing is handed to numba
before the manifest vouches for it: a missing, unreadable or mismatching manifest gives a
`CacheWarning` and the entry is wiped and compiled again. Every write goes to a temporary
file renamed into place, so two processes compiling the same kernel at once both succeed.

xfuse's own numba functions (the hand-off's, `split_gemm`'s) keep numba's cache files beside
their modules, or under NUMBA_CACHE_DIR; `guarded` turns a load of a damaged one into a
`CacheWarning` and a compile, where numba raised from inside every call that needed it.

`XFUSE_CACHE_DIR` moves the cache (default `$XDG_CACHE_HOME/xfuse` or `~/.cache/xfuse`);
`XFUSE_CACHE_DIR=off` turns it off. `stats` counts hits, misses and rejected entries.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import threading
import warnings
from collections.abc import Mapping
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path

import llvmlite
import llvmlite.binding as llvm
import numba
import numpy as np

from xfuse.backends import CacheWarning, cache_root  # shared with the C backend's cache
from . import pipeline

FORMAT = 1
_HERE = Path(__file__).resolve().parent
# The modules whose code a kernel inlines or whose text shapes the kernel (loop_kernels.py:
# the helpers a native loop's driver compiles in).
_KEYED_SOURCES = ("compile.py", "pipeline.py", "scalar.py", "rows.py", "mathlib/__init__.py",
                  "mathlib/core.py", "mathlib/f32.py", "mathlib/f64.py", "loop_kernels.py", "gemm.py")


@dataclass
class Stats:
    hits: int = 0  # kernels loaded from disk
    misses: int = 0  # kernels compiled and stored
    rejected: int = 0  # entries that failed their check and were recompiled
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def count(self, what: str) -> None:
        with self.lock:
            setattr(self, what, getattr(self, what) + 1)


stats = Stats()
_environment_key: str | None = None


def cache_dir() -> Path | None:
    """Where kernels are cached, or None when caching is off."""
    return cache_root()


def environment_key() -> str:
    """Everything besides the kernel's text that its machine code depends on."""
    global _environment_key
    if _environment_key is None:
        from xfuse import __version__

        h = hashlib.sha256()
        for part in (FORMAT, __version__, numba.__version__, llvmlite.__version__,
                     sys.version, llvm.get_host_cpu_name(), llvm.get_host_cpu_features().flatten(),
                     numba.config.BOUNDSCHECK, pipeline.VECTOR_WIDTH):
            h.update(str(part).encode() + b"\0")
        for name in _KEYED_SOURCES:
            h.update((_HERE / name).read_bytes())
        _environment_key = h.hexdigest()
    return _environment_key


def kernel_key(text: str, constants: Mapping[str, np.ndarray] | None = None) -> str:
    """The key of a kernel's entry. numba compiles the global arrays a kernel reads (constants
    inside a fusion) into its machine code, so their values are keyed too: two kernels of one
    text with other constants must not share an entry."""
    h = hashlib.sha256((environment_key() + "\0" + text).encode())
    for name, value in sorted((constants or {}).items()):
        array = np.ascontiguousarray(value)
        h.update(f"\0{name} {array.dtype.str} {array.shape}\0".encode())
        h.update(array.tobytes())
    return h.hexdigest()[:32]


def _digest(path: Path) -> dict:
    data = path.read_bytes()
    return {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def _write_atomic(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        with suppress(OSError):
            os.unlink(tmp)
        raise


def _temporary(name: str) -> bool:
    return name.startswith(".") or ".tmp" in name  # ours, or numba's `<file>.tmp.<uuid>`


@dataclass
class Entry:
    """One kernel's cache directory."""

    path: Path
    name: str
    text: str
    hit: bool = False  # the manifest vouched for compiled code: the first call loads it

    @property
    def source_file(self) -> Path:
        return self.path / "kernel.py"

    @property
    def manifest_file(self) -> Path:
        return self.path / "manifest.json"

    def files(self) -> list[Path]:
        pycache = self.path / "__pycache__"
        compiled = sorted(p for p in pycache.iterdir() if p.is_file() and not _temporary(p.name)) \
            if pycache.is_dir() else []
        return [self.source_file, *compiled]

    def check(self) -> bool:
        """True when the manifest vouches for every file; anything else wipes the entry."""
        if not self.path.exists():
            return False
        problem = self._problem()
        if problem is None:
            return True
        if problem == "no manifest":
            # Never compiled, or a process died (or is compiling now) between numba's save
            # and the manifest: nothing vouches for numba's files, so they are not used.
            with suppress(OSError):
                shutil.rmtree(self.path / "__pycache__")
            return False
        warnings.warn(f"xfuse kernel cache: {self.path}: {problem}; compiling {self.name} again",
                      CacheWarning, stacklevel=4)
        stats.count("rejected")
        for path in (self.path / "__pycache__", self.manifest_file, self.source_file):
            with suppress(OSError):
                shutil.rmtree(path) if path.is_dir() else path.unlink()
        return False

    def _problem(self) -> str | None:
        try:
            manifest = json.loads(self.manifest_file.read_text())
        except FileNotFoundError:
            return "no manifest"
        except (OSError, ValueError) as e:
            return f"unreadable manifest ({e})"
        if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
            return "manifest of another format"
        recorded = manifest.get("files")
        if not isinstance(recorded, dict) or "kernel.py" not in recorded or len(recorded) < 2:
            return "manifest lists no compiled code"
        try:
            present = {str(p.relative_to(self.path)): p for p in self.files()}
        except OSError as e:
            return f"unreadable ({e})"
        if set(present) != set(recorded):
            return "files differ from the manifest"
        for rel, path in present.items():
            try:
                if _digest(path) != recorded[rel]:
                    return f"{rel} is truncated or altered"
            except OSError as e:
                return f"{rel} is unreadable ({e})"
        try:
            if self.source_file.read_text() != self.text:
                return "kernel.py holds another kernel"
        except (OSError, UnicodeDecodeError) as e:
            return f"kernel.py is unreadable ({e})"
        return None

    def prepare(self) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        self.hit = self.check()
        if not self.source_file.exists():
            _write_atomic(self.source_file, self.text.encode())

    def commit(self) -> None:
        """Records the files numba wrote on the first compile (a miss) in the manifest."""
        files = {str(p.relative_to(self.path)): _digest(p) for p in self.files()}
        if len(files) < 2:
            return  # numba could not save (an unwritable directory): stay uncached
        body = {"format": FORMAT, "kernel": self.name, "files": files}
        _write_atomic(self.manifest_file, json.dumps(body, indent=1).encode())


def load_module(entry: Entry, namespace: dict) -> dict:
    """Executes kernel.py as a module over `namespace`; its functions then have a real file,
    which numba's cache needs."""
    name = f"xfuse_kernel_{entry.path.name}"
    spec = importlib.util.spec_from_file_location(name, entry.source_file)
    module = importlib.util.module_from_spec(spec)
    module.__dict__.update(namespace)
    spec.loader.exec_module(module)
    sys.modules[name] = module  # numba re-imports it by name to rebuild a cached kernel
    return module.__dict__


def open_entry(name: str, text: str, constants: Mapping[str, np.ndarray] | None = None) -> Entry | None:
    """The cache entry for a kernel, ready to compile from, or None when caching is off or the
    directory cannot be written (with a warning)."""
    root = cache_dir()
    if root is None:
        return None
    key = kernel_key(text, constants)
    entry = Entry(root / "kernels" / key[:2] / key, name, text)
    try:
        entry.prepare()
    except OSError as e:
        warnings.warn(f"xfuse kernel cache: cannot use {entry.path} ({e}); compiling {name} "
                      "without caching", CacheWarning, stacklevel=3)
        return None
    return entry


def guarded(fn):
    """`fn`, a numba function of xfuse's own modules compiled with `cache=True` (numba keeps its
    code beside the module, or under NUMBA_CACHE_DIR), its loads and saves guarded: numba trusts
    those files, and a truncated one raises from inside the compile of every call that needs
    the function (pickle's errors). So a load that fails gives a `CacheWarning`, numba's index
    of the function is emptied, and the function is compiled (and saved) again; a save that
    fails warns, and the function runs uncached. No manifest vouches for these files: one
    altered but whole is loaded as numba reads it."""
    functions = fn._cache
    load, save = functions.load_overload, functions.save_overload

    def load_overload(sig, target_context):
        try:
            return load(sig, target_context)
        except Exception as e:  # noqa: BLE001 - whatever unpickling a damaged file raises
            warnings.warn(f"xfuse: numba's cache of {fn.__name__} cannot be loaded ({type(e).__name__}: {e}); "
                          "compiling it again", CacheWarning, stacklevel=2)
            with suppress(Exception):
                functions.flush()
            return None

    def save_overload(sig, data):
        try:
            save(sig, data)
        except Exception as e:  # noqa: BLE001 - an unwritable directory, a full disk
            warnings.warn(f"xfuse: numba's cache of {fn.__name__} cannot be saved ({type(e).__name__}: {e}); "
                          "it runs uncached", CacheWarning, stacklevel=2)

    functions.load_overload, functions.save_overload = load_overload, save_overload
    return fn
