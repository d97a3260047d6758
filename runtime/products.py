"""Products: a dot_general as BLAS matrix products (`dot_plan`, `make_dot`, `dot_run`), and
where they run (`matmul`): numpy's BLAS with its own threads, or xfuse's threads with BLAS on
one thread in each, a block of the batch, of the rows or of the columns each, through oneDNN
for large float32 products where it is installed and the CPU has AVX-512, or through a
backend's own products handed in (`BackendProducts`: the numba backend's `gemm_f32` on one
thread for those `kernel_gemm_takes`, and its `split_f32` over its own threads for the other
products of matrices from SPLIT_PRODUCT_MIN multiply-adds, `_splits`, and `vector_f32` for
vectors times matrices from VECTOR_SPLIT_MIN floats, `_vector_splits`). Also the dtypes
programs name (`dtype`, `compute_dtype`). Imports numpy and the standard library only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from . import blas, onednn
from .parallel import num_threads, quiet, run_rows

# A product run in xfuse's threads (`blas`) is split over them from this many multiply-adds
# (about 60 us on one core here, beside the 40-50 us of handing a block to a pool thread).
SPLIT_PRODUCT_MIN = 1 << 22
# From this many multiply-adds a float32 product runs in xfuse's threads through oneDNN (see
# `matmul`): smaller ones are faster in OpenBLAS's threads, which spin between calls
# (softmax_relu at 64x512 @ 512x1024, 2^25, took 0.96 ms with the bound at 2^24 against
# 0.51 ms), and oneDNN's first product in a process costs 10-50 ms of code generation.
ONEDNN_MIN = 1 << 26
# A vector times a matrix (M = 1) goes to a backend's split product of a vector from a matrix
# of this many floats, with at least VECTOR_SPLIT_SIDE rows and columns: the product reads the
# matrix once, and two threads of the numba backend's read it faster than OpenBLAS's GEMV on its
# own two from about 2 MiB (1024x512: 19-23 against 25 us; 512x512, 1 MiB, as fast), but not
# with few rows or columns (64x8192 18 against 17 us, 8192x64 36 against 32 us, 4096x128 27
# against 51 us; the AVX-512 Xeon of benchmarks/README.md).
VECTOR_SPLIT_MIN = 1 << 19
VECTOR_SPLIT_SIDE = 128
_F32 = np.dtype(np.float32)
HALF = ("float16", "bfloat16")


def dtype(name: str) -> np.dtype:
    """A numpy dtype from its name; bfloat16 through ml_dtypes, imported only when needed."""
    if name == "bfloat16":
        try:
            import ml_dtypes
        except ImportError:  # pragma: no cover - ml_dtypes comes with jax
            raise TypeError("bfloat16 arrays need the ml_dtypes package (pip install ml_dtypes)") from None
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def compute_dtype(name: str) -> np.dtype:
    """What a kernel computes a dtype in: f16 and bf16 in f32."""
    return np.dtype(np.float32) if name in HALF else dtype(name)


def dot_plan(lhs, rhs, contracting, batch):
    """Transposes that turn a dot_general into a batched matmul (B, M, K) @ (B, K, N)."""
    (lc, rc), (lb, rb) = contracting, batch
    lf = [i for i in range(len(lhs)) if i not in lc and i not in lb]
    rf = [i for i in range(len(rhs)) if i not in rc and i not in rb]
    size = lambda dims, axes: int(np.prod([dims[a] for a in axes])) if axes else 1  # noqa: E731
    b, m, k, n = size(lhs, lb), size(lhs, lf), size(lhs, lc), size(rhs, rf)
    return (list(lb) + lf + list(lc), (b, m, k)), (list(rb) + list(rc) + rf, (b, k, n)), (b, m, n)


def numpy_product(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
    """numpy's matmul: BLAS, with its own threads unless `blas.single_threaded`."""
    with np.errstate(all="ignore"):  # inf * 0 is NaN, as in XLA: no warning
        np.matmul(a, b, out=out)


# A product goes to a backend's own product for one thread (`BackendProducts.thread`) where its
# right side, B's K x N floats, is at most KERNEL_GEMM_B_MAX (128 KiB, in a core's L2 while
# every row tile reads it) with N at most KERNEL_GEMM_COLUMNS, and its left side has at least
# KERNEL_GEMM_ROWS rows.
# There the numba backend's took 0.82-0.95 of OpenBLAS's time on one thread at 64 columns (256
# or 1024 rows, K from 64 to 512) and 0.9-1.2 at 128 and 256, as fast within the spread of two
# runs; attention's eight heads of 256x64 @ (256x64)^T took 0.90-1.01 of it and of 256x256 @
# 256x64 0.81-0.85. Past 256 columns it took up to 1.37, and 8x256 @ 256x256 14 us against 10.
KERNEL_GEMM_B_MAX = 1 << 15
KERNEL_GEMM_COLUMNS = 256
KERNEL_GEMM_ROWS = 32


def _gemm_shape(m: int, k: int, n: int) -> bool:
    return m >= KERNEL_GEMM_ROWS and 16 <= n <= KERNEL_GEMM_COLUMNS and k * n <= KERNEL_GEMM_B_MAX


def kernel_gemm_takes(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether a product of these operands goes to a backend's product for one thread (see
    KERNEL_GEMM_B_MAX)."""
    return a.dtype == _F32 and b.dtype == _F32 and _gemm_shape(a.shape[-2], b.shape[-2], b.shape[-1])


class BackendProducts(NamedTuple):
    """A backend's own float32 products, each None where it has none. `thread(a3, b3, out3) ->
    bool`: a batch of products (G, M, K) @ (G, K, N) on the calling thread (`_gemm`, for those
    `kernel_gemm_takes`); `split(a, b, out) -> bool`: a product of matrices (M, K) @ (K, N)
    split over the backend's own threads (`matmul`, for those `_splits`); `vector(a, b, out) ->
    bool`: a vector times a matrix (1, K) @ (K, N) split over them (`make_dot`, for those
    `_vector_splits`). Each returns False, having written nothing, for operands it does not
    take."""

    thread: Callable | None = None
    split: Callable | None = None
    vector: Callable | None = None


def _gemm(a: np.ndarray, b: np.ndarray, out: np.ndarray, sgemm: Callable | None = None,
          thread: Callable | None = None) -> None:
    """One product on the calling thread: through `thread` (a backend's, see
    `BackendProducts`) where given and `kernel_gemm_takes`, else `sgemm` (oneDNN's) where given
    and it takes the operands, else numpy's."""
    if thread is not None and kernel_gemm_takes(a, b):
        a3, b3, o3 = (a, b, out) if a.ndim == 3 else (a[None], b[None], out[None])  # views, never copies
        if thread(a3, b3, o3):
            return
    if sgemm is None or not _each(sgemm, a, b, out):
        numpy_product(a, b, out)


def _each(sgemm: Callable, a: np.ndarray, b: np.ndarray, out: np.ndarray) -> bool:
    """sgemm on a matrix or a batch of one; False for a larger batch (oneDNN's set-up for each
    small matrix of attention's batches costs more than it gains: numpy loops over them in C)."""
    if a.ndim == 2:
        return sgemm(a, b, out)
    return a.shape[0] == 1 and sgemm(a[0], b[0], out[0])


def matmul(a3: np.ndarray, b3: np.ndarray, out: np.ndarray, work: np.dtype, own: bool = False,
           backend: BackendProducts | None = None) -> None:
    """out = a3 @ b3 over (B, M, K) @ (B, K, N), or (M, K) @ (K, N). `own`: in xfuse's
    threads, BLAS single-threaded (`blas`), a block of the batch, of the rows or of the columns
    each. BLAS packs the whole right side for each block of rows, and the whole left side for
    each block of columns: a product wider than it is tall (N > M) splits its columns, so the
    larger side is packed once (gelu's 256x1024 @ 1024x4096: 11.7-12.0 ms against 12.9-13.3 ms
    by rows, and 11.8 ms in OpenBLAS's own two threads).

    A float32 product of matrices (not vectors) with at least `ONEDNN_MIN` multiply-adds runs
    in xfuse's threads whatever `own` says, where `XFUSE_SPLIT_PRODUCTS` is not 0, each block
    through oneDNN on one thread where it is installed and preferred (`onednn.preferred`: the
    CPU has AVX-512), else through OpenBLAS on one thread: softmax_relu's 4096x256 @ 256x1024
    took 10.0-10.6 ms so on znver4, against 11.7-12.6 ms in OpenBLAS's two threads and
    11.4-11.9 ms in XLA's; on an AVX2 EPYC, gelu's 256x1024 @ 1024x4096 took 17.3-17.7 ms
    with OpenBLAS in each thread, 17.3-21.0 ms in OpenBLAS's two threads and 21-36 ms with
    oneDNN in each thread (separate processes). Where a product runs on one thread of xfuse's,
    the backend's own product for one thread (`backend.thread`, see `_gemm`) runs it where it
    takes the operands. A product of matrices from SPLIT_PRODUCT_MIN multiply-adds (`_splits`)
    goes to the backend's split product where it has one (`backend.split`), whatever `own`
    says."""
    if a3.dtype != work:
        a3, b3 = a3.astype(work), b3.astype(work)
    o = out.reshape(*a3.shape[:-1], b3.shape[-1])
    if _splits(a3.shape, b3.shape, work, backend):
        if backend.split(a3.reshape(a3.shape[-2:]), b3.reshape(b3.shape[-2:]), o.reshape(o.shape[-2:])):
            return
    thread = backend.thread if backend is not None else None
    m, n = a3.shape[-2], b3.shape[-1]
    macs = a3.size * n  # B * M * K * N
    big = blas.ENABLED and _large_float32(a3.shape, b3.shape, work)
    sgemm = onednn.sgemm() if big and onednn.preferred() else None
    if not own and not big:
        quiet()  # BLAS's own threads: none of xfuse's spinning beside them
        numpy_product(a3, b3, o)
        return
    with blas.single_threaded():
        if macs < SPLIT_PRODUCT_MIN:
            _gemm(a3, b3, o, None, thread)
        elif a3.ndim == 3 and a3.shape[0] >= num_threads():
            run_rows(lambda s, e: _gemm(a3[s:e], b3[s:e], o[s:e], sgemm, thread), a3.shape[0])
        elif m > 1 and n > m:
            run_rows(lambda s, e: _gemm(a3, b3[..., s:e], o[..., s:e], sgemm, thread), n)
        elif a3.ndim == 3 and m > 1:
            run_rows(lambda s, e: _gemm(a3[:, s:e], b3, o[:, s:e], sgemm, thread), m)
        elif m > 1:
            run_rows(lambda s, e: _gemm(a3[s:e], b3, o[s:e], sgemm, thread), m)
        else:  # a vector times a matrix: one thread
            _gemm(a3, b3, o, None, thread)


def _float32_one(lshape, work: np.dtype) -> bool:
    """Whether a product with a left side of this shape may go to a backend's split products:
    float32, one product (no batch, or a batch of one), and XFUSE_SPLIT_PRODUCTS not 0."""
    return work == _F32 and blas.ENABLED and (len(lshape) != 3 or lshape[0] == 1)


def _splits(lshape, rshape, work: np.dtype, backend: BackendProducts | None) -> bool:
    """Whether a product of these (B, M, K) and (B, K, N) shapes, or (M, K) and (K, N), goes to
    the backend's split product (`BackendProducts.split`), where XFUSE_SPLIT_PRODUCTS is not 0:
    float32 matrices (a batch of one) with at least SPLIT_PRODUCT_MIN multiply-adds, not one the
    backend's product for one thread takes (`kernel_gemm_takes`); large ones too: the runtime's
    pool would take 40-50 us more to hand a part over (the scanned RNN's 2048x256 @ 256x256
    input product, 0.8 ms)."""
    if backend is None or backend.split is None or not _float32_one(lshape, work):
        return False
    m, k, n = lshape[-2], lshape[-1], rshape[-1]
    return m > 1 and n > 1 and SPLIT_PRODUCT_MIN <= m * k * n \
        and not (backend.thread is not None and _gemm_shape(m, k, n))


def _vector_splits(lshape, rshape, work: np.dtype, backend: BackendProducts | None) -> bool:
    """Whether a product of these (B, 1, K) and (B, K, N) shapes (a batch of one), or (1, K) and
    (K, N), goes to the backend's split product of a vector (`BackendProducts.vector`), where
    XFUSE_SPLIT_PRODUCTS is not 0: float32, a matrix of at least VECTOR_SPLIT_MIN floats and
    VECTOR_SPLIT_SIDE rows and columns."""
    if backend is None or backend.vector is None or not _float32_one(lshape, work):
        return False
    k, n = lshape[-1], rshape[-1]
    return lshape[-2] == 1 and min(k, n) >= VECTOR_SPLIT_SIDE and k * n >= VECTOR_SPLIT_MIN


def apart(lshape, rshape, work: np.dtype, backend: BackendProducts | None) -> bool:
    """Whether a product of these shapes runs apart from BLAS's own threads whatever `own` says
    (`matmul`, `make_dot`): split over xfuse's threads (`_large_float32`) or the backend's
    (`_splits`, `_vector_splits`)."""
    return blas.ENABLED and _large_float32(lshape, rshape, work) or _splits(lshape, rshape, work, backend) \
        or _vector_splits(lshape, rshape, work, backend)


def _large_float32(lshape, rshape, work: np.dtype) -> bool:
    """Whether a product of these (B, M, K) and (B, K, N) shapes, or (M, K) and (K, N), is a
    float32 product of matrices with at least `ONEDNN_MIN` multiply-adds: one `matmul` runs in
    xfuse's threads whatever its caller says (where XFUSE_SPLIT_PRODUCTS allows)."""
    return work == _F32 and lshape[-2] > 1 and int(np.prod(lshape)) * rshape[-1] >= ONEDNN_MIN


def make_dot(lhs, rhs, contracting, batch, out_dtype: str, own: bool = False,
             backend: BackendProducts | None = None) -> Callable:
    """dot(lhs, rhs, out) for arrays of these dims (out: the result's dims, contiguous). A
    transpose that moves nothing is skipped, and with no batch the product is a 2-D one: a
    small product in a loop body pays little besides BLAS. `own`: see `matmul`, whose choice is
    made here for a product it would hand to numpy as it is (`_numpy_dot`). `backend`: the
    backend's own products (`BackendProducts`)."""
    (lperm, lshape), (rperm, rshape), _ = dot_plan(lhs, rhs, contracting, batch)
    work = compute_dtype(out_dtype)
    if lshape[0] == 1:
        lshape, rshape = lshape[1:], rshape[1:]
    lt = None if lperm == sorted(lperm) else tuple(lperm)
    rt = None if rperm == sorted(rperm) else tuple(rperm)
    if lt is None and rt is None:
        if _vector_splits(lshape, rshape, work, backend):
            return _vector_dot(lshape[-1], rshape[-1], work, own, backend)
        if not own and not apart(lshape, rshape, work, backend):
            return _numpy_dot(lshape, rshape, work)

    def dot(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
        a = a.reshape(lshape) if lt is None else a.transpose(lt).reshape(lshape)
        b = b.reshape(rshape) if rt is None else b.transpose(rt).reshape(rshape)
        matmul(a, b, out, work, own, backend)

    return dot


def _vector_dot(k: int, n: int, work: np.dtype, own: bool, backend: BackendProducts) -> Callable:
    """dot(a, b, out) for a vector times a matrix that the backend splits (`_vector_splits`),
    handed to it straight; `matmul` where it declines."""
    vector = backend.vector

    def dot(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
        a, b, out = a.reshape(1, k), b.reshape(k, n), out.reshape(1, n)
        if not vector(a, b, out):
            matmul(a, b, out, work, own, backend)

    return dot


def _numpy_dot(lshape: tuple, rshape: tuple, work: np.dtype) -> Callable:
    """dot(a, b, out) for a product `matmul` would hand to numpy's BLAS as it is (not in
    xfuse's threads, below oneDNN's bound), that choice made here once: its tests cost some
    4 us a call, against batch-1's product of about 100 us."""
    oshape = (*lshape[:-1], rshape[-1])

    def dot(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
        a, b = a.reshape(lshape), b.reshape(rshape)
        if a.dtype != work or b.dtype != work:
            a, b = a.astype(work, copy=False), b.astype(work, copy=False)
        quiet()
        numpy_product(a, b, out.reshape(oshape))

    return dot


def dot_run(step: dict, own: bool = False, backend: BackendProducts | None = None) -> Callable:
    fn = make_dot(step["lhs"], step["rhs"], step["contracting"], step["batch"], step["dtype"], own, backend)
    work, target = compute_dtype(step["dtype"]), dtype(step["dtype"])
    dims = tuple(step["dims"])

    def run(inputs, outputs):
        if work == target:
            fn(inputs[0], inputs[1], outputs[0])
        else:
            tmp = np.empty(dims, work)
            fn(inputs[0], inputs[1], tmp)
            narrow(outputs[0], tmp)

    return run


def block_products(d: dict, lhs_axis: int, rhs_axis: int | None, own: bool,
                   backend: BackendProducts | None = None) -> Callable[[int], Callable]:
    """product(count): `make_dot` for a block of `count` rows of the dot `d`, its left operand
    cut along `lhs_axis` and its right one along `rhs_axis` (None: whole), made once per count:
    planning the transposes again for every block cost more than a small block's product
    (30-50 us against 60 us)."""
    made: dict[int, Callable] = {}

    def product(count: int) -> Callable:
        fn = made.get(count)
        if fn is None:
            lhs, rhs = list(d["lhs"]), list(d["rhs"])
            lhs[lhs_axis] = count
            if rhs_axis is not None:
                rhs[rhs_axis] = count
            fn = made[count] = make_dot(lhs, rhs, d["contracting"], d["batch"], d["dtype"], own, backend)
        return fn

    return product


def cut_rows(array: np.ndarray, axis: int, start: int, end: int) -> np.ndarray:
    """array[start:end] along `axis` (a view)."""
    index = [slice(None)] * array.ndim
    index[axis] = slice(start, end)
    return array[tuple(index)]


def macs(d: dict) -> int:
    """The multiply-adds of a dot step's (or an output fusion's dot's) product."""
    (_, (b, m, k)), (_, (_, _, n)), _ = dot_plan(d["lhs"], d["rhs"], d["contracting"], d["batch"])
    return b * m * k * n


def narrow(out: np.ndarray, wide: np.ndarray) -> None:
    """f32 results into an f16/bf16 output: rounding to nearest, overflow to inf as in XLA."""
    with np.errstate(over="ignore"):
        out[...] = wide.reshape(out.shape).astype(out.dtype)


__all__ = ["BackendProducts", "HALF", "KERNEL_GEMM_B_MAX", "KERNEL_GEMM_COLUMNS", "KERNEL_GEMM_ROWS", "ONEDNN_MIN",
           "SPLIT_PRODUCT_MIN", "VECTOR_SPLIT_MIN", "VECTOR_SPLIT_SIDE", "apart", "block_products", "compute_dtype",
           "cut_rows", "dot_plan", "dot_run", "dtype", "kernel_gemm_takes", "macs", "make_dot", "matmul", "narrow",
           "numpy_product"]
