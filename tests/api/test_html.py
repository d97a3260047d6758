"""Rich views of the stages: `_repr_html_` / `_repr_svg_` of Lowered and Compiled, the pass
history's diffs, and `xfuse inspect --html`, a standalone report (no scripts, no external
resources) with the graph, the highlighted HLO, the fusion report, costs and kernel source."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from html.parser import HTMLParser

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import xfuse
from xfuse.cli import main as cli_main
from xfuse.hlo import Op


def mlp(x, w1, w2):
    h = jnp.tanh(x @ w1)
    return jax.nn.softmax(jax.nn.relu(h @ w2), axis=-1), h.sum(axis=0)


ARGS = (np.ones((4, 8), np.float32), np.ones((8, 16), np.float32), np.ones((16, 5), np.float32))


class Tags(HTMLParser):
    """Every start tag and its attributes; fails on nothing (HTML is forgiving), so the tests
    look at what it collects."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict]] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))


def _standalone(text: str) -> Tags:
    tags = Tags()
    tags.feed(text)
    names = {t for t, _ in tags.tags}
    assert not names & {"script", "link", "img", "iframe", "object"}
    for _, attrs in tags.tags:
        assert "src" not in attrs and "href" not in attrs and "xlink:href" not in attrs
    return tags


def _fusions(module) -> list[str]:
    return [i.name for i in module.entry_computation.instructions if i.op is Op.FUSION]


@pytest.fixture(scope="module")
def compiled():
    return xfuse.jit(mlp).lower(*ARGS).compile()


def test_compiled_renders_everything(compiled):
    page = compiled._repr_html_()
    tags = _standalone(page)
    report = compiled.fusion_report()
    for fusion in report.fusions:
        assert fusion.name in page and fusion.kind in page
    assert "Candidates, taken and refused" in page
    assert "Cost analysis" in page and "Pass history" in page and "Kernel source" in page
    assert page.count('class="fusion-line"') == len(_fusions(compiled.module))
    assert sum(1 for t, a in tags.tags if t == "g" and "cluster" in a.get("class", "")) == len(report.fusions)
    assert "def " in page  # the generated kernel source


def test_svg_is_well_formed_with_one_cluster_per_fusion(compiled):
    svg = compiled._repr_svg_()
    root = ET.fromstring(svg)
    assert root.tag.endswith("svg")
    clusters = [g for g in root.iter() if g.tag.endswith("g") and "cluster" in (g.get("class") or "")]
    assert len(clusters) == len(_fusions(compiled.module))
    lowered_svg = ET.fromstring(compiled.lowered._repr_svg_())
    assert not [g for g in lowered_svg.iter() if "cluster" in (g.get("class") or "")]


def test_lowered_renders_its_module(compiled):
    page = compiled.lowered._repr_html_()
    _standalone(page)
    for inst in compiled.lowered.module.entry_computation.instructions:
        assert inst.name in page
    assert "before optimisation" in page


def test_pass_diff(compiled):
    names = [r.name for r in compiled.pass_history()]
    assert names[-1] == "fuse"
    diff = compiled.pass_diff("input", "fuse")
    assert diff.startswith("--- after input\n+++ after fuse")
    assert re.search(r"^\+.*fusion\(", diff, re.M)  # the fusions appear
    assert compiled.pass_diff(-1, "fuse") == ""  # a pass against itself
    assert compiled.pass_diff(0, -1) == compiled.pass_diff(names[0], "fuse")
    with pytest.raises(ValueError, match="no pass named 'nope' ran; the passes: input, simplify"):
        compiled.pass_diff("nope")
    with pytest.raises(ValueError, match="pass index 99 is out of range"):
        compiled.pass_diff(99)


def test_html_escapes_what_it_shows():
    def f(x):
        return x * 2 + 1

    compiled = xfuse.jit(f).lower(np.ones(3, np.float32)).compile()
    page = compiled._repr_html_()
    assert "->" not in page.split("<h3>Fused HLO</h3>")[1].split("</pre>")[0]  # written as -&gt;
    assert "-&gt;" in page


def test_inspect_command_writes_a_standalone_report(tmp_path, capsys):
    source = tmp_path / "model.py"
    source.write_text(
        "import jax, jax.numpy as jnp\n"
        "def mlp(x, w, b):\n"
        "    return jax.nn.softmax(jax.nn.relu(x @ w + b), axis=-1)\n"
    )
    out = tmp_path / "report.html"
    code = cli_main(["inspect", f"{source}:mlp", "--arg", "f32[64,512]", "--arg", "f32[512,1024]",
                     "--arg", "f32[1024]", "--html", str(out)])
    assert code == 0
    text = out.read_text()
    assert text.startswith("<!DOCTYPE html>") and "</html>" in text
    tags = _standalone(text)
    assert sum(1 for t, a in tags.tags if t == "g" and "cluster" in a.get("class", "")) == 1
    assert "kind=output" in text and "model.py:3 (mlp)" in text
    assert cli_main(["inspect", f"{source}:mlp", "--arg", "f32[2,3]", "--arg", "f32[3,4]", "--arg", "f32[4]"]) == 0
    assert "Fusion report for mlp" in capsys.readouterr().out
    assert cli_main(["inspect", f"{source}:nope", "--arg", "f32[2]"]) == 2
    assert "has no attribute 'nope'" in capsys.readouterr().err
