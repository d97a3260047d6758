"""The benchmark suite's worker: one small workload per engine, in quick mode, each in its own
process as the suite runs it; checks the JSON it returns has the fields the report reads.
No timing is asserted. Also the XLA kernel-count rule on a hand-written ENTRY computation."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.engines import xla_kernels  # noqa: E402
from benchmarks.worker import MARKER  # noqa: E402

TIMING_FIELDS = {"time_s", "min_s", "number", "repeats", "samples_s"}


def run_worker(*arguments: str) -> dict:
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.worker", *arguments, "--quick"],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=path),
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    lines = [line for line in done.stdout.splitlines() if line.startswith(MARKER)]
    assert len(lines) == 1, done.stdout[-2000:]
    return json.loads(lines[0][len(MARKER):])


@pytest.mark.parametrize("engine", ["xfuse", "jax", "numpy", "numexpr"])
def test_worker_times_one_small_workload(engine):
    result = run_worker("time", engine, "tiny_add_4")
    assert result["task"] == "time" and result["engine"] == engine
    assert result["workload"] == "tiny_add_4" and result["quick"] is True
    assert {"ok", "error"} <= result.keys()
    if engine == "xfuse" and not result["ok"]:
        pytest.fail(f"xfuse failed on the tiny workload: {result['error']}")
    assert result["ok"] is True
    assert TIMING_FIELDS <= result.keys()
    assert result["time_s"] > 0 and result["repeats"] == len(result["samples_s"])
    assert {"ok", "max_abs_err", "tolerance", "dtype"} <= result["check"].keys()
    if engine == "xfuse":
        assert result["kernel_count"] >= 1
        assert result["time_to_first_result_s"] > 0
    if engine == "jax":
        assert result["xla_kernel_count"] >= 1
        assert result["compile_s"] > 0


def test_worker_compile_and_bandwidth_tasks():
    compiled = run_worker("compile", "tiny_add_4")
    assert compiled["task"] == "compile" and compiled["ok"] is True, compiled.get("error")
    assert compiled["kernel_count"] >= 1 and compiled["time_to_first_result_s"] > 0
    bandwidth = run_worker("bandwidth")
    assert bandwidth["ok"] is True and bandwidth["gbps"] > 0 and bandwidth["buffer_bytes"] > 0


def test_xla_kernel_count_reads_only_the_entry_computation():
    text = """HloModule jit_f

%fused_computation (p: f32[4]) -> f32[4] {
  %p = f32[4]{0} parameter(0)
  ROOT %e = f32[4]{0} exponential(%p)
}

ENTRY %main.4 (x.1: f32[4]) -> (f32[4], f32[]) {
  %x.1 = f32[4]{0} parameter(0)
  %constant.6 = f32[] constant(0)
  %fusion = f32[4]{0} fusion(%x.1), kind=kLoop, calls=%fused_computation
  %bitcast.1 = f32[2,2]{1,0} bitcast(%fusion)
  %r = (f32[4]{0}, u8[64]{0}) custom-call(%bitcast.1), custom_call_target="x"
  %gte = f32[4]{0} get-tuple-element(%r), index=0
  %reduce.1 = f32[] reduce(%gte, %constant.6), dimensions={0}, to_apply=%add
  ROOT %tuple = (f32[4]{0}, f32[]) tuple(%gte, %reduce.1)
}
"""
    assert xla_kernels(text) == ["fusion:kLoop", "custom-call", "reduce"]
