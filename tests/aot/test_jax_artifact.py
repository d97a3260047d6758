"""The jax backend's AOT form: `compiled.save` on the jax backend writes the fused module
exported with `jax.export` into the artifact container; `xfuse.aot.load` in a fresh process runs
it with the same signature checks; the numpy-only loader refuses it with a clear error."""

from __future__ import annotations

import json
import subprocess
import sys

import jax
import numpy as np
import pytest

import xfuse
from xfuse.aot.cli import main as aot_main
from xfuse.runtime.artifact import ArtifactError
from xfuse.runtime.artifact import load as load_native


def softmax_relu(x, w, b):
    return jax.nn.softmax(jax.nn.relu(x @ w + b), axis=-1)


def pair(x, scale):
    return {"y": jax.numpy.tanh(x) * scale, "n": (x * x).sum()}


def _inputs():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((8, 16)).astype(np.float32)
    x[0, :4] = [np.nan, np.inf, -np.inf, -0.0]
    return x, rng.standard_normal((16, 32)).astype(np.float32), rng.standard_normal(32).astype(np.float32)


def test_saved_and_reloaded_in_a_fresh_process(tmp_path):
    args = _inputs()
    compiled = xfuse.jit(softmax_relu, backend="jax").lower(*args).compile()
    path = compiled.save(tmp_path / "f.xfa")
    np.savez(tmp_path / "in.npz", *args)
    code = (
        "import sys, numpy as np, xfuse.aot\n"
        f"f = xfuse.aot.load({str(path)!r})\n"
        f"d = np.load({str(tmp_path / 'in.npz')!r})\n"
        "out = np.asarray(f(*[d[f'arr_{i}'] for i in range(3)]))\n"
        f"np.save({str(tmp_path / 'out.npy')!r}, out)\n"
        "try:\n    f(d['arr_0'])\nexcept TypeError as e:\n    print('TypeError', e)\n"
        "try:\n    f(d['arr_1'], d['arr_1'], d['arr_2'])\nexcept TypeError as e:\n    print('TypeError', e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    got = np.load(tmp_path / "out.npy")
    with jax.default_matmul_precision("highest"):  # as the backend multiplies (not a GPU's tf32)
        want = np.asarray(jax.jit(softmax_relu)(*args))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7, equal_nan=True)
    np.testing.assert_allclose(got, np.asarray(compiled(*args)), rtol=1e-6, equal_nan=True)
    lines = out.stdout.splitlines()
    assert lines[0] == "TypeError softmax_relu takes 3 array arguments, got 1 (its arguments: x, w, b)"
    assert lines[1].startswith("TypeError softmax_relu: argument x should be float32[8, 16], got float32[16, 32]")


def test_pytrees_and_async(tmp_path):
    x = np.linspace(-3, 3, 12, dtype=np.float32)
    compiled = xfuse.jit(pair, backend="jax").lower(x, 2.0).compile()
    loaded = xfuse.aot.load(compiled.save(tmp_path / "p.xfa"))
    got = loaded(x, 2.0)
    want = jax.jit(pair)(x, 2.0)
    assert set(got) == {"y", "n"}
    np.testing.assert_allclose(np.asarray(got["y"]), want["y"], rtol=1e-6)
    np.testing.assert_allclose(np.asarray(loaded.call_async(x, 2.0).result()["n"]), want["n"], rtol=1e-6)


def test_the_numpy_only_loader_refuses_it_clearly(tmp_path):
    path = xfuse.jit(softmax_relu, backend="jax").lower(*_inputs()).compile().save(tmp_path / "f.xfa")
    with pytest.raises(ArtifactError, match=r"f.xfa: holds a module exported with jax.export"):
        load_native(path)


def test_inspect_and_cli(tmp_path, capsys):
    source = tmp_path / "fn.py"
    source.write_text("import jax\ndef f(x, y):\n    return jax.nn.relu(x * y + 1)\n")
    out = tmp_path / "f.xfa"
    assert aot_main([
        "compile", f"{source}:f", "--arg", "f32[8]", "--arg", "f32[8]", "--backend", "jax",
        "--platform", "cpu", "--platform", "cuda", "-o", str(out),
    ]) == 0
    assert aot_main(["inspect", str(out)]) == 0
    text = capsys.readouterr().out
    assert "runtime    jax.export" in text and "platforms  cpu, cuda" in text
    x, y = np.arange(8, dtype=np.float32) - 4, np.full(8, 2, np.float32)
    np.savez(tmp_path / "in.npz", x=x, y=y)
    assert aot_main(["run", str(out), str(tmp_path / "in.npz"), "-o", str(tmp_path / "o.npz")]) == 0
    np.testing.assert_array_equal(np.load(tmp_path / "o.npz")["arr_0"], np.maximum(x * y + 1, 0))
    capsys.readouterr()
    assert aot_main(["inspect", "--json", str(out)]) == 0
    manifest = json.loads(capsys.readouterr().out)
    assert manifest["runtime"] == "jax" and manifest["target"]["platforms"] == ["cpu", "cuda"]


def test_option_mistakes_are_named(tmp_path, capsys):
    source = tmp_path / "fn.py"
    source.write_text("def f(x):\n    return x + 1\n")
    assert aot_main(["compile", f"{source}:f", "--arg", "f32[2]", "--platform", "cuda", "-o", str(tmp_path / "a.xfa")]) == 2
    assert "--platform applies to --backend jax" in capsys.readouterr().err
    compiled = xfuse.jit(lambda x: x + 1).lower(np.ones(2, np.float32)).compile()
    with pytest.raises(ValueError, match="platforms= applies to the jax backend"):
        compiled.save(tmp_path / "b.xfa", platforms=("cuda",))
