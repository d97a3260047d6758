"""How a kernel writes its loops along short and middling rows: the sizes that choose, with the
measurements behind them, and the source rewrites they call for. kernels.py reads these
settings through this module at each use, so a test may set them.
"""

from __future__ import annotations

import re

import numpy as np

# A kernel whose rows (one reduced axis, the last; or a loop kernel's last axis) hold at most
# this many elements has its loops along the row unrolled, and reads and writes the arrays of
# its iteration space through flat views at constant strides: the loop over rows is then the
# innermost loop, and LLVM vectorises it across rows, each row's elements an interleaved group
# of loads (LLVM groups at most 8). A loop along a short row leaves the vector lanes idle and
# each row one chain of dependent operations: softmax over 65536x8 took 3.0 ms on one thread,
# 0.33 ms so.
# A loop kernel whose last dimension is this short (and cannot be flattened: a broadcast along
# it) is unrolled the same way: tanh(x + b) over 65536x4 took 1.5 ms on one thread, 0.26 ms so.
SHORT_ROW = 8
# ... unless a pass's body copied for each element would pass this many lines (a special
# function upstream of the reduction): numba's compile time grows with the copies.
SHORT_ROW_LINES = 256
# ... and only where the reduction's iteration space has at least this many elements: the
# unrolled kernel compiles in 0.4-0.5 s against 0.12-0.2 s (softmax and layer norm over rows of
# 8), which a small input does not win back (65536x8: 0.24 against 1.6 ms a call).
SHORT_ROW_MIN_ELEMENTS = 1 << 15
# Loops along rows of more than SHORT_ROW and fewer than ROW_LOOPS elements (an input kernel's
# passes), or LOOP_ROWS (a loop kernel's innermost loop), run to a trip count LLVM cannot see
# (`scalar.opaque`). LLVM unrolls a loop with a small known count whole before it vectorises,
# and the copies of an inlined exp or tanh then stay scalar where the loop vectoriser would have
# taken the loop as it is. On one thread: softmax over 32768x16, 3.1 ms against 0.45 ms; layer
# norm over 16384x32, 0.45 against 0.17 ms; tanh(x + b) over 52428x10, 1.47 against 0.49 ms.
# From these sizes on the known count is as fast or faster (softmax over 8192x64: 0.26 against
# 0.27 ms; tanh(x + b) over 10922x48: 0.18 against 0.22 ms).
ROW_LOOPS = 64
LOOP_ROWS = 24
# Row sums, maxima and minima (f32, f64) from this many elements go through `rows`, vectorised
# (32 before: softmax over rows of 9 to 31 summed its exps in order, one dependent add at a time)
ROW_SUMS_MIN = 9


# Reductions along rows of more than SHORT_ROW and at most TILED_ROW elements take the short-row
# form too, over blocks of TILE_ROWS rows (of the innermost kept axis, which must hold as many):
# past 8 elements LLVM reads a row's elements with gathers and would write them with scatters,
# so each block first copies the inputs of the row space into stack tiles, one column of the
# block after another (without them rows of 20 were not vectorised: argmax over 26214x20, 995
# against 199 us), and the outputs go to tiles that the block then copies out in order, each
# element gathered from its tile (`tile_order`; through scatters the copy took twice as long).
# Softmax over 43690x12 on one thread: 1.0 ms along each row (the loops of ROW_LOOPS, row sums
# through `rows`), 0.43 ms so; its row sums add in order along the row. From 24 elements the
# loops along the row are faster (softmax over 21845x24: 0.44 against 0.54 ms).
# A light kernel (one phase of row sums, maxima or minima, nothing transcendental) is tiled up to
# LIGHT_TILED_ROW only: from 16 elements `rows` does its little work faster than the tiles are
# filled (one thread, 524288 elements: a sum of squares over rows of 16, 96 us tiled against 80;
# of 20, 194 against 113; x - mean(x) over rows of 20, 325 against 232; at 15, 122 against 151).
TILED_ROW = 23
LIGHT_TILED_ROW = 15
TILE_ROWS = 64
# ... and a tiled kernel of more source lines than TILED_LINES, or more calls of the math library
# than TILED_CALLS, is written along its rows instead: numba and LLVM compile long unrolled
# bodies slowly (a softmax of erf(x) * tanh(x) * exp(-x*x) * log1p(x*x) + sin(x) * cos(x) over
# rows of 12, 286 lines and 96 calls: 3.4 s; softmax and layer norm over rows of 23, 180 and 240
# lines: 0.8-1.0 s; along the rows 0.2-0.4 s).
TILED_LINES = 300
TILED_CALLS = 32


def short(dims: tuple[int, ...], product, tiles: bool = False, light: bool = False) -> bool:
    """Whether a kernel over `dims` (the last axis the row) takes the short-row form: a short
    last axis (up to TILED_ROW where it may take the tiled form, `tiles`: a reduction along the
    row; LIGHT_TILED_ROW for a `light` one), a large enough input, and an output fusion's
    product (its dot instruction, or None) of these dims, read through a flat view as such
    inputs are."""
    limit = SHORT_ROW
    if tiles and len(dims) >= 2 and dims[-2] >= TILE_ROWS:
        limit = max(SHORT_ROW, min(LIGHT_TILED_ROW, TILED_ROW) if light else TILED_ROW)
    return 2 <= dims[-1] <= limit and int(np.prod(dims)) >= SHORT_ROW_MIN_ELEMENTS \
        and (product is None or tuple(product.shape.dims) == tuple(dims))


def tiled(dims: tuple[int, ...] | None) -> bool:
    """Whether a short-row kernel over `dims` reads and writes the row space through tiles."""
    return dims is not None and dims[-1] > SHORT_ROW


def tile_order(width: int) -> np.ndarray:
    """Where the element i of a block's rows, in order, lies in its tile (`TILED_ROW`)."""
    i = np.arange(TILE_ROWS * width)
    return ((i % width) * TILE_ROWS + i // width).astype(np.int32)


def hidden(extent: int, below: int) -> bool:
    """Whether a loop along a row of `extent` runs to a count hidden from LLVM (`ROW_LOOPS`,
    `LOOP_ROWS`)."""
    return SHORT_ROW < extent < below


def unrolled(var: str, extent: int, body: list[str]) -> list[str] | None:
    """The loop `for var in range(extent): body` as `extent` copies of its body; None where the
    copies would pass SHORT_ROW_LINES."""
    if len(body) * extent > SHORT_ROW_LINES:
        return None
    name = re.compile(rf"(?<![A-Za-z0-9_]){re.escape(var)}(?![A-Za-z0-9_])")
    return [name.sub(str(j), line) for j in range(extent) for line in body]
