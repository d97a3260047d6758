"""The kernel of a scan fusion (`fusion(kind=scan)`, see `xfuse.fusion.scan`): the space S of
the carries is flattened to n elements and cut into blocks of `BLOCK`; for each run of blocks, the
carries start in the output buffers, then the time loop runs inside the block, each step an
elementwise loop over the block's elements that reads the carries, the step's row of every
xs and writes the step's row of every stack and the carries back. A call takes up to CHUNK
blocks at once, whose carries stay in cache through all the steps; the element loop
vectorises as a loop kernel's does; blocks are the kernel's rows, so the runtime splits a
large scan over its threads, which no step-by-step loop can do.

    for b in range(row_start, row_end, CHUNK):   # up to CHUNK blocks of S at a time
        lo, hi = ...
        for f in range(lo, hi): carries' initial values into the outputs
        (stacks whose rows the steps do not all write: their initial rows, likewise)
        for t in range(trips):
            step scalars (the counter, the rows)
            for e in range(lo, hi): one step of element e

The values come from one `Emitter` over a computation merging the fusion's own
instructions (its parameters and the loop's initial state, named a<k>) with the loop body
(b<k>), every value over S flattened to [n], a row to [1, n] and an [R, *S] array to [R, n].
"""

from __future__ import annotations

from dataclasses import dataclass

from xfuse.hlo import Computation, DType, Instruction, Literal, Module, Op, Shape
from xfuse.hlo.scan import ScanLoop, scan_loop

from .emitter import Emitter, Ix, clamp_text, np_name
from .analysis import PARALLEL_MIN_WORK, TRANSCENDENTAL_OPS, TRANSCENDENTAL_WORK, output_shapes
from .kernels import KernelSource

# Elements per block (a row of the kernel, the unit the runtime splits over threads), and the
# blocks a call takes at once. Each step reads a block's part of a row of xs: the longer the
# run, the better the prefetchers keep up (h = tanh(0.9 h + x_t), 1000 steps of 4096 floats on
# one thread: 8.1 ms in blocks of 1024, 6.6 ms in 4096, 4.2 ms for one pass over the same 4M
# elements; with no tanh, 4.0 ms in blocks of 1024, 2.2 ms in 4096 and in one pass), while
# four f32 carries of 4096 elements still fit in L2.
BLOCK = 1024
CHUNK = 4


@dataclass(frozen=True)
class ScanForm:
    """A scan fusion this writer runs: its loop, the loop's plan, and the kind of value
    (`_ScanWriter.flat`) each initial state value of the fusion's computation is."""

    loop: Instruction
    plan: ScanLoop
    outer_kinds: dict


def scan_form(module: Module, comp: Computation) -> ScanForm | None:
    """`comp`'s form when it is a scan fusion's computation as `xfuse.fusion.scan` makes them
    (the loop's kept elements returned in order) whose loop is a scan, else None (the lowering
    then runs the loop step by step)."""
    loop = next((i for i in comp.instructions if i.op is Op.WHILE), None)
    if loop is None:
        return None
    plan = scan_loop(module, comp, loop)
    root = comp.root_instruction
    if isinstance(plan, str) or root.op is not Op.TUPLE or [comp[o].op for o in root.operands] != [
            Op.GET_TUPLE_ELEMENT] * len(root.operands) or [comp[o].attr("index") for o in root.operands] != list(plan.kept):
        return None
    body = module[loop.attr("body")]
    role = {plan.counter: "step"} | {j: "elem" for j in plan.carries} | {s.state: "stack" for s in plan.stacks}
    role |= {j: "step" for j in plan.scalars}
    role |= {j: plan.classes[body.parameters[j].name] for j in plan.invariants}
    outer_kinds: dict[str, str] = {}
    for j, operand in enumerate(loop.operands):
        if outer_kinds.setdefault(operand, role[j]) != role[j]:
            return None  # one value as two kinds of state (S = () and a scalar)
    return ScanForm(loop, plan, outer_kinds)


def write_scan_kernel(module: Module, comp: Computation, name: str, form: ScanForm) -> KernelSource:
    """The kernel of scan fusion `comp` (parameters named p<index>), of form `scan_form`."""
    return _ScanWriter(module, comp, form, name).write()


def _strides(dims) -> list[int]:
    """The C-order strides of `dims`, in elements."""
    strides = [1] * len(dims)
    for d in range(len(dims) - 2, -1, -1):
        strides[d] = strides[d + 1] * dims[d + 1]
    return strides


class _ScanWriter:
    def __init__(self, module: Module, comp: Computation, form: ScanForm, name: str) -> None:
        self.comp, self.loop, self.plan, self.name = comp, form.loop, form.plan, name
        self.outer_kinds = form.outer_kinds
        self.body = module[self.loop.attr("body")]
        self.shapes = output_shapes(comp)
        self.n = 1
        for d in self.plan.dims:
            self.n *= d
        self.kept = list(self.plan.kept)

    # ------------------------------------------------------------------ the merged computation
    def flat(self, shape: Shape, kind: str) -> Shape:
        n = self.n
        if kind == "elem":
            return shape.with_dims((n,))
        if kind == "row":
            return shape.with_dims((1, n))
        if kind in ("array", "stack"):
            return shape.with_dims((shape.dims[0], n))
        if kind == "other":  # an invariant read through broadcasts, at offsets into it
            return shape.with_dims((shape.size,))
        return shape

    def merged(self) -> tuple[Computation, dict[int, str]]:
        """(the merged computation, the merged name of each initial state element)."""
        loop, outer_kind = self.loop, self.outer_kinds
        names: dict[str, str] = {}
        out = []
        for k, inst in enumerate(self.comp.instructions):
            if inst.op in (Op.WHILE, Op.GET_TUPLE_ELEMENT, Op.TUPLE):
                continue
            names[inst.name] = f"a{k}" if inst.op is not Op.PARAMETER else inst.name
            shape = self.flat(inst.array_shape, outer_kind.get(inst.name, "step"))
            flat = inst.replace(name=names[inst.name], shape=shape, operands=tuple(names[o] for o in inst.operands))
            if inst.op is Op.CONSTANT and shape != inst.shape:
                value = inst.attr("value")
                flat = flat.replace(attrs=(("value", Literal(value.array.reshape(shape.dims), value.dtype)),))
            out.append(flat)
        out.append(Instruction("zero", Op.CONSTANT, Shape(DType.S32, ()), (), (("value", Literal(0, DType.S32)),)))
        inner: dict[str, str] = {}
        for k, inst in enumerate(self.body.instructions):
            inner[inst.name] = f"b{k}"
            kind = self.plan.classes.get(inst.name, "write")
            operands = tuple(inner[o] for o in inst.operands)
            if inst.op is Op.DYNAMIC_SLICE:
                operands = (operands[0], operands[1], "zero")
            if inst is self.body.root_instruction or kind == "write":
                continue
            out.append(inst.replace(name=inner[inst.name], shape=self.flat(inst.array_shape, kind), operands=operands))
        self.names = inner
        initial = {j: names[o] for j, o in enumerate(loop.operands)}
        return Computation(f"{self.name}_merged", tuple(out), out[-1].name), initial

    # ------------------------------------------------------------------ the kernel
    def write(self) -> KernelSource:
        merged, initial = self.merged()
        plan, n, kept = self.plan, self.n, self.kept
        params = [p.name for p in self.comp.parameters]
        level_of = {"t": 1, "e": 2, "f": 3}
        for m in range(len(kept)):
            level_of[f"g{m}"], level_of[f"h{m}"] = 4 + 2 * m, 5 + 2 * m
        loads = {}
        emitter = Emitter(merged, loads, level_of)
        self.emitter = emitter
        for p in params:
            loads[p] = self.loader(p, merged[p].array_shape.rank)
        body_params = self.body.parameters
        counter = body_params[plan.counter]
        position = {j: m for m, j in enumerate(kept)}
        for j, param in enumerate(body_params):
            name = self.names[param.name]
            if j == plan.counter:
                loads[name] = lambda index: Ix("cnt", frozenset({"t"}))
            elif j in plan.carries:
                loads[name] = self.carry_loader(position[j])
            elif j in plan.scalars:
                loads[name] = lambda index, j=j: Ix(f"sc{j}", frozenset({"t"}))
            else:
                loads[name] = lambda index, source=initial[j]: emitter.value(source, index)
        for inst in self.body.instructions:
            if inst.op is Op.BROADCAST_IN_DIM and plan.classes.get(inst.operands[0]) == "other":
                emitter.overrides[self.names[inst.name]] = self.broadcast_loader(inst)
        e, f = Ix("e", frozenset({"e"})), Ix("f", frozenset({"f"}))
        emitter.statements.setdefault(1, []).append(
            f"cnt = {np_name(counter.shape.dtype)}({plan.start} + t)")
        inits = [self.store(position[j], None, emitter.value(initial[j], (f,)), "f") for j in plan.carries]
        copies = []
        for s in plan.stacks:
            if s.covered:
                continue
            m = position[s.state]
            g, h = Ix(f"g{m}", frozenset({f"g{m}"})), Ix(f"h{m}", frozenset({f"h{m}"}))
            base = emitter.emit(f"np.int64(g{m}) * {n}", g.deps, "base")
            value = emitter.value(initial[s.state], (g, h))
            rows = self.body.parameters[s.state].array_shape.dims[0]
            copies.append((m, rows, self.store(m, base.text, value, f"h{m}")))
        root = self.body.root_instruction
        news = {j: emitter.value(self.names[root.operands[j]], (e,)) for j in plan.carries}
        stores = []
        for s in plan.stacks:
            m = position[s.state]
            rows = self.body.parameters[s.state].array_shape.dims[0]
            row = emitter.value(self.names[s.row], ())
            base = emitter.emit(f"{clamp_text(f'np.int64({row.text})', 0, rows - 1)} * {n}", row.deps | {"t"}, "base")
            stores.append(self.store(m, base.text, emitter.value(self.names[s.update], (Ix("0"), e)), "e"))
        stores += [self.store(position[j], None, news[j], "e") for j in plan.carries]
        scalars = []  # (initial value, final store) of each scalar carry; its next value first
        for j in plan.scalars:
            dtype = np_name(body_params[j].shape.dtype)
            start = emitter.value(initial[j], ())
            following = emitter.value(self.names[root.operands[j]], ())
            emitter.statements.setdefault(1, []).append(f"nsc{j} = {dtype}({following.text})")
            scalars.append((f"sc{j} = {dtype}({start.text})", f"sc{j} = nsc{j}",
                            self.store(position[j], None, Ix(f"sc{j}"), "0")))
        lines = self.render(inits, copies, stores, scalars)
        shapes = self.shapes
        header = [f"def {self.name}({', '.join(['row_start', 'row_end', *params, *[f'out{m}' for m in range(len(kept))]])}):"]
        header += [f"    {p} = {p}.ravel()" for p in params if self.comp[p].array_shape.rank]
        header += [f"    out{m} = out{m}.reshape({s.size})" for m, s in enumerate(shapes)]
        source = "\n".join([*emitter.helpers.values(), "", *header, *lines]) + "\n"
        blocks = max(-(-n // BLOCK), 1)  # one, with no elements, still runs the scalar carries
        transcendental = sum(1 for i in self.body.instructions if i.op in TRANSCENDENTAL_OPS)
        work = n * plan.trips * (1 + TRANSCENDENTAL_WORK * transcendental)
        return KernelSource(self.name, source, emitter.globals, params, shapes,
                            work >= PARALLEL_MIN_WORK and blocks > 1, "scan", blocks)

    def loader(self, param: str, rank: int):
        """Loads of a fusion parameter, flattened: [n] at e, [R, n] at (row, e)."""
        n = self.n

        def load(index: tuple[Ix, ...]) -> Ix:
            if rank == 0 or not index:
                return Ix(f"{param}[0]")
            if rank == 1:
                return Ix(f"{param}[U({index[-1].text})]", index[-1].deps)
            row, column = index
            base = self.emitter.emit(f"np.int64({row.text}) * {n}", row.deps, "base")
            return Ix(f"{param}[U({base.text} + {column.text})]", row.deps | column.deps)

        return load

    def broadcast_loader(self, inst):
        """An invariant broadcast into S, at flat index e of S: the offset of its element."""
        space = self.plan.dims
        source = self.body[inst.operands[0]].array_shape
        strides, source_strides = _strides(space), _strides(source.dims)
        mapped = tuple(inst.attr("dims"))
        suffix = source.dims == space[len(space) - source.rank:] and mapped == tuple(
            range(len(space) - source.rank, len(space)))  # S's last dims: one modulo
        size = source.size

        def load(index: tuple[Ix, ...]) -> Ix:
            e = index[-1]
            if suffix:
                offset = self.emitter.emit(f"np.int64({e.text} % {size})", e.deps, "at")
                return self.emitter.value(self.names[inst.operands[0]], (offset,))
            terms = []
            for k, d in enumerate(mapped):
                if source.dims[k] == 1:
                    continue
                term = e.text if strides[d] == 1 else f"({e.text} // {strides[d]})"
                if d > 0:
                    term = f"({term} % {space[d]})"
                terms.append(term if source_strides[k] == 1 else f"{term} * {source_strides[k]}")
            offset = self.emitter.emit(f"np.int64({' + '.join(terms) or '0'})", e.deps, "at")
            return self.emitter.value(self.names[inst.operands[0]], (offset,))

        return load

    def carry_loader(self, m: int):
        def load(index: tuple[Ix, ...]) -> Ix:
            return self.emitter.emit(f"out{m}[U(e)]", frozenset({"e", "t"}), "c")

        return load

    def store(self, m: int, base: str | None, value: Ix, var: str) -> str:
        shape = self.shapes[m]
        cast = value.text if shape.dtype is DType.PRED else f"{np_name(shape.dtype)}({value.text})"
        at = var if base is None else f"{base} + {var}"
        return f"out{m}[U({at})] = {cast}"

    def render(self, inits: list[str], copies: list, stores: list[str], scalars: list) -> list[str]:
        statements = self.emitter.statements
        lines = [f"    {s}" for s in statements.get(0, [])]
        lines += [f"    for b in range(row_start, row_end, {CHUNK}):",
                  f"        lo = b * {BLOCK}",
                  f"        hi = min(min(b + {CHUNK}, row_end) * {BLOCK}, {self.n})"]
        if inits:
            lines.append("        for f in range(lo, hi):")
            lines += [f"            {s}" for s in statements.get(3, []) + inits]
        for m, rows, store in copies:
            lines.append(f"        for g{m} in range({rows}):")
            lines += [f"            {s}" for s in statements.get(4 + 2 * m, [])]
            lines.append(f"            for h{m} in range(lo, hi):")
            lines += [f"                {s}" for s in statements.get(5 + 2 * m, []) + [store]]
        lines += [f"        {start}" for start, _, _ in scalars]
        lines.append(f"        for t in range({self.plan.trips}):")
        lines += [f"            {s}" for s in statements.get(1, [])]
        lines.append("            for e in range(lo, hi):")
        lines += [f"                {s}" for s in statements.get(2, []) + stores]
        lines += [f"            {advance}" for _, advance, _ in scalars]
        if scalars:  # every block computes the same scalars: the first writes them
            lines.append("        if b == 0:")
            lines += [f"            {store}" for _, _, store in scalars]
        return lines
