"""Grouping instructions into kernels, every decision recorded with its reason.

Producers are visited consumers-first (reverse topological order, as XLA's instruction fusion
does). A producer whose users all sit in one group joins it; one whose users sit in several
groups first tries to bring those groups together (one multi-output kernel), then to be
recomputed in each (when the cost model says recomputing is cheaper than a round trip through
memory), then to join one of them as an extra output; otherwise it stays a kernel of its own.
A last phase merges sibling groups that read the same values. Merges that would make the
kernel graph cyclic are refused (networkx). May import xfuse.hlo and networkx.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import networkx as nx

from xfuse.hlo import Computation, Kind, Op

from .cost import DEFAULT_MACHINE, Machine, flops_per_element
from .space import Refusal, check_group, fusible

LAUNCH_SECONDS = 1e-6  # what one kernel call costs beyond its work


@dataclass
class Decision:
    """One fusion candidate: `producer` into `target` (a group id, resolved to a name later)."""

    producer: str
    op: str
    target: int | None
    fused: bool
    reason: str
    bytes_saved: int = 0


@dataclass
class Partition:
    """Groups of instruction names (a name may sit in several groups when recomputed)."""

    groups: dict[int, set[str]] = field(default_factory=dict)
    decisions: list[Decision] = field(default_factory=list)
    evaluations: dict[str, float] = field(default_factory=dict)
    merged_into: dict[int, int] = field(default_factory=dict)

    def resolve(self, gid: int) -> int:
        """The group a (possibly merged) group id ended up in."""
        while gid in self.merged_into:
            gid = self.merged_into[gid]
        return gid

    def groups_of(self, name: str) -> list[int]:
        return [g for g, members in self.groups.items() if name in members]


def _hoistable(comp: Computation, inst) -> bool:
    """A broadcast that only repeats its operand along inner dimensions: the loop computes
    the operand once per outer index, outside the inner loop."""
    if inst.op is not Op.BROADCAST_IN_DIM:
        return False
    source = comp[inst.operands[0]].array_shape.dims
    varying = [d for i, d in enumerate(inst.attr("dims")) if source[i] != 1]
    expanded = [d for d in range(inst.array_shape.rank) if d not in varying]
    return not varying or not expanded or max(varying) < min(expanded)


def _moves_minor_axis(comp: Computation, inst) -> bool:
    """A reshape of a concatenate whose minor dimension is not the concatenate's (a
    convolution's patches flattened for its product): a kernel ending in it would index its
    loops by division and remainder and could not split the concatenate at its seams. Other
    reshapes fuse as before (leaving them all out slowed an optax scan by a quarter)."""
    if inst.op is not Op.RESHAPE or comp[inst.operands[0]].op is not Op.CONCATENATE:
        return False
    source, target = comp[inst.operands[0]].array_shape.dims, inst.array_shape.dims
    return bool(source) and bool(target) and source[-1] != target[-1]


class Partitioner:
    def __init__(self, comp: Computation, machine: Machine = DEFAULT_MACHINE) -> None:
        self.comp = comp
        self.machine = machine
        self.users = comp.users()
        self.order = {inst.name: i for i, inst in enumerate(comp.instructions)}
        self.external = {comp.root}  # values the computation returns
        root = comp.root_instruction
        if root.op is Op.TUPLE:
            self.external.update(root.operands)
        self.part = Partition()
        self.member_of: dict[str, set[int]] = {}
        self.next_id = 0

    # ------------------------------------------------------------------ bookkeeping
    def new_group(self, members: set[str]) -> int:
        gid = self.next_id
        self.next_id += 1
        self.part.groups[gid] = set(members)
        for m in members:
            self.member_of.setdefault(m, set()).add(gid)
            shape = self.comp[m].shape
            self.part.evaluations.setdefault(m, float(max(getattr(shape, "size", 1), 1)))
        return gid

    def merge(self, gids: list[int], extra: set[str] = frozenset()) -> int:
        keep = min(gids)
        for gid in gids:
            if gid == keep:
                continue
            self.part.merged_into[gid] = keep
            for m in self.part.groups.pop(gid):
                self.member_of[m].discard(gid)
                self.member_of[m].add(keep)
                self.part.groups[keep].add(m)
        for m in extra:
            self.part.groups[keep].add(m)
            self.member_of.setdefault(m, set()).add(keep)
        return keep

    def outputs(self, members: set[str]) -> set[str]:
        """Members whose value is needed outside `members`."""
        out = set()
        for m in members:
            if m in self.external:
                out.add(m)
                continue
            for u in self.users[m]:
                if u not in members or not fusible(self.comp[u]):
                    if not self.served_elsewhere(m, u, members):
                        out.add(m)
                        break
        return out

    def served_elsewhere(self, value: str, user: str, members: set[str]) -> bool:
        """True when every group holding `user` also holds its own copy of `value`."""
        holders = self.member_of.get(user, set())
        if user in members or not holders:
            return False
        return all(value in self.part.groups[g] for g in holders)

    # ------------------------------------------------------------------ the kernel graph
    def acyclic(self, groups: dict[int, set[str]]) -> bool:
        """Whether kernels (groups, and instructions outside any group) form a DAG."""
        home: dict[str, object] = {}
        for gid, members in groups.items():
            for m in members:
                home.setdefault(m, ("g", gid))
        graph = nx.DiGraph()
        for inst in self.comp.instructions:
            holders = [("g", g) for g, ms in groups.items() if inst.name in ms] or [("i", inst.name)]
            for unit in holders:
                graph.add_node(unit)
                for o in inst.operands:
                    if unit[0] == "g" and o in groups[unit[1]]:
                        continue
                    source = home.get(o, ("i", o))
                    if source != unit:
                        graph.add_edge(source, unit)
        return nx.is_directed_acyclic_graph(graph)

    # ------------------------------------------------------------------ cost
    def evaluations_in(self, name: str, members: set[str]) -> float:
        """How often a kernel holding `members` computes `name`.

        A value read through a reduction, or broadcast only along inner dimensions (a row
        value, a scalar), is computed once per element of its own; a value broadcast along
        an outer dimension (a bias row) is recomputed for every element it is broadcast to.
        Users that read it at the same index share one computation; slices read it at
        indices of their own, so each slice's reads add up (a stencil's window of shifted
        slices computes it once per slice: a 40-wide max pool fused into the next one, 40x).
        """
        inst = self.comp[name]
        size = float(max(getattr(inst.shape, "size", 1), 1))
        best, sliced = size, 0.0
        for u in self.users[name]:
            if u in members and u in self.part.evaluations:
                user = self.comp[u]
                if user.op is Op.SLICE:
                    sliced += self.part.evaluations[u]
                    continue
                shrink = user.info.kind is Kind.REDUCTION or _hoistable(self.comp, user)
                per = size / max(user.shape.size, 1) if shrink else 1.0
                best = max(best, self.part.evaluations[u] * per)
        return max(best, sliced)

    def weigh(self, name: str, members: set[str], stays_output: bool) -> tuple[bool, int, str]:
        """(profitable, bytes saved, reason) for computing `name` inside `members`."""
        inst = self.comp[name]
        evals = self.evaluations_in(name, members)
        extra_flops = (evals - inst.shape.size) * flops_per_element(inst)
        saved = inst.shape.nbytes * (1 if stays_output else 2)
        gain = self.machine.memory_time(saved) + (0 if stays_output else LAUNCH_SECONDS)
        cost = self.machine.compute_time(extra_flops)
        if cost > gain:
            factor = evals / max(inst.shape.size, 1)
            return False, 0, f"recomputing {inst.op} {factor:.0f}x per element costs more than it saves"
        self.part.evaluations[name] = evals
        return True, saved, f"saves {saved} bytes of memory traffic"

    # ------------------------------------------------------------------ decisions
    def record(self, producer: str, target: int | None, fused: bool, reason: str, saved: int = 0):
        op = str(self.comp[producer].op)
        self.part.decisions.append(Decision(producer, op, target, fused, reason, saved))

    def try_join(self, name: str, gids: list[int], check_cycles: bool) -> tuple[int | None, str, int]:
        """Joins `name` to the union of `gids`; (group or None, reason, bytes saved)."""
        members = set().union(*(self.part.groups[g] for g in gids)) | {name}
        trial = {g: m for g, m in self.part.groups.items() if g not in gids}
        trial[-1] = members
        outputs = self.outputs_with(members, trial)
        try:
            check_group(self.comp, members, outputs)
        except Refusal as e:
            return None, str(e), 0
        if check_cycles and not self.acyclic(trial):
            return None, "would create a cycle", 0
        ok, saved, reason = self.weigh(name, members, name in outputs)
        if not ok:
            return None, reason, 0
        return self.merge(gids, {name}), reason, saved

    def outputs_with(self, members: set[str], groups: dict[int, set[str]]) -> set[str]:
        saved_groups, saved_member_of = self.part.groups, self.member_of
        member_of: dict[str, set[int]] = {}
        for g, ms in groups.items():
            for m in ms:
                member_of.setdefault(m, set()).add(g)
        self.part.groups, self.member_of = groups, member_of
        try:
            return self.outputs(members)
        finally:
            self.part.groups, self.member_of = saved_groups, saved_member_of

    def visit(self, name: str) -> None:
        inst = self.comp[name]
        if not fusible(inst):
            return
        consumer_groups = sorted({g for u in self.users[name] for g in self.member_of.get(u, ())})
        if not consumer_groups:
            self.own_group(name)
            return
        if len(consumer_groups) == 1:
            # With every user inside the group no cycle can form; a user outside any kernel
            # (a call, a barrier) may lead back into the group, so then it is checked.
            others = any(not fusible(self.comp[u]) for u in self.users[name])
            gid, reason, saved = self.try_join(name, consumer_groups, check_cycles=others)
            self.record(name, consumer_groups[0], gid is not None, reason, saved)
            if gid is None:
                self.own_group(name)
            return
        gid, reason, saved = self.try_join(name, consumer_groups, check_cycles=True)
        if gid is not None:
            self.record(name, gid, True, f"joins {len(consumer_groups)} consumer kernels into one; {reason}", saved)
            return
        apart = f"its {len(consumer_groups)} consumer kernels cannot be one ({reason})"
        duplicated, why_not = self.duplicate(name, consumer_groups)
        if duplicated:
            self.record(name, consumer_groups[0], True, f"{apart}; recomputed in each, cheaper than storing it", 0)
            return
        if inst.op is Op.RESHAPE:  # stored, a reshape is a view: no kernel writes a copy of it
            self.record(name, None, False, f"{apart}; {why_not}; a reshape: a view of its stored operand")
            return
        for g in consumer_groups:  # join one consumer as an extra output
            joined, why, saved = self.try_join(name, [g], check_cycles=True)
            if joined is not None:
                self.record(name, joined, True, f"{apart}; {why_not}; computed in one of them as an extra output", saved)
                return
        self.record(name, consumer_groups[0], False, f"{apart}; {why_not}")
        self.new_group({name})

    def own_group(self, name: str) -> None:
        """`name` starts a kernel of its own, unless it is a reshape of a concatenate moving the
        minor axis (`_moves_minor_axis`): on a stored value that is free (a view), and its
        producer's loop then runs over its own shape, split at the seams."""
        if _moves_minor_axis(self.comp, self.comp[name]):
            self.record(name, None, False, "a reshape of a concatenate moving the minor axis: a view of its stored operand")
            return
        self.new_group({name})

    def duplicate(self, name: str, gids: list[int]) -> tuple[bool, str]:
        """Recomputes `name` in every consumer group when that is cheaper than storing it;
        (done, why not)."""
        inst = self.comp[name]
        if inst.info.kind in (Kind.REDUCTION, Kind.DOT):
            return False, f"a {inst.op} is never recomputed"
        if name in self.external or not all(fusible(self.comp[u]) for u in self.users[name]):
            # It must be stored anyway, and a stored copy inside one kernel could close a cycle.
            return False, "it is also needed outside the kernels, so it is stored once"
        copies = len(gids)
        size = max(inst.shape.size, 1)
        extra = (copies - 1) * size * flops_per_element(inst)
        saved = inst.shape.nbytes * (1 + copies) if name not in self.external else inst.shape.nbytes * copies
        if self.machine.compute_time(extra) > self.machine.memory_time(saved) + LAUNCH_SECONDS:
            return False, f"producer too expensive to duplicate into {copies} consumers"
        for g in gids:
            members = self.part.groups[g] | {name}
            try:
                check_group(self.comp, members, self.outputs(members))
            except Refusal as e:
                return False, f"cannot be recomputed in every consumer: {e}"
        for g in gids:
            self.part.groups[g].add(name)
            self.member_of.setdefault(name, set()).add(g)
        self.part.evaluations[name] = float(size * copies)
        return True, ""

    def siblings(self) -> None:
        """Merges groups that read the same value, when one kernel can compute both."""
        for inst in self.comp.instructions:
            readers = sorted(
                {g for u in self.users[inst.name] for g in self.member_of.get(u, ())}
                - self.member_of.get(inst.name, set())
            )
            while len(readers) > 1:
                first, second = readers[0], readers[1]
                members = self.part.groups[first] | self.part.groups[second]
                trial = {g: m for g, m in self.part.groups.items() if g not in (first, second)}
                trial[-1] = members
                try:
                    check_group(self.comp, members, self.outputs_with(members, trial))
                    if not self.acyclic(trial):
                        raise Refusal("would create a cycle")
                except Refusal as e:
                    self.record(inst.name, second, False, f"siblings reading {inst.name} stay apart: {e}")
                    readers.pop(1)
                    continue
                merged = self.merge([first, second])
                saved = inst.shape.nbytes
                self.record(inst.name, merged, True, f"siblings reading {inst.name} share one kernel", saved)
                readers = [merged] + [g for g in readers[2:] if g in self.part.groups]

    def run(self) -> Partition:
        for inst in reversed(self.comp.instructions):
            self.visit(inst.name)
        self.siblings()
        return self.part


def partition(comp: Computation, machine: Machine = DEFAULT_MACHINE) -> Partition:
    """Groups the instructions of `comp` into kernels."""
    return Partitioner(comp, machine).run()

