"""The real-program corpus (benchmarks/corpus/): every program at its test size under xfuse.jit
against jax.jit, the same output structure and values within the corpus's float32 tolerance
(`benchmarks.corpus.compare`: whole training steps and samplers carry their differences through
many ops, beyond the per-op bounds of tests/tolerances.py); the worker's `program` task in its
own process, as the suite runs it; and the corpus's table from a run's rows.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

import xfuse

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.corpus import BY_NAME, PROGRAMS, compare  # noqa: E402
from benchmarks.worker import MARKER  # noqa: E402

@pytest.mark.parametrize("name", [p.name for p in PROGRAMS])
def test_program_matches_jax_jit(name):
    fn, args = BY_NAME[name].build("test")
    want = jax.jit(fn)(*args)
    got = xfuse.jit(fn)(*args)
    verdict = compare(got, want)
    assert verdict["structure_ok"], verdict.get("structure")
    assert verdict["ok"], json.dumps(verdict["first_mismatch"], indent=1)


def test_the_corpus_covers_the_libraries_and_imports_none_of_them():
    assert len(PROGRAMS) >= 15 and len(BY_NAME) == len(PROGRAMS)
    libraries = {p.library for p in PROGRAMS}
    assert {"flax", "flax.nnx", "equinox", "optax", "numpyro", "blackjax", "diffrax"} <= libraries
    # The suite's driver imports the corpus to list it: no library may load with it.
    done = subprocess.run(
        [sys.executable, "-c", "import sys, benchmarks.corpus; "
         "print(sorted(m for m in ('jax', 'flax', 'equinox', 'numpyro', 'blackjax', 'optax') "
         "if m in sys.modules))"],
        capture_output=True, text=True, cwd=ROOT, check=True,
    )
    assert done.stdout.strip() == "[]"


def run_worker(*arguments: str) -> dict:
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.worker", *arguments, "--quick"],
        capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=path), timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    lines = [line for line in done.stdout.splitlines() if line.startswith(MARKER)]
    assert len(lines) == 1, done.stdout[-2000:]
    return json.loads(lines[0][len(MARKER):])


@pytest.mark.parametrize("engine", ["xfuse", "jax"])
def test_worker_runs_one_program(engine):
    result = run_worker("program", engine, "numpyro_eight_schools_grad")
    assert result["task"] == "program" and result["engine"] == engine
    assert result["program"] == "numpyro_eight_schools_grad" and result["size"] == "bench"
    assert result["ok"] is True and result["error"] is None, result.get("error")
    assert result["time_s"] > 0 and result["repeats"] == len(result["samples_s"])
    assert result["time_to_first_result_s"] > 0 and result["check"]["ok"] is True
    if engine == "xfuse":
        assert result["kernel_count"] >= 1 and result["steps_per_call"] >= 1
        assert result["cached_first_result_s"] > 0
        assert result["check"]["reference"] == "jax.jit" and result["check"]["leaves"] == 4
    else:
        assert result["xla_kernel_count"] >= 1


def test_worker_reports_a_program_that_fails_where_it_fails(monkeypatch, tmp_path):
    from benchmarks.corpus import Program
    from benchmarks.worker import task_program

    def build(size):
        def fn(x):
            raise ValueError("no such layer\nsecond line")

        return fn, (np.ones(3, np.float32),)

    monkeypatch.setitem(BY_NAME, "broken", Program("broken", "flax", "raises when traced", build))
    monkeypatch.setenv("XFUSE_CACHE_DIR", str(tmp_path))  # the task gives itself a cache
    result = task_program("xfuse", "broken", quick=True, size="test", backend=None)
    assert result["ok"] is False and result["failed_at"] == "trace"
    assert result["error"].startswith("ValueError: no such layer [")  # the first line, and where
    assert "second line" not in result["error"]


def test_compare_holds_floats_to_their_output_and_integers_exactly():
    want = {"loss": np.float32(2.0), "grads": [np.array([1.0, 1e-8], np.float32)],
            "count": np.int32(3)}
    noisy = {"loss": np.float32(2.002), "grads": [np.array([1.0, -1e-8], np.float32)],
             "count": np.int32(3)}
    assert compare(noisy, want)["ok"]  # 1e-8 beside 1.0 is rounding left by a cancelling sum
    wrong = dict(noisy, grads=[np.array([1.01, 1e-8], np.float32)])
    verdict = compare(wrong, want)
    assert not verdict["ok"] and verdict["first_mismatch"]["path"] == "['grads'][0]"
    assert not compare(dict(want, count=np.int32(4)), want)["ok"]
    assert not compare(dict(want, count=np.float32(3)), want)["ok"]  # the dtype too
    assert not compare((want["loss"],), want)["structure_ok"]


def test_the_corpus_table_shows_speed_ups_kernels_and_errors():
    from benchmarks.report import corpus_tables
    from benchmarks.suite import derive_program, summarize

    def runs(time_s, first_s, **more):
        return [{"ok": True, "error": None, "time_s": time_s, "time_to_first_result_s": first_s,
                 **more}]

    good = derive_program(BY_NAME["flax_mlp_train_adam"], {
        "xfuse": runs(1e-3, 2.0, kernel_count=9, steps_per_call=12, cached_first_result_s=0.5,
                      native_ready_s=30.0),
        "jax": runs(2e-3, 0.4, xla_kernel_count=20),
    })
    assert good["speedup_vs_jax"]["xfuse"] == pytest.approx(2.0)
    assert good["kernels"] == {"xfuse": 9, "xla": 20} and good["steps_per_call"] == 12
    assert good["first_result_s"] == {"xfuse": 2.0, "xfuse_native": 30.0, "xfuse_cached": 0.5, "jax": 0.4}
    failed = derive_program(BY_NAME["diffrax_neural_ode_tsit5"], {
        "xfuse": [{"ok": False, "error": "UnsupportedPrimitiveError: no rule",
                   "failed_at": "trace"}],
        "jax": runs(5e-3, 1.0, xla_kernel_count=31),
    })
    assert failed["speedup_vs_jax"] == {}
    results = {
        "meta": {"size": "bench", "date": "2026-01-01", "quick": True, "processes": 1,
                 "engines": ["xfuse", "jax"], "xfuse_backend": "default",
                 "machine": {"cpu": "CPU", "cores": 2}, "load_average_before": None},
        "programs": [good, failed],
        "summary": summarize([good, failed], ["xfuse", "jax"]),
    }
    text = corpus_tables(results)
    assert "flax_mlp_train_adam" in text and "2.00x" in text and "30 s" in text  # the native program ready
    assert "ERROR [1]" in text and "at trace: UnsupportedPrimitiveError: no rule" in text
    assert "over 1 of 2 programs" in text
