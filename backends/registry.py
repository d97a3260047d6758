"""The backend registry: PluggableDevice for xfuse.

Backends are found through the entry-point group `xfuse.backends` (xfuse's own register there
too, see pyproject.toml): each entry point names a `Backend` object. Discovery reads names only;
a backend's module is imported the first time it is asked for, and one that fails to import is
skipped with a `PluginWarning` naming it, breaking nothing else. Kernels for particular ops or
patterns come through the group `xfuse.kernels`, each entry point naming a `KernelRegistration`
or a list of them, loaded the first time any module is compiled; `register_kernel` adds one
from code.

May import xfuse.hlo and the standard library (importlib.metadata is imported on first use:
it is slow to import, and the numpy-only runtime never needs it).
"""

from __future__ import annotations

import os
import platform
import threading
import warnings
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from xfuse.hlo import Computation, Instruction, Module, Op

GROUP = "xfuse.backends"
KERNEL_GROUP = "xfuse.kernels"
STRUCTURAL = frozenset({Op.PARAMETER, Op.CONSTANT, Op.TUPLE, Op.GET_TUPLE_ELEMENT})


class PluginWarning(RuntimeWarning):
    """A backend or kernel plugin could not be loaded; it is skipped."""


class UnsupportedError(ValueError):
    """A backend cannot run an instruction and no fallback was chosen."""


@dataclass(frozen=True)
class Device:
    """One place a backend runs code, as `tf.config.list_physical_devices()` lists them."""

    backend: str
    platform: str  # "cpu", "gpu", or a plugin's own word
    index: int = 0
    description: str = ""

    @property
    def id(self) -> str:
        return f"{self.backend}:{self.platform}:{self.index}"

    def __str__(self) -> str:
        return f"{self.id} ({self.description})" if self.description else self.id


@dataclass(frozen=True)
class Capabilities:
    """What a backend can emit: opcode names, fusion kinds and dtype names such as "f32"
    (None: every one)."""

    ops: frozenset[str] | None = None
    fusion_kinds: frozenset[str] | None = None
    dtypes: frozenset[str] | None = None

    def refusal(self, module: Module, inst: Instruction) -> str | None:
        """Why this backend cannot run top-level instruction `inst`, or None if it can."""
        if inst.op in STRUCTURAL:
            return None
        if self.dtypes is not None:
            for shape in _array_shapes(inst.shape):
                if shape.dtype.value not in self.dtypes:
                    return f"it has no {shape.dtype.value} arrays"
        if inst.op is Op.FUSION:
            kind = inst.attr("kind")
            if self.fusion_kinds is not None and kind not in self.fusion_kinds:
                return f"it emits no {kind} fusions"
            for member in _members(module, module[inst.attr("calls")]):
                reason = self.refusal(module, member)
                if reason is not None:
                    return f"{reason} ({member.name}, inside {inst.name})"
            return None
        if self.ops is not None and inst.op.value not in self.ops:
            return f"it has no {inst.op.value} op"
        for callee in inst.callees:  # a loop's body, a conditional's branches run here too
            for member in _members(module, module[callee]):
                reason = self.refusal(module, member)
                if reason is not None:
                    return f"{reason} ({member.name}, inside {inst.name})"
        return None


def _array_shapes(shape) -> list:
    return [s for e in shape.elements for s in _array_shapes(e)] if hasattr(shape, "elements") else [shape]


def _members(module: Module, comp: Computation) -> Iterable[Instruction]:
    for inst in comp.instructions:
        for callee in inst.callees:
            yield from _members(module, module[callee])
        yield inst


def host_cpu() -> str:
    """This machine's CPU model, as /proc/cpuinfo names it (else what `platform` knows)."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


class Backend:
    """What a backend plugin provides. Subclass it (or give an object with these attributes):

    `name`, `description`, `capabilities`, `options` (the keyword options `compile` takes),
    `devices()`, and `compile(module, **options) -> executable`, where the executable is called
    with a list of input arrays and returns a list of output arrays (a tuple result gives one
    per element). `host_arrays`: whether the executable wants numpy arrays (True) or takes the
    arrays another backend produced as they are. `loops_at_once`: whether it runs independent
    loops at once, so the default pipeline splits loops by rows for it (`rowsplit`).
    """

    name: str = ""
    description: str = ""
    capabilities: Capabilities = Capabilities()
    options: tuple[str, ...] = ()
    host_arrays: bool = True
    loops_at_once: bool = False

    def devices(self) -> list[Device]:
        """The host CPU, for a backend that runs there (override for other devices)."""
        return [Device(self.name, "cpu", 0, f"{host_cpu()}, {os.cpu_count()} threads")]

    def compile(self, module: Module, **options: object) -> Callable:
        raise NotImplementedError(f"backend {self.name!r} does not compile")

    def __repr__(self) -> str:
        return f"<xfuse backend {self.name!r}>"


@dataclass(frozen=True)
class KernelRegistration:
    """A kernel a plugin provides for an op or a pattern on one backend.

    `op`: an opcode name (every instruction of that op, `dtypes` permitting); or `match(
    computation, instruction)` returning the names of the instructions the kernel replaces
    (rooted at `instruction`, whose value it computes) or None. `kernel(*arrays)` returns the
    root's value (a tuple for a tuple root) as numpy arrays.
    """

    backend: str
    name: str
    kernel: Callable
    op: str | None = None
    match: Callable | None = None
    dtypes: frozenset[str] | None = None
    source: str = ""  # the package or module it came from, for reports

    def __post_init__(self) -> None:
        if (self.op is None) == (self.match is None):
            raise ValueError(f"kernel {self.name!r}: give exactly one of op= and match=")
        if not callable(self.kernel):
            raise ValueError(f"kernel {self.name!r}: kernel= must be callable")
        if self.op is not None and self.op not in {o.value for o in Op}:
            raise ValueError(f"kernel {self.name!r}: op={self.op!r} is not an xfuse op")


@dataclass
class _Entry:
    name: str
    target: str  # "module:attr", for messages
    dist: str
    load: Callable[[], object]
    backend: Backend | None = None
    error: str | None = None


@dataclass
class Registry:
    """Backends by name and registered kernels; `REGISTRY` is the process's one."""

    _entries: dict[str, _Entry] = field(default_factory=dict)
    _kernels: list[KernelRegistration] = field(default_factory=list)
    _discovered: bool = False
    _kernels_loaded: bool = False
    _kernel_plugins: set = field(default_factory=set)  # (name, value) of loaded entry points
    _kernel_eps: tuple = ()  # the `xfuse.kernels` entry points found by `discover`
    _lock: threading.RLock = field(default_factory=threading.RLock)

    # ------------------------------------------------------------------ discovery
    def discover(self, *, again: bool = False) -> None:
        """Reads the entry points of `xfuse.backends` (names only; nothing is imported).
        `again=True` looks for newly installed plugins (and kernel plugins) too."""
        if self._discovered and not again:
            return
        with self._lock:
            if self._discovered and not again:
                return
            from importlib.metadata import entry_points

            found = entry_points()  # one scan of the installed distributions, for both groups
            self._kernel_eps = tuple(found.select(group=KERNEL_GROUP))
            for ep in found.select(group=GROUP):
                if ep.name not in self._entries:
                    dist = getattr(ep.dist, "name", "") or ""
                    self._entries[ep.name] = _Entry(ep.name, ep.value, dist, ep.load)
            from . import builtin  # a source tree that is not installed has no entry points

            for backend in builtin.BACKENDS:
                if backend.name not in self._entries:
                    self.register(backend)
            self._discovered = True
            self._kernels_loaded = self._kernels_loaded and not again

    def register(self, backend: Backend, *, replace: bool = False) -> None:
        """Adds a backend object from code (tests, notebooks, a plugin's own setup)."""
        _check_backend_object(backend, repr(backend))
        with self._lock:
            if backend.name in self._entries and not replace:
                raise ValueError(f"a backend named {backend.name!r} is already registered")
            self._entries[backend.name] = _Entry(
                backend.name, type(backend).__module__, "", lambda: backend, backend
            )

    def unregister(self, name: str) -> None:
        with self._lock:
            self._entries.pop(name, None)
            self._kernels = [k for k in self._kernels if k.backend != name]

    def names(self) -> list[str]:
        """Every backend found, loaded or not (a plugin that failed to load is left out)."""
        self.discover()
        from .builtin import BACKENDS

        builtin = [b.name for b in BACKENDS if b.name in self._entries]
        ordered = builtin + sorted(n for n in self._entries if n not in builtin)
        return [n for n in ordered if self._entries[n].error is None]

    def get(self, name: str) -> Backend:
        """The backend called `name`, imported now if it was not; ValueError if there is none or
        it failed to load (naming the plugin and the error)."""
        self.discover()
        entry = self._entries.get(name)
        if entry is None:
            raise ValueError(
                f"backend={name!r} is not available; choose one of {', '.join(self.names())}"
            )
        with self._lock:
            if entry.backend is None and entry.error is None:
                self._load(entry)
        if entry.error is not None:
            raise ValueError(f"backend={name!r} failed to load: {entry.error}")
        return entry.backend

    def _load(self, entry: _Entry) -> None:
        where = f"{entry.target}" + (f" from {entry.dist}" if entry.dist else "")
        try:
            backend = entry.load()
            if isinstance(backend, type):
                backend = backend()
            _check_backend_object(backend, where)
            if backend.name != entry.name:
                raise ValueError(f"the object is named {backend.name!r}, not {entry.name!r}")
        except Exception as error:  # noqa: BLE001 - a plugin's failure must not spread
            entry.error = f"{where}: {type(error).__name__}: {error}"
            warnings.warn(
                f"xfuse backend plugin {entry.name!r} ({entry.error}) could not be loaded; "
                "it is skipped",
                PluginWarning,
                stacklevel=4,
            )
            return
        entry.backend = backend

    def backends(self) -> list[Backend]:
        """Every backend that loads (imports them all; failures are warned about and skipped)."""
        result = []
        for name in list(self.names()):
            try:
                result.append(self.get(name))
            except ValueError:
                continue
        return result

    def devices(self, backend: str | None = None) -> list[Device]:
        """Every device of every backend that loads (or of one backend)."""
        backends = [self.get(backend)] if backend is not None else self.backends()
        found: list[Device] = []
        for b in backends:
            try:
                found.extend(b.devices())
            except Exception as error:  # noqa: BLE001 - one plugin's bug hides only its devices
                warnings.warn(
                    f"xfuse backend {b.name!r} failed to list its devices: "
                    f"{type(error).__name__}: {error}",
                    PluginWarning,
                    stacklevel=3,
                )
        return found

    @contextmanager
    def scoped(self) -> Iterator[Registry]:
        """Undoes every registration and discovery made inside the block (for tests)."""
        with self._lock:
            saved = (dict(self._entries), list(self._kernels), self._discovered,
                     self._kernels_loaded, set(self._kernel_plugins), self._kernel_eps)
        try:
            yield self
        finally:
            with self._lock:
                (self._entries, self._kernels, self._discovered, self._kernels_loaded,
                 self._kernel_plugins, self._kernel_eps) = saved

    # ------------------------------------------------------------------ kernels
    def register_kernel(self, registration: KernelRegistration) -> None:
        with self._lock:
            self._kernels.append(registration)

    def unregister_kernel(self, name: str) -> None:
        with self._lock:
            self._kernels = [k for k in self._kernels if k.name != name]

    def kernels_for(self, backend: str) -> list[KernelRegistration]:
        """The kernels registered for `backend`, the entry-point ones loaded on first use."""
        self._load_kernel_plugins()
        return [k for k in self._kernels if k.backend == backend]

    def _load_kernel_plugins(self) -> None:
        if self._kernels_loaded:
            return
        self.discover()
        with self._lock:
            if self._kernels_loaded:
                return
            self._kernels_loaded = True
            for ep in self._kernel_eps:
                if (ep.name, ep.value) in self._kernel_plugins:
                    continue
                self._kernel_plugins.add((ep.name, ep.value))
                dist = getattr(ep.dist, "name", "") or "?"
                try:
                    loaded = ep.load()
                    items = loaded() if callable(loaded) and not isinstance(
                        loaded, KernelRegistration
                    ) else loaded
                    items = [items] if isinstance(items, KernelRegistration) else list(items)
                    for item in items:
                        if not isinstance(item, KernelRegistration):
                            raise TypeError(f"{item!r} is not a KernelRegistration")
                except Exception as error:  # noqa: BLE001
                    warnings.warn(
                        f"xfuse kernel plugin {ep.name!r} ({ep.value} from {dist}) could not "
                        f"be loaded: {type(error).__name__}: {error}; it is skipped",
                        PluginWarning,
                        stacklevel=4,
                    )
                    continue
                for item in items:
                    self._kernels.append(
                        item if item.source else _with_source(item, dist)
                    )


def _with_source(item: KernelRegistration, source: str) -> KernelRegistration:
    from dataclasses import replace

    return replace(item, source=source)


def _check_backend_object(backend: object, where: str) -> None:
    for attribute in ("name", "compile", "devices", "capabilities"):
        if not hasattr(backend, attribute):
            raise TypeError(f"{where} is not an xfuse backend: it has no {attribute!r}")
    if not isinstance(backend.name, str) or not backend.name:
        raise TypeError(f"{where} is not an xfuse backend: its name is {backend.name!r}")


REGISTRY = Registry()


def devices(backend: str | None = None) -> list[Device]:
    return REGISTRY.devices(backend)


def register_backend(backend: Backend, *, replace: bool = False) -> None:
    REGISTRY.register(backend, replace=replace)


def register_kernel(
    backend: str,
    name: str,
    kernel: Callable,
    *,
    op: str | None = None,
    match: Callable | None = None,
    dtypes: Iterable[str] | None = None,
    source: str = "",
) -> KernelRegistration:
    """Registers `kernel` for `op` (or the pattern `match` finds) on `backend`; returns the
    registration (`REGISTRY.unregister_kernel(name)` removes it)."""
    registration = KernelRegistration(
        backend, name, kernel, op, match, None if dtypes is None else frozenset(dtypes), source
    )
    REGISTRY.register_kernel(registration)
    return registration
