"""Kernel templates: a fused computation to the Python source of one numba kernel.

- loop: one loop nest over the output shape (flattened to one loop when every access is the
  identity or a scalar), outputs stored at the innermost level.
- input: a loop nest over the kept dimensions K, and inside it, per row, one pass per phase
  of reductions (independent reductions share a pass), then a pass storing the row outputs
  (row_passes.py). Short rows unroll those passes; rows of 9 to 23 do so over blocks of rows
  read and written through stack tiles (`row_forms`). Reductions that keep the minor
  dimension take the column form instead (columns.py): the reduced loops outside, a block of
  columns inside.
- output: the dot's result arrives as a block of rows computed by BLAS (`dot`, whose first row
  is row `dot_start`); the epilogue is a loop or input kernel over those rows.

Every kernel computes the rows [row_start, row_end) of its outermost loop (`rows` of them in
all), so the runtime can split a large kernel across its threads; numba's own `prange` is not
used (its compile time is several times longer). Destination passing: kernels write into the
output arrays they are given.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field

import numpy as np

from xfuse.hlo import Computation, DType, Instruction, Kind, Op, Shape

from .analysis import (PARALLEL_MIN_WORK, TRANSCENDENTAL_OPS, WATCHING_MIN_WORK, dot_in_output, flattenable,
                       output_members, output_shapes, reads_across, reduction_space, work_estimate)
from . import row_forms
from .emitter import Emitter, Ix, index_text, linear_index, np_name, unsigned_index
from .columns import ColumnPasses, NotColumns
from .row_passes import RowPasses

# A loop nest whose innermost loop walks an operand's outer dimension (a transpose) in steps
# of a multiple of ALIASING bytes (`analysis.reads_across`) runs its last two loops in TILE x
# TILE blocks: reads that far apart fall in one set of the 8-way L1 and evict each other before
# the next iteration uses the rest of their lines. Measured: x.T + 1 at 1024x1024 f32, 6.75 ms untiled,
# 1.98 ms in 16x16 tiles (2.47 ms in 8x8, 3.14 ms in 32x32); at 1000x1000 the untiled loop was
# the fastest (1.45 ms, 2.9-4.1 ms tiled), so other strides stay untiled.
TILE = 16
MAX_PIECES = 32  # of a loop split where a concatenate or pad switches operands (in all, split twice)


def tile_index(column: str) -> str:
    """The index into a tile (`row_forms.tiled`) of the block's row b at `column`, as source."""
    column = column if re.fullmatch(r"\w+", column) else f"({column})"
    return f"U({column} * {row_forms.TILE_ROWS} + b)"


@dataclass
class KernelSource:
    name: str
    source: str
    globals: dict
    params: list[str]  # the fused computation's parameters, in order
    outputs: list[Shape]
    parallel: bool  # worth splitting across threads
    kind: str
    rows: int = 1  # the extent of the outermost loop
    dot: Instruction | None = None  # output fusions: the dot BLAS computes
    row_blocked: bool = False  # the dot can be computed a block of (outer-loop) rows at a time
    flat: bool = False
    extra: dict = field(default_factory=dict)
    dot_in_out: bool = False  # the dot may be computed into the output, the epilogue in place
    by_rows: bool = False  # a row-wise kernel: each row read whole (into buffers) before it is written
    watching: bool = False  # not `parallel`, but worth splitting across threads already watching


class Writer(RowPasses, ColumnPasses):
    """Builds one kernel: its loops, the emitter filling them, and the final source."""

    def __init__(self, comp: Computation, name: str, kind: str) -> None:
        self.comp = comp
        self.name = name
        self.kind = kind
        self.level_of: dict[str, int] = {}
        self.dot = next((i for i in comp.instructions if i.op is Op.DOT_GENERAL), None)
        self.params = [p.name for p in comp.parameters]
        self.outputs = output_members(comp)
        self.out_shapes = output_shapes(comp)
        loads = {p: self.loader(p) for p in self.params}
        self.emitter = Emitter(comp, loads, self.level_of)
        self.light = False  # an input kernel of one light phase (see `input`)
        self.emitter.flat_loads = {p: self.flat_loader(p) for p in self.params
                                   if comp[p].array_shape.rank > 1}
        self.flat_views: list[str] = []  # parameters (and `dot`) read through `p_flat = p.ravel()`
        self.lines: list[str] = []
        self.flat_dims: tuple[int, ...] | None = None
        # a kernel over short rows (`row_forms.SHORT_ROW`): its loops along the row unrolled,
        # and arrays of the iteration space's dims (the product's block too) read and written
        # through flat views
        self.short: tuple[int, ...] | None = None
        self.flat_outputs: list[int] = []  # outputs written through `out_flat = out.reshape(n)`
        self.rows = 1
        self.scratch: list[str] = []  # row buffers, allocated once per call
        self.knames: list[str] = []  # an input kernel's kept loops
        self.may_tile = True  # whether an input kernel may take the tiled form (`row_forms.TILED_ROW`)
        self.tiles: dict[str, str] = {}  # tiled kernels: array -> the source of its element (k, j)
        self.looped = False  # a loop along a short row was left a loop (`row_forms.unrolled`)

    def loader(self, param: str):
        rank = self.comp[param].array_shape.rank

        def load(index: tuple[Ix, ...]) -> Ix:
            if rank == 0:  # read once, before the loops: a load inside them is read again after
                # every store (LLVM cannot tell the output from this input), and the loop does
                # not vectorise (a convolution's patches, padded with p1[0]: 2.5x slower)
                key = ("scalar", param)
                value = self.emitter.memo.get(key)
                if value is None:
                    value = self.emitter.memo[key] = self.emitter.emit(f"{param}[0]", frozenset(), "s")
                return value
            if self.flat_dims is not None:  # the flat loop's index, from row_start: unsigned
                return Ix(f"{param}[{unsigned_index(index[0].text)}]", index[0].deps)
            deps = frozenset().union(*(i.deps for i in index))
            if self.short is not None and self.comp[param].array_shape.dims == self.short:
                if self.in_tile(index):
                    return Ix(self.tile_read(param, index[-1].text), deps)
                return self.flat_loader(param)(Ix(linear_index(index, self.short), deps))
            array, rest = self.row_view(param, index, deps)
            return Ix(f"{array}[{index_text(rest)}]", deps)

        return load

    def in_tile(self, index: tuple[Ix, ...]) -> bool:
        """Whether an element of the row space at `index` is read from its tile: in a tiled
        kernel (`row_forms.tiled`), in the block's row."""
        return row_forms.tiled(self.short) and [i.text for i in index[:-1]] == self.knames

    def tile_read(self, array: str, column: str) -> str:
        """The read of `array`'s element in `column` of the block's row b, from its tile,
        which each block fills first from the array's flat view (the product's block: its rows
        from `dot_start`)."""
        if array not in self.tiles:
            dtype = self.dot.shape.dtype if array == "dot" else self.comp[array].shape.dtype
            self.tile_buffer(f"t_{array}", dtype)
            row = [Ix(n) for n in self.knames]
            if array == "dot":
                row[0] = Ix(f"{row[0].text} - dot_start")
            self.tiles[array] = f"{array}_flat[U({linear_index((*row, Ix('j')), self.short)})]"
            if array not in self.flat_views:
                self.flat_views.append(array)
        return f"t_{array}[{tile_index(column)}]"

    def tile_buffer(self, name: str, dtype: DType) -> None:
        """A tile of a block's rows, made once per call in the stack frame."""
        self.scratch.append(f"{name} = scalar.row_buffer({self.short[-1] * row_forms.TILE_ROWS}, {np_name(dtype)})")

    def flat_loader(self, param: str):
        """A reshaped parameter read at the linear index of the reshape: one index into its
        flat buffer, which vectorises, where the index into the array itself would be a
        division and a remainder per dimension."""

        def load(linear: Ix) -> Ix:
            if param not in self.flat_views:
                self.flat_views.append(param)
            return Ix(f"{param}_flat[{unsigned_index(linear.text)}]", linear.deps)

        return load

    def row_view(self, param: str, index: tuple[Ix, ...], deps: frozenset):
        """(array, remaining index): the longest leading part of the index that is fixed in
        the inner loops becomes a view taken outside them (`row = p0[k0]`), because numba
        indexes a 1-D view much faster than a 2-D array."""
        level = self.emitter.level(deps)
        for cut in range(len(index) - 1, 0, -1):
            prefix = index[:cut]
            prefix_deps = frozenset().union(*(i.deps for i in prefix))
            if prefix_deps and self.emitter.level(prefix_deps) < level:
                key = ("view", param, tuple(i.text for i in prefix))
                view = self.emitter.memo.get(key)
                if view is None:
                    view = self.emitter.emit(f"{param}[{index_text(prefix)}]", prefix_deps, "row")
                    self.emitter.memo[key] = view
                return view.text, index[cut:]
        return param, index

    # ------------------------------------------------------------------ rendering helpers
    def statements(self, level: int, start: int = 0, end: int | None = None) -> list[str]:
        return self.emitter.statements.get(level, [])[start:end]

    def mark(self, level: int) -> int:
        return len(self.emitter.statements.get(level, []))

    def add(self, indent: int, text: str) -> None:
        self.lines.append("    " * indent + text)

    def store(self, k: int, index: tuple[Ix, ...], value: Ix) -> str:
        shape = self.out_shapes[k]
        cast = value.text if shape.dtype.is_pred else f"{np_name(shape.dtype)}({value.text})"
        if self.short is not None and shape.dims == self.short:
            tiled = row_forms.tiled(self.short)  # into the tile `to{k}`, copied out in order
            if k not in self.flat_outputs:
                self.flat_outputs.append(k)
                if tiled:
                    self.tile_buffer(f"to{k}", shape.dtype)
            if tiled:  # the block's row b, at the row's element index[-1]
                return f"to{k}[{tile_index(index[-1].text)}] = {cast}"
            return f"out{k}_flat[{unsigned_index(linear_index(index, self.short))}] = {cast}"
        if self.flat_dims is None and len(index) > 1:
            deps = frozenset().union(*(i.deps for i in index))
            array, rest = self.row_view(f"out{k}", index, deps)
            return f"{array}[{index_text(rest)}] = {cast}"
        return f"out{k}[{index_text(index)}] = {cast}"

    # ------------------------------------------------------------------ loop kernels
    def loop(self, dims: tuple[int, ...]) -> None:
        """One loop nest over `dims`; every output stored at the innermost level."""
        if self.dot is None and len(dims) > 1 and flattenable(self.comp, dims):
            self.flat_dims = dims
            size = 1
            for d in dims:
                size *= d
            dims = (size,)
        names = [f"i{k}" for k in range(len(dims))]
        for level, n in enumerate(names, start=1):
            self.level_of[n] = level
        index = tuple(Ix(n, frozenset({n})) for n in names)
        self.rows = dims[0] if dims else 1
        tiled = self.flat_dims is None and len(dims) >= 2 and min(dims[-2:]) > TILE and reads_across(self.comp)
        if self.flat_dims is None and not tiled and len(dims) > 1 and row_forms.short(dims, self.dot):
            self.short = tuple(dims)  # unrolled along the short last axis, vectorised across it
        stores = []
        for k, member in enumerate(self.outputs):
            value = self.emitter.value(member, index)
            stores.append(self.store(k, index, value))
        flat = self.flat_dims is not None or self.short is not None  # (an unrolled copy folds a switch)
        pieces, split = None, len(dims)
        if not (tiled or not dims or flat):
            for level in range(min(2, len(dims)), len(dims) + 1):  # a middle loop first, then the innermost
                pieces, split = self.pieces(names[level - 1], dims[level - 1]), level
                if pieces is not None:
                    break
        if pieces is None:
            parts = [(None, self.emitter, stores, None)]
        else:
            parts = self.split_loop(names[split - 1], index, pieces, names[-1] if split < len(dims) else None,
                                    dims[-1])
        self.render_nest(dims, names, parts, tiled, split)

    def pieces(self, var: str, extent: int) -> list[tuple[int, int]] | None:
        """Where the loop over `var` splits: at the points where a concatenate or a pad it
        indexes switches between its operands (or the padding), at most MAX_PIECES pieces."""
        cuts = sorted(c for c in self.emitter.cuts.get(var, ()) if 0 < c < extent)
        if not cuts or len(cuts) >= MAX_PIECES:
            return None
        bounds = [0, *cuts, extent]
        return list(zip(bounds, bounds[1:]))

    def split_loop(self, var: str, index, pieces, innermost: str | None = None, extent: int = 0) -> list:
        """(range, emitter, stores[, inner parts]) per piece of the loop over `var` (the
        innermost, else a middle one: the taps of a convolution's patches, whose pieces split
        their `innermost` loop, of `extent`, in turn), each piece emitted anew with the
        variable's range known: a concatenate there reads one operand, a pad the operand or
        its padding, at an index with no clamp. Over the whole range each read is a select
        between loads of two arrays at clamped indices, which LLVM does not vectorise (tanh
        of a concatenation of 1024x1000 and 1024x24: 5.2 ms, split 0.82 ms), and each element
        computes every operand's value."""
        first, parts = self.emitter, []
        for lo, hi in pieces:
            self.emitter = dataclasses.replace(
                first, statements={}, memo={}, counter=self.emitter.counter,
                ranges={**first.ranges, var: (lo, hi)}, cuts={})
            stores = [self.store(k, index, self.emitter.value(member, index))
                      for k, member in enumerate(self.outputs)]
            inner = self.pieces(innermost, extent) if innermost is not None else None
            if inner is not None and len(pieces) * len(inner) > MAX_PIECES:
                inner = None  # the code grows with every piece: at most MAX_PIECES loops in all
            piece = self.emitter
            parts.append(((lo, hi), piece, stores, None if inner is None else self.split_loop(innermost, index, inner)))
            self.emitter = dataclasses.replace(piece, counter=self.emitter.counter)
        return parts

    def render_nest(self, dims, names, parts: list, tiled: bool = False, split: int | None = None) -> None:
        """The loops over `dims`, the outermost over [row_start, row_end); `tiled`: the last two
        in TILE x TILE blocks (the block loops outside both). `parts`: (range, emitter, stores)
        per piece of the loop at level `split` (default the innermost; `split_loop`), or one
        with range None; each piece names its own values, and all their statements above that
        level go there; below it, each piece has its own loops."""
        split = len(dims) if split is None else split

        def emitters(part) -> list:
            return [part[1], *(inner[1] for inner in part[3] or ())]

        def statements(indent: int, level: int) -> None:
            for part in parts:
                for emitter in emitters(part):
                    for s in emitter.statements.get(level, []):
                        self.add(indent, s)

        indent = 1
        statements(indent, 0)
        first_tiled = len(dims) - 1 if tiled else len(dims) + 1
        for level, (n, d) in enumerate(zip(names, dims), start=1):
            lo, hi = ("row_start", "row_end") if level == 1 else ("0", str(d))
            bounds = f"{lo}, {hi}" if level == 1 else hi
            if level == split and parts[0][0] is not None:  # the pieces of a split loop
                for part in parts:
                    (a, b), stores = part[0], part[2]
                    bounds = f"max(row_start, {a}), min(row_end, {b})" if level == 1 else f"{a}, {b}"
                    self.add(indent, f"for {n} in range({bounds}):")
                    inner = indent + 1
                    for emitter in emitters(part):
                        for s in emitter.statements.get(level, []):
                            self.add(inner, s)
                    for deeper in range(level + 1, len(dims) + 1):  # the piece's own inner loops
                        if deeper == len(dims) and part[3]:  # split again: each sub-piece's loop
                            for (c, d), emitter, substores, _ in part[3]:
                                self.add(inner, f"for {names[deeper - 1]} in range({c}, {d}):")
                                for s in emitter.statements.get(deeper, []) + substores:
                                    self.add(inner + 1, s)
                            break
                        self.add(inner, f"for {names[deeper - 1]} in range({dims[deeper - 1]}):")
                        inner += 1
                        for emitter in emitters(part):
                            for s in emitter.statements.get(deeper, []):
                                self.add(inner, s)
                    else:
                        for s in stores:
                            self.add(inner, s)
                return
            if level == first_tiled:  # the block loops of both tiled levels
                self.add(indent, f"for {n}_t in range({lo}, {hi}, {TILE}):")
                self.add(indent + 1, f"for {names[-1]}_t in range(0, {dims[-1]}, {TILE}):")
                indent += 2
            if level >= first_tiled:
                self.add(indent, f"for {n} in range({n}_t, min({n}_t + {TILE}, {hi})):")
            elif level == len(dims) > 1 and self.short is not None:
                copies = row_forms.unrolled(n, d, [*parts[0][1].statements.get(level, []), *parts[0][2]])
                if copies is not None:
                    for line in copies:
                        self.add(indent, line)
                    return
                self.add(indent, f"for {n} in range({bounds}):")
            else:
                if level == len(dims) > 1:
                    bounds = self.count(d, row_forms.LOOP_ROWS)
                self.add(indent, f"for {n} in range({bounds}):")
            indent += 1
            statements(indent, level)
        for s in parts[0][2]:
            self.add(indent, s)

    # ------------------------------------------------------------------ input kernels
    def input(self, full: tuple[int, ...], axes: tuple[int, ...]) -> None:
        kept = [i for i in range(len(full)) if i not in axes]
        self.rows = full[kept[0]] if kept else 1
        reductions = [i for i in self.comp.instructions if i.info.kind is Kind.REDUCTION]
        phases = self.phases(reductions)
        # one phase of row sums, maxima or minima (through `rows`; not their indices) and nothing
        # transcendental: `row_forms.LIGHT_TILED_ROW`
        light = len(phases) == 1 and self.row_sums(reductions, full, axes) \
            and all(r.op not in (Op.ARGMAX, Op.ARGMIN) for r in reductions) \
            and not any(i.op in TRANSCENDENTAL_OPS for i in self.comp.instructions)
        self.light = light
        if kept and list(axes) == [len(full) - 1] and row_forms.short(full, self.dot, tiles=self.may_tile, light=light):
            self.short = tuple(full)
        knames = self.knames = [f"k{j}" for j in range(len(kept))]
        for level, n in enumerate(knames, start=1):
            self.level_of[n] = level
        row_level = len(knames)
        kept_index = tuple(Ix(n, frozenset({n})) for n in knames)
        segments = []  # (first row-level statement, (lines before the loop, loop, last statement))
        for p, members in enumerate(phases):
            start = self.mark(row_level)
            segments.append((start, self.reduction_pass(p, members, full, axes, kept, kept_index, row_level)))
        start = self.mark(row_level)
        segments.append((start, self.output_pass(len(phases), full, axes, kept, kept_index, row_level)))
        indent = 1
        if row_level > 0:  # with no kept dimensions, the segments hold the prologue
            for s in self.statements(0):
                self.add(indent, s)
        tiled = row_forms.tiled(self.short)
        for level, n in enumerate(knames, start=1):
            lo, hi = ("row_start", "row_end") if level == 1 else ("0", str(full[kept[level - 1]]))
            if tiled and level == row_level:  # blocks of TILE_ROWS rows, each row b of its block
                self.add(indent, f"for {n}_t in range({lo}, {hi}, {row_forms.TILE_ROWS}):")
                self.add(indent + 1, f"nb = scalar.opaque(min({row_forms.TILE_ROWS}, {hi} - {n}_t))")
                if self.tiles:  # the block's inputs, into their tiles
                    self.add(indent + 1, "for b in range(nb):")
                    self.add(indent + 2, f"{n} = {n}_t + b")
                    self.add(indent + 2, f"for j in range({full[-1]}):")
                    for array, element in self.tiles.items():
                        self.add(indent + 3, f"t_{array}[{tile_index('j')}] = {element}")
                self.add(indent + 1, "for b in range(nb):")
                self.add(indent + 2, f"{n} = {n}_t + b")
                indent += 1
            else:
                self.add(indent, f"for {n} in range({lo + ', ' + hi if level == 1 else hi}):")
            indent += 1
            if level < row_level:
                for s in self.statements(level):
                    self.add(indent, s)
        for start, (pre, loop_lines, end) in segments:
            for s in self.statements(row_level, start, end):
                self.add(indent, s)
            for line in pre + loop_lines:
                self.add(indent, line)
        if tiled:
            self.tile_copies(indent - 1, knames, full)

    def tile_copies(self, indent: int, knames: list[str], full: tuple[int, ...]) -> None:
        """A tiled block's outputs copied out in order (`row_forms.tile_order`), after its rows."""
        tiles = [k for k in self.flat_outputs if self.out_shapes[k].dims == self.short]
        if not tiles:
            return
        width = full[-1]
        order = f"tile_order_{width}"
        self.emitter.globals[order] = row_forms.tile_order(width)
        first = linear_index((*(Ix(n) for n in knames[:-1]), Ix(f"{knames[-1]}_t"), Ix("0")), tuple(full))
        self.add(indent, f"first = {first}")
        self.add(indent, f"for i in range(nb * {width}):")
        for k in tiles:
            self.add(indent + 1, f"out{k}_flat[U(first + i)] = to{k}[U({order}[i])]")

    def dot_load(self, index: tuple[Ix, ...]) -> Ix:
        """The product's element at `index` (of the whole product): its block holds the rows
        from `dot_start`."""
        if not index:
            return Ix("dot[0]")
        first, *rest = index
        local = (Ix(f"{first.text} - dot_start", first.deps), *rest)
        deps = frozenset().union(*(i.deps for i in index))
        if self.short is not None:  # (its dims are the short form's: `row_forms.short`)
            if self.in_tile(index):
                return Ix(self.tile_read("dot", index[-1].text), deps)
            return self.flat_loader("dot")(Ix(linear_index(local, self.short), deps))
        return Ix(f"dot[{index_text(local)}]", deps)

    def count(self, extent: int, opaque_below: int) -> str:
        """The count of a loop along a row, as source: hidden from LLVM (`scalar.opaque`, made
        once per call) where `row_forms.hidden`."""
        if not row_forms.hidden(extent, opaque_below):
            return str(extent)
        name = f"n{extent}"
        line = f"{name} = scalar.opaque({extent})"
        if line not in self.scratch:
            self.scratch.append(line)
        return name

    # ------------------------------------------------------------------ the whole kernel
    def source(self) -> str:
        args = ["row_start", "row_end"] + (["dot_start", "dot"] if self.dot is not None else [])
        args += self.params
        args += [f"out{k}" for k in range(len(self.outputs))]
        header = [f"def {self.name}({', '.join(args)}):"]
        if self.flat_dims is not None:
            size = 1
            for d in self.flat_dims:
                size *= d
            for p in self.params:  # ravel: a view of a C-ordered input, a copy of another
                if self.comp[p].array_shape.rank:
                    header.append(f"    {p} = {p}.ravel()")
            for k in range(len(self.outputs)):
                if self.out_shapes[k].rank:
                    header.append(f"    out{k} = out{k}.reshape({size})")
        header += [f"    {p}_flat = {p}.ravel()" for p in self.flat_views]
        header += [f"    out{k}_flat = out{k}.reshape({int(np.prod(self.out_shapes[k].dims))})"
                   for k in self.flat_outputs]
        header += ["    " + line for line in self.scratch]
        helpers = list(self.emitter.helpers.values())
        return "\n".join(helpers + [""] + header + self.lines) + "\n"


def write_kernel(comp: Computation, name: str, kind: str, tiles: bool = True,
                 columns: bool = True) -> KernelSource:
    """The source of the kernel computing the fused computation `comp`; `tiles`: whether it may
    take the tiled form (`row_forms.TILED_ROW`). A tiled kernel whose loops along the row did
    not all unroll, or whose source passes `row_forms.TILED_LINES` lines or `TILED_CALLS` calls
    of the math library, is written again without: a loop left inside the block keeps LLVM
    from vectorising across its rows, and a long unrolled body compiles for seconds."""
    writer = Writer(comp, name, kind)
    writer.may_tile = tiles
    space = reduction_space(comp)
    if writer.dot is not None:
        writer.emitter.overrides[writer.dot.name] = writer.dot_load
    if space is not None:
        try:
            by_columns = columns and writer.columns(*space)
        except NotColumns:
            return write_kernel(comp, name, kind, tiles, columns=False)
        if not by_columns:
            writer.input(*space)
        if row_forms.tiled(writer.short) and (
                writer.looped or len(writer.lines) > row_forms.TILED_LINES
                or sum(line.count("mathlib.") for line in writer.lines) > row_forms.TILED_CALLS):
            return write_kernel(comp, name, kind, tiles=False, columns=columns)
        # BLAS makes the dot a block of rows at a time when the epilogue's outer loop runs
        # over the dot's first axis (a reduction over that axis needs the whole result).
        blocked = 0 not in space[1] and len(space[0]) > len(space[1])
    else:
        writer.loop(writer.out_shapes[0].dims)
        blocked = writer.out_shapes[0].rank > 0
    work = work_estimate(comp, space)
    parallel = work >= PARALLEL_MIN_WORK and writer.rows > 1
    return KernelSource(
        name, writer.source(), writer.emitter.globals, writer.params, writer.out_shapes, parallel,
        kind, writer.rows, writer.dot, writer.dot is not None and blocked,
        writer.flat_dims is not None,
        # not in place in the short-row form: over one array read and written at distances under
        # a vector, LLVM leaves the loop scalar (a softmax over 65536x4 after its product: 1.1 ms
        # in place, 0.05 ms apart)
        dot_in_out=dot_in_output(comp, writer.dot, space) and writer.short is None,
        by_rows=space is not None,
        # a light reduction's little work is done before a split pays (row sums over 1024x256:
        # 12.7-13.5 us split over watching threads, 10.9-11.0 us on one)
        watching=not parallel and work >= WATCHING_MIN_WORK and writer.rows > 1 and not writer.light,
    )


__all__ = ["KernelSource", "write_kernel"]
