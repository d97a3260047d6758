"""float32 matrix products split over the hand-off's threads (`handoff`), each part through
oneDNN's `dnnl_sgemm` on its thread, for the runtime's products of matrices from a few million
multiply-adds (`runtime.products.matmul`, `_splits`).

numpy's BLAS runs a product of a few million multiply-adds on threads of its own; handing a part
to one of xfuse's threads through the runtime's pool costs some 40-50 us, as much as a split
saves. The watching workers take a part for a few microseconds, but they run numba functions
only: `sgemm_part` is one, which calls oneDNN through the function's address (and OpenMP's
thread-count functions around it, as `runtime.onednn.sgemm` does, so that oneDNN never starts a
team). Its arguments are integers only (the operands' addresses, shapes and leading
dimensions), so one compiled overload serves every layout and it is cached on disk.

Measured on the AVX-512 Xeon of benchmarks/README.md (2 cores), 64x512 @ 512x1024, the
product of softmax_relu_64x512x1024: 212-230 us split so, against 254-292 us in OpenBLAS's two
threads and 255-272 us through oneDNN in the runtime's pool (one part alone on one thread: 195-205
us); the scanned RNN's 2048x256 @ 256x256 input product, 0.81-0.89 ms through the pool, saves
the pool's hand-off too.

A split needs the other core. Where another's thread keeps it, as OpenBLAS's do for about 0.12 s
after each of the user's own numpy products, products go to numpy's BLAS for a while (`_Route`):
a numpy 256x256 product alternating with softmax_relu 64x512x1024 took 450-520 us a pair so,
against 660-680 us split through a worker sharing its core.

A vector times a matrix, (1, K) @ (K, N), reads the matrix once and does one multiply-add per
float read: its time is the time to read the matrix. OpenBLAS's GEMV on its own two threads
read batch-1's 1x2048 @ 2048x1000 (8 MiB, from the shared cache) in 137-196 us here over an
hour, where two threads of numba's loops that only sum it read it in 117-146 us. So, on CPUs
whose kernels use 512-bit vectors (`gemm.ENABLED`), such a product is split by the matrix's
rows over the hand-off's threads (`sgemv_part`, no oneDNN in it), in blocks of rows of about
512 KiB, a thread an equal share of them: each block is summed into a row of its own, eight
rows of the matrix at a time, and those sums are added in order after, so the result is the
same whichever thread runs a block. A thread reads its blocks first to last at one call and
last to first at the next: the blocks it read last are still in its core's L2 (2 MiB) when the
next call begins, and are read from there. Batch-1's product took 115-118 us so, 156-162 us
with its blocks always in one order. Imports numba, numpy and llvmlite.
"""

from __future__ import annotations

import functools
import threading
import time

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from xfuse.runtime import onednn, parallel, products
from xfuse.runtime.parallel import in_worker
from xfuse.runtime.pool import MIN_BYTES, POOL

from . import gemm, handoff
from .cache import guarded

_F32 = np.dtype(np.float32)
_POOL_FLOATS = MIN_BYTES // 4  # a vector's sums from this many floats come from the runtime's pool
NOT = ord("N")  # an operand as it is; ord("T"): transposed
COLUMNS_UNIT = 16  # a part's columns start at a multiple of 16 floats (64 bytes)
ROWS_UNIT = 8


@intrinsic
def _sgemm_at(typingctx, address, transa, transb, m, n, k, a, lda, b, ldb, c, ldc):
    """dnnl_sgemm(transa, transb, m, n, k, 1, a, lda, b, ldb, 0, c, ldc) called at `address`
    (every argument an int64: the transposes as characters, the operands as addresses); its
    status. The characters go as 32-bit integers: under the x86-64 C calling convention a
    callee reads the low byte of the register, or, compiled by clang, the whole extended
    value, and both are the character."""

    def codegen(context, builder, signature, args):
        i64, i32, f32, i8p = ir.IntType(64), ir.IntType(32), ir.FloatType(), ir.IntType(8).as_pointer()
        fnty = ir.FunctionType(i32, [i32, i32, i64, i64, i64, f32, i8p, i64, i8p, i64, f32, i8p, i64])
        fn = builder.inttoptr(args[0], fnty.as_pointer())
        ta, tb, m_, n_, k_, a_, lda_, b_, ldb_, c_, ldc_ = args[1:]
        status = builder.call(fn, [builder.trunc(ta, i32), builder.trunc(tb, i32), m_, n_, k_, f32(1.0),
                                   builder.inttoptr(a_, i8p), lda_, builder.inttoptr(b_, i8p), ldb_, f32(0.0),
                                   builder.inttoptr(c_, i8p), ldc_])
        return builder.sext(status, i64)

    return types.int64(*[types.int64] * 12), codegen


@intrinsic
def _threads_to(typingctx, get_address, set_address, count):
    """OpenMP's thread count for this thread set to `count` through the functions at these
    addresses (`omp_get_max_threads`, `omp_set_num_threads`); the count before."""

    def codegen(context, builder, signature, args):
        i32 = ir.IntType(32)
        get = builder.inttoptr(args[0], ir.FunctionType(i32, []).as_pointer())
        put = builder.inttoptr(args[1], ir.FunctionType(ir.VoidType(), [i32]).as_pointer())
        before, count_ = builder.call(get, []), builder.trunc(args[2], i32)
        with builder.if_then(builder.icmp_signed("!=", before, count_)):
            builder.call(put, [count_])
        return builder.sext(before, ir.IntType(64))

    return types.int64(types.int64, types.int64, types.int64), codegen


@guarded
@numba.njit(nogil=True, cache=True)
def sgemm_part(start, end, sgemm, get_threads, set_threads, columns, m, n, k, ta, a, lda, tb, b, ldb, c, ldc):
    """c = a @ b (float32, row-major, c's rows contiguous) over the units [start, end) of c's
    columns (COLUMNS_UNIT each) or of its rows (ROWS_UNIT each), through oneDNN on this thread."""
    extent, unit = (n, COLUMNS_UNIT) if columns else (m, ROWS_UNIT)
    lo, hi = start * unit, min(end * unit, extent)
    if hi <= lo:
        return
    if columns:  # b's column j: one float on in its row (N), or a row of its own (T)
        b += lo * 4 * (1 if tb == NOT else ldb)
        c += lo * 4
        n = hi - lo
    else:
        a += lo * 4 * (lda if ta == NOT else 1)
        c += lo * 4 * ldc
        m = hi - lo
    before = _threads_to(get_threads, set_threads, 1)
    status = _sgemm_at(sgemm, ta, tb, m, n, k, a, lda, b, ldb, c, ldc)
    if before != 1:
        _threads_to(get_threads, set_threads, before)
    if status != 0:
        raise RuntimeError("dnnl_sgemm failed")


# A vector's blocks: each is about VECTOR_BLOCK_BYTES of the matrix's rows (at least
# VECTOR_BLOCK_ROWS of them), its sum a row of its own, summed eight rows of the matrix at a time
# (the loop below names eight: one load and store of the sum a step instead of eight; one row at
# a time took 260-280 us for batch-1's on two threads, four 141-149, eight 134-148).
VECTOR_BLOCK_BYTES = 1 << 19
VECTOR_BLOCK_ROWS = 64
VECTOR_ROWS = 8


@guarded
@numba.njit(nogil=True, cache=True, fastmath={"contract"}, error_model="numpy")
def sgemv_part(start, end, x, w, sums, block, units, backward):
    """The sums of x[rows] @ w[rows] (x: K floats, w: K x N) for the blocks of `block` rows of w
    in the units [start, end) of `units`, equal shares of the blocks in order: block g's into
    sums[g] (N floats). A unit runs its blocks last to first where `backward`."""
    k, n = w.shape
    blocks = sums.shape[0]
    for u in range(start, end):
        g0, g1 = blocks * u // units, blocks * (u + 1) // units
        for step in range(g1 - g0):
            g = g1 - 1 - step if backward else g0 + step
            y = sums[g]
            for j in range(n):
                y[j] = 0.0
            i, hi = g * block, min(k, (g + 1) * block)
            while i + VECTOR_ROWS <= hi:
                a0, a1, a2, a3 = x[i], x[i + 1], x[i + 2], x[i + 3]
                a4, a5, a6, a7 = x[i + 4], x[i + 5], x[i + 6], x[i + 7]
                w0, w1, w2, w3 = w[i], w[i + 1], w[i + 2], w[i + 3]
                w4, w5, w6, w7 = w[i + 4], w[i + 5], w[i + 6], w[i + 7]
                for j in range(n):
                    y[j] += ((a0 * w0[j] + a1 * w1[j]) + (a2 * w2[j] + a3 * w3[j])) \
                        + ((a4 * w4[j] + a5 * w5[j]) + (a6 * w6[j] + a7 * w7[j]))
                i += VECTOR_ROWS
            while i < hi:
                a0, w0 = x[i], w[i]
                for j in range(n):
                    y[j] += a0 * w0[j]
                i += 1


@guarded
@numba.njit(nogil=True, cache=True, error_model="numpy")
def _summed(out, sums):
    """out = the rows of `sums` added in order."""
    for j in range(out.shape[0]):
        out[j] = sums[0, j]
    for p in range(1, sums.shape[0]):
        row = sums[p]
        for j in range(out.shape[0]):
            out[j] += row[j]


_F32_1D, _F32_2D = types.Array(types.float32, 1, "C"), types.Array(types.float32, 2, "C")
_SIGNATURES = {sgemm_part: (types.int64,) * 17,
               sgemv_part: (types.int64, types.int64, _F32_1D, _F32_2D, _F32_2D, types.int64, types.int64,
                            types.int64)}
_splitters: dict = {}
_lock = threading.Lock()


def _split(fn) -> handoff.Splitter:
    """The hand-off's Splitter of `fn`, one of `_SIGNATURES`, compiled (or loaded from numba's
    cache) for its one overload the first time."""
    splitter = _splitters.get(fn)
    if splitter is None:
        with _lock:
            splitter = _splitters.get(fn)
            if splitter is None:
                fn.compile(_SIGNATURES[fn])
                fn.disable_compile()
                splitter = _splitters[fn] = handoff.Splitter(fn)
    return splitter


# Which way the products go. A worker of the hand-off's runs on the other core; where a thread
# of another's keeps that core (OpenBLAS's, spinning for about 0.12 s after each of the user's
# numpy products, at 2**28 cycles), the worker, or one of the runtime's pool, gets half of it:
# softmax_relu's 64x512 @ 512x1024 took 430-450 us so, against 270-280 us in OpenBLAS's own
# threads, the spinning one among them, and 212-233 us split with the other core free. So after
# MISSES of the last WINDOW splits whose worker never began its part (the caller took it back),
# products go to numpy's BLAS for `period` seconds; then the hand-off is tried again, its
# splits judged only once OpenBLAS's threads have stopped spinning after the last of them
# (SPIN_S): were that judged alone, OpenBLAS's own spinning would keep the products there. A
# trial that fails again doubles the period (to PERIOD_MAX_S); one that passes resets it.
WINDOW, MISSES = 8, 3
PERIOD_S, PERIOD_MAX_S = 0.25, 2.0
SPIN_S = 0.15
# Misses closer together than this count once: the OS running something else on the other core
# for a millisecond or so makes several at once; a spinning thread makes one at every call.
MISS_GAP_S = 0.002


class _Route:
    """The state of that choice (one per process; calls hold the GIL while they change it)."""

    def __init__(self) -> None:
        self.blas_until = 0.0  # perf_counter: products go to numpy's BLAS until then
        self.judged_from = 0.0  # splits from then on count (OpenBLAS's threads at rest)
        self.period = PERIOD_S
        self.trial = False  # the hand-off is on trial after a period in BLAS
        self.outcomes: list[bool] = []  # the last WINDOW judged splits: did a worker run its part
        self.missed = -1.0  # when the last miss counted

    def judge(self, ran: bool, now: float) -> None:
        if not ran:
            if now - self.missed < MISS_GAP_S:
                return  # the same stretch of the other core's being held: one miss
            self.missed = now
        self.outcomes = [*self.outcomes[1 - WINDOW:], ran]
        if self.outcomes.count(False) >= MISSES:
            if self.trial:
                self.period = min(2 * self.period, PERIOD_MAX_S)
            self.blas_until, self.trial, self.outcomes = now + self.period, True, []
        elif self.trial and len(self.outcomes) == WINDOW:
            self.trial, self.period = False, PERIOD_S


_route = _Route()


def _in_blas(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
    """out = a @ b in numpy's BLAS, on its own threads, as the runtime runs its products there."""
    parallel.quiet()  # no worker of xfuse's spinning beside them
    products.numpy_product(a, b, out)


@functools.cache
def enabled() -> bool:
    """Whether the numba backend splits products of matrices here: the hand-off is on, and
    oneDNN is preferred (the CPU has AVX-512, `onednn.preferred`) and installed."""
    return handoff.ENABLED and onednn.preferred() and onednn.installed()


def vectors_enabled() -> bool:
    """Whether it splits a vector times a matrix here (`sgemv_part`): the hand-off is on, and
    kernels use 512-bit vectors (`gemm.ENABLED`), where that was measured faster than BLAS."""
    return handoff.ENABLED and gemm.ENABLED


def _to_blas(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> float | None:
    """None where the route sends products to numpy's BLAS for now (`_Route`), having run this
    one there; else the time, for judging the split about to run."""
    now = time.perf_counter()
    if now < _route.blas_until:
        _route.judged_from = now + SPIN_S
        _in_blas(a, b, out)
        return None
    return now


def _handed(fn, args: tuple, units: int, now: float) -> bool:
    """fn split over `units` through the hand-off, the split judged for the route; False where
    the hand-off cannot split now."""
    served = handoff.served()
    if not _split(fn)(args, units):
        return False
    if now >= _route.judged_from:
        _route.judge(handoff.served() != served, now)
    return True


# Which way the next vector's units run their blocks. The part of the matrix a core read last
# is still in its L2 when the next call begins (2 MiB here): a call that starts where the one
# before ended reads that part from there. Batch-1's product took 115-118 us so, against
# 156-162 us with its blocks always in one order; the sums are the same either way.
_backward = 0


def vector_f32(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> bool:
    """out = a @ b for float32 (1, K) @ (K, N), split by the matrix's rows over the hand-off's
    threads (`sgemv_part`): blocks of about VECTOR_BLOCK_BYTES of its rows, a thread an equal
    share of them, each block summed into a row of its own, those sums added in order after
    (the same bits whichever thread runs a block, and in whichever order); a thread's blocks
    run first to last and last to first at alternate calls (`_backward`). False (nothing
    written) where that is not enabled here (`vectors_enabled`), the shapes do not fit, the
    result overlaps an operand or is not a row of contiguous floats, the vector is not
    contiguous floats or the matrix not C-ordered (the hand-off checks those two), or the
    hand-off cannot split now (one thread, or inside another split). Where the splits' workers
    have lately not taken their parts, numpy's BLAS runs it for a while (`_Route`). Its checks
    are few: after the product has streamed the matrix through the caches, each costs
    microseconds."""
    global _backward
    if in_worker() or a.dtype != _F32 or b.dtype != _F32 or out.dtype != _F32 or not vectors_enabled():
        return False
    k, n = b.shape if b.ndim == 2 else (0, 0)
    flags = out.flags
    if k == 0 or a.shape != (1, k) or out.shape != (1, n) or not flags.c_contiguous or not flags.writeable \
            or np.may_share_memory(out, a) or np.may_share_memory(out, b):
        return False
    units = parallel.num_threads()
    if units < 2:
        return False
    now = _to_blas(a, b, out)
    if now is None:
        return True
    block = max(VECTOR_BLOCK_ROWS, VECTOR_BLOCK_BYTES // (4 * n) // VECTOR_ROWS * VECTOR_ROWS)
    blocks = -(-k // block)
    sums = (np.empty if blocks * n < _POOL_FLOATS else POOL.empty)((blocks, n), _F32)
    _backward ^= 1
    if not _handed(sgemv_part, (a.reshape(-1), b, sums, block, units, _backward), units, now):
        return False
    _summed(out.reshape(-1), sums)
    return True


def split_f32(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> bool:
    """out = a @ b for float32 matrices (M, K) @ (K, N), M and N at least 2, split over the
    hand-off's threads by columns (or rows, where M > N), each part through oneDNN; False
    (nothing written) where oneDNN is not there, an operand is not one oneDNN reads (rows or
    columns of contiguous floats, `onednn.layout`; `out` rows), the result overlaps an operand,
    or the hand-off cannot split now (one thread, or inside another split). Where the splits'
    workers have lately not taken their parts, numpy's BLAS runs the product for a while
    (`_Route`)."""
    if in_worker():  # a part of a split already (a block of attention's, a part of a split loop)
        return False
    calls = onednn.addresses()
    if calls is None or a.dtype != _F32 or b.dtype != _F32 or out.dtype != _F32 or a.ndim != 2 \
            or b.ndim != 2 or out.ndim != 2 or not out.flags.writeable:
        return False
    m, k = a.shape
    n = b.shape[1]
    if m < 2 or n < 2 or k < 1 or b.shape[0] != k or out.shape != (m, n):
        return False
    ta, lda = onednn.layout(a)
    tb, ldb = onednn.layout(b)
    tc, ldc = onednn.layout(out)
    if ta is None or tb is None or tc != b"N" or np.may_share_memory(out, a) or np.may_share_memory(out, b):
        return False
    now = _to_blas(a, b, out)
    if now is None:
        return True
    columns = n >= m
    units = -(-n // COLUMNS_UNIT) if columns else -(-m // ROWS_UNIT)
    args = (*calls, int(columns), m, n, k, ord(ta), a.ctypes.data, lda, ord(tb), b.ctypes.data, ldb,
            out.ctypes.data, ldc)
    return _handed(sgemm_part, args, units, now)


__all__ = ["enabled", "sgemm_part", "sgemv_part", "split_f32", "vector_f32", "vectors_enabled"]
