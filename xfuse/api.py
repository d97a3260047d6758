"""`xfuse.jit`: trace a JAX function into HLO, compile once per abstract signature, run.

The signature is the pytree structure, each leaf's shape, dtype and weak type, and the static
arguments' values; a second call with the same signature neither retraces nor recompiles.
"""

from __future__ import annotations

import functools
import operator
import threading
import time
from concurrent.futures import Future
from collections.abc import Callable, Iterable, Sequence

from jax._src.config import enable_x64 as _X64  # x64 decides canonical dtypes: in the key
import jax
from jax._src.array import ArrayImpl as _JaxArray
import numpy as np
from numpy import asarray, generic, ndarray

from . import frontend_bridge as bridge
from . import signature as sig
from . import tiers as tiers_
from .compiler import _DEFAULT as _CHOICE  # the innermost default_backend block: in the keys
from .compiler import check_passes, make_choice
from .runtime.executable import MISS
from .stages import CallInfo, Compiled, Lowered

# A numpy argument's part of a fast-path key: its class (so a jax array or an ndarray subclass
# of the same shape and dtype never takes a plain ndarray's entry), shape and dtype.
_SIGNATURE = operator.attrgetter("__class__", "shape", "dtype")
_flatten = jax.tree_util.tree_flatten


def _as_tuple(value: int | str | Iterable, option: str, kind: type) -> tuple:
    items = (value,) if isinstance(value, (int, str)) else tuple(value)
    for item in items:
        if not isinstance(item, kind) or isinstance(item, bool):
            raise ValueError(f"{option} must hold {kind.__name__}s, got {item!r}")
    return items


class Jitted:
    """A function compiled by xfuse on first call for each signature."""

    def __init__(
        self,
        fun: Callable,
        static_argnums: int | Iterable[int] = (),
        static_argnames: str | Iterable[str] = (),
        backend: str | None = None,
        passes: str | Sequence | None = None,
        donate_argnums: int | Iterable[int] = (),
        fallback: str | None = None,
        backend_options: dict | None = None,
        tiers: bool | None = None,
    ) -> None:
        if not callable(fun):
            raise TypeError(f"xfuse.jit expects a function, got {type(fun).__name__}")
        self.fun = fun
        # Naming no backend follows `xfuse.default_backend` blocks, read at each call.
        self.choice = None if backend is None else make_choice(backend, fallback, backend_options)
        if backend is None and (fallback is not None or backend_options):
            raise ValueError("fallback and backend_options need backend= too")
        self.passes = check_passes(passes)
        self.splitter = sig.ArgumentSplitter(
            fun,
            _as_tuple(static_argnums, "static_argnums", int),
            _as_tuple(static_argnames, "static_argnames", str),
        )
        self.donate_argnums = frozenset(_as_tuple(donate_argnums, "donate_argnums", int))
        both = self.donate_argnums & self.splitter.static_argnums
        if both:
            raise ValueError(f"donate_argnums and static_argnums both name argument {min(both)}")
        self._cache: dict[tuple, Compiled] = {}
        # key -> (run, guarded run or None, the class whose __call__ is the guarded run, or
        # None); _last: (x64, backend choice, guarded run) of the signature last called, tried
        # first (its guard checks the arguments).
        self._fast: dict[tuple, tuple] = {}
        self._last: tuple = (None, None, None)
        self._device_fast = False  # whether _fast holds entries for jax arrays
        # Pytrees of arrays: (x64, backend choice, tree structure, static values, (class,
        # shape, dtype) of each leaf) -> (run on the leaves, None or each leaf's dtype to
        # convert it to, None for a leaf passed as it is). A call pays for one flatten (in C)
        # and its key, not for each leaf's abstract signature (`_tree_call`).
        self._tree_fast: dict[tuple, tuple] = {}
        self._lock = threading.Lock()
        self._compiling: dict[tuple, threading.Lock] = {}
        if tiers not in (None, True, False):
            raise ValueError(f"tiers must be None, True or False, got {tiers!r}")
        self.tiers = tiers
        self._pending: dict[tuple, tiers_.Pending] = {}  # native compiles the quick tier covers
        functools.update_wrapper(self, fun)

    # ------------------------------------------------------------------ calling
    def __call__(self, *args: object, **kwargs: object) -> object:
        if not kwargs and self._fast:  # the fast path: positional numpy arrays seen before
            last = self._last  # the signature called last, checked by its own guard
            if last[0] is _X64.value and last[1] is _CHOICE.get():
                outputs = last[2](args)
                if outputs is not MISS:
                    return outputs
            try:  # (class, shape, dtype) of each argument, mapped in C
                key = (_X64.value, _CHOICE.get(), *map(_SIGNATURE, args))
                run = self._fast.get(key)
            except (AttributeError, TypeError):  # a scalar, or an object with an unhashable shape:
                run = None  # the slow path says what is wrong with it
            if run is not None:
                if run[1] is not None:
                    self._last = (key[0], key[1], run[1])
                    if run[2] is not None:
                        self.__class__ = run[2]
                return run[0](args)
            if self._device_fast:  # jax arrays, for a backend that takes them as they are
                key = [(a.shape, a.dtype) for a in args if type(a) is _JaxArray and not a.weak_type]
                if len(key) == len(args):
                    run = self._fast.get((_X64.value, _CHOICE.get(), "device", *key))
                    if run is not None:
                        return run[0](args)
        if self._tree_fast:
            outputs = self._tree_call(args, kwargs)
            if outputs is not MISS:
                return outputs
        key, leaves, specs = self._key_and_leaves(args, kwargs)
        compiled = self._cache.get(key)
        if compiled is None:
            compiled = self._compile_once(key, args, kwargs)
        arrays = [sig.to_array(leaf, spec, compiled._device_arrays) for leaf, spec in zip(leaves, specs)]
        outputs = compiled.call_flat(arrays)  # first: the fast path is chosen for settled kernels
        if compiled.tier != "native":  # the quick tier: no fast path, the native one comes
            return outputs
        self._remember_tree(key, leaves, arrays, compiled)
        if not kwargs and len(arrays) == len(args) and all(a is b for a, b in zip(arrays, args)) \
                and not self.splitter.has_static:
            # Every argument was a canonical numpy array (or a jax array the backend takes),
            # passed through untouched: next time the shapes and dtypes alone select the
            # executable.
            if all(type(a) is ndarray for a in args):
                x64, choice = _X64.value, _CHOICE.get()
                guarded = compiled.guarded_runner()
                # The class whose `__call__` is this signature's guarded call, in this x64 mode
                # and backend block (`Compiled.call_class`): the instance takes it while this
                # signature is the one called last.
                cls = None
                if guarded is not None and (type(self) is Jitted or vars(type(self)).get("call_class_of") is Jitted):
                    names = {"X64": _X64, "CHOICE": _CHOICE, "x64": x64, "choice": choice}
                    cls = compiled.call_class(Jitted, also=("X64.value is x64 and CHOICE.get() is choice", names))
                self._fast[(x64, choice, *map(_SIGNATURE, args))] = (compiled.fast_runner(), guarded, cls)
                if guarded is not None:
                    self._last = (x64, choice, guarded)
                    if cls is not None:
                        self.__class__ = cls
            elif all(type(a) is _JaxArray and not a.weak_type for a in args):
                signature = [(a.shape, a.dtype) for a in args]
                self._fast[(_X64.value, _CHOICE.get(), "device", *signature)] = (compiled.fast_runner(), None, None)
                self._device_fast = True
        return outputs

    def _tree_call(self, args: tuple, kwargs: dict) -> object:
        """The call's outputs through `_tree_fast`, or MISS for a signature it does not hold."""
        if self.splitter.has_static:
            try:
                args, kwargs, static = self.splitter.split(args, kwargs)
            except ValueError:  # an unhashable static value: the slow path says so
                return MISS
        else:
            static = ()
        leaves, treedef = _flatten((args, kwargs))
        try:
            key = (_X64.value, _CHOICE.get(), treedef, static, *map(_SIGNATURE, leaves))
            entry = self._tree_fast.get(key)
        except (AttributeError, TypeError):  # a scalar or an object with no hashable shape
            return MISS
        if entry is None:
            return MISS
        run, converts = entry
        if converts is not None:  # as to_array converts: no copy where nothing changes
            arrays = []
            for leaf, dtype in zip(leaves, converts):
                if dtype is not None:
                    if type(leaf) is _JaxArray and leaf.weak_type:
                        return MISS
                    leaf = asarray(leaf, dtype)
                arrays.append(leaf)
            leaves = arrays
        return run(leaves)

    def _remember_tree(self, key: tuple, leaves: list, arrays: list, compiled: Compiled) -> None:
        """Adds this call's signature to `_tree_fast` where each leaf was a numpy array or
        scalar, or a strongly typed jax array read as one (not for a backend that takes jax
        arrays as they are): those of another dtype than the canonical are converted at each
        call."""
        converts = []
        for leaf, array in zip(leaves, arrays):
            if leaf is array and type(leaf) is ndarray:
                converts.append(None)
                continue
            plain = type(leaf) is ndarray or isinstance(leaf, generic)
            if compiled._device_arrays or type(array) is not ndarray or \
                    not (plain or (type(leaf) is _JaxArray and not leaf.weak_type)):
                return
            converts.append(array.dtype)
        treedef, static = key[0], key[2]
        try:
            signature = (_X64.value, _CHOICE.get(), treedef, static, *map(_SIGNATURE, leaves))
        except (AttributeError, TypeError):
            return
        plain = all(c is None for c in converts)
        self._tree_fast[signature] = (compiled.fast_runner(), None if plain else tuple(converts))

    def _key_and_leaves(self, args: tuple, kwargs: dict):
        """The cache key of a call (signature and backend in effect), its leaves and their specs."""
        dynamic_args, dynamic_kwargs, static = self.splitter.split(args, kwargs)
        names = self.splitter.dynamic_names(len(args))
        leaves, paths, treedef = sig.leaf_paths(dynamic_args, dynamic_kwargs, names)
        specs = tuple(sig.abstractify(leaf, path) for leaf, path in zip(leaves, paths))
        key = (treedef, tuple((s.shape, s.weak) for s in specs), static, self._backend_choice())
        return key, leaves, specs

    def _compile_once(self, key: tuple, args: tuple, kwargs: dict) -> Compiled:
        """Compiles for `key`; threads racing on the same key wait for one compile."""
        with self._lock:
            gate = self._compiling.setdefault(key, threading.Lock())
        try:
            with gate:
                compiled = self._cache.get(key)
                if compiled is None:
                    lowered = self.lower(*args, **kwargs)
                    if tiers_.enabled(self.tiers, lowered.backend):
                        compiled = self._tiered(key, lowered, args, kwargs)
                    else:
                        compiled = self._cache[key] = lowered.compile()
        finally:  # the gate goes once its key is cached, or its compile failed: none stays behind
            with self._lock:
                if self._compiling.get(key) is gate:
                    del self._compiling[key]
        return compiled

    def _tiered(self, key: tuple, lowered: Lowered, args: tuple, kwargs: dict) -> Compiled:
        """The native program and the quick tier compile at once, each on a thread of its own:
        the first ready runs the call (with tiers=True the quick tier, unless the native
        program is ready by then too), and the native program takes over when it is ready."""
        dynamic_args, dynamic_kwargs, _ = self.splitter.split(args, kwargs)
        leaves, _, _ = sig.leaf_paths(dynamic_args, dynamic_kwargs, self.splitter.dynamic_names(len(args)))
        arrays = [np.array(sig.to_array(leaf, spec, False)) for leaf, spec in zip(leaves, lowered.info.leaves)]

        def install(pending: tiers_.Pending) -> None:
            with self._lock:
                if pending.native is not None:
                    self._cache[key] = pending.native
                self._pending.pop(key, None)

        with self._lock:
            pending = self._pending[key] = tiers_.Pending(lowered, arrays, install)
        built = tiers_.Building(lowered, self.fun)
        while not built.ready.wait(tiers_.POLL_S):
            if pending.done.is_set() and not self.tiers:
                break
        if built.quick is None or pending.done.is_set() and not self.tiers:
            pending.done.wait()  # no quick tier (jax.jit cannot take it), or native code first
            if pending.error is not None:
                raise pending.error
            return pending.native
        with self._lock:
            if pending.done.is_set() and pending.error is None:  # ready as the quick tier was
                return pending.native
            pending.quick_took_over = True
            self._cache.setdefault(key, built.quick)
            return self._cache[key]

    def wait_native(self, timeout: float | None = None) -> bool:
        """Waits for the native compiles the quick tier covers (`xfuse.tiers`); whether none
        is left after `timeout` seconds (None: as long as they take)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with self._lock:
                pending = list(self._pending.values())
            if not pending:
                return True
            left = None if deadline is None else max(deadline - time.monotonic(), 0)
            if not pending[0].done.wait(left):
                return False

    def tier_of(self, *args: object, **kwargs: object) -> str | None:
        """Which tier runs a call on these arguments now: "native", "jax" (the quick tier, while
        the native program compiles or where its compile failed), or None before a first call."""
        key, _, _ = self._key_and_leaves(args, kwargs)
        compiled = self._cache.get(key)
        return None if compiled is None else compiled.tier

    # ------------------------------------------------------------------ stages
    def lower(self, *args: object, **kwargs: object) -> Lowered:
        """Traces for these arguments' signature; `.as_text()` is the HLO before optimisation."""
        dynamic_args, dynamic_kwargs, static = self.splitter.split(args, kwargs)
        names = self.splitter.dynamic_names(len(args))
        leaves, paths, treedef = sig.leaf_paths(dynamic_args, dynamic_kwargs, names)
        specs = tuple(sig.abstractify(leaf, path) for leaf, path in zip(leaves, paths))
        info = CallInfo(treedef, specs, static, self.splitter)
        started = time.perf_counter()
        module, out_tree = bridge.trace_call(self.fun, info)
        lowered = Lowered(module, info, out_tree, self._backend_choice(), self.passes)
        lowered.trace_s = time.perf_counter() - started
        lowered.donated = self._donated_leaves(args, dynamic_args)
        return lowered

    @property
    def backend(self) -> str:
        """The backend this function compiles for now."""
        return self._backend_choice().name

    def _backend_choice(self):
        if self.choice is not None:
            return self.choice
        from .compiler import current_choice

        return current_choice()

    def _donated_leaves(self, args: tuple, dynamic_args: tuple) -> frozenset[int]:
        """Flat argument positions of the leaves of the donated arguments."""
        if not self.donate_argnums:
            return frozenset()
        nargs = len(args)
        static = {n if n >= 0 else n + nargs for n in self.splitter.static_argnums}
        dynamic_positions = [i for i in range(nargs) if i not in static]
        donated, start = set(), 0
        for d, position in enumerate(dynamic_positions):
            count = len(jax.tree_util.tree_leaves(dynamic_args[d]))
            if position in self.donate_argnums or position - nargs in self.donate_argnums:
                donated.update(range(start, start + count))
            start += count
        return frozenset(donated)

    def call_async(self, *args: object, **kwargs: object) -> Future:
        """Like calling, but returns a `concurrent.futures.Future` at once (a first call for a
        signature compiles before returning)."""
        key, _, _ = self._key_and_leaves(args, kwargs)
        compiled = self._cache.get(key)
        if compiled is None:
            compiled = self._compile_once(key, args, kwargs)
        dynamic_args, dynamic_kwargs, _ = self.splitter.split(args, kwargs)
        return compiled.call_async(*dynamic_args, **dynamic_kwargs)

    def _cache_size(self) -> int:
        return len(self._cache)

    def __repr__(self) -> str:
        return f"<xfuse.jit {getattr(self.fun, '__name__', self.fun)!r}>"


def jit(
    fun: Callable | None = None,
    *,
    static_argnums: int | Iterable[int] = (),
    static_argnames: str | Iterable[str] = (),
    backend: str | None = None,
    passes: str | Sequence | None = None,
    donate_argnums: int | Iterable[int] = (),
    fallback: str | None = None,
    backend_options: dict | None = None,
    tiers: bool | None = None,
) -> Jitted | Callable[[Callable], Jitted]:
    """Compiles `fun` with xfuse; usable as `@xfuse.jit` or `@xfuse.jit(static_argnums=...)`.

    `passes` names the optimisation pipeline ("simplify,cse,dce,fuse"; "none" turns
    optimisation off) or gives pass objects. `donate_argnums`: arguments whose buffers the
    call may reuse for its outputs (as in jax; their contents are undefined afterwards).
    `backend`: a backend's name (`xfuse.devices()` lists them; default numba, or the innermost
    `with xfuse.default_backend(...)`). `fallback`: the backend that runs the instructions
    `backend` cannot (None: those raise `UnsupportedError`, naming the op). `backend_options`:
    the backend's own options (the jax backend: `mode`, `device`). `tiers`: whether a first
    call runs on jax.jit's executable while native code compiles (`xfuse.tiers`; None: where
    that is ready first, True: unless native code is ready by then too, False: never, every
    call runs native code).
    """
    if fun is None:
        return functools.partial(
            jit,
            static_argnums=static_argnums,
            static_argnames=static_argnames,
            backend=backend,
            passes=passes,
            donate_argnums=donate_argnums,
            fallback=fallback,
            backend_options=backend_options,
            tiers=tiers,
        )
    return Jitted(
        fun, static_argnums, static_argnames, backend, passes, donate_argnums, fallback, backend_options, tiers
    )


__all__ = ["Jitted", "jit"]
