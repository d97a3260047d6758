"""Programs: what a compiled module does, as plain data, and how the runtime runs it.

A backend lowers a fused module to a `program` (dicts, lists, numbers and strings only, so it
goes into an AOT artifact as JSON) and a set of kernel functions; `build(program, kernels,
constants)` turns them into an `Executable`. Steps:

- `kernel`: a compiled kernel over a row range, `fn(row_start, row_end, *inputs, *outputs)`
  (output fusions: `fn(row_start, row_end, dot_start, dot, *inputs, *outputs)`, the dot's
  result computed here by BLAS a block of rows at a time, or straight into the output).
  f16/bf16 values are converted to f32 at the kernel boundary, as XLA:CPU does in its fusions.
  With a `window` (in a loop body), the step writes only a window of one input, in place
  (`runtime.control.window_run`).
- `dot`: a dot_general through BLAS (`runtime.products`). An output fusion followed by a batched
  dot that alone reads its result (attention's scores, softmax, then @ v) runs as one chain
  step, a block of leading rows at a time (`chained`), and so does a loop kernel followed by
  the dot that alone reads its result as its rows (`fed`: the patches of a convolution, then
  their product): decided here, so artifacts chain too.
- `alias`: a tuple, a tuple element or a reshape: views, no work.
- `nested`: a program of its own (a fusion no single kernel holds), run as one step.
- `while`, `conditional`: loops and branches over nested programs (`runtime.control`).
- `library`: a data op (sort, gather, scatter, ...) as a numpy call (`runtime.library`).

Shapes are lists of ints, dtypes numpy names ("float32", "bfloat16": bfloat16 needs ml_dtypes).
Imports numpy and the standard library only.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from . import blas, products, split_loops
from .control import conditional_run, nested_programs, while_run, window_run
from .executable import BufferSpec, Executable, Step
from .library import callback_run, library_run, view_run
from .parallel import num_threads, run_each, run_rows
from .pool import POOL
from .products import (HALF, BackendProducts, apart, block_products, compute_dtype, cut_rows, dot_plan, dot_run, dtype,
                       macs, make_dot, narrow)

# An output fusion's dot result is produced in blocks of about this many bytes. Measured here,
# one BLAS call over all rows then the epilogue beat 1 MiB blocks (OpenBLAS's threads spin
# between calls and slow the epilogue's), so only results past 16 MiB are split.
BLOCK_BYTES = 1 << 24


def spec(entry) -> BufferSpec:
    dims, name = entry
    return BufferSpec(tuple(dims), dtype(name))


class Kernel:
    """A compiled kernel function and what to do after its first call (or None). `pointers`:
    fn takes data pointers (a C kernel), so a scalar needs no reshape to one element. `split`:
    the backend's own way of running fn's rows across threads: split(args, rows, first,
    watching) runs fn(start, end, *args) over [first, first + rows) and says whether it did
    (False: nothing ran, the runtime runs it); `watching`: a step worth splitting only where
    threads are at hand (a step's "watching"), the rest of the work on the calling thread.
    `exact`: exact(args) is fn's compiled entry for arguments of exactly the types of `args`
    (C-ordered, aligned, writable arrays and ints, as given), which skips the dispatch on types
    a call of fn does, or None where it has none; the caller must check each later call's
    arguments for those types itself (`executable.guarded_call` checks C order and
    alignment)."""

    __slots__ = ("fn", "settle", "pointers", "split", "exact")

    def __init__(self, fn: Callable, settle: Callable | None = None, pointers: bool = False,
                 split: Callable | None = None, exact: Callable | None = None) -> None:
        self.fn, self.settle, self.pointers, self.split, self.exact = fn, settle, pointers, split, exact


def _splitting(kernel: Kernel, fn: Callable) -> Callable:
    """rows(args, rows, first, split, watching): fn over [first, first + rows) with args, in a
    chunk per thread where `split` (through the kernel's own `split` where it can), or where
    `watching` and the kernel's own split has threads watching for work (see `Kernel`)."""
    own = kernel.split

    def rows_of(args: tuple, rows: int, first: int = 0, split: bool = True, watching: bool = False) -> None:
        if (split or watching) and own is not None and own(args, rows, first, not split):
            return
        run_rows(lambda s, e: fn(first + s, first + e, *args), rows, split)

    return rows_of


# ---------------------------------------------------------------------------- kernels
def _same(a):
    return a


def _preparer(dims, name: str, pointers: bool = False) -> Callable:
    """What a kernel reads for an input: f16/bf16 widened to f32, a scalar as one element
    (unless the kernel takes `pointers`)."""
    convert, scalar = name in HALF, len(dims) == 0 and not pointers
    if not convert and not scalar:
        return _same
    if convert:
        return lambda a: a.astype(np.float32).reshape(-1) if scalar else a.astype(np.float32)
    return lambda a: a.reshape(-1)


_AS_IS = (_same, lambda o, tmp: None)


def _unconverted(prepare: list, finish: list) -> bool:
    """Whether a kernel step reads its inputs and writes its outputs as they are."""
    return all(f is _same for f in prepare) and all(f is _AS_IS for f in finish)


def _finisher(dims, name: str, pointers: bool = False) -> tuple[Callable, Callable]:
    """(the buffer the kernel writes, then copy it into the real output)."""
    if name in HALF:
        return (lambda o: np.empty(o.shape, np.float32).reshape(-1) if o.ndim == 0 else np.empty(o.shape, np.float32),
                narrow)
    if len(dims) == 0 and not pointers:
        return (lambda o: o.reshape(-1), lambda o, tmp: None)
    return _AS_IS


def kernel_run(step: dict, kernel: Kernel, own: bool = False, watch: bool = True,
               backend: BackendProducts | None = None) -> Callable:
    """run(inputs, outputs) for a kernel step (`own`: an output fusion's product runs in
    xfuse's threads, see `products.matmul`; `watch`: a "watching" step may split, see
    `Kernel`: not where BLAS's own threads run the program's products, as they spin for a
    while after each and take the core a split would: softmax(relu(x @ w + b)) at 64x512 @
    512x1024, its epilogue split, took 0.53-0.61 ms against 0.34-0.37 ms)."""
    watching = watch and bool(step.get("watching")) and kernel.split is not None
    if step.get("dot") is not None:
        return _output_run(step, kernel, own, watching, backend)
    fn, settle = kernel.fn, kernel.settle
    prepare = [_preparer(dims, name, kernel.pointers) for dims, name in step["params"]]
    finish = [_finisher(dims, name, kernel.pointers) for dims, name in step["specs"]]
    rows, split = step["rows"], step["parallel"]
    first = [settle is not None]
    as_is = _unconverted(prepare, finish)
    if not split and not watching and as_is:

        def serial(inputs, outputs):  # the common small case: no conversion, one thread
            fn(0, rows, *inputs, *outputs)
            if first[0]:
                first[0] = False
                settle(fn)
                serial.direct = fn, rows, kernel.exact

        serial.dispatcher = fn
        if settle is None:  # nothing to do after the first call: the caller may call fn itself
            serial.direct = fn, rows, kernel.exact
        return serial

    over = _splitting(kernel, fn)
    if as_is:

        def plain(inputs, outputs):  # the arguments as they are, split
            over((*inputs, *outputs), rows, 0, split, watching)
            if first[0]:
                first[0] = False
                settle(fn)

        plain.dispatcher = fn
        return plain

    def run(inputs, outputs):
        args = [f(a) for f, a in zip(prepare, inputs)]
        outs = [f[0](o) for f, o in zip(finish, outputs)]
        over((*args, *outs), rows, 0, split, watching)
        for f, o, tmp in zip(finish, outputs, outs):
            f[1](o, tmp)
        if first[0]:  # the first call compiled the kernel or loaded it from a disk cache
            first[0] = False
            settle(fn)

    run.dispatcher = fn
    return run


def _blocks(d: dict) -> tuple[int, int, int | None, int]:
    """(rows, rows a block, the left side's axis cut into blocks, bytes a row) of an output
    fusion's dot `d`: a block of rows holds at most BLOCK_BYTES of the product where the fusion
    is row-blocked; with no row axis on the left (a scalar times a vector), one block."""
    dims = tuple(d["dims"])
    lhs, (lc, _), (lb, _) = d["lhs"], d["contracting"], d["batch"]
    rows = dims[0] if dims else 1
    row_bytes = max(1, int(np.prod(dims[1:])) * compute_dtype(d["dtype"]).itemsize) if dims else 1
    block = rows if not d["row_blocked"] else max(1, min(rows, BLOCK_BYTES // row_bytes))
    lhs_axis = lb[0] if lb else next((i for i in range(len(lhs)) if i not in lc), None)
    return rows, (rows if lhs_axis is None else block), lhs_axis, row_bytes


def _output_run(step: dict, kernel: Kernel, own: bool, watching: bool,
                backend: BackendProducts | None = None) -> Callable:
    """run(inputs, outputs) for an output fusion: BLAS a block of rows, then the epilogue
    (`watching`: split where threads watch, see `kernel_run`)."""
    fn, settle = kernel.fn, kernel.settle
    d = step["dot"]
    lhs, rhs, contracting, batch = d["lhs"], d["rhs"], d["contracting"], d["batch"]
    li, ri = d["operands"]
    dims = tuple(d["dims"])
    prepare = [_preparer(dims_, name, kernel.pointers) for dims_, name in step["params"]]
    finish = [_finisher(dims_, name, kernel.pointers) for dims_, name in step["specs"]]
    work = compute_dtype(d["dtype"])
    rows, block, lhs_axis, row_bytes = _blocks(d)
    split = step["parallel"]
    lb, rb = batch
    full_dot = make_dot(lhs, rhs, contracting, batch, d["dtype"], own, backend)
    block_product = block_products(d, lhs_axis, rb[0] if lb else None, own, backend) if block < rows else None
    first = [settle is not None]
    in_out = d["in_out"] and block >= rows and finish[0] is _AS_IS
    plain = _unconverted(prepare, finish)
    lean = bool(in_out and plain and not split and not watching and dims)
    kernel_rows = step["rows"]
    over = _splitting(kernel, fn)

    def in_place(inputs, outputs):  # the product into the output, the epilogue there: the least work
        out = outputs[0]
        full_dot(inputs[li], inputs[ri], out)
        fn(0, kernel_rows, 0, out, *inputs, *outputs)

    if lean and settle is None:
        in_place.dispatcher = fn
        in_place.scratch_bytes = 0
        return in_place

    def run(inputs, outputs):
        if lean and not first[0]:  # settled: a lean step needs nothing else
            in_place(inputs, outputs)
            return
        args = [f(a) for f, a in zip(prepare, inputs)]
        outs = [f[0](o) for f, o in zip(finish, outputs)]
        a, b = inputs[li], inputs[ri]
        if block >= rows:
            buf = outs[0] if in_out else POOL.empty(dims, work)
            full_dot(a, b, buf)
            flat = buf.reshape(-1) if not dims else buf
            over((0, flat, *args, *outs), step["rows"], 0, split, watching)
        else:
            buf = POOL.empty((block,) + dims[1:], work)
            for start in range(0, rows, block):
                end = min(rows, start + block)
                part = buf[: end - start]
                b_rows = cut_rows(b, rb[0], start, end) if lb else b
                block_product(end - start)(cut_rows(a, lhs_axis, start, end), b_rows, part)
                over((start, part, *args, *outs), end - start, start, split, watching)
        for f, o, tmp in zip(finish, outputs, outs):
            f[1](o, tmp)
        if first[0]:
            first[0] = False
            settle(fn)

    run.dispatcher = fn
    run.scratch_bytes = 0 if in_out else min(block, rows) * row_bytes
    return run


# ---------------------------------------------------------------------------- chains
# A chain's blocks of leading rows hold about this many bytes of the fusion's result: each
# block's product, epilogue and second product run one after another on one thread while the
# block is in cache (attention's 8 heads of 256x256 float32 make 2 MiB). Smaller blocks pay
# the calls' overhead more often: at 16x4x128x32, blocks of one row (256 KiB) took 1.8 ms
# against 1.4 ms as three steps, blocks of eight 1.5 ms against 1.7 ms.
CHAIN_BLOCK_BYTES = 1 << 21


def chained(program: dict, at: int, own: bool, kernels: Mapping[str, Kernel]) -> bool:
    """Whether step `at`, an output fusion, and the dot after it, the only reader of its one
    result (as its left side), run as one step (`_chain_run`): both products batched over the
    result's leading axis, the fusion's kernel split over those rows and able to run over a
    block of them alone (`row_slices`; a C kernel's inputs cut along their first axis only),
    products run in xfuse's threads (`own`), and each big enough to split (attention's q k^T,
    softmax, then @ v)."""
    steps = program["steps"]
    if not own or at + 1 >= len(steps):
        return False
    a, b = steps[at], steps[at + 1]
    d = a.get("dot") if a["op"] == "kernel" and "window" not in a else None
    if d is None or b["op"] != "dot" or not a["parallel"] or d.get("row_slices") is None \
            or len(a["outputs"]) != 1 or a["rows"] != d["dims"][0] or a["kernel"] not in kernels:
        return False
    if kernels[a["kernel"]].pointers and any(cut > 0 for cut in d["row_slices"]):
        return False  # a C kernel reads its inputs as contiguous: only cuts along the first axis
    made = a["outputs"][0]
    if b["inputs"][0] != made or b["inputs"][1] == made or made in program["results"] \
            or any(made in s["inputs"] for k, s in enumerate(steps) if k != at + 1):
        return False
    if any(name in HALF for _, name in (*a["params"], *a["specs"])) or {d["dtype"], b["dtype"]} & set(HALF):
        return False
    (lb, _), (blb, _) = d["batch"], b["batch"]
    return bool(lb) and bool(blb) and blb[0] == 0 and d["dims"][0] >= 2 and list(a["specs"][0][0]) == d["dims"] \
        and min(macs(d), macs(b)) >= products.SPLIT_PRODUCT_MIN


def _in_shares(share: Callable[[int, int], None], rows: int) -> None:
    """share(start, end) over each thread's share of `rows`, all at once, BLAS on one thread in
    each (each share runs as a pool worker: its products split no further)."""
    threads = min(num_threads(), rows)
    bounds = [rows * i // threads for i in range(threads + 1)]
    with blas.single_threaded():
        run_each([lambda i=i: share(bounds[i], bounds[i + 1]) for i in range(threads)])


def _chain_run(step: dict, kernel: Kernel, then: dict, backend: BackendProducts | None = None) -> Callable:
    """run(inputs, outputs) for an output fusion `step` and the dot `then` reading its result
    (see `chained`); inputs: the fusion's, then the dot's right side. Each thread takes a share
    of the leading rows and, a block of them at a time, runs the fusion's product (BLAS on
    that thread alone), its epilogue over the block alone (its inputs cut to the block's rows,
    as `row_slices` says) and `then`'s product of those rows, in buffers of one block that stay
    in cache: the intermediate never goes to memory, and the pool is handed work once, not
    three times (attention, 8x8x256x64: 8.5-11.2 ms against 9.4-12.5 ms as three steps)."""
    fn, settle = kernel.fn, kernel.settle
    d = step["dot"]
    li, ri = d["operands"]
    (lb, rb), (_, then_rb) = d["batch"], then["batch"]
    dims, work = tuple(d["dims"]), compute_dtype(d["dtype"])
    made_type = compute_dtype(step["specs"][0][1])  # the fusion's result: its own dtype, not the dot's
    rows, row_size = dims[0], int(np.prod(dims[1:]))
    block = max(1, CHAIN_BLOCK_BYTES // max(1, row_size * made_type.itemsize))
    first_product = block_products(d, lb[0], rb[0], True, backend)
    second_product = block_products(then, 0, then_rb[0], True, backend)
    n = len(step["inputs"])
    prepare = [_preparer(dims_, name, kernel.pointers) for dims_, name in step["params"]]
    cuts = list(d["row_slices"])
    first = [settle is not None]

    def run(inputs, outputs):
        args, right, out = [f(a) for f, a in zip(prepare, inputs[:n])], inputs[n], outputs[0]

        def share(start: int, end: int) -> None:
            size = min(block, end - start)
            made = POOL.empty((size, *dims[1:]), made_type)  # this thread's block of the fusion's result
            dot = made if d["in_out"] else POOL.empty((size, *dims[1:]), work)
            for s in range(start, end, size):
                e = min(end, s + size)
                first_product(e - s)(cut_rows(args[li], lb[0], s, e), cut_rows(args[ri], rb[0], s, e), dot[:e - s])
                fn(0, e - s, 0, dot, *[a if c < 0 else cut_rows(a, c, s, e) for a, c in zip(args, cuts)], made)
                second_product(e - s)(made[:e - s], cut_rows(right, then_rb[0], s, e), out[s:e])

        _in_shares(share, rows)
        if first[0]:
            first[0] = False
            settle(fn)

    run.dispatcher = fn
    share_rows = min(block, -(-rows // max(1, min(num_threads(), rows))))
    per_row = made_type.itemsize + (0 if d["in_out"] else work.itemsize)
    run.scratch_bytes = num_threads() * share_rows * row_size * per_row
    return run


def fed(program: dict, at: int, own: bool, kernels: Mapping[str, Kernel]) -> int | None:
    """Where the dot is that step `at` feeds, if the two run as one step (`_feed_run`): `at` a
    loop kernel whose rows make its one result's rows in order (`leading` of them a row), and
    the dot the only reader of that result, as its left side with no batch and every axis but
    the first contracted, so a block of the kernel's rows makes the same block of the
    product's; only alias steps (views, no work) between them, none reading the result. The
    product big enough to split and run in xfuse's threads anyway (`own`, or big enough for
    oneDNN, see `products.matmul`); no f16/bf16 conversions."""
    steps = program["steps"]
    a = steps[at]
    if a["op"] != "kernel" or "window" in a or a.get("dot") is not None or not a.get("leading") \
            or len(a["outputs"]) != 1 or a["kernel"] not in kernels:
        return None
    made = a["outputs"][0]
    dims, name = a["specs"][0]
    after = at + 1
    while after < len(steps) and steps[after]["op"] == "alias" and made not in steps[after]["inputs"]:
        after += 1
    if after >= len(steps) or made in program["results"]:
        return None
    b = steps[after]
    if b["op"] != "dot" or b["inputs"][0] != made or b["inputs"][1] == made \
            or any(made in s["inputs"] for k, s in enumerate(steps) if k != after):
        return None
    (lc, _), (lb, _) = b["contracting"], b["batch"]
    if lb or len(dims) < 2 or list(b["lhs"]) != list(dims) or sorted(lc) != list(range(1, len(dims))) \
            or b["dims"][0] != dims[0] or name != b["dtype"]:
        return None
    if name in HALF or any(n in HALF for _, n in a["params"]):
        return None
    size = macs(b)
    return after if size >= products.SPLIT_PRODUCT_MIN and (own or size >= products.ONEDNN_MIN) else None


# A kernel feeding a product (`fed`) makes its result this many bytes of rows at a time, each
# block multiplied while in cache. A 3x3 convolution's patches (8x32x32x64, 8192 x 576) then
# their product (@ 576x64) took 7.95 ms (median of 36) against 9.16 ms as two steps, in blocks
# of 512 rows (1.2 MB); 256 rows gave 8.3 ms.
FEED_BLOCK_BYTES = 1 << 20


def _feed_run(step: dict, kernel: Kernel, then: dict, backend: BackendProducts | None = None) -> Callable:
    """run(inputs, outputs) for a loop kernel `step` and the dot `then` reading its result (see
    `fed`); inputs: the kernel's, then the dot's right side. Each thread takes a share of the
    rows and, a block of them at a time, runs the kernel over the block and the product of
    those rows (BLAS on that thread alone) while they are in cache, rather than writing the
    whole result to memory and reading it back (a convolution's patches are nine times its
    input)."""
    fn, settle = kernel.fn, kernel.settle
    dims, name = step["specs"][0]
    made_type, rows, unit = dtype(name), dims[0], step["leading"]
    block = max(1, FEED_BLOCK_BYTES // max(1, int(np.prod(dims[1:])) * made_type.itemsize))
    product = block_products(then, 0, None, True, backend)
    n = len(step["inputs"])
    prepare = [_preparer(dims_, name_, kernel.pointers) for dims_, name_ in step["params"]]
    first = [settle is not None]

    def run(inputs, outputs):
        args, right, out = [f(a) for f, a in zip(prepare, inputs[:n])], inputs[n], outputs[0]
        made = POOL.empty(tuple(dims), made_type)

        def share(start: int, end: int) -> None:
            for s in range(start, end, block):
                e = min(end, s + block)
                fn(s * unit, e * unit, *args, made)
                product(e - s)(made[s:e], right, out[s:e])

        _in_shares(share, rows)
        if first[0]:
            first[0] = False
            settle(fn)

    run.dispatcher = fn
    run.scratch_bytes = int(np.prod(dims)) * made_type.itemsize
    return run


# ---------------------------------------------------------------------------- programs
def _alias(step: dict) -> tuple[Callable, int | None]:
    kind = step["kind"]
    if kind == "tuple":
        return (lambda xs: [tuple(xs)]), -1
    if kind == "barrier":
        return (lambda xs: [tuple(xs)]), None
    if kind == "element":
        i = step["index"]
        return (lambda xs: [xs[0][i]]), i
    if kind == "reshape":
        dims = tuple(step["dims"])
        return (lambda xs: [xs[0].reshape(dims)]), None
    raise ValueError(f"step {step.get('name')!r}: unknown alias kind {kind!r}")


def _on_blas_threads(step: dict, backend: BackendProducts | None) -> bool:
    """Whether `step`, in a program whose products do not run in xfuse's threads (not `own`),
    runs a product on BLAS's own threads: a dot, or an output fusion's, that neither is large
    enough to split over xfuse's threads nor goes to the backend's split product whole
    (`products.apart`; an output fusion cut into blocks of rows is taken as BLAS's)."""
    d = step if step["op"] == "dot" else step.get("dot") if step["op"] == "kernel" else None
    if d is None:
        return False
    if step is not d:
        rows, block, _, _ = _blocks(d)
        if block < rows:
            return True
    (_, lshape), (_, rshape), _ = dot_plan(d["lhs"], d["rhs"], d["contracting"], d["batch"])
    return not apart(lshape, rshape, compute_dtype(d["dtype"]), backend)


def build(program: dict, kernels: Mapping[str, Kernel], constants: Mapping[str, np.ndarray],
          sources: Mapping[str, str] | None = None, own: bool | None = None,
          backend: BackendProducts | None = None) -> Executable:
    """The executable of `program`, given its kernels by name and its constants by key (a
    program's `constants` maps each constant's value slot to its key). `own`: whether its
    products run in xfuse's threads (`blas`); by default, where any kernel of the program,
    nested ones included, is split over threads and BLAS's thread count can be set. `backend`:
    the backend's own float32 products, where it has them (`products.BackendProducts`)."""
    if own is None:
        own = blas.available() and (any(s["op"] == "kernel" and s.get("parallel") for s in walk(program))
                                    or split_loops.loops_side_by_side(program["steps"]))
    # "watching" kernels split only where no product runs on BLAS's own threads (`kernel_run`)
    watch = own or not any(_on_blas_threads(s, backend) for s in walk(program))
    steps = []
    inner_sources: dict[str, str] = {}  # the kernels of loop bodies and branches, by step
    chain_at = {at for at in range(len(program["steps"])) if chained(program, at, own, kernels)}
    feeds = {}  # the dot's position: the kernel step feeding it (`fed`)
    for at in range(len(program["steps"])):
        to = fed(program, at, own, kernels)  # None for a chain's steps: an output fusion, a dot
        if to is not None:
            feeds[to] = at
    fed_at = set(feeds.values())
    viewed = split_loops.read_by_parts_alone(program)
    for at, s in enumerate(program["steps"]):
        op, inputs, outputs = s["op"], tuple(s["inputs"]), tuple(s["outputs"])
        if at - 1 in chain_at or at in fed_at:
            continue  # run by the chain before it, or with the dot it feeds
        if at in feeds:
            k = program["steps"][feeds[at]]
            run = _feed_run(k, kernels[k["kernel"]], s, backend)
            steps.append(Step(f"{k['name']}+{s['name']}", "kernel", run, (*k["inputs"], s["inputs"][1]), outputs,
                              (spec((s["dims"], s["dtype"])),),
                              f"{k['label']}, then {s['name']} a block of rows at a time", False,
                              run.scratch_bytes))
            continue
        if at in chain_at:
            then = program["steps"][at + 1]
            run = _chain_run(s, kernels[s["kernel"]], then, backend)
            steps.append(Step(f"{s['name']}+{then['name']}", "kernel", run, (*inputs, then["inputs"][1]),
                              tuple(then["outputs"]), (spec((then["dims"], then["dtype"])),),
                              f"{s['label']}, then {then['name']} a block of rows at a time", False,
                              run.scratch_bytes))
            continue
        if op == "alias":
            run, element = _alias(s)
            steps.append(Step(s["name"], "alias", run, inputs, outputs, element=element))
        elif op == "dot":
            specs = (spec((s["dims"], s["dtype"])),)
            steps.append(Step(s["name"], "blas", dot_run(s, own, backend), inputs, outputs, specs, "dot_general"))
        elif op == "kernel" and "window" in s:
            parts = build(s["window"]["parts"], kernels, constants, sources, own, backend)
            steps.append(Step(s["name"], "alias", window_run(s["window"], parts), inputs, outputs, label=s["label"]))
        elif op == "kernel":
            if s["kernel"] not in kernels:
                raise KeyError(f"step {s['name']!r}: no kernel {s['kernel']!r} in this library")
            kernel = kernels[s["kernel"]]
            run = kernel_run(s, kernel, own, watch, backend)
            specs = tuple(spec(e) for e in s["specs"])
            # Over an input it reads, a numba kernel's vectorised loop falls back to its scalar
            # one (LLVM checks at run time that the arrays do not overlap): 2x slower for x * 2
            # + 1, 7x for a tanh chain, so only C kernels (pointer-taking) write in place.
            in_place = s["in_place"] and kernel.pointers
            steps.append(Step(s["name"], "kernel", run, inputs, outputs, specs, s["label"], in_place,
                              getattr(run, "scratch_bytes", 0)))
        elif op == "library" and (gathered := split_loops.gathered(program, at, steps)) is not None:
            k, gather = gathered
            parts = steps[k]
            steps[k] = split_loops.parts_step(parts.name, parts.run.parts, parts.inputs, parts.outputs,
                                   f"{parts.label}, then {s['name']} by each part", gather)
        elif op == "library" and at in viewed:
            steps.append(Step(s["name"], "alias", view_run(s), inputs, outputs, label=s["label"]))
        elif op == "library":
            specs = tuple(spec(e) for e in s["specs"])
            steps.append(Step(s["name"], "library", library_run(s), inputs, outputs, specs, s["label"]))
        elif op == "callback":
            specs = tuple(spec(e) for e in s["specs"])
            steps.append(Step(s["name"], "library", callback_run(s), inputs, outputs, specs, s["label"]))
        elif op == "while":
            condition = build(s["condition"], kernels, constants, sources, own, backend)
            body = build(s["body"], kernels, constants, sources, own, backend)
            native = kernels.get(s.get("native", ""))
            run = while_run(condition, body, s["flat"], native.fn if native is not None else None, s.get("owned", ()))
            part_of = at > 0 and split_loops.parts_of(program["steps"][at - 1], s)
            steps.append(split_loops.beside_loop(steps, Step(s["name"], "alias", run, inputs, outputs, label=s["label"]), part_of))
            for part, inner in (("cond", condition), ("body", body)):
                inner_sources.update({f"{s['name']}/{part}/{k}": v for k, v in inner.kernel_sources.items()})
        elif op == "conditional":
            branches = [build(b, kernels, constants, sources, own, backend) for b in s["branches"]]
            steps.append(Step(s["name"], "alias", conditional_run(branches, s["tupled"]), inputs, outputs,
                              label=s["label"]))
            for k, inner in enumerate(branches):
                inner_sources.update({f"{s['name']}/branch{k}/{n}": v for n, v in inner.kernel_sources.items()})
        elif op == "native":
            inner = build(s["program"], kernels, constants, sources, own, backend)
            steps.append(Step(s["name"], "alias", _native_run(kernels[s["kernel"]].fn, inner), inputs, outputs,
                              label=s["label"]))
            inner_sources.update({f"{s['name']}/{n}": v for n, v in inner.kernel_sources.items()})
        elif op == "nested":
            inner = build(s["program"], kernels, constants, sources, own, backend)
            steps.append(Step(s["name"], "alias", _nested_run(inner, s["tupled"]), inputs, outputs,
                              label=s["label"]))
        else:
            raise ValueError(f"step {s.get('name')!r}: unknown step kind {op!r}")
    specs = [None if p is None else spec(p) for p in program["param_specs"]]
    own = {int(slot): constants[key] for slot, key in program["constants"].items()}
    kernel_sources = {s["name"]: sources[s["kernel"]] for s in program["steps"]
                      if s["op"] == "kernel" and sources and s["kernel"] in sources}
    kernel_sources.update(inner_sources)
    return Executable(list(program["params"]), list(program["results"]), steps, own,
                      program["n_values"], kernel_sources, specs)


def _native_run(native: Callable, inner: Executable) -> Callable:
    """run(arrays) -> results through the backend's native function for the whole program,
    or through the program's own steps where it declines (returns None)."""

    def run(xs):
        results = native(list(xs))
        return inner(list(xs)) if results is None else results

    run.fresh, run.inner = getattr(native, "fresh", False), inner
    run.memory = getattr(native, "memory", None)
    return run


def _nested_run(inner: Executable, tupled: bool) -> Callable:
    def run(xs):
        results = inner(list(xs))
        return [tuple(results) if tupled else results[0]]

    return run


def walk(program: dict):
    """Every step of a program, nested programs' steps included."""
    for s in program["steps"]:
        yield s
        for inner in nested_programs(s):
            yield from walk(inner)


__all__ = ["BLOCK_BYTES", "Kernel", "build", "dtype", "walk"]
