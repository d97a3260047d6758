"""The on-disk kernel cache, across real processes: a second process loads instead of compiling;
truncated, altered or foreign entries give a CacheWarning and a recompile with right results;
the cache can be turned off or pointed at an unusable place; two processes compiling the same
kernels at once both succeed; kernels of one text with other constants do not share an entry;
numba's own cache files of xfuse's numba functions, damaged, give a CacheWarning and a
recompile too, and a save of theirs that fails a warning."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

SCRIPT = textwrap.dedent("""
    import json, sys, warnings
    import numpy as np
    import jax.numpy as jnp
    import xfuse
    from xfuse.backends.numba import cache

    def f(x, y):
        return jnp.tanh(x) * 2.0 + jnp.exp(-y), jnp.sum(x * y, axis=1)

    x = np.linspace(-3, 3, 64 * 48, dtype=np.float32).reshape(64, 48)
    y = np.cos(x)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        a, s = xfuse.jit(f)(x, y)
    print("RESULT " + json.dumps({
        "hits": cache.stats.hits, "misses": cache.stats.misses, "rejected": cache.stats.rejected,
        "warnings": [f"{w.category.__name__}: {w.message}" for w in caught],
        "a": np.asarray(a).tolist(), "s": np.asarray(s).tolist(),
    }))
""")


def run(cache_dir, *, check=True) -> dict:
    env = dict(os.environ, XFUSE_CACHE_DIR=str(cache_dir))
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                          env=env, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(l for l in done.stdout.splitlines() if l.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


def expected():
    x = np.linspace(-3, 3, 64 * 48, dtype=np.float32).reshape(64, 48)
    y = np.cos(x)
    return np.tanh(x) * 2 + np.exp(-y), (x.astype(np.float64) * y).sum(axis=1)


def assert_right(result):
    a, s = expected()
    np.testing.assert_allclose(np.array(result["a"], np.float32), a, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(np.array(result["s"]), s, rtol=1e-5, atol=1e-4)


def entries(cache_dir: Path) -> list[Path]:
    return sorted(p.parent for p in cache_dir.glob("kernels/*/*/manifest.json"))


@pytest.fixture(scope="module")
def warm(tmp_path_factory):
    """A cache filled by one process, and that process's result."""
    cache_dir = tmp_path_factory.mktemp("cache")
    return cache_dir, run(cache_dir)


def copy_of(cache_dir: Path, tmp_path: Path) -> Path:
    import shutil

    target = tmp_path / "cache"
    shutil.copytree(cache_dir, target)
    return target


def test_first_process_compiles_and_stores(warm):
    cache_dir, first = warm
    assert first["misses"] >= 1 and first["hits"] == 0 and first["rejected"] == 0
    assert first["warnings"] == []
    assert len(entries(cache_dir)) == first["misses"]
    for entry in entries(cache_dir):
        manifest = json.loads((entry / "manifest.json").read_text())
        assert any(name.endswith(".nbc") for name in manifest["files"]), manifest
    assert_right(first)


def test_second_process_loads_instead_of_compiling(warm):
    cache_dir, first = warm
    second = run(cache_dir)
    assert second["hits"] == first["misses"] and second["misses"] == 0, second
    assert second["warnings"] == []
    assert second["a"] == first["a"] and second["s"] == first["s"]


@pytest.mark.parametrize("damage", ["truncate_code", "empty_index", "flip_a_byte", "garbage_manifest",
                                    "other_kernel_text", "drop_manifest_entry"])
def test_a_damaged_entry_warns_and_recompiles(warm, tmp_path, damage):
    cache_dir = copy_of(warm[0], tmp_path)
    entry = entries(cache_dir)[0]
    code = next((entry / "__pycache__").glob("*.nbc"))
    if damage == "truncate_code":
        code.write_bytes(code.read_bytes()[: code.stat().st_size // 2])
    elif damage == "empty_index":
        next((entry / "__pycache__").glob("*.nbi")).write_bytes(b"")
    elif damage == "flip_a_byte":
        data = bytearray(code.read_bytes())
        data[len(data) // 2] ^= 0xFF
        code.write_bytes(bytes(data))
    elif damage == "garbage_manifest":
        (entry / "manifest.json").write_bytes(b"\x00{not json")
    elif damage == "other_kernel_text":
        (entry / "kernel.py").write_text("def k(): pass\n")
    elif damage == "drop_manifest_entry":
        manifest = json.loads((entry / "manifest.json").read_text())
        manifest["files"].pop(code.relative_to(entry).as_posix())
        (entry / "manifest.json").write_text(json.dumps(manifest))
    again = run(cache_dir)
    assert again["rejected"] == 1 and again["misses"] == 1, again
    assert any("CacheWarning" in w and "compiling" in w for w in again["warnings"]), again["warnings"]
    assert_right(again)
    healed = run(cache_dir)
    assert healed["misses"] == 0 and healed["rejected"] == 0 and healed["warnings"] == []


def test_a_process_killed_before_its_manifest_is_not_trusted(warm, tmp_path):
    """numba's files without a manifest: maybe half a story; compiled again, quietly."""
    cache_dir = copy_of(warm[0], tmp_path)
    for entry in entries(cache_dir):
        (entry / "manifest.json").unlink()
    again = run(cache_dir)
    assert again["hits"] == 0 and again["misses"] == warm[1]["misses"] and again["warnings"] == []
    assert_right(again)


def test_cache_off_writes_nothing(tmp_path):
    result = run("off")
    assert result["hits"] == result["misses"] == 0
    assert_right(result)


def test_an_unusable_cache_directory_warns_and_still_runs(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    result = run(blocker / "cache")
    assert result["hits"] == result["misses"] == 0
    assert any("CacheWarning" in w and "without caching" in w for w in result["warnings"])
    assert_right(result)


def test_two_processes_filling_one_cache_at_once_both_succeed(tmp_path):
    env = dict(os.environ, XFUSE_CACHE_DIR=str(tmp_path))
    procs = [subprocess.Popen([sys.executable, "-c", SCRIPT], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env) for _ in range(2)]
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-3000:]
        result = json.loads(next(l for l in out.splitlines() if l.startswith("RESULT "))[7:])
        assert_right(result)
        assert result["rejected"] == 0
    after = run(tmp_path)
    assert after["misses"] == 0 and after["rejected"] == 0, after


def test_a_save_that_fails_warns_and_the_call_still_runs(tmp_path):
    """numba saves inside the compile; here every save fails as it does when another process
    clears the entry meanwhile (FileNotFoundError from numba's rename): the call warns and
    runs uncached, and the next process compiles and stores as if nothing had been there."""
    lost = textwrap.dedent("""
        import numba.core.caching as caching

        def lost(self, name, data):
            raise FileNotFoundError(2, "No such file or directory", str(name))

        caching.IndexDataCacheFile._save_data = lost
    """)
    env = dict(os.environ, XFUSE_CACHE_DIR=str(tmp_path))
    done = subprocess.run([sys.executable, "-c", lost + SCRIPT], capture_output=True, text=True,
                          env=env, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(next(l for l in done.stdout.splitlines() if l.startswith("RESULT "))[7:])
    assert_right(result)
    assert any("CacheWarning" in w and "cannot save" in w and "uncached" in w
               for w in result["warnings"]), result["warnings"]
    assert not list(tmp_path.rglob("manifest.json"))  # nothing vouched for
    after = run(tmp_path)
    assert_right(after)
    assert after["misses"] >= 1 and after["rejected"] == 0 and after["warnings"] == [], after
    assert run(tmp_path)["misses"] == 0


LAYOUTS = textwrap.dedent("""
    import json, warnings
    import numpy as np
    import jax.numpy as jnp
    import xfuse
    from xfuse.backends.numba import cache

    f = xfuse.jit(lambda x: jnp.sin(x) * 2.0)
    x = np.linspace(-3, 3, 12, dtype=np.float32).reshape(3, 4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        results = [f(x), f(np.asfortranarray(x)), f(np.repeat(x, 2, axis=1)[:, ::2])]
    for r in results:
        np.testing.assert_allclose(r, np.sin(x) * 2, rtol=1e-6, atol=1e-6)
    print("RESULT " + json.dumps({"hits": cache.stats.hits, "misses": cache.stats.misses,
                                  "rejected": cache.stats.rejected,
                                  "warnings": [str(w.message) for w in caught]}))
""")


def test_overloads_for_other_layouts_are_recorded_for_the_next_process(tmp_path):
    """A cached kernel called with Fortran-ordered and strided arrays gets more numba overloads
    in its entry; the manifest records them at exit, so the next process loads the entry
    instead of rejecting it."""
    env = dict(os.environ, XFUSE_CACHE_DIR=str(tmp_path))
    outcomes = []
    for _ in range(2):
        done = subprocess.run([sys.executable, "-c", LAYOUTS], capture_output=True, text=True,
                              env=env, timeout=300, check=False)
        assert done.returncode == 0, done.stderr[-3000:]
        line = next(l for l in done.stdout.splitlines() if l.startswith("RESULT "))
        outcomes.append(json.loads(line[len("RESULT "):]))
    first, second = outcomes
    assert (first["misses"], first["rejected"]) == (1, 0)
    assert (second["hits"], second["misses"], second["rejected"], second["warnings"]) == (1, 0, 0, [])


CONSTANT_IN_A_FUSION = """
HloModule constant_in_a_fusion

fused (p0: f32[3]) -> f32[3] {{
  p0 = f32[3] parameter(0)
  constant.0 = f32[3] constant({{1, 2, {last}}})
  ROOT add.1 = f32[3] add(p0, constant.0)
}}

ENTRY main (x: f32[3]) -> f32[3] {{
  x = f32[3] parameter(0)
  ROOT fusion.0 = f32[3] fusion(x), kind=loop, calls=fused
}}
"""


def test_kernels_of_one_text_with_other_constants_get_entries_of_their_own(tmp_path, monkeypatch):
    """A constant inside a fusion is a global array, which numba compiles into the kernel's
    code: keyed by the text alone, the second module loaded the first one's entry and added
    the first one's constant (in this process and every later one)."""
    from xfuse.backends.numba import compile_module
    from xfuse.hlo import parse

    monkeypatch.setenv("XFUSE_CACHE_DIR", str(tmp_path))
    x = np.zeros(3, np.float32)
    for last in (3, 4, 3):
        got = compile_module(parse(CONSTANT_IN_A_FUSION.format(last=last)))([x])[0]
        np.testing.assert_array_equal(got, [1, 2, last])
    assert len(entries(tmp_path)) == 2


def test_the_drivers_helpers_are_in_the_cache_key(monkeypatch, tmp_path):
    # a native loop's driver compiles small_matmul_t and put_window in: a changed helper must
    # not load a driver cached with the old one
    from xfuse.backends.numba import cache as kernel_cache

    before = kernel_cache.environment_key()
    here = tmp_path / "numba"
    for name in kernel_cache._KEYED_SOURCES:
        (here / name).parent.mkdir(parents=True, exist_ok=True)
        (here / name).write_bytes((kernel_cache._HERE / name).read_bytes())
    (here / "loop_kernels.py").write_bytes((here / "loop_kernels.py").read_bytes() + b"\n# changed\n")
    monkeypatch.setattr(kernel_cache, "_HERE", here)
    monkeypatch.setattr(kernel_cache, "_environment_key", None)
    assert kernel_cache.environment_key() != before


def test_the_vector_width_is_in_the_cache_key(monkeypatch):
    # kernels compiled to prefer 512-bit vectors must not load where 256 bits are asked for
    from xfuse.backends.numba import cache as kernel_cache
    from xfuse.backends.numba import pipeline

    keys = set()
    for width in (None, 512):
        monkeypatch.setattr(pipeline, "VECTOR_WIDTH", width)
        monkeypatch.setattr(kernel_cache, "_environment_key", None)
        keys.add(kernel_cache.environment_key())
    assert len(keys) == 2


OWN = textwrap.dedent("""
    import json, warnings
    import numpy as np
    from xfuse.backends.numba import split_gemm
    from xfuse.runtime import parallel

    parallel.set_num_threads(2)
    split_gemm.vectors_enabled = lambda: True  # the vector split, through the hand-off, on any CPU
    a = np.linspace(-1, 1, 512, dtype=np.float32)[None]
    b = np.cos(np.arange(512 * 1024, dtype=np.float32)).reshape(512, 1024)
    out = np.empty((1, 1024), np.float32)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        taken = split_gemm.vector_f32(a, b, out)
    print("RESULT " + json.dumps({
        "taken": taken, "error": float(np.abs(out - a.astype(np.float64) @ b).max()),
        "warnings": [f"{w.category.__name__}: {w.message}" for w in caught]}))
""")


def test_a_damaged_numba_cache_of_xfuses_own_functions_warns_and_recompiles(tmp_path):
    """The hand-off's and split_gemm's numba functions keep numba's own cache files (under
    NUMBA_CACHE_DIR here): numba raised from inside every call on a truncated one."""

    def own() -> dict:
        env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "numba"), XFUSE_CACHE_DIR=str(tmp_path / "xfuse"))
        done = subprocess.run([sys.executable, "-c", OWN], capture_output=True, text=True, env=env, timeout=300,
                              check=False)
        assert done.returncode == 0, done.stderr[-3000:]
        result = json.loads(next(l for l in done.stdout.splitlines() if l.startswith("RESULT "))[7:])
        assert result["taken"] and result["error"] < 1e-3, result
        return result

    assert own()["warnings"] == []
    (code,) = (tmp_path / "numba").rglob("split_gemm.sgemv_part-*.nbc")
    code.write_bytes(code.read_bytes()[:50])
    (index,) = (tmp_path / "numba").rglob("handoff._split-*.nbi")
    index.write_bytes(b"")
    damaged = own()["warnings"]
    assert any("CacheWarning" in w and "sgemv_part" in w and "compiling it again" in w for w in damaged), damaged
    assert any("CacheWarning" in w and "_split" in w for w in damaged), damaged
    assert own()["warnings"] == []  # saved again


def test_a_guarded_function_whose_save_fails_warns_and_runs(tmp_path, monkeypatch):
    from xfuse.backends import CacheWarning
    from xfuse.backends.numba.cache import guarded

    (tmp_path / "xfuse_guarded_probe.py").write_text("import numba\n\n\n@numba.njit(cache=True)\n"
                                                     "def twice(x):\n    return 2 * x\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import xfuse_guarded_probe

    fn = xfuse_guarded_probe.twice

    def full(name, data):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(fn._cache._cache_file, "save", full)
    guarded(fn)
    with pytest.warns(CacheWarning, match="twice cannot be saved.*uncached"):
        assert fn(21) == 42
