"""Draw a module's entry computation as a standalone SVG graph, each fusion a cluster.

`to_svg(module)` draws one node per instruction (name, op, shape) and an edge from each operand
to its user. A top-level `fusion` instruction is drawn as a cluster (`<g class="cluster"
id="cluster-<fusion name>">`, a rounded rectangle titled after the fusion's ops) holding the
instructions of the computation it calls; the called computation's parameters are not drawn,
the fusion's outer operands feed the cluster directly. Parameters are filled green, the root
has a thick red border and a "ROOT" tag.

Two renderers: Graphviz (`to_dot(module)` piped through `dot -Tsvg`) when `dot` is on PATH, and
otherwise, or when it fails, a pure-Python one (a layered layout from networkx, SVG written by
hand). Both give well-formed SVG with no external references.

Imports `xfuse.hlo`, networkx and the standard library only (no jax, no numba).
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass, field
from xml.sax.saxutils import escape, quoteattr

import networkx as nx

from xfuse.hlo import Module, Op

__all__ = ["to_dot", "to_svg"]

_PLUMBING = {Op.PARAMETER, Op.CONSTANT, Op.BROADCAST_IN_DIM, Op.TUPLE, Op.GET_TUPLE_ELEMENT}
_TITLE_OPS = 5  # ops named in a cluster title before "..."


@dataclass(frozen=True, slots=True)
class _Node:
    id: str
    lines: tuple[str, ...]  # label: name, op, shape
    is_param: bool = False
    is_root: bool = False
    cluster: str | None = None  # the fusion instruction's name


@dataclass(slots=True)
class _Graph:
    nodes: dict[str, _Node] = field(default_factory=dict)
    edges: list[tuple[str, str]] = field(default_factory=list)
    clusters: dict[str, str] = field(default_factory=dict)  # fusion name -> title


def _cluster_title(name: str, kind: object, ops: list[Op]) -> str:
    named = [op for op in ops if op not in _PLUMBING] or [op for op in ops if op is not Op.PARAMETER]
    distinct = list(dict.fromkeys(op.value for op in named))
    shown = ", ".join(distinct[:_TITLE_OPS]) + (", ..." if len(distinct) > _TITLE_OPS else "")
    return f"{name} ({kind}: {shown})" if shown else f"{name} ({kind})"


def _build(module: Module) -> _Graph:
    """The entry computation as nodes, edges and clusters (fusion bodies inlined)."""
    entry = module.entry_computation
    graph = _Graph()
    output: dict[str, str] = {}  # top-level name -> id of the node that produces its value

    for inst in entry:
        is_root = inst.name == entry.root
        body = module.get(inst.called) if inst.op is Op.FUSION and inst.called else None
        if body is None:
            node = _Node(
                inst.name,
                (inst.name, inst.op.value, str(inst.shape)),
                is_param=inst.op is Op.PARAMETER,
                is_root=is_root,
            )
            graph.nodes[node.id] = node
            graph.edges.extend((output[o], node.id) for o in dict.fromkeys(inst.operands))
            output[inst.name] = node.id
            continue
        graph.clusters[inst.name] = _cluster_title(
            inst.name, inst.attributes.get("kind", "?"), [i.op for i in body]
        )
        inner: dict[str, str] = {}  # inner name -> node id
        for sub in body:
            if sub.op is Op.PARAMETER:  # stands for the fusion's outer operand
                inner[sub.name] = output[inst.operands[sub.attr("index")]]
                continue
            node = _Node(
                f"{inst.name}/{sub.name}",
                (sub.name, sub.op.value, str(sub.shape)),
                is_root=is_root and sub.name == body.root,
                cluster=inst.name,
            )
            graph.nodes[node.id] = node
            graph.edges.extend((inner[o], node.id) for o in dict.fromkeys(sub.operands))
            inner[sub.name] = node.id
        output[inst.name] = inner[body.root]
    graph.edges = list(dict.fromkeys(graph.edges))
    return graph


# --- Graphviz -------------------------------------------------------------------------------


def _dot_str(text: str) -> str:
    """A quoted DOT string; a newline becomes DOT's centred line break, `\\n`."""
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return '"' + escaped + '"'


def _dot_node(node: _Node) -> str:
    lines = ("ROOT " + node.lines[0], *node.lines[1:]) if node.is_root else node.lines
    attrs = [f"label={_dot_str(chr(10).join(lines))}", f"id={_dot_str('node-' + node.id)}"]
    if node.is_param:
        attrs.append('style="filled", fillcolor="#c8e6c9"')
    if node.is_root:
        attrs.append('color="#c62828", penwidth=3')
    return f"{_dot_str(node.id)} [{', '.join(attrs)}];"


def to_dot(module: Module) -> str:
    """The entry computation as Graphviz DOT text, one `subgraph cluster_...` per fusion."""
    graph = _build(module)
    out = [
        f"digraph {_dot_str(module.name)} {{",
        '  node [shape=box, style="rounded", fontname="monospace", fontsize=10];',
        "  edge [arrowsize=0.7];",
    ]
    for node in graph.nodes.values():
        if node.cluster is None:
            out.append("  " + _dot_node(node))
    for i, (name, title) in enumerate(graph.clusters.items()):
        out.append(f"  subgraph {_dot_str(f'cluster_{i}_{name}')} {{")
        out.append(f"    label={_dot_str(title)}; id={_dot_str('cluster-' + name)};")
        out.append('    style="rounded,filled"; fillcolor="#e3f2fd"; color="#1565c0";')
        for node in graph.nodes.values():
            if node.cluster == name:
                out.append("    " + _dot_node(node))
        out.append("  }")
    out.extend(f"  {_dot_str(a)} -> {_dot_str(b)};" for a, b in graph.edges)
    out.append("}")
    return "\n".join(out) + "\n"


def _run_dot(dot: str, text: str) -> str | None:
    try:
        done = subprocess.run(
            [dot, "-Tsvg"], input=text, capture_output=True, text=True, timeout=20, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return None
    start = done.stdout.find("<svg")  # drop the XML declaration and the DTD's external URL
    return done.stdout[start:] if start >= 0 else None


# --- pure-Python layout and SVG -------------------------------------------------------------

_CHAR_W, _LINE_H, _PAD = 7.0, 14.0, 8.0  # monospace 11px
_GAP_X, _GAP_Y, _MARGIN = 24.0, 56.0, 20.0
_CLUSTER_PAD, _TITLE_H = 10.0, 18.0


def _layout(graph: _Graph) -> tuple[dict[str, tuple[float, float]], float, float, float, float]:
    """Centre of each node, node width and height, and the drawing's width and height.

    Rows are networkx's topological generations. Each cluster, and the unclustered nodes, get
    a band of columns of their own, so cluster boxes never overlap; within a band's row, nodes
    are ordered by the mean column of their operands.
    """
    dag = nx.DiGraph()
    dag.add_nodes_from(graph.nodes)
    dag.add_edges_from(graph.edges)
    row = {n: r for r, gen in enumerate(nx.topological_generations(dag)) for n in gen}
    width = max(len(line) for n in graph.nodes.values() for line in n.lines) * _CHAR_W + 2 * _PAD
    height = 3 * _LINE_H + 2 * _PAD

    bands = list(dict.fromkeys(n.cluster for n in graph.nodes.values()))  # first appearance
    cells: dict[tuple[str | None, int], list[str]] = {}
    for node_id in sorted(graph.nodes, key=lambda n: row[n]):
        cells.setdefault((graph.nodes[node_id].cluster, row[node_id]), []).append(node_id)
    band_cols = {b: max(len(v) for (c, _), v in cells.items() if c == b) for b in bands}
    offset, start = 0, {}
    for b in bands:
        start[b], offset = offset, offset + band_cols[b]

    col: dict[str, float] = {}
    for (band, _), members in sorted(cells.items(), key=lambda kv: kv[0][1]):  # row by row
        order = {n: i for i, n in enumerate(members)}

        def barycentre(n: str) -> tuple[float, int]:
            preds = [col[p] for p in dag.predecessors(n) if p in col]
            return (sum(preds) / len(preds) if preds else float(order[n]), order[n])

        members.sort(key=barycentre)
        shift = (band_cols[band] - len(members)) / 2
        for i, n in enumerate(members):
            col[n] = start[band] + shift + i

    step_x, step_y = width + _GAP_X, height + _GAP_Y
    top = _MARGIN + (_TITLE_H + _CLUSTER_PAD if graph.clusters else 0)
    centres = {
        n: (_MARGIN + _CLUSTER_PAD + col[n] * step_x + width / 2, top + row[n] * step_y + height / 2)
        for n in graph.nodes
    }
    total_w = 2 * (_MARGIN + _CLUSTER_PAD) + offset * step_x - _GAP_X
    total_h = top + (max(row.values(), default=0) + 1) * step_y - _GAP_Y + _CLUSTER_PAD + _MARGIN
    return centres, width, height, total_w, total_h


def _f(x: float) -> str:
    return f"{x:.1f}"


def _python_svg(module: Module) -> str:
    graph = _build(module)
    pos, w, h, total_w, total_h = _layout(graph)
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{_f(total_w)}" height="{_f(total_h)}"'
        f' viewBox="0 0 {_f(total_w)} {_f(total_h)}" font-family="monospace" font-size="11">',
        f"<title>{escape(module.name)}</title>",
        '<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7"'
        ' markerHeight="7" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z"'
        ' fill="#555"/></marker></defs>',
        f'<rect width="{_f(total_w)}" height="{_f(total_h)}" fill="white"/>',
    ]
    for name, title in graph.clusters.items():
        members = [pos[n.id] for n in graph.nodes.values() if n.cluster == name]
        if not members:
            continue
        x0 = min(x for x, _ in members) - w / 2 - _CLUSTER_PAD
        x1 = max(x for x, _ in members) + w / 2 + _CLUSTER_PAD
        y0 = min(y for _, y in members) - h / 2 - _CLUSTER_PAD - _TITLE_H
        y1 = max(y for _, y in members) + h / 2 + _CLUSTER_PAD
        out.append(f'<g class="cluster" id={quoteattr("cluster-" + name)}>')
        out.append(f"<title>{escape(title)}</title>")
        out.append(
            f'<rect x="{_f(x0)}" y="{_f(y0)}" width="{_f(x1 - x0)}" height="{_f(y1 - y0)}"'
            ' rx="10" ry="10" fill="#e3f2fd" stroke="#1565c0"/>'
        )
        out.append(
            f'<text x="{_f(x0 + _CLUSTER_PAD)}" y="{_f(y0 + _TITLE_H - 4)}" font-weight="bold"'
            f' fill="#0d47a1">{escape(title)}</text>'
        )
        out.append("</g>")
    for a, b in graph.edges:
        (xa, ya), (xb, yb) = pos[a], pos[b]
        ya, yb = ya + h / 2, yb - h / 2
        mid = (ya + yb) / 2
        out.append(
            f'<path class="edge" d="M{_f(xa)},{_f(ya)} C{_f(xa)},{_f(mid)} {_f(xb)},{_f(mid)}'
            f' {_f(xb)},{_f(yb)}" fill="none" stroke="#555" marker-end="url(#arrow)"/>'
        )
    for node in graph.nodes.values():
        x, y = pos[node.id]
        fill = "#c8e6c9" if node.is_param else "white"
        stroke = ' stroke="#c62828" stroke-width="3"' if node.is_root else ' stroke="#333"'
        kind = "node parameter" if node.is_param else "node root" if node.is_root else "node"
        out.append(f'<g class="{kind}" id={quoteattr("node-" + node.id)}>')
        out.append(
            f'<rect x="{_f(x - w / 2)}" y="{_f(y - h / 2)}" width="{_f(w)}" height="{_f(h)}"'
            f' rx="4" ry="4" fill="{fill}"{stroke}/>'
        )
        name, op, shape = node.lines
        label = [("ROOT " if node.is_root else "") + name, op, shape]
        for i, line in enumerate(label):
            weight = ' font-weight="bold"' if i == 0 else ""
            ty = y - h / 2 + _PAD + (i + 0.8) * _LINE_H
            out.append(
                f'<text x="{_f(x)}" y="{_f(ty)}" text-anchor="middle"{weight}>{escape(line)}</text>'
            )
        out.append("</g>")
    out.append("</svg>")
    return "\n".join(out) + "\n"


def to_svg(module: Module, *, engine: str | None = None) -> str:
    """The entry computation of `module` as standalone SVG text, each fusion a cluster.

    `engine`: None (Graphviz's `dot` when on PATH, else Python), "dot" (Graphviz, falling back
    to Python when `dot` is missing or fails) or "python".
    """
    if engine not in (None, "dot", "python"):
        raise ValueError(f"engine must be None, 'dot' or 'python', got {engine!r}")
    dot = shutil.which("dot") if engine != "python" else None
    if dot is not None:
        svg = _run_dot(dot, to_dot(module))
        if svg is not None:
            return svg
    return _python_svg(module)
