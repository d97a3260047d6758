"""The numba helpers a native loop's driver calls besides its kernels (`native_loop`): small
matrix products in the driver's own loops (`packed_matmul` through the product's tiles of
`gemm`), and the write of a window into a state buffer.
Drivers compile them in as callees (`native_loop.HELPERS`), so the kernel cache keys on this
file's source (`cache._KEYED_SOURCES`): a changed helper recompiles the cached drivers.
"""

from __future__ import annotations

import numba
import numpy as np
from numba.core import types
from numba.extending import overload

from . import gemm

# packed_matmul's tile: 8 rows by PANEL columns of the result (gemm.tile_8x32).
ROWS, PANEL = 8, 2 * gemm.LANES


@numba.njit(nogil=True, error_model="numpy", cache=False)
def small_matmul(a, b, out):
    """out = a @ b for matrices, four rows of `a` at a time, so each row of `b` read from
    cache serves four rows of the result (as fast as one BLAS thread at 16x256x256)."""
    m, k = a.shape
    n = b.shape[1]
    out[:] = 0
    i = 0
    while i + 4 <= m:
        o0, o1, o2, o3 = out[i], out[i + 1], out[i + 2], out[i + 3]
        for p in range(k):
            x0, x1, x2, x3 = a[i, p], a[i + 1, p], a[i + 2, p], a[i + 3, p]
            row = b[p]
            for j in range(n):
                v = row[j]
                o0[j] += x0 * v
                o1[j] += x1 * v
                o2[j] += x2 * v
                o3[j] += x3 * v
        i += 4
    for r in range(i, m):
        o = out[r]
        for p in range(k):
            x = a[r, p]
            row = b[p]
            for j in range(n):
                o[j] += x * row[j]


@numba.njit(nogil=True, error_model="numpy", cache=False, fastmath={"reassoc", "contract"})
def small_matmul_t(a, bt, out):
    """out = a @ bt.T in blocks of four rows by two columns, for a right side a loop keeps
    (transposed once, before the loop): each result is a sum along rows of `a` and `bt`, which
    vectorises as eight partial sums over a block (3x faster than `small_matmul` at
    16x256x256). The sums may be reassociated and fused, as BLAS does; NaN, infinities and
    signed zeros keep IEEE semantics. `small_matmul_t_rest` computes what the blocks miss."""
    m, k = a.shape
    n = bt.shape[0]
    zero = out.dtype.type(0)
    # One statement a value, no tuples: numba types and lowers this in 0.33 s, not 0.45 s.
    for i in range(0, m - 3, 4):
        a0 = a[i]
        a1 = a[i + 1]
        a2 = a[i + 2]
        a3 = a[i + 3]
        o0 = out[i]
        o1 = out[i + 1]
        o2 = out[i + 2]
        o3 = out[i + 3]
        for j in range(0, n - 1, 2):
            b0 = bt[j]
            b1 = bt[j + 1]
            c00 = c01 = c10 = c11 = c20 = c21 = c30 = c31 = zero
            for p in range(k):
                x0 = a0[p]
                x1 = a1[p]
                x2 = a2[p]
                x3 = a3[p]
                y0 = b0[p]
                y1 = b1[p]
                c00 += x0 * y0
                c01 += x0 * y1
                c10 += x1 * y0
                c11 += x1 * y1
                c20 += x2 * y0
                c21 += x2 * y1
                c30 += x3 * y0
                c31 += x3 * y1
            o0[j] = c00
            o0[j + 1] = c01
            o1[j] = c10
            o1[j + 1] = c11
            o2[j] = c20
            o2[j + 1] = c21
            o3[j] = c30
            o3[j + 1] = c31


@numba.njit(nogil=True, error_model="numpy", cache=False, fastmath={"reassoc", "contract"})
def small_matmul_t_rest(a, bt, out):
    """The results `small_matmul_t` leaves: the last rows when `a` has not a multiple of four,
    the last column when `bt` has an odd number of rows. The driver calls it only then, so the
    common shapes do not compile it (0.1 s)."""
    m, k = a.shape
    n = bt.shape[0]
    zero = out.dtype.type(0)
    i = m - m % 4
    for r in range(m):
        for c in range(n):
            if r < i and c < n - n % 2:
                continue
            total = zero
            for p in range(k):
                total += a[r, p] * bt[c, p]
            out[r, c] = total


@numba.njit(nogil=True, error_model="numpy", cache=False, fastmath={"reassoc", "contract"})
def matrix_vector(a, x, out):
    """out = a @ x for a C-ordered matrix: each element a sum along a row of `a`, which
    vectorises as partial sums (reassociated, as BLAS's are; IEEE semantics otherwise)."""
    m, k = a.shape
    zero = out.dtype.type(0)
    for i in range(m):
        row = a[i]
        total = zero
        for p in range(k):
            total += row[p] * x[p]
        out[i] = total


@numba.njit(nogil=True, error_model="numpy", cache=False)
def vector_matrix(x, a, out):
    """out = x @ a for a C-ordered matrix: its rows scaled and added in order, the columns
    in vectors (a sampler's gradient through x @ w, its rows read once)."""
    k, n = a.shape
    out[:] = 0
    for p in range(k):
        v = x[p]
        row = a[p]
        for j in range(n):
            out[j] += v * row[j]


@numba.njit(nogil=True, error_model="numpy", cache=False, fastmath={"reassoc", "contract"})
def vector_vector(x, y, out):
    """out[0] = x . y (a scalar is a one-element vector inside a driver)."""
    total = out.dtype.type(0)
    for p in range(x.shape[0]):
        total += x[p] * y[p]
    out[0] = total


@numba.njit(nogil=True, error_model="numpy", cache=False)
def batched_matmul(a, b, out):
    """out[p] = a[p] @ b[p] for C-ordered (B, M, K) and (B, K, N) arrays: any other product
    (batched, or of operands of higher rank) in the form `native_loop._batched` gives it."""
    for p in range(a.shape[0]):
        for i in range(a.shape[1]):
            row = out[p, i]
            row[:] = 0
            for k in range(a.shape[2]):
                x, b_row = a[p, i, k], b[p, k]
                for j in range(row.shape[0]):
                    row[j] += x * b_row[j]


@numba.njit(nogil=True, error_model="numpy", cache=False)
def scatter_row(operand, index, update, out, add, clip):
    """out = operand with row `index` (its one element) of the first dimension set to, or
    added to, `update`: clamped into range (`clip`), or else dropped when out of range, as a
    fill_or_drop scatter drops it."""
    n = operand.shape[0]
    flat_out, flat_in = out.reshape(n, out.size // n), operand.reshape(n, operand.size // n)
    flat_out[:] = flat_in
    row = np.int64(index.reshape(-1)[0])
    if clip:
        row = min(max(row, 0), n - 1)
    elif row < 0 or row >= n:
        return
    values = update.reshape(-1)
    for j in range(values.size):
        if add:
            flat_out[row, j] += values[j]
        else:
            flat_out[row, j] = values[j]


@numba.njit(nogil=True, error_model="numpy", cache=False)
def put_window(target, update, starts, target_dims, update_dims):
    """Writes `update` into the window of `target` at `starts` (both flat views of C-ordered
    arrays of those dims): a loop over the window's rows, each a contiguous copy. (A slice
    assignment in the driver would do the same, but numba takes seconds to compile its shape
    checks' error messages.)"""
    rank = len(update_dims)
    inner = update_dims[rank - 1]
    rows = update.size // inner if inner else 0
    for row in range(rows):
        rest, offset, scale = row, 0, 1
        for d in range(rank - 1, -1, -1):
            at = starts[d]
            if d < rank - 1:
                at += rest % update_dims[d]
                rest //= update_dims[d]
            offset += at * scale
            scale *= target_dims[d]
        base = row * inner
        for j in range(inner):
            target[offset + j] = update[base + j]


@numba.njit(nogil=True, error_model="numpy", cache=False)
def _plain_matmul(a, b, out):
    """out = a @ b one sum at a time: packed_matmul's way for operands its tiles do not take
    (not C-ordered float32), compiled only for those (small_matmul would add 0.4 s to a driver's
    compile)."""
    m, k = a.shape
    n = b.shape[1]
    for i in range(m):
        for j in range(n):
            total = out.dtype.type(0)
            for p in range(k):
                total += a[i, p] * b[p, j]
            out[i, j] = total


def panels(b):
    """The right side (K, N) of a product as `packed_matmul` reads it: N / PANEL panels of K rows
    of PANEL floats each, one after another (made by numpy, once before the loop)."""
    k, n = b.shape
    return np.ascontiguousarray(b.reshape(k, n // PANEL, PANEL).transpose(1, 0, 2), dtype=np.float32)


def _tiles(a, b, p, out):  # packed_matmul's body, chosen by the operands' types (see below)
    raise NotImplementedError


@overload(_tiles, inline="always")
def _tiles_for(a, b, p, out):
    tiled = all(isinstance(x, types.Array) and x.dtype == types.float32 and x.ndim == n
                for x, n in ((a, 2), (b, 2), (p, 3), (out, 2))) and a.layout == out.layout == p.layout == "C"
    if not tiled:
        return lambda a, b, p, out: _plain_matmul(a, b, out)

    def run(a, b, p, out):
        m, k = a.shape
        if m % ROWS or out.shape[0] != m or out.shape[1] != p.shape[0] * PANEL or p.shape[1] != k \
                or p.shape[2] != PANEL:
            raise ValueError("packed_matmul: operands of shapes its tiles do not take")
        n = out.shape[1]
        for q in range(p.shape[0]):
            for i in range(0, m, ROWS):
                gemm.tile_8x32(a, i * k, k, p, q * k * PANEL, PANEL, out, i * n + q * PANEL, n, k, 0)

    return run


@numba.njit(nogil=True, error_model="numpy", cache=False)
def packed_matmul(a, b, p, out):
    """out = a @ b for float32 matrices, `p` being `b` as `panels` packs it: tiles of 8 rows by
    32 columns in registers, each result one chain of fused multiply-adds along the
    contracting dimension, as `gemm`'s. 8x256 @ 256x256 took 6.6 us so, against 7.9 us in
    numba's np.dot (OpenBLAS, one thread); 16x256 @ 256x256 12.2 against 25.6 us. Operands not
    C-ordered float32 go through `_plain_matmul`; rows not a multiple of 8 (or shapes that do
    not fit) raise ValueError."""
    _tiles(a, b, p, out)
