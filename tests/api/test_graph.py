"""xfuse.graph: a module drawn as standalone, well-formed SVG with one cluster per top-level
fusion, by the pure-Python renderer and by Graphviz when `dot` is installed (else the fallback
that engine=None takes)."""

import re
import shutil
import xml.etree.ElementTree as ET

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import xfuse
from xfuse.graph import to_dot, to_svg
from xfuse.hlo import Op

SVG_NS = "http://www.w3.org/2000/svg"


def f32(*shape):
    return np.ones(shape, np.float32)


CASES = {
    "softmax_relu": (
        lambda x, w, b: jax.nn.softmax(jax.nn.relu(x @ w + b), axis=-1),
        (f32(4, 8), f32(8, 16), f32(16)),
    ),
    "mlp2": (
        lambda x, w1, w2: jax.nn.relu(jax.nn.relu(x @ w1) @ w2),
        (f32(4, 8), f32(8, 16), f32(16, 4)),
    ),
    "tuple_out": (lambda x: (jnp.tanh(x) * 2, x.sum()), (f32(4, 8),)),
}


@pytest.fixture(scope="module", params=list(CASES))
def compiled(request):
    fn, args = CASES[request.param]
    return xfuse.jit(fn).lower(*args).compile()


def fusions(module):
    return [i for i in module.entry_computation if i.op is Op.FUSION]


def check_svg(svg, module):
    """Well-formed, svg namespace, one cluster per fusion, every name drawn, standalone."""
    root = ET.fromstring(svg)
    assert root.tag == f"{{{SVG_NS}}}svg"
    clusters = [
        g for g in root.iter(f"{{{SVG_NS}}}g") if "cluster" in g.get("class", "").split()
    ]
    assert len(clusters) == len(fusions(module))
    text = "".join(root.itertext())
    for inst in module.entry_computation:
        if inst.op is not Op.FUSION:
            assert inst.name in text
    for fusion in fusions(module):
        assert fusion.name in text  # in the cluster's title
        for inner in module[fusion.called]:
            if inner.op is not Op.PARAMETER:
                assert inner.name in text
    assert "href" not in svg
    assert re.sub(r'xmlns(:\w+)?="[^"]*"', "", svg).count("http") == 0
    return clusters


def test_python_renderer_draws_one_cluster_per_fusion(compiled):
    module = compiled.module
    assert fusions(module)
    clusters = check_svg(to_svg(module, engine="python"), module)
    assert {c.get("id") for c in clusters} == {f"cluster-{f.name}" for f in fusions(module)}
    for cluster, fusion in zip(clusters, fusions(module)):
        title = cluster.find(f"{{{SVG_NS}}}title").text
        assert title.startswith(f"{fusion.name} ({fusion.attr('kind')}: ")


def test_python_renderer_unfused_module_has_no_clusters(compiled):
    module = compiled.lowered.module
    assert not fusions(module)
    assert check_svg(to_svg(module, engine="python"), module) == []


def test_two_fusion_function_has_two_clusters():
    fn, args = CASES["mlp2"]
    module = xfuse.jit(fn).lower(*args).compile().module
    assert len(check_svg(to_svg(module, engine="python"), module)) == 2


def test_parameters_and_root_are_marked(compiled):
    module = compiled.module
    root = ET.fromstring(to_svg(module, engine="python"))
    classes = [g.get("class", "") for g in root.iter(f"{{{SVG_NS}}}g")]
    params = [i for i in module.entry_computation if i.op is Op.PARAMETER]
    assert classes.count("node parameter") == len(params)
    assert classes.count("node root") == 1
    assert "ROOT" in "".join(root.itertext())


def test_dot_text_has_a_cluster_subgraph_per_fusion(compiled):
    module = compiled.module
    dot = to_dot(module)
    assert dot.startswith("digraph ") and dot.rstrip().endswith("}")
    assert dot.count("subgraph \"cluster_") == len(fusions(module))
    assert "subgraph" not in to_dot(compiled.lowered.module)


def test_default_engine_uses_graphviz_or_falls_back(compiled):
    module = compiled.module
    if shutil.which("dot"):
        for engine in (None, "dot"):
            check_svg(to_svg(module, engine=engine), module)
        check_svg(to_svg(compiled.lowered.module, engine="dot"), compiled.lowered.module)
    else:  # no Graphviz: both fall back to the Python renderer, byte for byte
        python = to_svg(module, engine="python")
        assert to_svg(module) == python
        assert to_svg(module, engine="dot") == python
        check_svg(to_svg(module), module)


def test_unknown_engine_is_an_error(compiled):
    with pytest.raises(ValueError, match="engine"):
        to_svg(compiled.module, engine="neato")
