"""The `fuse` pass: partitions each non-fusion computation into kernels and outlines them.

Runs on the entry and on computations reached through `call`; the bodies of existing fusions
are left alone. First, every while that is an elementwise scan becomes a scan fusion
(`fusion.scan`; `scan=False` turns that off). The reports of each run are kept on the pass (`reports`). May import xfuse.hlo
and networkx.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from xfuse.hlo import Computation, Module, Op

from .cost import DEFAULT_MACHINE, Machine
from .outline import Outliner
from .partition import partition
from .pipeline import register
from .report import DecisionInfo, FusionReport
from .scan import fusion_bodies, scan_fusions
from .space import fusible

UNCOUNTED = {Op.PARAMETER, Op.CONSTANT, Op.TUPLE, Op.GET_TUPLE_ELEMENT, Op.OPTIMIZATION_BARRIER}


def kernel_count(module: Module) -> int:
    """Kernels the entry launches: fusions and the instructions that compute on their own."""
    count = 0
    for inst in module.entry_computation.instructions:
        if inst.op is Op.FUSION or (inst.op not in UNCOUNTED and inst.op is not Op.CALL):
            count += 1
    return count


@register("fuse")
@dataclass(frozen=True)
class Fuse:
    name: str = "fuse"
    machine: Machine = DEFAULT_MACHINE
    reports: list = field(default_factory=list, compare=False, repr=False)
    scan: bool = True

    def run(self, module: Module) -> Module:
        report = FusionReport(module.name)
        original = module
        if self.scan:
            module, report.fusions, report.decisions = scan_fusions(module)
        skipped = fusion_bodies(module)
        taken = {c.name for c in module.computations}
        new_comps: list[Computation] = []
        changed = module is not original
        for comp in module.computations:
            if comp.name in skipped or not any(fusible(i) for i in comp.instructions):
                new_comps.append(comp)
                continue
            part = partition(comp, self.machine)
            if not any(len(m) > 1 for m in part.groups.values()):
                new_comps.append(comp)
                self._record(report, comp, part, {})
                continue
            outlined, called, infos = Outliner(comp, part, taken).run()
            new_comps.extend(called)
            new_comps.append(outlined)
            report.fusions.extend(infos)
            self._record(report, comp, part, {info.group: info.name for info in infos})
            changed = True
        result = module.replace(computations=tuple(new_comps)) if changed else module
        report.kernels = kernel_count(result)
        self.reports.append(report)
        return result

    @staticmethod
    def _record(report: FusionReport, comp: Computation, part, names: dict[int, str]) -> None:
        for d in part.decisions:
            gid = part.resolve(d.target) if d.target is not None else None
            members = part.groups.get(gid, set()) if gid is not None else set()
            target = names.get(gid) or (min(members) if members else "-")
            report.decisions.append(
                DecisionInfo(d.producer, d.op, target, d.fused, d.reason, d.bytes_saved)
            )
