"""The jax backend's ahead-of-time form (`xfuse.backends.jax.export`), run in a fresh process,
and the kernel structure of its "fusions" mode: one `jax.jit` function per top-level kernel."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import xfuse
from tests.tolerances import ACCUMULATION, TRANSCENDENTAL, assert_close
from xfuse.backends.jax import compile_module
from xfuse.backends.jax.export import ExportError, deserialize, read_header, serialize
from xfuse.hlo import DType, Op, interpret, parse


def mlp(x, w, b):
    return jax.nn.softmax(jax.nn.relu(x @ w + b), axis=-1)


def mlp_arrays() -> list[np.ndarray]:
    rng = np.random.default_rng(7)
    return [rng.standard_normal(s).astype(np.float32) for s in [(8, 16), (16, 32), (32,)]]


def mlp_module():
    return xfuse.jit(mlp).lower(*mlp_arrays()).compile().module


# 64-bit types (jax needs x64 for them; the loading process has it off), a multi-output fusion
# and integer edge values: division by zero, MIN / -1, shifts past the width.
WIDE = parse("""
HloModule wide

fused_div_shift (p0: s64[6], p1: s64[6], p2: f64[6]) -> (s64[6], s64[6], f64[6]) {
  p0 = s64[6] parameter(0)
  p1 = s64[6] parameter(1)
  p2 = f64[6] parameter(2)
  div.0 = s64[6] div(p0, p1)
  shift_left.1 = s64[6] shift_left(p0, p1)
  exp.2 = f64[6] exp(p2)
  ROOT tuple.3 = (s64[6], s64[6], f64[6]) tuple(div.0, shift_left.1, exp.2)
}

ENTRY main (a: s64[6], b: s64[6], x: f64[6]) -> (s64[6], f64[6], s64[6]) {
  a = s64[6] parameter(0)
  b = s64[6] parameter(1)
  x = f64[6] parameter(2)
  fusion.0 = (s64[6], s64[6], f64[6]) fusion(a, b, x), kind=multi_output, calls=fused_div_shift
  div.0 = s64[6] get_tuple_element(fusion.0), index=0
  exp.2 = f64[6] get_tuple_element(fusion.0), index=2
  shift_left.1 = s64[6] get_tuple_element(fusion.0), index=1
  ROOT tuple.4 = (s64[6], f64[6], s64[6]) tuple(div.0, exp.2, shift_left.1)
}
""")


def wide_arrays() -> list[np.ndarray]:
    low = np.iinfo(np.int64).min
    a = np.array([7, -7, low, low, 5, 3], np.int64)
    b = np.array([0, 2, -1, 1, 64, 70], np.int64)
    x = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1.5])
    return [a, b, x]


RUN_EXPORTED = textwrap.dedent("""
    import sys
    import numpy as np
    from xfuse.backends.jax.export import deserialize

    blob_path, inputs_path, outputs_path = sys.argv[1:]
    with open(blob_path, "rb") as f:
        run = deserialize(f.read())
    with np.load(inputs_path) as inputs:
        arrays = [inputs[f"a{i}"] for i in range(len(inputs.files))]
    outputs = run(arrays)
    np.savez(outputs_path, **{f"o{i}": np.asarray(o) for i, o in enumerate(outputs)})
    print(",".join(run.platforms))
""")


def run_in_fresh_process(blob: bytes, arrays: list[np.ndarray], folder: Path) -> tuple[list, str]:
    """Writes the blob and inputs to files, deserializes and runs them in a new interpreter;
    (its outputs, the platforms it reports)."""
    (folder / "model.xjx").write_bytes(blob)
    np.savez(folder / "inputs.npz", **{f"a{i}": a for i, a in enumerate(arrays)})
    env = {k: v for k, v in os.environ.items() if k != "JAX_ENABLE_X64"}
    done = subprocess.run(
        [sys.executable, "-c", RUN_EXPORTED, str(folder / "model.xjx"), str(folder / "inputs.npz"),
         str(folder / "outputs.npz")],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    with np.load(folder / "outputs.npz") as outputs:
        return [outputs[f"o{i}"] for i in range(len(outputs.files))], done.stdout.strip()


@pytest.mark.parametrize("platforms", [None, ("cpu", "cuda")], ids=["default", "cpu+cuda"])
def test_exported_mlp_runs_in_a_fresh_process(tmp_path: Path, platforms) -> None:
    module, arrays = mlp_module(), mlp_arrays()
    outputs, reported = run_in_fresh_process(serialize(module, platforms=platforms), arrays, tmp_path)
    assert reported == ",".join(platforms or (jax.export.default_export_platform(),))
    (got,) = outputs
    want = interpret(module, *arrays)
    assert got.dtype == np.float32
    assert_close(got, want, DType.F32, "mlp", ACCUMULATION, scale=np.ones_like(want))


def test_exported_64_bit_module_runs_in_a_fresh_process(tmp_path: Path) -> None:
    arrays = wide_arrays()
    outputs, _ = run_in_fresh_process(serialize(WIDE), arrays, tmp_path)
    want = interpret(WIDE, *arrays)
    assert [o.dtype for o in outputs] == [np.int64, np.float64, np.int64]
    np.testing.assert_array_equal(outputs[0], want[0])
    assert_close(outputs[1], want[1], DType.F64, "exp", TRANSCENDENTAL)
    np.testing.assert_array_equal(outputs[2], want[2])


def test_deserialize_refuses_what_is_not_an_export() -> None:
    with pytest.raises(ExportError, match="not an xfuse jax export"):
        deserialize(b"\x7fELF not a model")
    blob = serialize(mlp_module())
    assert read_header(blob) == {"version": 1, "x64": False, "module": "mlp",
                                 "platforms": [jax.export.default_export_platform()]}
    newer = blob.replace(b'"version": 1', b'"version": 99', 1)
    with pytest.raises(ExportError, match="format 99"):
        deserialize(newer)
    with pytest.raises(TypeError, match="takes 3 arguments, got 1"):
        deserialize(blob)(mlp_arrays()[:1])


# ---------------------------------------------------------------------------- fusions mode
def two_layers(x, w, b, w2):
    h = jax.nn.gelu(x @ w + b)
    y = h @ w2
    return jax.nn.softmax(y, axis=-1), jnp.sum(y, axis=0), jnp.argmax(h, axis=1)


def top_level_kernels(module) -> list[str]:
    hosted = {Op.PARAMETER, Op.CONSTANT, Op.TUPLE, Op.GET_TUPLE_ELEMENT, Op.OPTIMIZATION_BARRIER}
    return [i.name for i in module.entry_computation.instructions if i.op not in hosted]


def test_fusions_mode_jits_each_fusion_on_its_own() -> None:
    compiled = xfuse.jit(mlp, backend="jax").lower(*mlp_arrays()).compile()
    fusions = [i.name for i in compiled.module.entry_computation.instructions if i.op is Op.FUSION]
    executable = compiled.executable
    assert executable.mode == "fusions"
    assert list(executable.kernel_sources) == fusions == ["fusion.0"]
    assert len(executable.kernels) == compiled.kernel_count() == 1
    assert "lax.dot_general" in compiled.kernel_source() and "lax.exp" in compiled.kernel_source()


def test_fusions_mode_kernels_are_the_fused_modules_kernels() -> None:
    rng = np.random.default_rng(3)
    arrays = [rng.standard_normal(s).astype(np.float32) for s in [(4, 8), (8, 16), (16,), (16, 5)]]
    compiled = xfuse.jit(two_layers, backend="jax").lower(*arrays).compile()
    kernels = top_level_kernels(compiled.module)
    executable = compiled.executable
    assert list(executable.kernel_sources) == list(executable.kernels) == kernels
    assert len(kernels) == compiled.kernel_count() >= 3
    for name, kernel in executable.kernels.items():
        assert callable(getattr(kernel, "lower", None)), f"{name} is not a jax.jit function"
    assert executable.driver_source.count(" = jit_") == len(kernels)  # one call each
    module_mode = compile_module(compiled.module, mode="module")
    assert list(module_mode.kernels) == ["main"]
    want = jax.tree.leaves(compiled(*arrays))
    for got, expected in zip(module_mode(arrays), want):
        dtype = DType.from_numpy(np.asarray(expected).dtype)
        assert_close(np.asarray(got), np.asarray(expected), dtype, "module mode", ACCUMULATION,
                     scale=np.ones(np.shape(expected)))
