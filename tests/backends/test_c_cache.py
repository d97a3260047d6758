"""The C backend's library cache: an entry whose library is missing, truncated or altered, or
whose index is unreadable, gives a CacheWarning and is built again (never loaded); a failed
build leaves nothing behind; an unusable cache folder builds privately; two processes
compiling the same function and saving its artifact to one path at once both succeed."""

from __future__ import annotations

import ctypes
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

import xfuse
from xfuse.backends import CacheWarning
from xfuse.backends.c.backend import build_library
from xfuse.backends.c.toolchain import CompilerError

SOURCE = '__attribute__((visibility("default"))) int xf_cache_probe(int a) { return a * 3 + %d; }\n'


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("XFUSE_CACHE_DIR", str(tmp_path))
    return tmp_path


def entry_of(cache: Path) -> tuple[Path, Path]:
    """(index, library) of the one entry in the cache."""
    (index,) = (cache / "c").glob("*.entry")
    return index, cache / "c" / index.read_text()


def replace(path: Path, data: bytes) -> None:
    """New contents under the same name, as a new file (a loaded library's pages stay as they
    were: writing into its file in place could crash this process)."""
    tmp = path.with_name(path.name + ".new")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def build_quietly(source: str) -> Path:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return build_library(source)


def probe(path: Path, k: int) -> int:
    return ctypes.CDLL(str(path)).xf_cache_probe(k)


def test_a_second_build_loads_the_entry(cache):
    first = build_quietly(SOURCE % 1)
    index, library = entry_of(cache)
    assert first == library and index.name.split(".")[0] in library.name
    assert build_quietly(SOURCE % 1) == first
    assert probe(first, 5) == 16


def flipped(data: bytes) -> bytes:
    middle = len(data) // 2
    return data[:middle] + bytes([data[middle] ^ 0x5A]) + data[middle + 1 :]


DAMAGE = {
    "truncated": lambda index, library: replace(library, library.read_bytes()[: library.stat().st_size // 2]),
    "empty": lambda index, library: replace(library, b""),
    "a flipped byte": lambda index, library: replace(library, flipped(library.read_bytes())),
    "missing": lambda index, library: library.unlink(),
    "an index of garbage": lambda index, library: replace(index, b"\xff\x00not a name"),
    "an index naming another file": lambda index, library: replace(index, b"../../etc/passwd"),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_entry_warns_and_is_built_again(cache, damage):
    source = SOURCE % (len(damage) + 10)
    build_quietly(source)
    index, library = entry_of(cache)
    DAMAGE[damage](index, library)
    with pytest.warns(CacheWarning, match=f"{re.escape(str(index))}: .*; building it again"):
        rebuilt = build_library(source)
    assert probe(rebuilt, 1) == len(damage) + 13
    assert build_quietly(source) == rebuilt  # healed: the next build loads it
    assert not [p for p in (cache / "c").iterdir() if ".tmp" in p.name]


def test_a_damaged_entry_of_a_jitted_function_warns_and_runs_right(cache):
    def f(x):
        return jnp.tanh(x) * 1.625 + 0.5

    x = np.linspace(-2, 2, 300, dtype=np.float32)
    want = np.tanh(x) * 1.625 + 0.5
    np.testing.assert_allclose(xfuse.jit(f, backend="c")(x), want, rtol=2e-6, atol=2e-6)
    library = entry_of(cache)[1]
    replace(library, library.read_bytes()[:1000])
    with pytest.warns(CacheWarning, match="truncated or altered"):
        got = xfuse.jit(f, backend="c")(x)
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=2e-6)


def test_a_failed_build_leaves_nothing_in_the_cache(cache):
    with pytest.raises(CompilerError, match="rejected") as info:
        build_library("this is not C;\n")
    kept = re.search(r"kept at (\S+)\)", str(info.value))
    if kept:
        shutil.rmtree(Path(kept[1]).parent, ignore_errors=True)
    assert [p for p in cache.rglob("*") if p.is_file()] == []


def test_an_unusable_cache_folder_builds_privately(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("XFUSE_CACHE_DIR", str(blocker / "cache"))
    path = build_quietly(SOURCE % 7)
    assert not path.is_relative_to(tmp_path) and probe(path, 2) == 13


TWO = textwrap.dedent("""
    import json, sys, warnings
    import numpy as np
    import jax.numpy as jnp
    import xfuse

    def f(x, y):
        return jnp.tanh(x) * 2.25 + jnp.exp(-y), jnp.sum(x * y, axis=1)

    x = np.linspace(-3, 3, 64 * 40, dtype=np.float32).reshape(64, 40)
    y = np.cos(x)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        compiled = xfuse.jit(f, backend="c").lower(x, y).compile()
        a, s = compiled(x, y)
        compiled.save(sys.argv[1])
        la, ls = xfuse.aot.load(sys.argv[1])(x, y)
    print("RESULT " + json.dumps({"warnings": [f"{w.category.__name__}: {w.message}" for w in caught],
                                  "same": bool((a == la).all() and (s == ls).all()),
                                  "a": a.tolist(), "s": s.tolist()}))
""")


def test_two_processes_building_and_saving_one_function_at_once_both_succeed(tmp_path):
    env = dict(os.environ, XFUSE_CACHE_DIR=str(tmp_path / "cache"))
    artifact = tmp_path / "shared.xfa"
    procs = [subprocess.Popen([sys.executable, "-c", TWO, str(artifact)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env) for _ in range(2)]
    x = np.linspace(-3, 3, 64 * 40, dtype=np.float32).reshape(64, 40)
    y = np.cos(x)
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-3000:]
        result = json.loads(next(l for l in out.splitlines() if l.startswith("RESULT "))[7:])
        assert result["warnings"] == [] and result["same"], result["warnings"]
        np.testing.assert_allclose(result["a"], np.tanh(x) * 2.25 + np.exp(-y), rtol=2e-6, atol=2e-6)
        np.testing.assert_allclose(result["s"], (x * y).sum(1), rtol=1e-5, atol=1e-4)
    folder = tmp_path / "cache" / "c"
    assert not [p for p in folder.iterdir() if ".tmp" in p.name]
    for index in folder.glob("*.entry"):  # each names a whole library
        assert (folder / index.read_text()).is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache", "shared.xfa"]
    a, _ = xfuse.aot.load(artifact)(x, y)
    np.testing.assert_allclose(a, np.tanh(x) * 2.25 + np.exp(-y), rtol=2e-6, atol=2e-6)
