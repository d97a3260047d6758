"""The stages of a jitted function, as in `jax.stages`: `Lowered` (the HLO straight from the
frontend, before optimisation) and `Compiled` (the optimised module and its executable).

Outputs of the CPU backends are numpy arrays.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass

import jax
import numpy as np
from jax._src.array import ArrayImpl as _JaxArray

from xfuse.fusion import FusionReport, cost_analysis
from xfuse.hlo import Module
from xfuse.runtime.executable import MISS, method_class

from . import signature as sig


def _never(args: tuple) -> object:
    """The guarded call before the first call, or for executables without one: no match."""
    return MISS


def _takes_device_arrays(backend: str) -> bool:
    """Whether the backend takes jax arrays as they are (else they become numpy arrays)."""
    from xfuse.backends.registry import REGISTRY

    return not REGISTRY.get(backend).host_arrays


@dataclass(frozen=True)
class CallInfo:
    """What a compiled function expects: the pytree of dynamic arguments and each leaf's type."""

    in_tree: object
    leaves: tuple[sig.LeafSpec, ...]
    static: tuple
    splitter: sig.ArgumentSplitter


class Lowered:
    """A traced function: `as_text()` is its HLO before optimisation, with source lines."""

    def __init__(
        self, module: Module, info: CallInfo, out_tree: object, backend, passes=None
    ) -> None:
        from .compiler import BackendChoice, make_choice

        self.module = module
        self.info = info
        self.out_tree = out_tree
        self.choice = backend if isinstance(backend, BackendChoice) else make_choice(backend)
        self.backend = self.choice.name
        self.passes = passes
        self.donated: frozenset[int] = frozenset()  # flat argument positions given up
        self.trace_s = 0.0  # how long tracing took (`Jitted.lower`)

    def as_text(self) -> str:
        return str(self.module)

    def __repr__(self) -> str:
        return f"<xfuse.Lowered {self.module.name} on {self.backend}>"

    def _repr_html_(self) -> str:
        from .html import lowered_html

        return lowered_html(self)

    def _repr_svg_(self) -> str:
        from .graph import to_svg

        return to_svg(self.module)

    def compile(self) -> Compiled:
        from .compiler import compile_module

        started = time.perf_counter()
        result = compile_module(self.module, self.choice, self.passes)
        compiled = Compiled(self, result)
        compiled._compile_s = time.perf_counter() - started
        return compiled


class Compiled:
    """An executable for one signature: call it with the dynamic arguments of that signature."""

    tier = "native"  # the program of the backend asked for (`xfuse.tiers` has a quick one)

    def __init__(self, lowered: Lowered, result) -> None:
        self.lowered = lowered
        self.module = result.module
        self.executable = result.executable
        if lowered.donated and hasattr(self.executable, "with_donated"):
            self.executable = self.executable.with_donated(lowered.donated)
        self._result = result
        self._device_arrays = _takes_device_arrays(lowered.backend)
        self._fast = None  # (signature, runner) once known; () when there is no fast path
        self._guarded = _never  # the runtime's guarded call, once the first call has settled it
        self._compile_s = 0.0  # `Lowered.compile`, all of it
        self._first_call_s: float | None = None  # the first call: kernels compiled or loaded, and run

    def as_text(self) -> str:
        """The optimised module."""
        return str(self.module)

    def fusion_report(self) -> FusionReport:
        """Every fusion made and every candidate refused, with reasons (`str()` for text)."""
        report = self._result.report
        report.compile_stats = self.compile_stats()
        return report

    def compile_stats(self) -> dict:
        """Where the time to a first result went, in seconds: `trace_s` (the function to HLO),
        `passes_s` (the optimisation passes; `passes` by name, `fusion_s` the fuse pass's
        share), `backend_s` (placement and the backend's code generation), `other_s` (the rest
        of compiling: verification, outlining), `first_call_s` (the numba backend compiles or
        loads its kernels at the first call; None before it) and `total_s`, their sum."""
        history = getattr(self._result, "history", [])
        passes: dict[str, float] = {}
        for record in history:
            passes[record.name] = passes.get(record.name, 0.0) + record.seconds
        passes_s = sum(passes.values())
        backend_s = getattr(self._result, "backend_s", 0.0)
        other_s = max(self._compile_s - passes_s - backend_s, 0.0)
        first = self._first_call_s
        stats = {
            "trace_s": self.lowered.trace_s,
            "passes_s": passes_s,
            "fusion_s": passes.get("fuse", 0.0),
            "backend_s": backend_s,
            "other_s": other_s,
            "first_call_s": first,
            "passes": passes,
        }
        stats["total_s"] = self.lowered.trace_s + passes_s + backend_s + other_s + (first or 0.0)
        return stats

    def cost_analysis(self) -> dict:
        """Flops and bytes accessed per kernel and in total."""
        return cost_analysis(self.module)

    def save(self, path, *, target: str = "native", platforms=None):
        """Writes an AOT artifact (`xfuse.aot.load(path)` runs it with numpy alone); returns
        the path. `target`: the CPU the native code is built for ("native", "x86-64-v2", ...).
        On the jax backend the artifact holds the module exported with `jax.export` instead,
        for `platforms` (default: the current one; e.g. ("cpu", "cuda")); loading it needs jax."""
        from xfuse.aot.writer import save

        return save(self, path, target=target, platforms=platforms)

    def kernel_source(self) -> str:
        """The generated source of every kernel (numba backend), one after another."""
        sources = getattr(self.executable, "kernel_sources", {}) or {}
        if not sources:
            return f"# the {self.lowered.backend} backend generates no kernel source\n"
        return "\n".join(f"# ---- {name}\n{text}" for name, text in sources.items())

    def kernel_count(self) -> int:
        return self._result.report.kernels

    def pass_history(self) -> list:
        """The module after each pass: `[PassRecord(name, changed, module), ...]`."""
        return list(self._result.history)

    def pass_diff(self, a: int | str = 0, b: int | str = -1) -> str:
        """A unified diff of the module after pass `a` and after pass `b` (an index into
        `pass_history()` or a pass's name; "input" is the module before the first pass)."""
        import difflib

        first, second = self._module_after(a), self._module_after(b)
        return "\n".join(difflib.unified_diff(
            str(first[1]).splitlines(), str(second[1]).splitlines(),
            f"after {first[0]}", f"after {second[0]}", lineterm="",
        ))

    def _module_after(self, which: int | str):
        history = self._result.history
        if which == "input":
            return "input", self.lowered.module
        if isinstance(which, str):
            for record in history:
                if record.name == which:
                    return record.name, record.module
            names = ", ".join(["input", *(r.name for r in history)])
            raise ValueError(f"no pass named {which!r} ran; the passes: {names}")
        try:
            record = history[which]
        except (IndexError, TypeError):
            raise ValueError(f"pass index {which!r} is out of range (0..{len(history) - 1})") from None
        return record.name, record.module

    def _repr_html_(self) -> str:
        from .html import compiled_html

        return compiled_html(self)

    def _repr_svg_(self) -> str:
        from .graph import to_svg

        return to_svg(self.module)

    def __repr__(self) -> str:
        return f"<xfuse.Compiled {self.module.name} on {self.lowered.backend}>"

    def memory_analysis(self):
        """Argument, output, alias (donated) and temporary bytes, as jax's; the temporaries are
        the planned arena plus the largest working buffer a step allocates."""
        analysis = getattr(self.executable, "memory_analysis", None)
        if analysis is None:
            raise NotImplementedError(f"the {self.lowered.backend} backend plans no buffers")
        return analysis()

    def call_async(self, *args: object, **kwargs: object) -> Future:
        """Starts a call and returns a `concurrent.futures.Future` of its result at once.
        Arguments are checked here (a TypeError is raised, not deferred); an error inside a
        kernel reaches the future, naming the kernel and its fusion."""
        arrays = self._checked_arrays(args, kwargs)
        tree = self.lowered.out_tree
        if hasattr(self.executable, "plan"):
            from xfuse.runtime.asynchronous import call_async

            inner = call_async(self.executable, arrays)
        else:
            from xfuse.runtime.asynchronous import executor

            inner = executor().submit(self.executable, arrays)
        outer: Future = Future()

        def done(f: Future) -> None:
            error = f.exception()
            if error is not None:
                outer.set_exception(error)
            else:
                outer.set_result(jax.tree_util.tree_unflatten(tree, f.result()))

        inner.add_done_callback(done)
        return outer

    def _fast_signature(self) -> list | None:
        """[(shape, dtype)] of the arguments when the signature is positional numpy arrays
        (none weak): a call matching it skips the pytree and dtype checks."""
        info = self.lowered.info
        n = len(info.leaves)
        if info.static or info.splitter.has_static or any(spec.weak for spec in info.leaves):
            return None
        names = info.splitter.dynamic_names(n)
        if sig.leaf_paths(tuple(range(n)), {}, names)[2] != info.in_tree:
            return None
        return [(spec.shape.dims, np.dtype(spec.shape.dtype.numpy)) for spec in info.leaves]

    def __call__(self, *args: object, **kwargs: object) -> object:
        if not kwargs:
            outputs = self._guarded(args)
            if outputs is not MISS:
                return outputs
            fast = self._fast
            if fast is None:
                expected = self._fast_signature()
                if expected is None:
                    fast = self._fast = ()
                else:  # the first call first: the fast path is chosen for kernels it has settled
                    outputs = self.call_flat(self._checked_arrays(args, kwargs))
                    self._fast = (expected, self.fast_runner())
                    self._guarded = self._guarded_runner(expected)
                    self._own_call(expected)
                    return outputs
            # Every argument must be counted: one of another type beside matching arrays
            # (an ndarray subclass, say) would reach the kernels in a matching array's place.
            if fast and len(args) == len(fast[0]):
                if [(a.shape, a.dtype) for a in args if type(a) is np.ndarray] == fast[0]:
                    return fast[1](args)
                if self._device_arrays and fast[0] == [  # jax arrays the backend takes
                    (a.shape, a.dtype) for a in args if type(a) is _JaxArray and not a.weak_type
                ]:
                    return fast[1](args)
        return self.call_flat(self._checked_arrays(args, kwargs))

    def guarded_runner(self) -> Callable | None:
        """run(args): the outputs for positional plain ndarrays of this signature, else MISS;
        None when the signature has no fast path (`_fast_signature`)."""
        expected = self._fast_signature()
        return None if expected is None else self._guarded_runner(expected)

    def _guarded_runner(self, expected: list) -> Callable:
        """run(args): the output pytree for positional plain ndarrays of exactly the expected
        shapes and dtypes, else MISS (the first check of every call)."""
        make = getattr(self.executable, "guarded_runner", None)
        tree = self.lowered.out_tree
        single = jax.tree_util.treedef_is_leaf(tree)
        if make is not None and single:
            return make(expected, single=True)
        run = make(expected, single=False) if make is not None else None
        if run is None:
            return _never

        def unflattened(args):
            outputs = run(args)
            return outputs if outputs is MISS else jax.tree_util.tree_unflatten(tree, outputs)

        return unflattened

    def _own_call(self, expected: list) -> None:
        """Gives this instance a class of its own whose `__call__` is the runtime's guarded
        call made a method (`call_class`): a call pays for one Python frame, not two (x + 1 on
        4 floats: 0.57 against 0.64 us)."""
        if type(self) is Compiled:
            cls = self.call_class(Compiled, expected)
            if cls is not None:
                self.__class__ = cls

    def call_class(self, base: type, expected: list | None = None, also: tuple[str, dict] | None = None) -> type | None:
        """A subclass of `base` whose `__call__` is this executable's guarded call made a method
        (`runtime.executable.guarded_call`), calling `base.__call__` for any other arguments
        (`also`: a condition the call must meet too, the names it reads); None where the
        signature has no such call (not plain arrays, more than one output, another runtime)."""
        make = getattr(self.executable, "guarded_runner", None)
        expected = self._fast_signature() if expected is None else expected
        if make is None or expected is None or not jax.tree_util.treedef_is_leaf(self.lowered.out_tree):
            return None
        return method_class(base, make(expected, single=True, method=base.__call__, also=also))

    def _checked_arrays(self, args: tuple, kwargs: dict) -> list:
        """The arguments as canonical arrays; TypeError naming the first that does not fit."""
        info = self.lowered.info
        names = info.splitter.dynamic_names(len(args) + len(info.splitter.static_argnums))
        leaves, paths, treedef = sig.leaf_paths(args, kwargs, names)
        if treedef != info.in_tree:
            where = sig.structure_mismatch(info.in_tree, args, kwargs, info.splitter)
            raise TypeError(f"{self.module.name}: {where}")
        arrays = []
        for leaf, path, spec in zip(leaves, paths, info.leaves):
            given = sig.abstractify(leaf, path)
            if given.shape != spec.shape:
                raise TypeError(
                    f"{self.module.name}: argument {path} should be {spec.shape}, got {given.shape}"
                )
            arrays.append(sig.to_array(leaf, spec, self._device_arrays))
        return arrays

    def fast_runner(self) -> Callable:
        """run(arrays) -> outputs for arguments already known to match (the jit fast path)."""
        executable, tree = self.executable, self.lowered.out_tree
        single = jax.tree_util.treedef_is_leaf(tree)
        make = getattr(executable, "guarded_runner", None)
        if make is not None and single:
            return make(None, single=True)
        executable = getattr(executable, "runner", lambda: executable)()
        if single:
            return lambda arrays: executable(arrays)[0]
        return lambda arrays: jax.tree_util.tree_unflatten(tree, executable(arrays))

    def steps_per_call(self, *args: object, **kwargs: object) -> int | None:
        """How many steps one call on these arguments runs in Python: each top-level step once,
        and each step of a loop body, condition or branch the runtime runs itself once per
        time it runs (a loop compiled to native code is the one step that enters it). None
        for an executable of another runtime (the jax backend's: one XLA call)."""
        counted = getattr(self.executable, "counted_call", None)
        if counted is None:
            return None
        _, counter = counted(self._checked_arrays(args, kwargs))
        return counter.steps

    def call_flat(self, arrays: Sequence[np.ndarray]) -> object:
        """Runs on already checked, canonical arrays; returns the output pytree."""
        started = time.perf_counter()
        outputs = self.executable(arrays)
        if self._first_call_s is None:
            self._first_call_s = time.perf_counter() - started
        return jax.tree_util.tree_unflatten(self.lowered.out_tree, outputs)
