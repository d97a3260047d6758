"""Rich views of the stages for notebooks and the `xfuse inspect --html` report: the module as a
graph (each fusion a cluster), the HLO text with each fusion's lines highlighted, the fusion
report as tables (fusions, decisions taken and refused, placements), cost analysis, the pass
history with diffs, and the generated kernel source. Every page is standalone: styles inline,
no scripts, no external resources.
"""

from __future__ import annotations

import difflib
import html
import re

from xfuse.hlo import Module, Op

from .graph import to_svg

STYLE = """
.xfuse { font-family: system-ui, sans-serif; font-size: 13px; }
.xfuse h2 { font-size: 16px; margin: 14px 0 6px; }
.xfuse h3 { font-size: 14px; margin: 10px 0 4px; }
.xfuse pre { background: #f7f7f7; padding: 8px; overflow-x: auto; font-size: 12px; line-height: 1.35; }
.xfuse table { border-collapse: collapse; margin: 4px 0; }
.xfuse td, .xfuse th { border: 1px solid #ccc; padding: 2px 6px; text-align: left; vertical-align: top; }
.xfuse th { background: #eee; }
.xfuse .fusion-line { background: #fff3c4; }
.xfuse .fusion-body { background: #eef6ff; }
.xfuse .refused { color: #a33; }
.xfuse .added { background: #e6ffec; }
.xfuse .removed { background: #ffebe9; }
.xfuse details { margin: 4px 0; }
"""


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def _pre(text: str, cls: str = "") -> str:
    return f'<pre class="{cls}">{_e(text)}</pre>'


def highlighted_hlo(module: Module) -> str:
    """The module's text with each fusion instruction and each fused computation marked."""
    bodies = {
        inst.attr("calls")
        for comp in module.computations
        for inst in comp.instructions
        if inst.op is Op.FUSION
    }
    lines, inside = [], False
    for line in str(module).splitlines():
        header = re.match(r"(?:ENTRY )?([A-Za-z_][\w.\-]*) \(", line)
        if header and not line.startswith(" "):
            inside = header.group(1) in bodies
        cls = ""
        if inside:
            cls = "fusion-body"
        elif re.search(r"\bfusion\(", line):
            cls = "fusion-line"
        text = _e(line) or " "
        lines.append(f'<span class="{cls}">{text}</span>' if cls else text)
        if line.startswith("}"):
            inside = False
    return "<pre>" + "\n".join(lines) + "</pre>"


def _table(header: list[str], rows: list[list[object]], row_class=None) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in header)
    body = []
    for i, row in enumerate(rows):
        cls = row_class(i) if row_class else ""
        cells = "".join(f"<td>{_e(c)}</td>" for c in row)
        body.append(f'<tr class="{cls}">{cells}</tr>' if cls else f"<tr>{cells}</tr>")
    return f"<table><tr>{head}</tr>{''.join(body)}</table>"


def report_tables(report) -> str:
    parts = [f"<p>{report.kernels} kernel(s), {len(report.fusions)} fusion(s)</p>"]
    if report.fusions:
        rows = [
            [f.name, f.kind, ", ".join(dict.fromkeys(f.ops)), len(f.members), "; ".join(f.locs[:4]),
             f"{f.bytes_saved} B"]
            for f in report.fusions
        ]
        parts.append(_table(["fusion", "kind", "ops", "members", "source lines", "bytes saved"], rows))
    if report.decisions:
        rows = [[d.producer, d.op, d.target, "fused" if d.fused else "refused", d.reason]
                for d in report.decisions]
        parts.append("<h3>Candidates, taken and refused</h3>")
        parts.append(_table(["producer", "op", "into", "verdict", "reason"], rows,
                            lambda i: "" if report.decisions[i].fused else "refused"))
    if report.placements:
        rows = [[p.instruction, p.what, p.target, p.reason] for p in report.placements]
        parts.append("<h3>Placement</h3>")
        parts.append(_table(["instruction", "what", "runs on", "why"], rows))
    return "".join(parts)


def cost_table(costs: dict) -> str:
    rows = [[k["name"], k.get("kind", ""), k.get("flops", 0), k.get("bytes accessed", 0)]
            for k in costs.get("kernels", [])]
    total = f"<p>total: {costs.get('flops', 0):.0f} flops, {costs.get('bytes accessed', 0):.0f} bytes accessed</p>"
    return total + _table(["kernel", "kind", "flops", "bytes accessed"], rows)


def module_diff(before: Module, after: Module, names: tuple[str, str] = ("before", "after")) -> str:
    """A unified diff of two modules' text, as HTML (added and removed lines coloured)."""
    lines = difflib.unified_diff(
        str(before).splitlines(), str(after).splitlines(), names[0], names[1], lineterm=""
    )
    out = []
    for line in lines:
        cls = "added" if line.startswith("+") and not line.startswith("+++") else (
            "removed" if line.startswith("-") and not line.startswith("---") else "")
        out.append(f'<span class="{cls}">{_e(line)}</span>' if cls else _e(line))
    return "<pre>" + ("\n".join(out) or "(no change)") + "</pre>"


def history_section(lowered_module: Module, history: list) -> str:
    parts, previous = [], lowered_module
    for record in history:
        summary = f"{_e(record.name)}: {'changed the module' if record.changed else 'no change'}"
        body = module_diff(previous, record.module, ("before " + record.name, "after " + record.name)) \
            if record.changed else ""
        parts.append(f"<details><summary>{summary}</summary>{body}</details>")
        previous = record.module
    return "".join(parts)


def _svg(module: Module) -> str:
    try:
        return to_svg(module)
    except Exception as error:  # noqa: BLE001 - a drawing failure must not hide the rest
        return f"<p>(the graph could not be drawn: {_e(type(error).__name__)}: {_e(error)})</p>"


def lowered_html(lowered) -> str:
    module = lowered.module
    return (
        f'<div class="xfuse"><style>{STYLE}</style>'
        f"<h2>{_e(module.name)}: lowered (before optimisation), for backend {_e(lowered.backend)}</h2>"
        f"{_svg(module)}<h3>HLO</h3>{highlighted_hlo(module)}</div>"
    )


def compiled_html(compiled, *, title: str | None = None) -> str:
    module = compiled.module
    sources = compiled.kernel_source()
    return (
        f'<div class="xfuse"><style>{STYLE}</style>'
        f"<h2>{_e(title or module.name)}: compiled for backend {_e(compiled.lowered.backend)}</h2>"
        f"<h3>Graph (each fusion a cluster)</h3>{_svg(module)}"
        f"<h3>Fused HLO</h3>{highlighted_hlo(module)}"
        f"<h3>Fusion report</h3>{report_tables(compiled.fusion_report())}"
        f"<h3>Cost analysis</h3>{cost_table(compiled.cost_analysis())}"
        f"<h3>Pass history</h3>{history_section(compiled.lowered.module, compiled.pass_history())}"
        f"<details><summary>Kernel source</summary>{_pre(sources)}</details></div>"
    )


def page(body: str, title: str) -> str:
    """A standalone HTML document around `body`."""
    return (
        "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\">"
        f"<title>{_e(title)}</title></head><body>{body}</body></html>\n"
    )
