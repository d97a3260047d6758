"""AOT artifacts: saved, loaded and run (in this process and in one where jax, numba and
llvmlite cannot be imported), equal to the JIT path; damaged, foreign and newer files, and
CPUs without the features, give clear errors; signature checks as `Compiled`'s."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import xfuse
from benchmarks.aot import BLOCKER  # makes importing jax, jaxlib, numba or llvmlite fail
from xfuse.runtime import artifact
from xfuse.runtime.artifact import ArtifactError

RNG = np.random.default_rng(7)


def softmax_relu(x, w, b):
    return jax.nn.softmax(jax.nn.relu(x @ w + b), axis=-1)


def layer_norm(x):
    m = x.mean(-1, keepdims=True)
    v = ((x - m) ** 2).mean(-1, keepdims=True)
    return (x - m) / jnp.sqrt(v + 1e-5)


def tree_fn(params, x):
    """Dict and tuple arguments, a dict of results, a constant, integer and half work."""
    h = jnp.tanh(x @ params["w"] + params["b"])
    counts = (params["ids"] % 3).astype(jnp.int32).sum(0)
    half = (x.astype(jnp.float16) * 2).sum(-1)
    return {"h": h, "n": counts, "half": half, "k": jnp.arange(4.0) * h[0, :4]}


def chain(x):
    return jnp.tanh(x) * jax.nn.sigmoid(x) + jnp.exp(-x * x)


def f32(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


WORKLOADS = {
    "softmax_relu": (softmax_relu, lambda: (f32(64, 512), f32(512, 1024), f32(1024))),
    "layer_norm": (layer_norm, lambda: (f32(256, 1024),)),
    "chain": (chain, lambda: (f32(1 << 16),)),
    "tree": (tree_fn, lambda: ({"w": f32(16, 8), "b": f32(8), "ids": RNG.integers(-9, 9, (5, 3)).astype(np.int32)},
                               f32(4, 16))),
}


def assert_same(got, want, rtol=2e-5, atol=2e-5) -> None:
    # The artifact's products run in numpy's BLAS, the JIT's where the runtime chooses (oneDNN,
    # its split products): the sums' orders differ by host (znver5 here: 3e-5 relative after a
    # softmax), so the bound is float32's rounding of those sums, as against jax.jit.
    got_leaves, got_tree = jax.tree_util.tree_flatten(got)
    want_leaves, want_tree = jax.tree_util.tree_flatten(want)
    assert got_tree == want_tree
    for g, w in zip(got_leaves, want_leaves):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_allclose(np.asarray(g, np.float64), np.asarray(w, np.float64), rtol=rtol, atol=atol)


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> dict:
    """name -> (artifact path, arguments, the JIT result, jax.jit's result)."""
    folder = tmp_path_factory.mktemp("artifacts")
    out = {}
    for name, (fn, make) in WORKLOADS.items():
        args = make()
        compiled = xfuse.jit(fn).lower(*args).compile()
        path = compiled.save(folder / f"{name}.xfa")
        out[name] = (path, args, compiled(*args), jax.jit(fn)(*args))
    return out


@pytest.mark.parametrize("name", list(WORKLOADS))
def test_loaded_artifact_matches_jit_and_jax(saved, name) -> None:
    path, args, jit_result, jax_result = saved[name]
    loaded = xfuse.aot.load(path)
    got = loaded(*args)
    assert_same(got, jit_result)
    assert_same(got, jax.tree_util.tree_map(np.asarray, jax_result), rtol=2e-5, atol=2e-5)
    assert_same(loaded(*args), got)  # a second call (buffers reused) gives the same


def test_softmax_relu_artifact_is_small(saved) -> None:
    path = saved["softmax_relu"][0]
    assert path.stat().st_size < 100_000
    assert xfuse.aot.inspect(path).count("k_fusion") >= 1


def test_artifact_runs_where_jax_and_numba_cannot_be_imported(saved, tmp_path) -> None:
    path, args, jit_result, _ = saved["tree"]
    params, x = args
    np.savez(tmp_path / "in.npz", x=x, **params)
    code = BLOCKER + textwrap.dedent(f"""
        import sys
        import numpy as np
        import xfuse.aot
        f = xfuse.aot.load({str(path)!r})
        d = dict(np.load({str(tmp_path / 'in.npz')!r}))
        x = d.pop("x")
        out = f(d, x)
        np.savez({str(tmp_path / 'out.npz')!r}, **out)
        blocked = [m for m in ("jax", "jaxlib", "numba", "llvmlite") if m in sys.modules]
        print("imported:", blocked)
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "imported: []" in done.stdout
    with np.load(tmp_path / "out.npz") as out:
        assert_same({k: out[k] for k in out}, jit_result)


def test_loading_and_calling_imports_nothing_heavy_beyond_numpy(saved) -> None:
    """Start-up beyond numpy is import, load and first call: the modules the loader brings in
    are those it needs (json, the runtime), not the stdlib's slower ones (each a millisecond
    or more to import or, for dataclasses, to use)."""
    path, args, _, _ = saved["softmax_relu"]
    heavy = ("dataclasses", "queue", "concurrent", "asyncio", "tempfile", "subprocess", "pathlib",
             "typing", "inspect", "hashlib", "jax", "jaxlib", "numba", "llvmlite")
    code = BLOCKER + textwrap.dedent(f"""
        import sys
        import numpy as np
        before = set(sys.modules)
        args = [np.zeros(s, np.float32) for s in {[a.shape for a in args]!r}]
        import xfuse.aot
        xfuse.aot.load({str(path)!r})(*args)
        print("new:", " ".join(sorted(set(sys.modules) - before)))
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    new = done.stdout.split("new:", 1)[1].split()
    assert "xfuse.runtime.artifact" in new
    assert [m for m in new if m.split(".")[0] in heavy] == []


def test_cli_compile_run_inspect(tmp_path) -> None:
    (tmp_path / "model.py").write_text("import jax\n\ndef mlp(x, w, b):\n"
                                       "    return jax.nn.softmax(jax.nn.relu(x @ w + b), axis=-1)\n")
    out = tmp_path / "mlp.xfa"
    cli = [sys.executable, "-m", "xfuse", "aot"]
    made = subprocess.run([*cli, "compile", f"{tmp_path / 'model.py'}:mlp", "--arg", "f32[8,16]",
                           "--arg", "f32[16,32]", "--arg", "f32[32]", "-o", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert made.returncode == 0, made.stderr
    x, w, b = f32(8, 16), f32(16, 32), f32(32)
    np.savez(tmp_path / "in.npz", x=x, w=w, b=b)
    ran = subprocess.run([*cli, "run", str(out), str(tmp_path / "in.npz"), "-o", str(tmp_path / "out.npz")],
                         capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stderr
    with np.load(tmp_path / "out.npz") as result:
        np.testing.assert_allclose(result["arr_0"], softmax_relu(x, w, b), rtol=2e-5, atol=1e-6)
    shown = subprocess.run([*cli, "inspect", str(out)], capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    for words in ("mlp(x: float32[8, 16], w: float32[16, 32], b: float32[32])", "kernels    1",
                  "output fusion", "needs", "buffers", "xfuse "):
        assert words in shown.stdout
    bad = subprocess.run([*cli, "compile", f"{tmp_path / 'model.py'}:mlp", "--arg", "f33[8]", "-o", str(out)],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "unknown dtype 'f33'" in bad.stderr
    foreign = subprocess.run([*cli, "run", str(tmp_path / "in.npz"), str(tmp_path / "in.npz"), "-o",
                              str(tmp_path / "o.npz")], capture_output=True, text=True, timeout=60)
    assert foreign.returncode == 2 and "not an xfuse artifact" in foreign.stderr


def test_cli_emit_c_writes_a_library_and_header_a_caller_can_use(tmp_path) -> None:
    """`xfuse aot compile ... --emit-c DIR` (tfcompile's C interface): the header declares the
    entry, and a process with numpy alone calls the library's entry through ctypes."""
    (tmp_path / "model.py").write_text("import jax\n\ndef mlp(x, w, b):\n"
                                       "    return jax.nn.softmax(jax.nn.relu(x @ w + b), axis=-1)\n")
    made = subprocess.run([sys.executable, "-m", "xfuse", "aot", "compile", f"{tmp_path / 'model.py'}:mlp",
                           "--arg", "f32[8,16]", "--arg", "f32[16,32]", "--arg", "f32[32]",
                           "--emit-c", str(tmp_path / "c"), "--name", "mlp"],
                          capture_output=True, text=True, timeout=300)
    assert made.returncode == 0, made.stderr
    header, library = tmp_path / "c" / "mlp.h", next((tmp_path / "c").glob("*mlp*.so"))
    assert "mlp_run(" in header.read_text()
    x, w, b = f32(8, 16), f32(16, 32), f32(32)
    np.savez(tmp_path / "in.npz", x=x, w=w, b=b)
    code = BLOCKER + textwrap.dedent(f"""
        import ctypes
        import numpy as np
        d = np.load({str(tmp_path / 'in.npz')!r})
        args = [np.ascontiguousarray(d[k]) for k in ("x", "w", "b")]
        out = np.full((8, 32), np.nan, np.float32)
        run = ctypes.CDLL({str(library)!r}).mlp_run
        run.restype = ctypes.c_int
        status = run((ctypes.c_void_p * 3)(*[a.ctypes.data for a in args]),
                     (ctypes.c_void_p * 1)(out.ctypes.data))
        np.save({str(tmp_path / 'out.npy')!r}, out)
        print("status", status)
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "status 0" in done.stdout
    np.testing.assert_allclose(np.load(tmp_path / "out.npy"), softmax_relu(x, w, b), rtol=2e-5, atol=1e-6)


# ---------------------------------------------------------------------------- damage
def repack(path: Path, change) -> bytes:
    """The artifact at `path` with its manifest changed by `change`, checksum made valid."""
    manifest, blobs = artifact.read(path)
    change(manifest)
    spans = manifest.pop("blobs")
    parts = {k: bytes(blobs[a : a + n]) for k, (a, n) in spans.items()}
    return artifact.pack(manifest, parts)


def test_damaged_and_foreign_files_give_clear_errors(saved, tmp_path) -> None:
    path, args, _, _ = saved["softmax_relu"]
    data = path.read_bytes()
    cases = {
        "truncated": (data[: len(data) // 2], "truncated|corrupted"),
        "header only": (data[:30], "truncated"),
        "empty": (b"", "truncated|not an xfuse artifact"),
        "flipped byte": (data[:-100] + bytes([data[-100] ^ 0x40]) + data[-99:], "corrupted"),
        "foreign": (b"\x89PNG\r\n\x1a\n" + bytes(200), "not an xfuse artifact"),
        "newer format": (data[:8] + struct.pack("<I", artifact.FORMAT + 1) + data[12:], "newer"),
    }
    for label, (content, message) in cases.items():
        bad = tmp_path / f"{label.replace(' ', '_')}.xfa"
        bad.write_bytes(content)
        with pytest.raises(ArtifactError, match=message) as info:
            xfuse.aot.load(bad)
        assert str(bad) in str(info.value), label
    with pytest.raises(ArtifactError, match="cannot read"):
        xfuse.aot.load(tmp_path / "missing.xfa")


def test_a_cpu_without_the_features_or_another_machine_is_refused(saved, tmp_path) -> None:
    path = saved["softmax_relu"][0]
    lacking = sorted({"AVX512FP16", "AVX512BF16", "SVE", "RVV"} - artifact.cpu_features())[0]
    bad = tmp_path / "features.xfa"
    bad.write_bytes(repack(path, lambda m: m["target"]["features"].append(lacking)))
    with pytest.raises(ArtifactError, match=f"CPU features this CPU lacks: {lacking}"):
        xfuse.aot.load(bad)
    other = tmp_path / "machine.xfa"
    other.write_bytes(repack(path, lambda m: m["target"].update(machine="sparc64")))
    with pytest.raises(ArtifactError, match="built for .*/sparc64"):
        xfuse.aot.load(other)


def test_features_an_older_numpy_does_not_know_are_read_from_the_kernel(saved, monkeypatch) -> None:
    """numpy 2.0 knows no BMI, BMI2, LZCNT or MOVBE: a loader with it must not refuse a CPU
    that has them (it did), nor accept one that lacks them where /proc/cpuinfo can tell."""
    newer = {"BMI", "BMI2", "LZCNT", "MOVBE"}
    as_numpy_2_0 = {k: v for k, v in artifact._numpy_features().items() if k not in newer}
    monkeypatch.setattr(artifact, "_numpy_features", lambda: as_numpy_2_0)
    path, args, jit_result, _ = saved["softmax_relu"]
    assert_same(xfuse.aot.load(path)(*args), jit_result)  # built for this CPU: it has them all

    monkeypatch.setattr(artifact, "_numpy_features", lambda: {"AVX2": True, "FMA3": False})
    monkeypatch.setattr(artifact, "_cpuinfo_flags", lambda: {"avx2", "bmi1", "bmi2", "movbe"})
    assert artifact.missing_features(["AVX2", "BMI", "BMI2", "MOVBE"]) == []
    assert artifact.missing_features(["AVX2", "FMA3", "LZCNT", "AVX512FP16"]) == ["AVX512FP16", "FMA3", "LZCNT"]
    monkeypatch.setattr(artifact, "_cpuinfo_flags", lambda: None)  # nothing to ask: numpy decides
    assert artifact.missing_features(["FMA3", "LZCNT"]) == ["FMA3"]


def test_a_program_naming_a_missing_kernel_is_an_error_not_a_crash(saved, tmp_path) -> None:
    path = saved["softmax_relu"][0]

    def rename(manifest):
        manifest["program"]["steps"][0]["kernel"] = "k_nothing_here"

    bad = tmp_path / "renamed.xfa"
    bad.write_bytes(repack(path, rename))
    with pytest.raises(KeyError, match="k_nothing_here"):
        xfuse.aot.load(bad)


def test_arguments_are_checked_as_compiled_checks_them(saved) -> None:
    path, args, _, _ = saved["softmax_relu"]
    loaded = xfuse.aot.load(path)
    x, w, b = args
    with pytest.raises(TypeError, match="takes 3 array arguments, got 2"):
        loaded(x, w)
    with pytest.raises(TypeError, match=r"argument w should be float32\[512, 1024\], got float32\[512, 1000\]"):
        loaded(x, w[:, :1000], b)
    with pytest.raises(TypeError, match=r"argument b should be float32\[1024\], got int32\[1024\]"):
        loaded(x, w, b.astype(np.int32))
    tree_path, (params, tx), _, _ = saved["tree"]
    tree = xfuse.aot.load(tree_path)
    with pytest.raises(TypeError, match=r"params should be a dict with keys \['b', 'ids', 'w'\]"):
        tree({"w": params["w"]}, tx)
    # a non-contiguous and a float64 argument are accepted as Compiled accepts them (x64 off)
    wide = {k: (v.astype(np.float64) if v.dtype == np.float32 else v) for k, v in params.items()}
    assert_same(tree(wide, np.asfortranarray(tx)), tree(params, tx))


def test_a_call_of_the_exact_signature_takes_the_guarded_function(saved) -> None:
    """Positional plain ndarrays of the signature go through one generated function (guard,
    buffer, kernels), the loaded artifact's own `__call__`; anything else (an ndarray subclass,
    a float64 array) takes the checked path, with the same result."""
    import sys as _sys

    class Sub(np.ndarray):
        pass

    for name in ("chain", "softmax_relu"):
        path, args, jit_result, _ = saved[name]
        loaded = xfuse.aot.load(path)
        loaded(*args)
        files = []
        _sys.setprofile(lambda frame, event, arg: files.append(frame.f_code.co_filename) if event == "call" else None)
        try:
            got = loaded(*args)
        finally:
            _sys.setprofile(None)
        assert "<xfuse fast path>" in files, files
        # one frame: the artifact's class of its own has the guarded call as its __call__
        assert files[0] == "<xfuse fast path>" and type(loaded).call_class_of is artifact.Loaded, files
        assert_same(got, jit_result)
        assert_same(loaded(*(a.view(Sub) for a in args)), jit_result)
        assert_same(loaded(*(a.astype(np.float64) for a in args)), jit_result, rtol=2e-5, atol=2e-5)


def test_manifest_records_signature_target_and_plan(saved) -> None:
    manifest, _ = artifact.read(saved["softmax_relu"][0])
    assert manifest["signature"]["args"] == [[[64, 512], "float32", False], [[512, 1024], "float32", False],
                                             [[1024], "float32", False]]
    assert manifest["target"]["cpu"] == "native" and manifest["xfuse"] == xfuse.__version__
    assert manifest["plan"]["output_bytes"] == 64 * 1024 * 4
    json.dumps(manifest)  # plain data throughout


def test_call_async_on_an_artifact(saved) -> None:
    path, args, jit_result, _ = saved["layer_norm"]
    assert_same(xfuse.aot.load(path).call_async(*args).result(timeout=60), jit_result)


def test_aot_compile_with_shape_specs_and_an_older_target(tmp_path) -> None:
    specs = (jax.ShapeDtypeStruct((32, 64), np.float32),)
    path = xfuse.aot.compile(layer_norm, *specs, path=tmp_path / "ln.xfa", target="x86-64-v2")
    manifest, _ = artifact.read(path)
    assert "AVX2" not in manifest["target"]["features"]
    x = f32(32, 64)
    np.testing.assert_allclose(xfuse.aot.load(path)(x), jax.jit(layer_norm)(x), rtol=2e-5, atol=2e-5)
    with pytest.raises(ValueError, match="target='pentium' is not known"):
        xfuse.aot.compile(layer_norm, *specs, path=tmp_path / "x.xfa", target="pentium")
