"""The passes of an input kernel over each row (kernels.py's `Writer` takes them as a mixin):
one pass per phase of reductions (independent reductions share a pass), in the form its
reductions and its rows call for, then the pass storing the row's outputs.

- `buffer_pass`: row sums, maxima, minima and their indices through `rows` (vectorised), the
  summand in a row buffer that later passes read again;
- `lane_pass`: LANES independent accumulators along a long row, combined after the loop;
- otherwise one in-order accumulator per reduction (`reductions.combiner`), the loop along the
  row unrolled in the short-row forms (`row_forms`).
"""

from __future__ import annotations

import re

from xfuse.hlo import DType, Instruction, Kind, Op

from . import row_forms
from .analysis import STACK_ROW_BYTES, TRANSCENDENTAL_OPS
from .emitter import Ix, compute_dtype, np_name
from .reductions import combiner

LANES = 8  # accumulators of a vectorised row reduction
ROW_OPS = {Op.REDUCE_SUM: "sum", Op.REDUCE_MAX: "max", Op.REDUCE_MIN: "min",  # through `rows`
           Op.ARGMAX: "argmax", Op.ARGMIN: "argmin"}
LANE_OPS = {Op.REDUCE_SUM, Op.REDUCE_PROD, Op.REDUCE_MAX, Op.REDUCE_MIN, Op.REDUCE_AND, Op.REDUCE_OR}


class RowPasses:
    """The passes over a row; the writer provides the emitter, `short`, `store`, `count` and the
    statement marks they use."""

    def phases(self, reductions: list[Instruction]) -> list[list[Instruction]]:
        phase: dict[str, int] = {}
        depends: dict[str, set[str]] = {}
        names = {r.name for r in reductions}
        for inst in self.comp.instructions:
            deps = set()
            for o in inst.operands:
                deps |= depends.get(o, set())
                if o in names:
                    deps.add(o)
            depends[inst.name] = deps
        for r in reductions:
            before = depends[r.operands[0]] | ({r.operands[0]} & names)
            phase[r.name] = 1 + max((phase[d] for d in before), default=-1)
        count = max(phase.values(), default=-1) + 1
        return [[r for r in reductions if phase[r.name] == p] for p in range(count)]

    def reduced_loops(self, p: int, full, axes, kept, kept_index, row_level):
        rnames = [f"r{p}_{j}" for j in range(len(axes))]
        for depth, n in enumerate(rnames, start=1):
            self.level_of[n] = 1000 * (p + 1) + depth
        full_index = [None] * len(full)
        for pos, ix in zip(kept, kept_index):
            full_index[pos] = ix
        for pos, n in zip(axes, rnames):
            full_index[pos] = Ix(n, frozenset({n}))
        return rnames, tuple(full_index)

    def reduction_pass(self, p, members, full, axes, kept, kept_index, row_level):
        row_deps = frozenset().union(*(i.deps for i in kept_index)) if kept_index else frozenset()
        extent = full[axes[-1]] if axes else 1
        if self.short is None and self.row_sums(members, full, axes):
            return self.buffer_pass(p, members, full, axes, kept, kept_index, row_level, row_deps)
        cheap = not any(self.transcendental_upstream(r.operands[0]) for r in members)
        if len(axes) == 1 and extent >= 4 * LANES and cheap and all(r.op in LANE_OPS for r in members):
            return self.lane_pass(p, members, full, axes, kept, kept_index, row_level, row_deps)
        rnames, full_index = self.reduced_loops(p, full, axes, kept, kept_index, row_level)
        inits, updates = [], []
        for r in members:
            tag = r.name.replace('.', '_').replace('-', '_')
            acc = f"acc_{tag}"
            operand = self.emitter.value(r.operands[0], full_index)
            if self.short is not None and r.operands[0] not in self.emitter.overrides \
                    and self.transcendental_upstream(r.operands[0]) and operand.deps & set(rnames):
                # kept for the later passes over the row (softmax's exp), as `buffer_pass` does:
                # with the row unrolled the buffer's elements become registers
                buf = f"buf_{tag}"
                self.row_buffer(buf, extent, compute_dtype(self.comp[r.operands[0]].shape.dtype))
                updates.append(f"{buf}[{rnames[0]}] = {operand.text}")
                operand = Ix(f"{buf}[{rnames[0]}]", operand.deps)
                self.reuse_row(r.operands[0], buf, axes[0], kept, kept_index, row_deps)
            init, update, result = combiner(self.comp, r, acc, operand, rnames)
            result = Ix(result.text, row_deps)  # a reduction's value lives at the row level
            inits.extend(init)
            updates.extend(update)
            self.emitter.overrides[r.name] = lambda index, result=result: result
        end = self.mark(row_level)
        loop_lines = self.reduced_loop_lines(p, rnames, [full[a] for a in axes], updates)
        return inits, loop_lines, end

    def row_sums(self, members, full, axes) -> bool:
        """Whether a phase is f32/f64 sums, maxima and minima along the last axis, long enough
        to vectorise: those go through `rows`."""
        if len(axes) != 1 or axes[0] != len(full) - 1 or full[axes[0]] < row_forms.ROW_SUMS_MIN:
            return False
        return all(r.op in ROW_OPS and self.comp[r.operands[0]].shape.dtype in (DType.F32, DType.F64)
                   and (r.op in (Op.ARGMAX, Op.ARGMIN) or self.comp[r.operands[0]].shape.dtype == r.shape.dtype)
                   for r in members)

    def buffer_pass(self, p, members, full, axes, kept, kept_index, row_level, row_deps):
        """Row sums in two steps: the summand of every column into a row buffer (a loop with
        no carried value, so it vectorises, transcendentals included), then `rows.sum_*`, whose
        additions alone may be reordered into vector lanes. Later passes over the same row
        read the buffer instead of computing the summand again (softmax's exp). Maxima, minima
        and their indices (`rows.argmax_*`) go the same way."""
        rnames, full_index = self.reduced_loops(p, full, axes, kept, kept_index, row_level)
        axis, extent, var = axes[0], full[axes[0]], rnames[0]
        inits, updates, finals = [], [], []
        for r in members:
            tag = r.name.replace(".", "_").replace("-", "_")
            buf, acc = f"buf_{tag}", f"acc_{tag}"
            dtype = self.comp[r.operands[0]].shape.dtype
            fn = f"rows.{ROW_OPS[r.op]}_{dtype.value}"
            summand = self.emitter.value(r.operands[0], full_index)
            direct = re.fullmatch(rf"(row\d+)\[{var}\]", summand.text)
            if direct:  # the row of an input itself
                finals.append(f"{acc} = {fn}({direct[1]}[:{extent}])")
            else:
                self.row_buffer(buf, extent, dtype)
                updates.append(f"{buf}[{var}] = {summand.text}")
                finals.append(f"{acc} = {fn}({buf})")
            result = Ix(f"{np_name(r.shape.dtype)}({acc})" if r.op in (Op.ARGMAX, Op.ARGMIN) else acc, row_deps)
            self.emitter.overrides[r.name] = lambda index, result=result: result
            if updates and updates[-1].startswith(buf) and r.operands[0] not in self.emitter.overrides:
                self.reuse_row(r.operands[0], buf, axis, kept, kept_index, row_deps)
        end = self.mark(row_level)
        loop_lines = self.reduced_loop_lines(p, rnames, [extent], updates) if updates else []
        return inits, loop_lines + finals, end

    def row_buffer(self, buf: str, extent: int, dtype) -> None:
        """A row buffer made once per call: in the stack frame up to STACK_ROW_BYTES."""
        on_stack = extent * compute_dtype(dtype).numpy.itemsize <= STACK_ROW_BYTES
        make = "scalar.row_buffer" if on_stack else "np.empty"
        self.scratch.append(f"{buf} = {make}({extent}, {np_name(dtype)})")

    def reuse_row(self, name, buf, axis, kept, kept_index, row_deps) -> None:
        """Reads of `name` in this row at a loop index come from `buf`, once it is full."""
        emitter = self.emitter

        def load(index: tuple[Ix, ...]) -> Ix:
            same_row = all(index[pos].text == ix.text for pos, ix in zip(kept, kept_index))
            if same_row and index[axis].deps:
                return Ix(f"{buf}[{index[axis].text}]", index[axis].deps | row_deps)
            return emitter.compute(self.comp[name], index)

        emitter.overrides[name] = load

    def lane_pass(self, p, members, full, axes, kept, kept_index, row_level, row_deps):
        """A one-axis reduction with LANES accumulators, combined after the loop: the lanes
        are independent, so LLVM packs them into vectors. max/min/and/or stay exact; sums and
        products are reassociated, as XLA's vectorised reductions are."""
        axis, extent = axes[0], full[axes[0]]
        main, tail = f"c{p}", f"t{p}"
        self.level_of[main] = 1000 * (p + 1) + 1
        self.level_of[tail] = 1000 * (p + 1) + 501

        def index_at(text: str, var: str) -> tuple[Ix, ...]:
            index = [None] * len(full)
            for pos, ix in zip(kept, kept_index):
                index[pos] = ix
            index[axis] = Ix(text, frozenset({var}))
            return tuple(index)

        inits, main_updates, tail_updates, finals = [], [], [], []
        for r in members:
            acc = f"acc_{r.name.replace('.', '_').replace('-', '_')}"
            lanes = [f"{acc}_{lane}" for lane in range(LANES)]
            for lane, name in enumerate(lanes):
                v = self.emitter.value(r.operands[0], index_at(f"{main} + {lane}", main))
                init, update, _ = combiner(self.comp, r, name, v, [main])
                inits.extend(init)
                main_updates.extend(update)
            v = self.emitter.value(r.operands[0], index_at(tail, tail))
            tail_updates.extend(combiner(self.comp, r, lanes[0], v, [tail])[1])
            while len(lanes) > 1:  # a pairwise tree, as a vector reduction does
                pairs = []
                for a, b in zip(lanes[::2], lanes[1::2]):
                    finals.append(self.merge_lanes(r, a, b))
                    pairs.append(a)
                lanes = pairs
            finals.append(f"{acc} = {lanes[0]}")
            result = Ix(acc, row_deps)
            self.emitter.overrides[r.name] = lambda index, result=result: result
        end = self.mark(row_level)
        body_end = extent - extent % LANES
        lines = [f"for {main} in range(0, {body_end}, {LANES}):"]
        lines += ["    " + s for s in self.emitter.statements.get(self.level_of[main], [])]
        lines += ["    " + u for u in main_updates]
        if body_end < extent:
            lines.append(f"for {tail} in range({body_end}, {extent}):")
            lines += ["    " + s for s in self.emitter.statements.get(self.level_of[tail], [])]
            lines += ["    " + u for u in tail_updates]
        return inits, lines + finals, end

    def transcendental_upstream(self, name: str) -> bool:
        """Whether computing `name` calls the math library: such a body copied into every
        lane makes numba compile for seconds, so those reductions run one lane."""
        seen, todo = set(), [name]
        while todo:
            inst = self.comp[todo.pop()]
            if inst.name in seen or inst.info.kind is Kind.REDUCTION:
                continue
            seen.add(inst.name)
            if inst.op in TRANSCENDENTAL_OPS:
                return True
            todo.extend(inst.operands)
        return False

    def merge_lanes(self, r: Instruction, a: str, b: str) -> str:
        """`a = a (op) b` for two lane accumulators of reduction `r`."""
        _, update, _ = combiner(self.comp, r, a, Ix(b), [])
        return update[0]

    def output_pass(self, p, full, axes, kept, kept_index, row_level):
        row_outputs, full_outputs = [], []
        for k, member in enumerate(self.outputs):
            dims = self.out_shapes[k].dims
            (full_outputs if dims == tuple(full) and axes else row_outputs).append((k, member))
        stores_row = []
        for k, member in row_outputs:
            dims = self.out_shapes[k].dims
            value = self.emitter.value(member, self.row_index(dims, full, axes, kept_index))
            idx = self.row_index(dims, full, axes, kept_index)
            stores_row.append(self.store(k, idx, value))
        updates = []
        rnames = []
        if full_outputs:
            rnames, full_index = self.reduced_loops(p, full, axes, kept, kept_index, row_level)
            for k, member in full_outputs:
                value = self.emitter.value(member, full_index)
                updates.append(self.store(k, full_index, value))
        end = self.mark(row_level)
        loop_lines = self.reduced_loop_lines(p, rnames, [full[a] for a in axes], updates) if updates else []
        return stores_row, loop_lines, end

    def row_index(self, dims, full, axes, kept_index) -> tuple[Ix, ...]:
        """An index into a row-shaped (K, or K with unit reduced dims) value."""
        if len(dims) == len(full):
            it = iter(kept_index)
            return tuple(Ix("0") if i in axes else next(it) for i in range(len(full)))
        return kept_index

    def reduced_loop_lines(self, p, rnames, extents, updates) -> list[str]:
        if self.short is not None:  # one copy of the body per element of the short row
            (name,), (extent,) = rnames, extents
            body = [*self.emitter.statements.get(1000 * (p + 1) + 1, []), *updates]
            copies = row_forms.unrolled(name, extent, body)
            if copies is not None:
                return copies
            self.looped = True
        lines, indent = [], 0
        for depth, (n, d) in enumerate(zip(rnames, extents), start=1):
            if depth == len(extents) and self.short is None:  # (in a short form LLVM may unroll it)
                d = self.count(d, row_forms.ROW_LOOPS)
            lines.append("    " * indent + f"for {n} in range({d}):")
            indent += 1
            for s in self.emitter.statements.get(1000 * (p + 1) + depth, []):
                lines.append("    " * indent + s)
        for u in updates:
            lines.append("    " * indent + u)
        return lines
