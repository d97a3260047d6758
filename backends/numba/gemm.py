"""float32 matrix products in numba's own code, for the products BLAS runs well below the core's
peak here: attention's per-head products, 256x64 @ (256x64)^T and 256x256 @ 256x64, took 69-76
and 65-72 us each in OpenBLAS on one thread (batches of eight heads), against 65-72 and 53-60 us
here; on operands in cache this kernel reaches 150-180 GFLOP/s, OpenBLAS 183-198 on a 2048^3
product.

The work is done by a micro-kernel written in LLVM IR (`tile`), as BLAS's are written in
assembly: a tile of `mr` rows by `nv` vectors of 16 floats of the result stays in registers
through a block of `KC` steps of the contracting dimension; each step broadcasts one float of each of the tile's
rows of `a` and loads `nv` vectors of `b`, for `mr * nv` fused multiply-adds. The loop
vectoriser cannot be asked for this from Python source (it vectorises innermost loops, which
would load and store the tile at every step). `b` is first copied into panels of `NR` columns,
contiguous and zero-padded on the right, so every step reads one 256-byte run, rows of `b`
thousands of bytes apart do not fight over the same cache sets (the contracting dimension
goes in blocks of `KC`, so a panel stays in the first-level cache), and a transposed `b`
(attention's k) is read through its strides once, 16x16 blocks at a time (`transpose16`), not
for every row tile.

Each result is one chain of fused multiply-adds along the contracting dimension, in order:
NaN, infinities and signed zeros follow IEEE as BLAS's do; the order of the sum is not
BLAS's, as the order of XLA's and of BLAS's differ from each other.

`gemm_f32(a, b, out)` runs a batch of products (G, M, K) @ (G, K, N) on the calling thread
(without the GIL), or returns False for operands it does not take (`takes`). The driver is a
generated kernel compiled through `compile.compile_kernel`, so it is cached on disk like any
kernel, and compiled once, for operands of any layout: numba would compile it again (most of a
second each) for every combination of C-ordered and strided operands it met, as attention's
k^T and v are. Its loops over such operands stay scalar, so the copies of whole rows go through
an intrinsic of their own (`copy16`). Imports numba, numpy and llvmlite.
"""

from __future__ import annotations

import threading

import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from .pipeline import VECTOR_WIDTH

LANES = 16
MR, NV = 6, 4  # the tile: 6 rows by 64 columns, 24 accumulators of the 32 vector registers
NR = NV * LANES
KC = 128  # the contracting dimension's block: a panel of KC x NR floats is 32 KiB
# Whether programs hand products to it (`backend.compile_module`): where kernels use 512-bit
# vectors (`pipeline.VECTOR_WIDTH`). Elsewhere LLVM splits each 16-float vector in two, and the
# tile's 24 accumulators become 48 halves, more than the registers: it would spill in its loop.
ENABLED = VECTOR_WIDTH == 512
_F32 = np.dtype(np.float32)
_V = ir.VectorType(ir.FloatType(), LANES)
_I64 = ir.IntType(64)


def _declared(module: ir.Module, name: str, fnty: ir.FunctionType) -> ir.Function:
    """The LLVM function `name` of `module`, declared there the first time."""
    existing = module.globals.get(name)
    return existing if existing is not None else ir.Function(module, fnty, name)


def _fma_declaration(module: ir.Module) -> ir.Function:
    return _declared(module, f"llvm.fma.v{LANES}f32", ir.FunctionType(_V, [_V] * 3))


def _address(context, builder, ty, array, offset):
    """The address of element `offset` (in floats) of `array`, a numba array of type `ty`."""
    return builder.gep(context.make_array(ty)(context, builder, array).data, [offset])


def _loop(builder, count, name: str):
    """Opens `for i in range(count)` in LLVM IR at the builder's block: (i, the entry block,
    the block after the loop); the builder is left in the loop's body. `_close` ends it."""
    entry = builder.block
    loop = builder.append_basic_block(f"{name}.loop")
    done = builder.append_basic_block(f"{name}.done")
    builder.cbranch(builder.icmp_signed(">", count, ir.Constant(_I64, 0)), loop, done)
    builder.position_at_end(loop)
    i = builder.phi(_I64)
    i.add_incoming(ir.Constant(_I64, 0), entry)
    return i, entry, done


def _close(builder, i, count, done):
    """Ends the loop `_loop` opened: i + 1, back while below `count`; the builder is left after
    it. Returns the body's last block (where values the loop carries come from)."""
    following = builder.add(i, ir.Constant(_I64, 1))
    tail = builder.block
    builder.cbranch(builder.icmp_signed("<", following, count), i.parent, done)
    i.add_incoming(following, tail)
    builder.position_at_end(done)
    return tail


def _start(builder, targets, adding):
    """The tile's first sums: the values at `targets` where `adding`, else zeros, loaded only
    where adding (a select would load them always, and wait for lines about to be written)."""
    zero = ir.Constant(_V, None)
    entry = builder.block
    load = builder.append_basic_block("tile.load")
    joined = builder.append_basic_block("tile.start")
    builder.cbranch(adding, load, joined)
    builder.position_at_end(load)
    loaded = [[builder.load(target, align=4) for target in row] for row in targets]
    builder.branch(joined)
    builder.position_at_end(joined)
    start = []
    for row in loaded:
        start.append([])
        for value in row:
            phi = builder.phi(_V)
            phi.add_incoming(value, load)
            phi.add_incoming(zero, entry)
            start[-1].append(phi)
    return start


def _prefetch_for_write(builder, address) -> None:
    """llvm.prefetch of the line at `address` for writing, into every level of cache (a hint:
    it never faults)."""
    i8p, i32 = ir.IntType(8).as_pointer(), ir.IntType(32)
    fn = _declared(builder.module, "llvm.prefetch.p0", ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32]))
    builder.call(fn, [builder.bitcast(address, i8p), ir.Constant(i32, 1), ir.Constant(i32, 3), ir.Constant(i32, 1)])


def _tile(mr: int, nv: int):
    """tile(a, ao, lda, p, po, ldp, c, co, ldc, k, add): c[co + r*ldc + j] = (that value, where
    `add` is not 0, else 0) + the sum over d < k of a[ao + r*lda + d] * p[po + d*ldp + j], for
    r < mr and j < nv*16 (offsets and leading dimensions in floats from each array's first
    element). With `add`, the fused multiply-adds go on from the value in c: blocks of the
    contracting dimension one after another make the same chain, in the same order, as one."""

    @intrinsic
    def tile(typingctx, a, ao, lda, p, po, ldp, c, co, ldc, k, add):
        if not all(isinstance(x, types.Array) and x.dtype == types.float32 for x in (a, p, c)):
            return None
        sig = types.void(a, types.int64, types.int64, p, types.int64, types.int64, c, types.int64, types.int64,
                         types.int64, types.int64)

        def codegen(context, builder, signature, args):
            a_, ao_, lda_, p_, po_, ldp_, c_, co_, ldc_, k_, add_ = args
            at, pt, ct = signature.args[0], signature.args[3], signature.args[6]
            base_a = _address(context, builder, at, a_, ao_)
            base_p = _address(context, builder, pt, p_, po_)
            base_c = _address(context, builder, ct, c_, co_)
            fma = _fma_declaration(builder.module)
            vptr = _V.as_pointer()
            undef = ir.Constant(_V, ir.Undefined)
            splat = ir.Constant(ir.VectorType(ir.IntType(32), LANES), [0] * LANES)
            first = ir.Constant(ir.IntType(32), 0)
            rows_a = [builder.gep(base_a, [builder.mul(ir.Constant(_I64, r), lda_)]) for r in range(mr)]
            targets = [[builder.bitcast(builder.gep(base_c, [builder.add(builder.mul(ir.Constant(_I64, r), ldc_),
                                                                         ir.Constant(_I64, v * LANES))]), vptr)
                        for v in range(nv)] for r in range(mr)]
            start = _start(builder, targets, builder.icmp_signed("!=", add_, ir.Constant(_I64, 0)))

            d, entry, done = _loop(builder, k_, "tile")
            acc = [[builder.phi(_V) for _ in range(nv)] for _ in range(mr)]
            step = builder.gep(base_p, [builder.mul(d, ldp_)])
            b = [builder.load(builder.bitcast(builder.gep(step, [ir.Constant(_I64, v * LANES)]), vptr), align=4)
                 for v in range(nv)]
            # The tile's lines of c, one a step (the last again once all are asked for), to be
            # written: fetched while the tile computes, its stores do not wait for them at the
            # end (attention's q k^T, 256x64 @ 64x256 a head: 540 against 440 us for eight).
            line = builder.select(builder.icmp_signed("<", d, ir.Constant(_I64, mr * nv - 1)), d,
                                  ir.Constant(_I64, mr * nv - 1))
            row, vector = builder.udiv(line, ir.Constant(_I64, nv)), builder.urem(line, ir.Constant(_I64, nv))
            offset = builder.add(builder.mul(row, ldc_), builder.mul(vector, ir.Constant(_I64, LANES)))
            _prefetch_for_write(builder, builder.gep(base_c, [offset]))
            new = []
            for r in range(mr):
                x = builder.load(builder.gep(rows_a[r], [d]), align=4)
                xs = builder.shuffle_vector(builder.insert_element(undef, x, first), undef, splat)
                new.append([builder.call(fma, [xs, b[v], acc[r][v]]) for v in range(nv)])
            tail = _close(builder, d, k_, done)
            for r in range(mr):
                for v in range(nv):
                    acc[r][v].add_incoming(start[r][v], entry)
                    acc[r][v].add_incoming(new[r][v], tail)

            sums = [[builder.phi(_V) for _ in range(nv)] for _ in range(mr)]
            for r in range(mr):
                for v in range(nv):
                    sums[r][v].add_incoming(start[r][v], entry)
                    sums[r][v].add_incoming(new[r][v], tail)
                    builder.store(sums[r][v], targets[r][v], align=4)
            return context.get_dummy_value()

        return sig, codegen

    tile.__name__ = f"tile_{mr}x{nv * LANES}"
    return tile


tile = _tile(MR, NV)
# 8 rows by 32 columns, 16 accumulators: the products of a loop's few rows by a right side the
# loop keeps (`loop_kernels.packed_matmul`).
tile_8x32 = _tile(8, 2)


@intrinsic
def transpose16(typingctx, src, so, lds, dst, do, ldd):
    """dst[do + j*ldd + i] = src[so + i*lds + j] for i, j < 16: a 16x16 block transposed in
    registers, four rounds of two-vector shuffles (row i and row i + b exchange blocks of b
    floats, b = 8, 4, 2, 1), where a loop would store one float at a time."""
    if not all(isinstance(x, types.Array) and x.dtype == types.float32 for x in (src, dst)):
        return None
    sig = types.void(src, types.int64, types.int64, dst, types.int64, types.int64)

    def codegen(context, builder, signature, args):
        src_, so_, lds_, dst_, do_, ldd_ = args
        base_s = _address(context, builder, signature.args[0], src_, so_)
        base_d = _address(context, builder, signature.args[3], dst_, do_)
        vptr = _V.as_pointer()
        rows = [builder.load(builder.bitcast(builder.gep(base_s, [builder.mul(ir.Constant(_I64, i), lds_)]), vptr),
                             align=4) for i in range(LANES)]
        i32 = ir.IntType(32)
        for b in (8, 4, 2, 1):
            low = ir.Constant(ir.VectorType(i32, LANES), [p if not p & b else LANES + p - b for p in range(LANES)])
            high = ir.Constant(ir.VectorType(i32, LANES), [p + b if not p & b else LANES + p for p in range(LANES)])
            new = list(rows)
            for i in range(LANES):
                if not i & b:
                    new[i] = builder.shuffle_vector(rows[i], rows[i + b], low)
                    new[i + b] = builder.shuffle_vector(rows[i], rows[i + b], high)
            rows = new
        for i in range(LANES):
            builder.store(rows[i], builder.bitcast(builder.gep(base_d, [builder.mul(ir.Constant(_I64, i), ldd_)]),
                                                   vptr), align=4)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def copy16(typingctx, src, so, dst, do, count):
    """dst[do + i] = src[so + i] for i < 16 * count: vectors of 16 floats, whatever layout
    numba typed the arrays with (the driver reads its operands as strided arrays, whose loops
    LLVM leaves scalar)."""
    if not all(isinstance(x, types.Array) and x.dtype == types.float32 for x in (src, dst)):
        return None
    sig = types.void(src, types.int64, dst, types.int64, types.int64)

    def codegen(context, builder, signature, args):
        src_, so_, dst_, do_, count_ = args
        base_s = _address(context, builder, signature.args[0], src_, so_)
        base_d = _address(context, builder, signature.args[2], dst_, do_)
        vptr = _V.as_pointer()
        i, _, done = _loop(builder, count_, "copy")
        at = builder.mul(i, ir.Constant(_I64, LANES))
        value = builder.load(builder.bitcast(builder.gep(base_s, [at]), vptr), align=4)
        builder.store(value, builder.bitcast(builder.gep(base_d, [at]), vptr), align=4)
        _close(builder, i, count_, done)
        return context.get_dummy_value()

    return sig, codegen


def driver_text() -> str:
    """The generated driver. The contracting dimension goes in blocks of `KC`; for each, `b`'s
    rows of the block are copied into panels of `NR` columns (`KC` x 64 floats, 32 KiB: one
    stays in the first-level cache while every row tile reads it), or read in place where `b`
    is one contiguous panel (64 columns). The rows of `a` left over after the whole tiles are
    copied into a zero-padded tile (`apad`), and a tile short of rows or columns goes through
    `cpad`. After the first block each tile adds to the sums the blocks before it left."""
    return f'''def gemm_driver(a, b, c, panel, apad, cpad):
    groups, m, k = a.shape
    n = b.shape[2]
    lda = a.strides[1] // 4
    ldc = c.strides[1] // 4
    ldb = b.strides[1] // 4
    ldt = b.strides[2] // 4
    direct = b.strides[2] == 4 and b.strides[1] == {NR * 4} and n == {NR}
    transposed = b.strides[1] == 4
    panels = (n + {NR - 1}) // {NR}
    rest = m % {MR}
    whole = m - rest
    for g in range(groups):
        ga = g * (a.strides[0] // 4)
        gc = g * (c.strides[0] // 4)
        gb = g * (b.strides[0] // 4)
        bg = b[g]
        for k0 in range(0, k, {KC}):
            kc = min({KC}, k - k0)
            add = 1 if k0 > 0 else 0
            if not direct:
                for q in range(panels):
                    j0 = q * {NR}
                    w = min({NR}, n - j0)
                    block = panel[q]
                    if transposed:  # (attention's k): 16x16 blocks transposed in registers
                        whole_j = w - w % 16
                        whole_d = kc - kc % 16
                        bo = gb + j0 * ldt + k0
                        po = q * {KC * NR}
                        for j in range(0, whole_j, 16):
                            for d in range(0, whole_d, 16):
                                gemm.transpose16(b, bo + j * ldt + d, ldt, panel, po + d * {NR} + j, {NR})
                        for d in range(kc):
                            dst = block[d]
                            for j in range(whole_j if d < whole_d else 0, w):
                                dst[j] = bg[k0 + d, j0 + j]
                            for j in range(w, {NR}):
                                dst[j] = np.float32(0)
                    else:
                        whole_j = w - w % 16 if ldt == 1 else 0  # rows of b contiguous: vectors
                        for d in range(kc):
                            gemm.copy16(b, gb + (k0 + d) * ldb + j0, panel, q * {KC * NR} + d * {NR}, whole_j // 16)
                            if whole_j < {NR}:  # the columns past whole vectors, then zeros
                                dst = block[d]
                                for j in range(whole_j, w):
                                    dst[j] = bg[k0 + d, j0 + j]
                                for j in range(w, {NR}):
                                    dst[j] = np.float32(0)
            if rest:
                for r in range({MR}):
                    row = apad[0, r]
                    if r < rest:
                        src = a[g, whole + r]
                        for d in range(kc):
                            row[d] = src[k0 + d]
                    else:
                        for d in range(kc):
                            row[d] = np.float32(0)
            for q in range(panels):
                j0 = q * {NR}
                w = min({NR}, n - j0)
                if direct:
                    p = b
                    po = gb + k0 * ldb + j0
                    ldp = ldb
                else:
                    p = panel
                    po = q * {KC * NR}
                    ldp = {NR}
                for i0 in range(0, m, {MR}):
                    if i0 < whole:
                        x = a
                        xo = ga + i0 * lda + k0
                        ldx = lda
                    else:
                        x = apad
                        xo = 0
                        ldx = {KC}
                    full = w == {NR} and i0 < whole
                    if full:
                        dest = c
                        do = gc + i0 * ldc + j0
                        ldd = ldc
                    else:
                        dest = cpad
                        do = 0
                        ldd = {NR}
                        if add:  # the sums so far, into the tile
                            for r in range(min({MR}, m - i0)):
                                t = cpad[0, r]
                                out = c[g, i0 + r]
                                for j in range(w):
                                    t[j] = out[j0 + j]
                    gemm.tile(x, xo, ldx, p, po, ldp, dest, do, ldd, kc, add)
                    if not full:
                        for r in range(min({MR}, m - i0)):
                            out = c[g, i0 + r]
                            t = cpad[0, r]
                            for j in range(w):
                                out[j0 + j] = t[j]
'''


class _Buffers(threading.local):
    """Each thread's packed panels and scratch tile, grown as needed: fresh pages fault slowly
    here, so a product's panels are not allocated on every call."""

    def __init__(self) -> None:
        self.panel = np.empty(0, _F32)
        self.apad = np.zeros((1, MR, KC), _F32)
        self.cpad = np.zeros((1, MR, NR), _F32)  # 3-D, as the result it stands for

    def panels(self, count: int) -> np.ndarray:
        size = count * KC * NR
        if self.panel.size < size:
            self.panel = np.empty(size, _F32)
        return self.panel[:size].reshape(count, KC, NR)


_buffers = _Buffers()
_READ = types.Array(types.float32, 3, "A", readonly=True)
_OWN = types.Array(types.float32, 3, "C")
# a and b read-only (a writable array converts to one), out writable, any layout; the buffers
_SIGNATURE = (_READ, _READ, types.Array(types.float32, 3, "A"), _OWN, _OWN, _OWN)
_compiled: list = []
_lock = threading.Lock()


def _driver():
    if not _compiled:
        with _lock:
            if not _compiled:
                from .compile import compile_kernel, settle
                from .kernels import KernelSource

                source = KernelSource(name="gemm_driver", source=driver_text(), globals={}, params=[],
                                      outputs=[], parallel=False, kind="gemm")
                fn = compile_kernel(source)
                # One overload for every layout: numba would compile (0.9 s each) one for each
                # combination of C-ordered and strided operands it meets (attention's k^T and v).
                fn.compile(_SIGNATURE)
                fn.disable_compile()
                settle(fn)  # compiled (or loaded) above, not on a first call: the cache's count now
                _compiled.append(fn)
    return _compiled[0]


def takes(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> bool:
    """Whether `gemm_f32` runs out = a @ b for these operands: aligned float32 batches (G, M, K),
    (G, K, N) and (G, M, N), the rows of `a` and `out` contiguous, every stride a whole number
    of floats (the tiles address rows by strides in floats), K at least 1, `out` writable."""
    return (a.dtype == _F32 and b.dtype == _F32 and out.dtype == _F32 and a.ndim == b.ndim == out.ndim == 3
            and a.strides[2] == 4 and out.strides[2] == 4 and a.shape[2] > 0
            and a.shape[:2] == out.shape[:2] and b.shape[0] == a.shape[0] and b.shape[1] == a.shape[2]
            and b.shape[2] == out.shape[2] and a.flags.aligned and b.flags.aligned and out.flags.aligned
            and out.flags.writeable
            and not any(s % 4 for s in (*a.strides, *b.strides, *out.strides)))


def gemm_f32(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> bool:
    """out = a @ b over (G, M, K) @ (G, K, N) on the calling thread, or False where `takes`
    does not hold (nothing written)."""
    if not takes(a, b, out):
        return False
    panel = _buffers.panels((b.shape[2] + NR - 1) // NR)
    _driver()(a, b, out, panel, _buffers.apad, _buffers.cpad)
    return True


__all__ = ["ENABLED", "KC", "LANES", "MR", "NR", "NV", "copy16", "driver_text", "gemm_f32", "takes", "tile", "tile_8x32",
           "transpose16"]
