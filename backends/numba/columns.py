"""Column reductions: the form of an input kernel whose reductions keep the minor dimension (a
bias gradient's sum over the batch, batch norm's statistics over N, H and W, a reduction over
the middle axis of a 3-D array). Read the row way, each accumulator walks down a column, a
cache line per element; here the reduced loops run outside and a block of `BLOCK` adjacent
columns inside, one accumulator each in a stack buffer, so every row is read in order and the
innermost loop vectorises across the columns. Each column sums in order, as the row form's
one-accumulator pass does.

kernels.py's `Writer` takes this as a mixin (`columns` returns False where the form does not
apply: products, argmax/argmin, more than MAX_PHASES phases of reductions, narrow minor
dimensions). Each phase of reductions (a softmax's maximum, then its sum) is a pass of its own
over the reduced dimensions, reading the results of the passes before it.
"""

from __future__ import annotations

from xfuse.hlo import Kind, Op

from .analysis import STACK_ROW_BYTES
from .emitter import Ix, compute_dtype, np_name
from .reductions import combiner

BLOCK = 256  # columns accumulated at once: 1 KiB of f32 accumulators a reduction, in L1
MAX_PHASES = 4  # passes over the reduced dimensions, each reading the results before it
MIN_COLUMNS = 8  # a narrower minor dimension is not worth a vector: the row form stays
COLUMN_OPS = {Op.REDUCE_SUM, Op.REDUCE_PROD, Op.REDUCE_MAX, Op.REDUCE_MIN, Op.REDUCE_AND, Op.REDUCE_OR}


class NotColumns(Exception):
    """A result of the sums read at an index the column form does not hold (another row of
    the kept dimensions above the minor one, through a reshape): the kernel is written again
    in the row form."""


class ColumnPasses:
    """The column form of an input kernel; the writer provides the emitter, `store`, `add`,
    `statements`, `scratch` and `level_of`."""

    def columns(self, full: tuple[int, ...], axes: tuple[int, ...]) -> bool:
        """Writes the kernel in the column form and returns True, or returns False (nothing
        written) where the form does not apply."""
        minor = len(full) - 1
        reductions = [i for i in self.comp.instructions if i.info.kind is Kind.REDUCTION]
        if self.dot is not None or not axes or minor in axes or full[minor] < MIN_COLUMNS:
            return False
        phases = self.phases(reductions)
        if any(r.op not in COLUMN_OPS for r in reductions) or len(phases) > MAX_PHASES:
            return False
        kept = [d for d in range(len(full)) if d not in axes]
        self.rows = full[kept[0]]
        outer = [f"k{j}" for j in range(len(kept) - 1)]  # kept dimensions above the minor one
        passes = [([f"r{p}_{j}" for j in range(len(axes))], f"b{p}") for p in range(len(phases))]
        after = [f"q{j}" for j in range(len(axes))]  # the pass storing what reads the results
        loop_vars = [*outer, "kc", *(v for names, column in passes for v in (*names, column)),
                     "e", *after, "f"]
        for level, name in enumerate(loop_vars, start=1):
            self.level_of[name] = level

        def index(reduced_vars: list[str], column: str) -> tuple[Ix, ...]:
            at = [None] * len(full)
            for pos, name in zip(kept[:-1], outer):
                at[pos] = Ix(name, frozenset({name}))
            for pos, name in zip(axes, reduced_vars):
                at[pos] = Ix(name, frozenset({name}))
            at[minor] = Ix(f"(kc + {column})", frozenset({column}))  # whole, inside any index
            return tuple(at)

        depends = self.reduction_dependents(reductions)
        full_outputs, row_outputs, late_outputs = [], [], []
        for k, member in enumerate(self.outputs):
            if self.out_shapes[k].dims != tuple(full):
                row_outputs.append((k, member))
            else:
                (late_outputs if member in depends else full_outputs).append((k, member))
        bodies = []  # (reduced loop names, column name, initial values, the loop's lines)
        for members, (reduced, column) in zip(phases, passes):
            at = index(reduced, column)
            inits, updates = [], []
            for r in members:
                tag = r.name.replace(".", "_").replace("-", "_")
                dtype = compute_dtype(self.comp[r.operands[0]].shape.dtype)
                on_stack = BLOCK * dtype.numpy.itemsize <= STACK_ROW_BYTES
                make = "scalar.row_buffer" if on_stack else "np.empty"
                self.scratch.append(f"acc_{tag} = {make}({BLOCK}, {np_name(dtype)})")
                operand = self.emitter.value(r.operands[0], at)
                init, update, _ = combiner(self.comp, r, f"acc_{tag}[{column}]", operand, reduced)
                inits += init
                updates += update
            if not bodies:  # what reads no result is stored in the first pass
                updates += [self.store(k, at, self.emitter.value(member, at))
                            for k, member in full_outputs]
            for r in members:  # the results, for the passes after this one
                tag = r.name.replace(".", "_").replace("-", "_")
                self.emitter.overrides[r.name] = (
                    lambda at, tag=tag: self.result_at(tag, at, outer, kept))
            bodies.append((reduced, column, inits, updates))
        row = index(passes[0][0], "e")
        kept_index = tuple(row[d] for d in kept)
        row_stores = []
        for k, member in row_outputs:
            at = self.row_index(self.out_shapes[k].dims, full, axes, kept_index)
            row_stores.append(self.store(k, at, self.emitter.value(member, at)))
        late = index(after, "f")
        late_stores = [self.store(k, late, self.emitter.value(member, late)) for k, member in late_outputs]
        self.render_columns(full, axes, kept, outer, bodies, after, row_stores, late_stores)
        return True

    def result_at(self, tag: str, at: tuple[Ix, ...], outer: list[str], kept: list[int]) -> Ix:
        """A reduction's result at `at` (an index into the kept dimensions): its accumulator's
        element in this block; NotColumns where `at` leaves the current row of the outer
        kept dimensions or the block's columns."""
        *above, column = (at[d] for d in kept) if len(at) > len(kept) else at
        inner = column.text[len("(kc + "):-1]
        if [i.text for i in above] != outer or column.text != f"(kc + {inner})" or not inner.isidentifier():
            raise NotColumns(tag)
        return Ix(f"acc_{tag}[{inner}]", column.deps)

    def reduction_dependents(self, reductions) -> set[str]:
        """The members computed from a reduction's result."""
        found = {r.name for r in reductions}
        for inst in self.comp.instructions:
            if any(o in found for o in inst.operands):
                found.add(inst.name)
        return found

    def render_columns(self, full, axes, kept, outer, bodies, after, row_stores, late_stores) -> None:
        indent = 1
        for s in self.statements(0):
            self.add(indent, s)
        minor = len(full) - 1
        for j, name in enumerate(outer):
            bounds = "row_start, row_end" if j == 0 else str(full[kept[j]])
            self.add(indent, f"for {name} in range({bounds}):")
            indent += 1
            for s in self.statements(self.level_of[name]):
                self.add(indent, s)
        lo, hi = ("row_start", "row_end") if not outer else ("0", str(full[minor]))
        self.add(indent, f"for kc in range({lo}, {hi}, {BLOCK}):")
        indent += 1
        self.add(indent, f"nb = min({BLOCK}, {hi} - kc)")
        for s in self.statements(self.level_of["kc"]):
            self.add(indent, s)
        for reduced, column, inits, lines in bodies:
            self.add(indent, f"for {column} in range(nb):")
            for line in inits:
                self.add(indent + 1, line)
            self.nest(indent, [(name, full[a]) for name, a in zip(reduced, axes)], column, lines)
        if row_stores:
            self.add(indent, "for e in range(nb):")
            for s in self.statements(self.level_of["e"]) + row_stores:
                self.add(indent + 1, s)
        if late_stores:
            self.nest(indent, [(name, full[a]) for name, a in zip(after, axes)], "f", late_stores)

    def nest(self, indent: int, loops: list[tuple[str, int]], column: str, lines: list[str]) -> None:
        """Loops over `loops` (name, extent), then over the block's columns, with the
        statements of each level and `lines` innermost."""
        for name, extent in loops:
            self.add(indent, f"for {name} in range({extent}):")
            indent += 1
            for s in self.statements(self.level_of[name]):
                self.add(indent, s)
        self.add(indent, f"for {column} in range(nb):")
        for s in self.statements(self.level_of[column]) + lines:
            self.add(indent + 1, s)


__all__ = ["BLOCK", "ColumnPasses", "NotColumns"]
