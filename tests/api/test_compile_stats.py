"""`Compiled.compile_stats()`: where the time to a first result went (trace, passes with the
fuse pass's share, the backend's code generation, the rest of compiling, the first call), each
part present and the parts adding up to the total; the fusion report prints them. No timing is
asserted: only that the accounting is whole."""

from __future__ import annotations

import jax
import numpy as np
import pytest

import xfuse


def mlp(x, w, b):
    return jax.nn.softmax(jax.nn.relu(x @ w + b), axis=-1)


def arguments():
    rng = np.random.default_rng(5)
    return (rng.standard_normal((16, 8)).astype(np.float32), rng.standard_normal((8, 4)).astype(np.float32),
            rng.standard_normal(4).astype(np.float32))


@pytest.mark.parametrize("backend", ["numba", "jax", "reference"])
def test_the_stages_add_up_to_the_total(backend):
    args = arguments()
    compiled = xfuse.jit(mlp, backend=backend).lower(*args).compile()
    before = compiled.compile_stats()
    assert before["first_call_s"] is None
    compiled(*args)
    stats = compiled.compile_stats()
    parts = ("trace_s", "passes_s", "backend_s", "other_s", "first_call_s")
    assert all(stats[k] >= 0 for k in parts) and stats["trace_s"] > 0 and stats["first_call_s"] > 0
    assert stats["total_s"] == pytest.approx(sum(stats[k] for k in parts))
    assert stats["passes_s"] == pytest.approx(sum(stats["passes"].values()))
    assert "fuse" in stats["passes"] and stats["fusion_s"] == stats["passes"]["fuse"]
    compiled(*args)
    assert compiled.compile_stats()["first_call_s"] == stats["first_call_s"]  # the first call's only
    text = str(compiled.fusion_report())
    assert "Compile: trace" in text and f"total {stats['total_s']:.3f} s" in text
    assert compiled.fusion_report().as_dict()["compile_stats"]["total_s"] == pytest.approx(stats["total_s"])


def test_no_passes_means_no_pass_time():
    args = arguments()
    compiled = xfuse.jit(mlp, passes="none").lower(*args).compile()
    stats = compiled.compile_stats()
    assert stats["passes"] == {} and stats["passes_s"] == 0 and stats["fusion_s"] == 0
