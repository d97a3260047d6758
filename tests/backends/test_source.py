"""Generated kernels are readable and findable: `compiled.kernel_source()` shows each kernel,
and the code numba runs comes from lines Python can show (linecache for kernels compiled in
memory, the cache file otherwise), so a traceback or a numba error into a kernel quotes the
generated line."""

from __future__ import annotations

import linecache

import jax
import numpy as np
import pytest

import xfuse


def dispatchers(compiled):
    return [step.run.dispatcher for step in compiled.executable.steps if hasattr(step.run, "dispatcher")]


@pytest.mark.parametrize("cache", ["off", "on"])
def test_kernel_lines_are_visible_to_tracebacks(cache, monkeypatch, tmp_path):
    if cache == "off":
        monkeypatch.setenv("XFUSE_CACHE_DIR", "off")
    else:
        monkeypatch.setenv("XFUSE_CACHE_DIR", str(tmp_path))
    x = np.linspace(-2, 2, 512, dtype=np.float32).reshape(8, 64)
    compiled = xfuse.jit(lambda x: jax.nn.softmax(x * 2.0, axis=-1)).lower(x).compile()
    compiled(x)
    text = compiled.kernel_source()
    assert "def k_fusion_0(row_start, row_end" in text and "rows.max_f32" in text
    (fn,) = dispatchers(compiled)
    code = fn.py_func.__code__
    lines = linecache.getlines(code.co_filename)
    assert lines, f"no source lines for {code.co_filename}"
    assert lines[code.co_firstlineno - 1].startswith("def k_fusion_0(")
    body = "".join(lines)
    for line in text.splitlines():
        if line.startswith("    "):
            assert line in body
    if cache == "on":
        assert code.co_filename.startswith(str(tmp_path))
