"""Outlining: turns each group of a `Partition` into a `fusion` instruction calling a new
computation named after its ops (`fused_add_max_exp`), with a tuple root when the group has
several outputs. Kernels are emitted in a topological order of the kernel graph, keeping the
original order where it is free. May import xfuse.hlo and networkx.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import networkx as nx

from xfuse.hlo import Computation, Instruction, Kind, Op, TupleShape, fresh_name

from .partition import Partition
from .rewrite import Namer

NOISE_OPS = {"broadcast_in_dim", "reshape", "constant", "convert_element_type", "iota"}
MAX_NAME_OPS = 5


@dataclass
class FusionInfo:
    """One fusion as it was made: for the report and the backends."""

    name: str  # the fusion instruction
    computation: str
    kind: str
    members: list[str]
    ops: list[str]
    outputs: list[str]
    locs: list[str]
    bytes_saved: int
    group: int = -1
    extra: dict = field(default_factory=dict)


def fusion_kind(comp: Computation, members: list[str], outputs: list[str]) -> str:
    kinds = {comp[m].info.kind for m in members}
    if Kind.DOT in kinds:
        return "output"
    if Kind.REDUCTION in kinds:
        return "input"
    return "multi_output" if len(outputs) > 1 else "loop"


def computation_name(comp: Computation, members: list[str], taken: set[str]) -> str:
    ops = list(dict.fromkeys(str(comp[m].op) for m in members))
    shown = [o for o in ops if o not in NOISE_OPS] or ops
    return fresh_name("fused_" + "_".join(shown[:MAX_NAME_OPS]), taken)


class Outliner:
    def __init__(self, comp: Computation, part: Partition, taken_computations: set[str]) -> None:
        self.comp = comp
        self.part = part
        self.taken = taken_computations
        self.order = {inst.name: i for i, inst in enumerate(comp.instructions)}
        self.fusions = {g: m for g, m in part.groups.items() if len(m) > 1}
        self.home: dict[str, int] = {}
        for gid in sorted(self.fusions):
            for m in self.fusions[gid]:
                self.home.setdefault(m, gid)
        self.users = comp.users()
        self.external = {comp.root}
        if comp.root_instruction.op is Op.TUPLE:
            self.external.update(comp.root_instruction.operands)

    def sorted_members(self, gid: int) -> list[str]:
        return sorted(self.fusions[gid], key=self.order.__getitem__)

    def inputs(self, gid: int) -> list[str]:
        members = self.fusions[gid]
        seen: dict[str, None] = {}
        for m in self.sorted_members(gid):
            for o in self.comp[m].operands:
                if o not in members:
                    seen.setdefault(o)
        return list(seen)

    def outputs(self, gid: int) -> list[str]:
        members = self.fusions[gid]
        result = []
        for m in self.sorted_members(gid):
            if self.home.get(m) != gid:
                continue
            needed = m in self.external
            for u in self.users[m]:
                holders = [g for g in self.fusions if u in self.fusions[g]]
                if not holders or any(m not in self.fusions[g] for g in holders):
                    needed = True
            if needed:
                result.append(m)
        if not result:  # a group nobody reads still computes its last member
            result.append(self.sorted_members(gid)[-1])
        return result

    def unit_of(self, name: str) -> tuple[str, object]:
        return ("g", self.home[name]) if name in self.home else ("i", name)

    def unit_order(self) -> list[tuple[str, object]]:
        graph = nx.DiGraph()
        first: dict[tuple, int] = {}
        for inst in self.comp.instructions:
            if inst.name in self.home:
                continue
            unit = ("i", inst.name)
            graph.add_node(unit)
            first[unit] = self.order[inst.name]
            for o in inst.operands:
                graph.add_edge(self.unit_of(o), unit)
        for gid in self.fusions:
            unit = ("g", gid)
            graph.add_node(unit)
            first[unit] = max(self.order[m] for m in self.fusions[gid])
            for o in self.inputs(gid):
                graph.add_edge(self.unit_of(o), unit)
        return list(nx.lexicographical_topological_sort(graph, key=first.__getitem__))

    def run(self) -> tuple[Computation, list[Computation], list[FusionInfo]]:
        namer = Namer(inst.name for inst in self.comp.instructions)
        value: dict[str, str] = {}
        entry: list[Instruction] = []
        called: list[Computation] = []
        infos: list[FusionInfo] = []
        for kind, key in self.unit_order():
            if kind == "i":
                inst = self.comp[key]
                entry.append(inst.replace(operands=tuple(value.get(o, o) for o in inst.operands)))
                value[key] = key
                continue
            fused, info, instructions = self.outline_group(key, namer, value)
            called.append(fused)
            infos.append(info)
            entry.extend(instructions)
        root = value.get(self.comp.root, self.comp.root)
        return Computation(self.comp.name, tuple(entry), root), called, infos

    def outline_group(self, gid: int, namer: Namer, value: dict[str, str]):
        members = self.sorted_members(gid)
        inputs, outputs = self.inputs(gid), self.outputs(gid)
        params = {o: f"p{i}" for i, o in enumerate(inputs)}
        body = [
            Instruction(params[o], Op.PARAMETER, self.comp[o].shape, (), (("index", i),))
            for i, o in enumerate(inputs)
        ]
        taken = set(params.values())
        rename = dict(params)
        for m in members:  # member names stay, unless they collide with a parameter's
            new = m if m not in taken else f"{m}.member"
            rename[m] = new
            inst = self.comp[m]
            body.append(inst.replace(name=new, operands=tuple(rename[o] for o in inst.operands)))
        if len(outputs) == 1:
            root = rename[outputs[0]]
            result_shape = self.comp[outputs[0]].shape
        else:
            root = "tuple.out"
            result_shape = TupleShape(tuple(self.comp[o].shape for o in outputs))
            body.append(Instruction(root, Op.TUPLE, result_shape, tuple(rename[o] for o in outputs)))
        comp_name = computation_name(self.comp, members, self.taken)
        fused = Computation(comp_name, tuple(body), root)
        kind = fusion_kind(self.comp, members, outputs)
        loc = next((self.comp[o].loc for o in outputs if self.comp[o].loc), None)
        fusion_name = namer("fusion")
        fusion = Instruction(
            fusion_name,
            Op.FUSION,
            result_shape,
            tuple(value.get(o, o) for o in inputs),
            (("kind", kind), ("calls", comp_name)),
            loc,
        )
        instructions = [fusion]
        if len(outputs) == 1:
            value[outputs[0]] = fusion_name
        else:
            for i, o in enumerate(outputs):
                gte = Instruction(
                    o, Op.GET_TUPLE_ELEMENT, self.comp[o].shape, (fusion_name,), (("index", i),),
                    self.comp[o].loc,
                )
                instructions.append(gte)
                value[o] = o
        internal = [m for m in members if m not in outputs]
        saved = sum(2 * self.comp[m].shape.nbytes for m in internal)
        locs = list(dict.fromkeys(str(self.comp[m].loc) for m in members if self.comp[m].loc))
        info = FusionInfo(
            fusion_name, comp_name, kind, members, [str(self.comp[m].op) for m in members],
            outputs, locs, saved, gid,
        )
        return fused, info, instructions
