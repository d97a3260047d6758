"""The benchmark suite's worker: one small workload per engine, in quick mode, each in its own
process as the suite runs it; checks the JSON it returns has the fields the report reads.
No timing is asserted. Also the XLA kernel-count rule on a hand-written ENTRY computation, and
the suite taking the median of several timing processes per engine."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.engines import xla_kernels  # noqa: E402
from benchmarks.suite import median_process  # noqa: E402
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


def test_the_median_process_stands_for_the_engine_with_every_process_beside_it():
    runs = [{"ok": True, "error": None, "time_s": t, "process": k} for k, t in enumerate([3e-3, 1e-3, 2e-3])]
    chosen = median_process(runs)
    assert chosen["process"] == 2 and chosen["time_s"] == 2e-3
    assert chosen["process_times_s"] == [3e-3, 1e-3, 2e-3]  # in the order they ran
    assert median_process(runs[:2])["time_s"] == 1e-3  # the lower middle of an even count
    wrong = dict(runs[0], error="wrong result (see check)")
    assert median_process([runs[1], wrong, runs[2]])["error"] == "wrong result (see check)"
    failed = {"ok": False, "error": "worker timed out after 600 s"}
    assert median_process([runs[1], runs[2], failed])["ok"] is False


def test_the_suite_times_each_engine_in_several_processes_in_turns(tmp_path):
    out = tmp_path / "results.json"
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--quick", "--processes", "2", "--only", "tiny_add_4",
         "--engines", "xfuse,jax,numpy", "--json", str(out), "--png", str(tmp_path / "chart.png")],
        capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=path), timeout=600, check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    progress = [line.split("]", 1)[1].split()[1:3] for line in done.stderr.splitlines() if "tiny_add_4" in line and "/2)" in line]
    assert progress == [[e, f"({k}/2)"] for k in (1, 2) for e in ("xfuse", "jax", "numpy")]
    results = json.loads(out.read_text())
    assert results["meta"]["processes"] == 2
    (row,) = results["workloads"]
    for engine in ("xfuse", "jax", "numpy"):
        times = row["engines"][engine]["process_times_s"]
        assert len(times) == 2 and row["engines"][engine]["time_s"] == min(times)
    assert "time per process" in done.stdout
    # the machine line names the core and its vector extension, as /proc/cpuinfo has them
    from benchmarks.report import _machine

    machine = results["meta"]["machine"]
    flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags")).split()
    widest = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "AVX" if "avx" in flags else None
    assert machine["simd"] == widest
    assert machine["core"] and _machine(machine) in done.stdout


def test_speed_ups_between_fastest_processes_sit_beside_the_medians():
    from benchmarks.suite import derive, summarize
    from benchmarks.workloads import WORKLOADS

    tiny = next(w for w in WORKLOADS if w.name == "tiny_add_4")
    engines = {
        "xfuse": {"ok": True, "error": None, "time_s": 2e-6, "process_times_s": [2e-6, 1e-6, 3e-6]},
        "jax": {"ok": True, "error": None, "time_s": 8e-6, "process_times_s": [8e-6, 12e-6, 4e-6]},
    }
    row = derive(tiny, engines, None, 0.0)
    assert row["speedup_vs_jax"]["xfuse"] == pytest.approx(4.0)  # median process against median
    assert row["speedup_vs_jax_fastest"]["xfuse"] == pytest.approx(4.0)  # 4 us against 1 us
    engines["jax"]["process_times_s"] = [8e-6, 12e-6, 9e-6]
    row = derive(tiny, engines, None, 0.0)
    assert row["speedup_vs_jax_fastest"]["xfuse"] == pytest.approx(8.0)
    summary = summarize([row], ["xfuse", "jax"])["xfuse"]
    assert summary["geomean_speedup_vs_jax"] == pytest.approx(4.0)
    assert summary["geomean_speedup_vs_jax_fastest"] == pytest.approx(8.0)
