"""`Executable`: what a backend hands the runtime. A sequence of steps (thunks) over numbered
values: kernels and library calls write into output buffers the runtime allocates (destination
passing); aliases (reshape views, tuple elements) make new names for existing buffers.

A call runs the steps in order over a buffer plan (runtime.plan): temporaries are views into
one arena per call, sharing memory where their lifetimes allow, and a kernel that may write in
place takes a dying input's buffer; arenas and large outputs come from the pool, so their pages
stay hot across calls. `call_async` (runtime.asynchronous) runs independent steps at once.
Imports numpy and the standard library only.
"""

from __future__ import annotations

from collections import namedtuple
from collections.abc import Callable, Sequence
from functools import partial

import numpy as np

from .plan import make_plan
from .pool import MIN_BYTES, POOL


# The records here are named tuples and plain classes, not dataclasses: a dataclass costs about
# a millisecond to define, and a loaded artifact's start-up pays for every record it imports.
class BufferSpec(namedtuple("BufferSpec", "shape dtype")):
    __slots__ = ()

    @property
    def nbytes(self) -> int:
        size = 1
        for d in self.shape:
            size *= d
        return size * np.dtype(self.dtype).itemsize


# What `Executable.guarded_runner`'s function returns for arguments it does not take.
MISS = object()
# A positional argument not given to a `guarded_call` method.
_NOARG = object()
# The open `StepCounter`s (`count_steps`): each `run_steps` adds its program's steps to the
# innermost. Empty outside `count_steps`, so a call pays one truth test of a list per program.
_COUNTING: list = []


class StepCounter:
    """Python-level step executions seen while `count_steps` was open: `steps`, the steps run
    by every program, top-level and nested (loop bodies, conditions, branches); a native loop
    or program counts as the one step that enters it."""

    __slots__ = ("steps",)

    def __init__(self) -> None:
        self.steps = 0


class count_steps:  # noqa: N801 - a context manager, named as contextlib's are
    """`with count_steps() as counter:` counts the steps the runtime runs in Python inside the
    block (`StepCounter`); calls made through an executable's fast paths count when they are run
    by `Executable.counted_call`."""

    def __enter__(self) -> StepCounter:
        _COUNTING.append(StepCounter())
        return _COUNTING[-1]

    def __exit__(self, *exc) -> None:
        _COUNTING.pop()


class KernelError(RuntimeError):
    """A step failed; names the step (the kernel and its fusion)."""


class Step(namedtuple("Step", "name kind run inputs outputs out_specs label in_place scratch_bytes element",
                      defaults=((), "", False, 0, None))):
    """One unit of work. `run(inputs, outputs)` fills `outputs` (kernels, BLAS, copies);
    an alias step's `run(inputs)` returns its outputs instead (views, no work).

    name; kind: "kernel", "blas", "copy" or "alias"; run; inputs and outputs (value slots);
    out_specs (BufferSpec each); label: what the step computes, for errors and reports;
    in_place: reads each input only at the index it writes, so may reuse one; scratch_bytes:
    working memory the step allocates for itself while it runs; element: alias steps, -1
    makes a tuple of the inputs, k takes element k."""

    __slots__ = ()

    def failed(self, error: BaseException) -> KernelError:
        return KernelError(f"{self.name} ({self.label or self.kind}) failed: {type(error).__name__}: {error}")


class Executable:
    """Values 0..n-1: parameters first, then what the steps produce; `results` are returned.
    `kernel_sources`: step name -> source; `donated`: parameter positions whose buffers may be
    reused."""

    def __init__(self, params: list[int], results: list[int], steps: list[Step],
                 constants: dict[int, np.ndarray] | None = None, n_values: int = 0,
                 kernel_sources: dict[str, str] | None = None, param_specs: list[BufferSpec] | None = None,
                 donated: frozenset[int] = frozenset()) -> None:
        self.params, self.results, self.steps, self.n_values = params, results, steps, n_values
        self.constants = {} if constants is None else constants
        self.kernel_sources = {} if kernel_sources is None else kernel_sources
        self.param_specs = [] if param_specs is None else param_specs
        self.donated = donated
        self.pool = POOL
        self.plan = make_plan(self, self.donated)
        # Results that may be an argument or constant itself, or a view of one (through alias
        # steps): those are copied on the way out, so a caller never shares their memory.
        borrowed = set(self.params) | set(self.constants)
        for step in self.steps:
            # (an alias step whose run says its results are `fresh` never returns what it reads)
            fresh = getattr(step.run, "fresh", False)
            if step.kind == "alias" and borrowed.intersection(step.inputs) and not fresh:
                borrowed.update(step.outputs)
        self.may_borrow = any(r in borrowed for r in self.results)
        self.program = [self._compile_step(i, step) for i, step in enumerate(self.steps)]
        # A program of no steps (a window's parts, plumbing): its results picked straight from
        # its arguments and constants.
        self.picks = None
        position = {slot: i for i, slot in enumerate(self.params)}
        if not self.steps and all(r in position or r in self.constants for r in self.results):
            self.picks = [(position.get(r), self.constants.get(r)) for r in self.results]

    def with_donated(self, donated: frozenset[int]) -> Executable:
        """The same program, free to reuse the buffers of these parameter positions."""
        return Executable(self.params, self.results, self.steps, self.constants, self.n_values,
                          self.kernel_sources, self.param_specs, frozenset(donated))

    def _compile_step(self, i: int, step: Step) -> tuple:
        """(alias, run, inputs, outputs, makers, packed): each maker gives one output buffer
        from (values, arena)."""
        makers = []
        for k, spec in enumerate(step.out_specs):
            shape, dtype = tuple(spec.shape), np.dtype(spec.dtype)
            if (i, k) in self.plan.in_place:
                makers.append(self._reuse(self.plan.in_place[(i, k)], shape, dtype))
            elif (i, k) in self.plan.offsets and spec.nbytes:
                makers.append(_arena_view(self.plan.offsets[(i, k)], spec.nbytes, shape, dtype))
            elif spec.nbytes < MIN_BYTES:
                makers.append(lambda values, arena, s=shape, d=dtype: np.empty(s, d))
            else:
                makers.append(lambda values, arena, s=shape, d=dtype, e=self.pool.empty: e(s, d))
        packed = len(step.outputs) == 1 and len(step.out_specs) > 1
        return step.kind == "alias", step.run, step.inputs, step.outputs, tuple(makers), packed

    def _reuse(self, slot: int, shape, dtype) -> Callable:
        def make(values, arena):
            buf = values[slot]
            if slot in self.params:  # a donated argument: only a plain array of this type
                usable = type(buf) is np.ndarray and buf.dtype == dtype and buf.shape == shape \
                    and buf.flags.c_contiguous and buf.flags.writeable
                if not usable:
                    return np.empty(shape, dtype)
            return buf

        return make

    def _lone_step(self) -> tuple | None:
        """The program's one step when it reads the arguments in order and returns its outputs
        as they are (no constants, no buffer reused in place, not an alias), else None."""
        if len(self.program) != 1 or self.constants or self.plan.in_place:
            return None
        alias, run, ins, outs, makers, packed = lone = self.program[0]
        if alias or packed or list(ins) != list(self.params) or list(outs) != list(self.results):
            return None
        return lone

    def _direct(self) -> tuple | None:
        """(arguments, fn, rows, exact, shape, dtype, make, step) when the lone step is a
        settled kernel with one output: the call is then `fn(0, rows, *arrays, out)` on a
        buffer from `make()` (np.empty(shape, dtype) when `shape` is not None); `exact`: the
        kernel's `Kernel.exact`, or None."""
        lone = self._lone_step()
        direct = getattr(lone[1], "direct", None) if lone is not None else None
        if direct is None or len(lone[4]) != 1:
            return None
        spec = self.steps[0].out_specs[0]
        small = spec.nbytes < MIN_BYTES and (0, 0) not in self.plan.offsets
        shape, dtype = (tuple(spec.shape), np.dtype(spec.dtype)) if small else (None, None)
        return (len(self.params), *direct, shape, dtype, partial(lone[4][0], None, None), self.steps[0])

    def runner(self) -> Callable[[Sequence[np.ndarray]], list[np.ndarray]]:
        """The cheapest callable equal to `self(arrays)`: for one step reading the arguments in
        order and returning its outputs, a closure with no step loop (straight to the kernel
        when it is one, `guarded_call`); otherwise `self`."""
        direct = self._direct()
        if direct is not None:  # one kernel, one output: the least work
            return guarded_call(None, False, direct=direct)
        lone = self._lone_step()
        if lone is None:
            return self
        run, makers, step = lone[1], lone[4], self.steps[0]
        allocate = [partial(m, None, None) for m in makers]

        def call(arrays):
            outputs = [a() for a in allocate]
            try:
                run(arrays, outputs)
            except Exception as e:
                raise step.failed(e) from e
            return outputs

        return call

    def guarded_runner(self, expected: Sequence[tuple[tuple, np.dtype]] | None, single: bool,
                       method: Callable | None = None, also: tuple[str, dict] | None = None) -> Callable:
        """`guarded_call` of this program: straight to its kernel when it is one (`_direct`)."""
        direct = self._direct()
        if direct is None:
            return guarded_call(expected, single, self.runner(), method=method, also=also)
        return guarded_call(expected, single, direct=direct, method=method, also=also)

    def __call__(self, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        return self.finish(self.run_steps(arrays))

    def borrowing_call(self, arrays: Sequence[np.ndarray]) -> list:
        """The results as the steps left them: an argument or constant itself, or a view of
        one, is returned as it is (a loop passing state along unchanged does not copy it)."""
        if self.picks is not None:
            return [value if at is None else arrays[at] for at, value in self.picks]
        values = self.run_steps(arrays)
        return [values[r] for r in self.results]

    def run_steps(self, arrays: Sequence[np.ndarray]) -> list:
        """Every value slot after running the steps on `arrays`."""
        if _COUNTING:
            _COUNTING[-1].steps += len(self.program)
        values: list = [None] * self.n_values
        for slot, array in zip(self.params, arrays):
            values[slot] = array
        for slot, array in self.constants.items():
            values[slot] = array
        arena = self.pool.empty((self.plan.arena_bytes,), np.uint8) if self.plan.arena_bytes else None
        for n, (alias, run, ins, outs, makers, packed) in enumerate(self.program):
            try:
                if alias:
                    outputs = run([values[i] for i in ins])
                else:
                    outputs = [m(values, arena) for m in makers]
                    run([values[i] for i in ins], outputs)
            except KernelError:
                raise
            except Exception as e:
                raise self.steps[n].failed(e) from e
            if packed:  # a multi-output kernel: one tuple value
                outputs = [tuple(outputs)]
            for slot, out in zip(outs, outputs):
                values[slot] = out
        return values

    def counted_call(self, arrays: Sequence[np.ndarray]) -> tuple[list[np.ndarray], StepCounter]:
        """The call's outputs, and the Python-level steps it ran (`count_steps`): the same
        steps as any call, run through `run_steps` so that each one is seen."""
        with count_steps() as counter:
            outputs = self(arrays)
        return outputs, counter

    def finish(self, values: list) -> list[np.ndarray]:
        if not self.may_borrow:
            return [values[r] for r in self.results]
        kept = {id(_root(a)) for s in self.params for a in _leaves(values[s])}
        kept |= {id(_root(a)) for a in self.constants.values()}
        return [_copy_kept(values[r], kept) for r in self.results]

    def memory_analysis(self) -> MemoryStats:
        p = self.plan
        code = sum(len(text) for text in self.kernel_sources.values())
        return MemoryStats(p.argument_bytes, p.output_bytes, p.alias_bytes, p.temp_bytes, code,
                           p.unplanned_bytes)


def guarded_call(expected: Sequence[tuple[tuple, np.dtype]] | None, single: bool,
                 call: Callable | None = None, direct: tuple | None = None,
                 method: Callable | None = None, also: tuple[str, dict] | None = None) -> Callable:
    """`run(args)`: `call(args)` for a tuple of exactly `len(expected)` plain ndarrays of the
    (shape, dtype) in `expected`, else `MISS`, without running anything; with `expected` None,
    the caller has checked the arguments. The outputs are a list, or the only one itself when
    `single`. `direct`, instead of `call`: `Executable._direct()`, a kernel called on the
    arguments and a new output buffer. The guard and the call are one generated
    function, so a small call pays for one Python frame and the kernel's dispatch (the fast
    paths of `Compiled`, `xfuse.jit` and artifacts).

    `method` (with `expected`): the function is a method instead, `run(self, *args, **kwargs)`,
    that calls `method(self, *args, **kwargs)` for arguments it does not take, or where `also`
    (the text of a condition, and the names it reads) does not hold: a `Compiled`'s or an
    `xfuse.jit` function's `__call__`, one frame fewer (`Compiled.call_class`).

    Where the kernel has an `exact` entry for arguments of the expected types (`Kernel.exact`)
    and its output is small, the function calls that entry after checking that each argument is
    C-contiguous (numba's C layout) and aligned too, both read from one flags object (34 ns an
    argument less than comparing its strides): x + 1 on 4 floats took 0.57 us a call so, 0.70 us
    through `Compiled.__call__`, this function and the kernel's dispatcher. A read-only array
    reads the same through the entry (a lone kernel step writes only its new output)."""
    n = len(expected) if expected is not None else direct[0] if direct is not None else 0
    names = [f"a{i}" for i in range(n)]
    env: dict = {"ndarray": np.ndarray, "MISS": MISS, "len": len, "type": type, "empty": np.empty,
                 "NOARG": _NOARG, "method": method, **(also[1] if also else {})}
    miss = "        return MISS"
    if method is not None:
        given = "".join(f"{a}, " for a in names)
        lines = [f"def run(self, {''.join(a + '=NOARG, ' for a in names)}*rest, **kwargs):",
                 "    if rest or kwargs" + "".join(f" or {a} is NOARG" for a in names[-1:])
                 + (f" or not ({also[0]})" if also else "") + ":",
                 f"        return method(self, *[a for a in ({given}) if a is not NOARG], *rest, **kwargs)"]
        miss = f"        return method(self, {given})"
    else:
        lines = ["def run(args):"]
    exact_types = False  # the call goes to the kernel's exact entry
    if direct is not None:
        _, env["fn"], env["rows"], exact, env["so"], env["do"], env["make"], step = direct
        env["failed"] = step.failed
        if exact is not None and expected is not None and env["so"] is not None:
            samples = [np.empty(tuple(shape), dtype) for shape, dtype in expected]
            entry = exact((0, env["rows"], *samples, np.empty(env["so"], env["do"])))
            if entry is not None:
                env["fn"], exact_types = entry, True
    if expected is not None:
        if method is None:
            lines += [f"    if len(args) != {n}:", miss]
            if names:
                lines.append(f"    {', '.join(names)}, = args")
        for i, (shape, dtype) in enumerate(expected):
            env[f"s{i}"], env[f"d{i}"] = tuple(shape), np.dtype(dtype)
            layout = ""
            if exact_types:  # numba's C layout, as its typeof reads the flag; one flags object
                layout = f" or not (f{i} := a{i}.flags).c_contiguous or not f{i}.aligned"
            lines += [f"    if type(a{i}) is not ndarray or a{i}.shape != s{i} or a{i}.dtype is not d{i}{layout}:",
                      miss]
    if direct is not None:
        if expected is None and names:
            lines.append(f"    {', '.join(names)}, = args")
        lines += ["    out = empty(so, do)" if env["so"] is not None else "    out = make()",
                  "    try:", f"        fn(0, rows, {''.join(n + ', ' for n in names)}out)",
                  "    except Exception as e:", "        raise failed(e) from e",
                  "    return out" if single else "    return [out]"]
    else:
        env["call"] = call
        args = "args" if method is None else f"({''.join(a + ', ' for a in names)})"
        lines.append(f"    return call({args})[0]" if single else f"    return call({args})")
    exec(compile("\n".join(lines) + "\n", "<xfuse fast path>", "exec"), env)
    return env["run"]


def method_class(base: type, call: Callable) -> type:
    """A subclass of `base`, named as it is, whose `__call__` is `call` (a `guarded_call` made a
    method, calling `base.__call__` for the arguments it does not take): an instance given it as
    its class pays for one Python frame a call (`Compiled`, `xfuse.jit` and loaded artifacts).
    torch.fx gives each GraphModule a class of its own so for its generated `forward`."""
    call.__name__, call.__qualname__ = "__call__", f"{base.__qualname__}.__call__"
    call.__doc__ = base.__call__.__doc__
    return type(base.__name__, (base,), {"__call__": call, "__module__": base.__module__,
                                         "__qualname__": base.__qualname__, "call_class_of": base})


class MemoryStats(namedtuple("MemoryStats", "argument_size_in_bytes output_size_in_bytes alias_size_in_bytes "
                             "temp_size_in_bytes generated_code_size_in_bytes temp_size_unplanned_in_bytes")):
    """Bytes, in the fields of jax's `compiled.memory_analysis()`. alias: donated argument
    bytes reused for outputs; temp: the arena of planned temporaries plus the largest step
    scratch; generated code: of the kernels' source text; temp unplanned: the temporaries
    one buffer each."""

    __slots__ = ()


def _arena_view(offset: int, nbytes: int, shape, dtype) -> Callable:
    def make(values, arena):
        return arena[offset : offset + nbytes].view(dtype).reshape(shape)

    return make


def _leaves(value) -> list:
    return [a for v in value for a in _leaves(v)] if isinstance(value, tuple) else [value]


def _copy_kept(value, kept: set):
    """`value` with every array whose memory is in `kept` copied (tuples element by element)."""
    if isinstance(value, tuple):
        return tuple(_copy_kept(v, kept) for v in value)
    return np.array(value, copy=True) if id(_root(value)) in kept else value


def _root(array: np.ndarray) -> np.ndarray:
    """The array that owns the memory of `array` (itself, or the base of a view)."""
    while isinstance(getattr(array, "base", None), np.ndarray):
        array = array.base
    return array
