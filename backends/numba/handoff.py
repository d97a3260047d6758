"""Handing a split kernel's chunks to threads that wait without the GIL.

The runtime's pool (`xfuse.runtime.parallel`) hands a chunk to a Python thread: the OS wakes
the thread, which then waits for the GIL, which the caller holds to start its own chunk, and
the OS wakes it again. That costs some 40 us a split, so kernels under about 100 us of work
ran on one thread. Here each worker thread, after a chunk, stays in a numba function without
the GIL for `SPIN_US`, watching its control row with `pause`. A caller that finds it there
claims it with a compare-and-swap, writes the chunk's arguments (the words numba passes a
function: an array is its meminfo, parent, size, item size, data pointer, shape and strides)
and a sequence number, runs its own chunk, and watches for the worker's answer, all in one
call of a numba function, never touching the GIL between. A worker asleep (it stopped
watching) is claimed the same way and woken through its queue: that hand-off is as slow as the
pool's, once, and the worker watches again after the chunk. Through xfuse's program, on 2
cores: the tanh/sigmoid chain over 2**16 floats 28-32 us split against 38-44 us on one
thread; x * 2 + 1 over 2**18 floats 29-31 against 53-55 us; row sums over 4096x256, 55-60 us
against 82-89 us through the pool.

Waiting never holds a core another thread needs for long. A caller whose own chunk is done
takes back a worker's chunk the worker has not begun by then (a worker still waking, or one
the OS runs on the caller's own core, as it did for the first 20-100 calls of some
processes here: those calls took 1.5x one thread's time before this rule, and now at most
about one thread's); it waits for one that has begun with sched_yield every `GIVE_WAY_US`;
and a watching worker that finds itself taken off its core for a while stops watching.

Kernels of middling work (a step's "watching", `analysis.WATCHING_MIN_WORK`) split only over
workers already watching: the caller runs the chunks of those asleep itself, and wakes them
only in a run of calls (`BURST_US`). Spinning threads take cores from other threads: numpy's
BLAS runs products on threads of its own, so xfuse's products there first ask the workers to
rest (`parallel.quiet`), and the runtime does not split middling kernels in programs whose
products run on those threads (OpenBLAS's spin in turn, for a while after each product).

The worker calls the kernel's machine code directly through numba's calling convention (the
status it returns, the exception slot, then the words): a `Splitter` checks, once per
overload, that every word is an integer or a pointer (`_overload_plan`), and for each call
that the arrays are what the overload was compiled for (dtype, rank, layout, alignment). Where
anything does not fit (another overload would be compiled, a scalar float argument, more than
`MAX_WORDS` words, a split inside a chunk, one thread, another thread of the user's splitting
at the same time) it says so and the caller uses the runtime's pool. A chunk that raised
reports a status: the caller runs that chunk again through the dispatcher, which raises the
exception with its traceback.

Each control row is 128 bytes of int64s (two cache lines: the caller's fields, then the
worker's). State: AWAY (not watching, asleep on its queue or about to be), WATCHING, CLAIMED
(a caller owns the worker until it answers). Only the worker moves WATCHING to AWAY, by
compare-and-swap, so a caller that claimed it first is always served. A forked child makes
its own workers (the parent's threads are not in it). `XFUSE_HANDOFF=0` turns this off.
"""

from __future__ import annotations

import ctypes
import os
import platform
import threading
import time
from _queue import SimpleQueue

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.core.registry import cpu_target
from numba.extending import intrinsic
from numba.np.arrayobj import make_array
from numba.np.numpy_support import as_dtype

from xfuse.runtime import parallel

from .cache import guarded

# How long a worker watches for the next chunk after one, in microseconds: back-to-back calls
# of a split kernel find it watching; a worker idle longer sleeps and costs nothing.
SPIN_US = float(os.environ.get("XFUSE_SPIN_US", 100))
# A kernel split only where workers watch (`Splitter`'s `watching`) wakes those asleep only when
# the last split ended less than this long ago, in a run of calls: a lone call pays no wake-up,
# and wakes no worker to spin beside what the program does next (the 2**16 chain then a numpy
# 256x256 product, in a loop: 247-251 us a pair with the worker woken at each call, 192-200 us
# without, 185-218 us with no hand-off at all).
BURST_US = SPIN_US
# A watching worker that finds this long gone between two looks at its row was taken off its
# core for another thread, and stops watching; waiting threads call sched_yield this often.
GIVE_WAY_US = 20.0
# XFUSE_HANDOFF=0: split kernels through the runtime's pool alone; so elsewhere than on x86-64
# (`pause`, and the calling convention `_call` relies on, were checked there).
ENABLED = os.environ.get("XFUSE_HANDOFF", "1") != "0" and platform.machine().lower() in ("x86_64", "amd64")
MAX_WORDS = 64
ROW = 16  # int64s a control row
# a control row's fields: the caller's line, then the worker's
JOB, STATE, ADDR, WAKING, REST, TAKEN = 0, 1, 2, 4, 5, 6
DONE, STATUS, RAN = 8, 9, 10
AWAY, WATCHING, CLAIMED = 0, 1, 2
QUIT = -1
RETURNED, RETURNED_NONE = 0, -2  # numba's status of a function that returned (a value, or None)
_ARRAY_FIELDS = ("meminfo", "parent", "nitems", "itemsize", "data", "shape", "strides")


# ---------------------------------------------------------------------------- intrinsics
def _element(context, builder, arrty, arr, index):
    return builder.gep(make_array(arrty)(context, builder, arr).data, [index])


@intrinsic
def _pause(typingctx):
    def codegen(context, builder, signature, args):
        fnty = ir.FunctionType(ir.VoidType(), [])
        builder.call(builder.module.declare_intrinsic("llvm.x86.sse2.pause", fnty=fnty), [])
        return context.get_dummy_value()

    return types.none(), codegen


@intrinsic
def _cycles(typingctx):
    def codegen(context, builder, signature, args):
        fnty = ir.FunctionType(ir.IntType(64), [])
        return builder.call(builder.module.declare_intrinsic("llvm.readcyclecounter", fnty=fnty), [])

    return types.int64(), codegen


@intrinsic
def _load(typingctx, arr, index):
    def codegen(context, builder, signature, args):
        return builder.load_atomic(_element(context, builder, signature.args[0], *args), "acquire", 8)

    return types.int64(arr, index), codegen


@intrinsic
def _store(typingctx, arr, index, value):
    def codegen(context, builder, signature, args):
        builder.store_atomic(args[2], _element(context, builder, signature.args[0], args[0], args[1]), "release", 8)
        return context.get_dummy_value()

    return types.none(arr, index, value), codegen


@intrinsic
def _swap(typingctx, arr, index, old, new):
    """Compare-and-swap of arr[index] from old to new; whether it swapped."""

    def codegen(context, builder, signature, args):
        pointer = _element(context, builder, signature.args[0], args[0], args[1])
        return builder.extract_value(builder.cmpxchg(pointer, args[2], args[3], "seq_cst", "seq_cst"), 1)

    return types.boolean(arr, index, old, new), codegen


@intrinsic
def _call(typingctx, address, words, base):
    """Calls the numba function at `address` with words[base:base + MAX_WORDS] as its
    arguments, through numba's calling convention, and returns its status. The function takes
    its first few words (each an integer or a pointer) and ignores the rest: under the C
    calling conventions of x86-64 the caller places integer arguments in order, in registers
    then on its own stack, and removes them itself, so trailing ones the callee does not
    declare are never read. One call for any count of words keeps this a small function to
    compile (a call for each count, to 64, took 1.8 s)."""

    def codegen(context, builder, signature, args):
        i64, i32, i8p = ir.IntType(64), ir.IntType(32), ir.IntType(8).as_pointer()
        addr, arr, start = args
        data = make_array(signature.args[1])(context, builder, arr).data
        ret = builder.alloca(i64, name="ret")
        builder.store(i64(0), ret)
        exc = builder.alloca(i8p, name="excinfo")
        builder.store(i8p(None), exc)
        fnty = ir.FunctionType(i32, [i8p, i8p.as_pointer()] + [i64] * MAX_WORDS)
        fn = builder.inttoptr(addr, fnty.as_pointer())
        words = [builder.load(builder.gep(data, [builder.add(start, i64(j))])) for j in range(MAX_WORDS)]
        return builder.sext(builder.call(fn, [builder.bitcast(ret, i8p), exc] + words), i64)

    return types.int64(address, words, base), codegen


@intrinsic
def _call_c(typingctx, address):
    """Calls the C function at `address` (no arguments; its int result is dropped)."""

    def codegen(context, builder, signature, args):
        fnty = ir.FunctionType(ir.IntType(32), [])
        builder.call(builder.inttoptr(args[0], fnty.as_pointer()), [])
        return context.get_dummy_value()

    return types.none(address), codegen


# ---------------------------------------------------------------------------- the loops
# A pool of `count` workers keeps everything in one int64 array (one argument to pass): the
# control rows, then count + 1 rows of words (the caller's last), then the chunks' statuses,
# then how each worker was claimed.
@numba.njit(inline="always")
def _words_at(count, row):
    return count * ROW + row * MAX_WORDS


@numba.njit(inline="always")
def _status_at(count):
    return count * ROW + (count + 1) * MAX_WORDS


@guarded
@numba.njit(nogil=True, cache=True)
def _watch(state, count, row, spin, give_way, yield_at):
    """A worker's loop: run each chunk posted on its control row, then watch `spin` cycles for
    the next; leaves once it has set itself AWAY (or is told to quit). A worker that finds
    `give_way` cycles gone between two looks was taken off its core for another thread (one
    the OS put on the same core, the caller's perhaps): it stops watching rather than take
    that core by turns. Every `give_way` cycles it also calls sched_yield (at `yield_at`, 0:
    none), so a thread waiting for its core gets it at once."""
    base = row * ROW
    _store(state, base + WAKING, 0)  # woken: a caller that finds it away again wakes it again
    _store(state, base + REST, 0)  # a rest asked for before is over
    _swap(state, base + STATE, AWAY, WATCHING)  # watching, unless a caller has claimed it already
    deadline = _cycles() + spin
    last = _cycles()
    turn = last + give_way
    while True:
        job = _load(state, base + JOB)
        if job != _load(state, base + DONE):
            if job == QUIT:
                return
            if _swap(state, base + TAKEN, 0, 1):  # not taken back by the caller
                status = _call(_load(state, base + ADDR), state, _words_at(count, row))
                _store(state, base + STATUS, status)
                _store(state, base + RAN, _load(state, base + RAN) + 1)
            _store(state, base + STATE, WATCHING)  # watching again, before the caller hears
            _store(state, base + DONE, job)
            deadline = _cycles() + spin
            last = _cycles()
            turn = last + give_way
            continue
        _pause()
        now = _cycles()
        # time up, asked to rest, or taken off its core meanwhile
        if now > deadline or _load(state, base + REST) != 0 or now - last > give_way:
            if _swap(state, base + STATE, WATCHING, AWAY):
                return
            deadline = now + spin  # claimed meanwhile: its chunk is on the way
        if now > turn and yield_at != 0:
            _call_c(yield_at)
            now = _cycles()
            turn = now + give_way
        last = now


@guarded
@numba.njit(nogil=True, cache=True)
def _split(state, count, workers, address, words, first, rows, watching, give_way, yield_at, patience):
    """Hands chunks of [first, first + rows) of the function at `address` to `workers`
    workers, taking the first itself (the caller's row of words holds `words` words, the row
    bounds to be filled in). How each worker was taken goes to its place after the statuses:
    1, watching: claimed and its chunk posted; 2, asleep: the same, but it must be woken; 0,
    claimed by another caller, or asleep when only `watching` workers are to be taken (1:
    left asleep, 2: woken): this caller runs its chunk; 3, the same, asleep: woken to watch
    for the next call. Where any is to be woken, returns how many (wake them, then call
    `_finish`); else runs `_finish` and returns minus the number of chunks that failed."""
    threads = workers + 1
    mine = _status_at(count) + count + 1
    me = _words_at(count, count)
    state[me] = first
    state[me + 1] = first + rows // threads
    woken = 0
    for w in range(workers):
        at = _words_at(count, w)
        for j in range(2, words):
            state[at + j] = state[me + j]
        state[at] = first + rows * (w + 1) // threads
        state[at + 1] = first + rows * (w + 2) // threads
        base = w * ROW
        state[mine + w] = 0
        if _swap(state, base + STATE, WATCHING, CLAIMED):
            state[mine + w] = 1
        elif watching:  # asleep (or leaving): woken to watch if asked, unless a wake is on its way
            if watching == 2 and _load(state, base + STATE) == AWAY and _swap(state, base + WAKING, 0, 1):
                state[mine + w] = 3
                woken += 1
            continue
        elif _swap(state, base + STATE, AWAY, CLAIMED):  # asleep: claimed, and woken unless a wake is on its way
            if _swap(state, base + WAKING, 0, 1):
                state[mine + w] = 2
                woken += 1
            else:
                state[mine + w] = 1
        else:
            continue
        state[base + ADDR] = address
        state[base + TAKEN] = 0
        # the next number after the last job posted, not after the last one answered: a worker
        # answering a job taken back from it turns WATCHING before it writes DONE
        _store(state, base + JOB, _load(state, base + JOB) + 1)
    if woken:
        return woken
    return -_finish(state, count, workers, address, give_way, yield_at, patience)


@guarded
@numba.njit(nogil=True, cache=True)
def _finish(state, count, workers, address, give_way, yield_at, patience):
    """Runs the caller's chunk and those of workers not claimed, then waits for the claimed
    ones; each chunk's status (numba's: 0 or -2 when it returned) goes to its place. Returns
    how many failed."""
    status, mine = _status_at(count), _status_at(count) + count + 1
    began = _cycles()
    state[status + count] = _call(address, state, _words_at(count, count))
    took = _cycles() - began
    for w in range(workers):
        if state[mine + w] == 0 or state[mine + w] == 3:
            state[status + w] = _call(address, state, _words_at(count, w))
    for w in range(workers):
        if state[mine + w] == 1 or state[mine + w] == 2:
            base = w * ROW
            # A worker that has not begun its chunk by the time the caller's took (a worker
            # still waking, or one the OS runs on the caller's own core), or `patience` cycles
            # if longer, gets it taken back: the caller never waits on a thread not running.
            deadline = _cycles() + max(took, patience)
            while _load(state, base + TAKEN) == 0 and _cycles() < deadline:
                _pause()
            if _swap(state, base + TAKEN, 0, 2):
                state[status + w] = _call(address, state, _words_at(count, w))
                continue  # the worker hears of it later, and is claimed again once it has
            job = _load(state, base + JOB)
            turn = _cycles() + give_way
            while _load(state, base + DONE) != job:
                _pause()
                if yield_at != 0 and _cycles() > turn:  # the worker may be waiting for this core
                    _call_c(yield_at)
                    turn = _cycles() + give_way
            state[status + w] = _load(state, base + STATUS)
    failed = 0
    for w in range(count + 1):
        if (w < workers or w == count) and state[status + w] != RETURNED and state[status + w] != RETURNED_NONE:
            failed += 1
    return failed


@guarded
@numba.njit(nogil=True, cache=True)
def _cycles_now():
    return _cycles()


# ---------------------------------------------------------------------------- the workers
class _Workers:
    def __init__(self, count: int) -> None:
        self.count = count
        # the layout `_words_at` and `_status_at` spell for the numba loops
        self.state = np.zeros(count * ROW + (count + 1) * MAX_WORDS + 2 * count + 1, np.int64)
        self.words = self.state[count * ROW:count * ROW + (count + 1) * MAX_WORDS].reshape(count + 1, MAX_WORDS)
        self.status = self.state[count * ROW + (count + 1) * MAX_WORDS:][:count + 1]
        self.mine = self.state[-count:]  # how each worker was taken (`_split`)
        self.lock = threading.Lock()  # one caller at a time uses the words and statuses
        self.last = 0.0  # when the last split through them ended (perf_counter)
        self.wake = [SimpleQueue() for _ in range(count)]
        self.spin, self.give_way = _cycles_in(SPIN_US), _cycles_in(GIVE_WAY_US)
        self.patience = 0  # cycles a caller waits at least for a worker to begin its chunk
        _watch(np.array([QUIT] + [0] * (ROW - 1), np.int64), 1, 0, 0, 0, 0)  # compiled here
        for w in range(count):
            threading.Thread(target=self._serve, args=(w,), name=f"xfuse-handoff-{w}", daemon=True).start()

    def _serve(self, row: int) -> None:
        while self.wake[row].get() is not None:
            _watch(self.state, self.count, row, self.spin, self.give_way, _YIELD)

    def close(self) -> None:
        """The workers leave (once no split is running through them); later splits find the
        lock taken and go to the runtime's pool."""
        self.lock.acquire()
        for w in range(self.count):
            self.state[w * ROW + JOB] = QUIT  # a watching worker leaves
            self.wake[w].put(None)  # a sleeping one too


_workers: _Workers | None = None
_workers_lock = threading.Lock()
_rate: list[float] = []  # the cycle counter's ticks a second, once measured


def _cycles_in(us: float) -> int:
    """`us` microseconds in the cycle counter's ticks (its rate measured once, over 2 ms)."""
    if not _rate:
        _cycles_now()  # compiled (or loaded) before it is timed
        t0, c0 = time.perf_counter(), _cycles_now()
        while time.perf_counter() - t0 < 0.002:
            pass
        _rate.append((_cycles_now() - c0) / (time.perf_counter() - t0))
    return int(_rate[0] * us * 1e-6)


def _sched_yield() -> int:
    """The address of the C library's sched_yield (0 where there is none)."""
    try:
        return ctypes.cast(ctypes.CDLL(None).sched_yield, ctypes.c_void_p).value or 0
    except (OSError, AttributeError):
        return 0


_YIELD = _sched_yield()


def _get_workers(count: int) -> _Workers:
    global _workers
    pool = _workers
    if pool is not None and pool.count == count:
        return pool
    with _workers_lock:
        if _workers is None or _workers.count != count:
            if _workers is not None:
                _workers.close()
            _workers = _Workers(count)
        return _workers


def rest() -> None:
    """Workers watching stop (`parallel.quiet`: BLAS is about to run on its own threads)."""
    pool = _workers
    if pool is not None:
        state = pool.state
        for w in range(pool.count):
            if state[w * ROW + STATE] == WATCHING:
                state[w * ROW + REST] = 1


parallel.on_quiet(rest)


def served() -> int:
    """How many chunks this process's workers have run."""
    pool = _workers
    return 0 if pool is None else sum(int(pool.state[w * ROW + RAN]) for w in range(pool.count))


def _after_fork_in_child() -> None:
    global _workers, _workers_lock
    _workers, _workers_lock = None, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


# ---------------------------------------------------------------------------- kernels
def _overload_plan(fn, signature) -> tuple[int, list, int] | None:
    """(address, checks, words) for calling the overload of `fn` for `signature` through `_call`, or
    None where a word would not be an integer or a pointer (or numba's convention is not the
    one this module knows). checks: per argument, None (an int64) or the array type's
    (dtype, ndim, layout); words: how many it takes."""
    context = cpu_target.target_context
    if type(context.call_conv).__name__ != "CPUCallConv":
        return None
    result = fn.overloads.get(signature)
    if result is None:
        return None
    fnty = context.call_conv.get_function_type(result.fndesc.restype, result.fndesc.argtypes)
    params = fnty.args[2:]
    if len(params) > MAX_WORDS or any(
            not isinstance(p, ir.PointerType) and not (isinstance(p, ir.IntType) and p.width == 64) for p in params):
        return None
    checks = []
    for ty in signature:
        if isinstance(ty, types.Integer) and ty.bitwidth == 64:
            checks.append(None)
        elif isinstance(ty, types.Array) and ty.aligned:
            if tuple(context.data_model_manager[ty]._fields) != _ARRAY_FIELDS:
                return None
            checks.append((as_dtype(ty.dtype), ty.ndim, ty.layout))
        else:
            return None
    address = result.library.get_pointer_to_function(result.fndesc.llvm_func_name)
    return (address, checks, len(params)) if address else None


@guarded
@numba.njit(nogil=True, cache=True)
def _array_words(state, at, a):
    """An array's words as numba passes it (meminfo and parent none) into state[at:]."""
    state[at] = 0
    state[at + 1] = 0
    state[at + 2] = a.size
    state[at + 3] = a.itemsize
    state[at + 4] = a.ctypes.data
    for i in range(a.ndim):
        state[at + 5 + i] = a.shape[i]
        state[at + 5 + a.ndim + i] = a.strides[i]


def _fill_words(row: np.ndarray, at: int, args: tuple, checks: list) -> bool:
    """Writes the words of `args` (those after the two row bounds) into row[at:], for an
    overload whose checks these are; False where an argument is not what it was compiled
    for."""
    for a, check in zip(args, checks):
        if check is None:
            if type(a) is not int:
                return False
            row[at] = a
            at += 1
            continue
        dtype, ndim, layout = check
        if type(a) is not np.ndarray or a.ndim != ndim or a.dtype != dtype:
            return False
        flags = a.flags
        if not flags.aligned or layout == "C" and not flags.c_contiguous or layout == "F" and not flags.f_contiguous:
            return False
        _array_words(row, at, a)
        at += 5 + 2 * ndim
    return True


class Splitter:
    """split(args, rows, first, watching): runs `fn(start, end, *args)` over [first, first +
    rows), a chunk per thread, through the workers (`watching`: only those watching, the
    caller runs the others' chunks and wakes them for the next call); False (nothing run)
    where it cannot (see the module's docstring) and the caller should use the runtime's
    pool."""

    __slots__ = ("fn", "plan")

    def __init__(self, fn) -> None:
        self.fn = fn
        self.plan = None  # _overload_plan of fn's one overload, worked out once

    def __call__(self, args: tuple, rows: int, first: int = 0, watching: bool = False) -> bool:
        overloads = self.fn.overloads
        if len(overloads) != 1 or parallel.in_worker():
            return False
        available = parallel.num_threads()
        threads = min(available, rows)
        if threads <= 1:
            return False
        plan = self.plan
        if plan is None:
            plan = self.plan = _overload_plan(self.fn, next(iter(overloads))) or ()
        if not plan or len(plan[1]) != len(args) + 2:
            return False
        address, checks, count = plan
        pool = _get_workers(available - 1)
        if not pool.lock.acquire(blocking=False):  # another thread of the user's is splitting
            return False
        try:
            if not _fill_words(pool.words[pool.count], 2, args, checks[2:]):  # the caller's row
                return False
            workers = threads - 1
            mode = 0  # watching: wake the workers asleep only in a run of calls (see BURST_US)
            if watching:
                mode = 2 if time.perf_counter() - pool.last < BURST_US * 1e-6 else 1
            answer = _split(pool.state, pool.count, workers, address, count, first, rows, mode, pool.give_way,
                            _YIELD, pool.patience)
            if answer > 0:  # workers asleep: woken, then the chunks run
                for w in range(workers):
                    if pool.mine[w] >= 2:
                        pool.wake[w].put(True)
                answer = -_finish(pool.state, pool.count, workers, address, pool.give_way, _YIELD, pool.patience)
            pool.last = time.perf_counter()
            failed = []
            if answer:
                failed = [(int(pool.words[w, 0]), int(pool.words[w, 1])) for w in (*range(workers), pool.count)
                          if pool.status[w] not in (RETURNED, RETURNED_NONE)]
        finally:
            pool.lock.release()
        for start, end in failed:  # the dispatcher raises what the chunk raised
            self.fn(start, end, *args)
        if failed:
            raise RuntimeError(f"a chunk of {self.fn.__name__} failed ({failed}) and did not fail again")
        return True


__all__ = ["ENABLED", "SPIN_US", "Splitter", "served"]
