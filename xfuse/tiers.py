"""Tiered compiles, as JVMs and JavaScript engines run code: a signature's native compile (the
numba or C backend: numba compiles each kernel, about 0.4 s a kernel cold) runs on a thread of
its own, and so does the quick tier's: `jax.jit` of the same function at the same signature
(ready in about jax.jit's own compile time). The first call runs on whichever is ready first
(a function whose kernels are few or in the disk cache: native code), later calls on the quick
tier until the native program is ready, then on it.

Both tiers give numpy arrays, equal within the documented tolerances (XLA's kernels and
xfuse's round differently, as jax.jit and xfuse do). Where the native compile fails after the
quick tier took over, the quick tier keeps running the calls and a warning says why.

`xfuse.jit(f, tiers=False)` waits for native code (for benchmarks and AOT); `tiers=True` runs
the quick tier unless the native program is ready as soon; `XFUSE_TIERS=0` turns tiers off for
every function that does not ask for them (tiers=True). Imports jax, numpy and xfuse's own packages.
"""

from __future__ import annotations

import os
import threading
import warnings
from types import SimpleNamespace
from collections.abc import Callable
from concurrent.futures import Future

import jax
import numpy as np
from jax._src.config import enable_x64 as _X64

from .stages import Compiled, Lowered

# How often the first call looks at which tier is ready.
POLL_S = 0.002
TIERED_BACKENDS = ("numba", "c")


def enabled(tiers: bool | None, backend: str) -> bool:
    """Whether a compile for `backend` may run through the quick tier first."""
    if tiers is False or backend not in TIERED_BACKENDS:
        return False
    return tiers is True or os.environ.get("XFUSE_TIERS", "1") != "0"


class Pending:
    """One signature's native compile, on a daemon thread of its own: `done` is set once it
    ended, with `native` (the Compiled) or `error`; `install(self)` runs first. The backend
    compiles its kernels at their first call, so the thread calls the program once on copies
    of the first call's arrays (`arrays`), its result dropped: a later call finds every kernel
    compiled (an error that call raises is the call's, as the quick tier's would be)."""

    def __init__(self, lowered: Lowered, arrays: list, install: Callable[[Pending], None]) -> None:
        self.native: Compiled | None = None
        self.error: BaseException | None = None
        self.quick_took_over = False
        self.done = threading.Event()
        self._install = install
        self.thread = threading.Thread(target=self._run, args=(lowered, arrays), daemon=True,
                                       name=f"xfuse native compile of {lowered.module.name}")
        self.thread.start()

    def _run(self, lowered: Lowered, arrays: list) -> None:
        try:
            native = lowered.compile()
        except BaseException as error:  # noqa: BLE001 - given to the caller, or warned about
            self.error = error
        else:
            try:
                native.call_flat(arrays)
            except Exception:  # noqa: BLE001 - the call's own error: the program is ready
                pass
            self.native = native
        try:
            self._install(self)
        finally:
            self.done.set()
        if self.error is not None and self.quick_took_over:
            warnings.warn(f"xfuse: the native compile of {lowered.module.name} failed, its calls keep running "
                          f"on the jax backend: {type(self.error).__name__}: {self.error}", RuntimeWarning,
                          stacklevel=1)


class Building:
    """The quick tier compiling on a daemon thread of its own: `ready` is set once it ended,
    with `quick` (None where jax.jit could not take the function)."""

    def __init__(self, lowered: Lowered, fun: Callable) -> None:
        self.quick: QuickCompiled | None = None
        self.ready = threading.Event()
        x64 = _X64.value  # the caller's (thread-local) x64 mode, which the signature was traced in
        threading.Thread(target=self._run, args=(lowered, fun, x64), daemon=True,
                         name=f"xfuse quick tier of {lowered.module.name}").start()

    def _run(self, lowered: Lowered, fun: Callable, x64: bool) -> None:
        try:
            with jax.enable_x64(x64):
                self.quick = QuickCompiled(lowered, fun)
        except Exception:  # noqa: BLE001 - the calls wait for native code instead
            pass
        finally:
            self.ready.set()


class QuickCompiled(Compiled):
    """The quick tier of a signature: `jax.jit` of the function at the traced signature (weak
    types included), giving numpy arrays as the native tier does."""

    tier = "jax"

    def __init__(self, lowered: Lowered, fun: Callable) -> None:
        from xfuse.fusion import FusionReport

        info = lowered.info

        def flat(*arrays):
            dynamic_args, dynamic_kwargs = jax.tree_util.tree_unflatten(info.in_tree, arrays)
            args, kwargs = info.splitter.merge(dynamic_args, dynamic_kwargs, info.static)
            return fun(*args, **kwargs)

        self.lowered, self.module = lowered, lowered.module
        self.executable = jax.jit(flat).lower(*[spec.struct for spec in info.leaves]).compile()
        self._device_arrays = False
        self._compile_s, self._first_call_s = 0.0, None
        report = FusionReport(lowered.module.name)
        report.tier = "calls run on jax.jit's executable while the native program compiles; they switch to it when ready"
        self._result = SimpleNamespace(report=report, history=[])

    def call_flat(self, arrays) -> object:
        outputs = self.executable(*arrays)
        return jax.tree_util.tree_map(np.array, outputs)  # writable numpy arrays, as native ones

    def __call__(self, *args: object, **kwargs: object) -> object:
        return self.call_flat(self._checked_arrays(args, kwargs))

    def call_async(self, *args: object, **kwargs: object) -> Future:
        from xfuse.runtime.asynchronous import executor

        return executor().submit(self.call_flat, self._checked_arrays(args, kwargs))

    def fast_runner(self) -> Callable:
        return self.call_flat

    def guarded_runner(self) -> None:
        return None

    def steps_per_call(self, *args: object, **kwargs: object) -> None:
        return None

    def kernel_count(self) -> int:
        return 0


__all__ = ["POLL_S", "Building", "Pending", "QuickCompiled", "enabled"]
