"""The fusion report: every fusion (kind, member ops, the user source lines they came from,
bytes saved) and every candidate considered, taken or refused, with its reason; as text and
as data. May import xfuse.hlo only.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from .outline import FusionInfo


@dataclass
class DecisionInfo:
    producer: str
    op: str
    target: str  # the fusion (or instruction) the producer was or would have been fused into
    fused: bool
    reason: str
    bytes_saved: int = 0


@dataclass
class PlacementInfo:
    """An instruction placed away from the chosen backend: on a registered kernel or on the
    fallback backend, and why."""

    instruction: str
    what: str
    target: str
    reason: str


@dataclass
class FusionReport:
    module: str
    fusions: list[FusionInfo] = field(default_factory=list)
    decisions: list[DecisionInfo] = field(default_factory=list)
    kernels: int = 0  # fusions plus instructions that run as kernels of their own
    placements: list[PlacementInfo] = field(default_factory=list)
    loops: list[str] = field(default_factory=list)  # what licm hoisted and rowsplit split
    tier: str = ""  # which tier runs the calls, where not the native program (`xfuse.tiers`)
    compile_stats: dict = field(default_factory=dict)  # `Compiled.compile_stats()`

    def refused(self) -> list[DecisionInfo]:
        return [d for d in self.decisions if not d.fused]

    def as_dict(self) -> dict:
        return {
            "module": self.module,
            "kernels": self.kernels,
            "fusions": [asdict(f) for f in self.fusions],
            "decisions": [asdict(d) for d in self.decisions],
            "placements": [asdict(p) for p in self.placements],
            "loops": list(self.loops),
            "tier": self.tier,
            "compile_stats": dict(self.compile_stats),
        }

    def __str__(self) -> str:
        lines = [f"Fusion report for {self.module}: {self.kernels} kernel(s), {len(self.fusions)} fusion(s)"]
        if self.tier:
            lines.append(f"Tier: {self.tier}")
        stats = self.compile_stats
        if stats:
            first = stats.get("first_call_s")
            lines.append(f"Compile: trace {stats['trace_s']:.3f} s, passes {stats['passes_s']:.3f} s (fusion "
                         f"{stats['fusion_s']:.3f} s), backend {stats['backend_s']:.3f} s, other {stats['other_s']:.3f} s, "
                         f"first call {'-' if first is None else f'{first:.3f} s'}; total {stats['total_s']:.3f} s")
        for f in self.fusions:
            ops = ", ".join(dict.fromkeys(f.ops))
            lines.append("")
            lines.append(f"{f.name}  kind={f.kind}  calls={f.computation}  ({len(f.members)} ops: {ops})")
            lines.append(f"    outputs: {', '.join(f.outputs)}")
            if f.locs:
                lines.append(f"    from: {'; '.join(f.locs[:4])}{' ...' if len(f.locs) > 4 else ''}")
            lines.append(f"    saves: {_bytes(f.bytes_saved)} of memory traffic")
        if self.decisions:
            lines.append("")
            lines.append("Decisions:")
            for d in self.decisions:
                verdict = "fused  " if d.fused else "refused"
                lines.append(f"  {verdict} {d.producer} ({d.op}) -> {d.target}: {d.reason}")
        if self.loops:
            lines.append("")
            lines.append("Loops:")
            lines.extend(f"  {line}" for line in self.loops)
        if self.placements:
            lines.append("")
            lines.append("Placement (registered kernels, and what the backend left to its fallback):")
            for p in self.placements:
                lines.append(f"  {p.instruction} ({p.what}) -> {p.target}: {p.reason}")
        return "\n".join(lines)

    def as_text(self) -> str:
        return str(self)


def _bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"
