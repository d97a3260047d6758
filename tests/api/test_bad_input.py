"""Bad input, each error named: wrong arguments (count, shape, dtype, pytree structure, leaf
type) to a jitted function after its first compile (fast and slow path), to a `Compiled` and
to a loaded AOT artifact give a TypeError naming the argument; unsupported primitives name
themselves and the user's line; bad options and CLI flags give a ValueError naming the option.
None leaves a cache entry behind, in memory or on disk, and none takes the process down."""

from __future__ import annotations

import inspect
import json
import os
import re
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import xfuse
from xfuse.aot import cli as aot_cli
from xfuse.frontend import UnsupportedPrimitiveError

RNG = np.random.default_rng(11)


def f32(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def affine(x, w, b):
    return jnp.tanh(x @ w + b)


def model(params, x):
    return {"h": jnp.tanh(x @ params["w"] + params["b"]), "n": jnp.sum(x)}


X, W, B = f32(4, 8), f32(8, 3), f32(3)
PARAMS = {"w": W, "b": B}


def assert_tree_close(got, want) -> None:
    got_leaves, got_tree = jax.tree_util.tree_flatten(got)
    want_leaves, want_tree = jax.tree_util.tree_flatten(want)
    assert got_tree == want_tree
    for g, w in zip(got_leaves, want_leaves):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=2e-5, atol=2e-6)


@pytest.fixture(scope="module")
def callables(tmp_path_factory) -> dict:
    """kind -> (affine, model): jitted (each compiled once), Compiled, and loaded artifacts."""
    folder = tmp_path_factory.mktemp("bad-input")
    jitted = xfuse.jit(affine), xfuse.jit(model)
    jitted[0](X, W, B)
    jitted[1](PARAMS, X)
    compiled = jitted[0].lower(X, W, B).compile(), jitted[1].lower(PARAMS, X).compile()
    loaded = tuple(xfuse.aot.load(c.save(folder / f"{c.module.name}.xfa")) for c in compiled)
    return {"jitted": jitted, "compiled": compiled, "loaded": loaded}


class Masked(np.ndarray):
    """An ndarray subclass: not a plain numpy array, so never taken by a fast path as one."""


TINY = np.zeros(1, np.float32).view(Masked)

# case -> (arguments, {kind: the TypeError's message}); a kind left out takes the call (a new
# signature for a jitted function, as for jax.jit) or fails inside the user's code.
AFFINE_CASES = {
    "too few": ((X, W), {
        "jitted": "missing 1 required positional argument: 'b'",
        "compiled": r"takes 3 array arguments \(x, w, b\), got 2",
        "loaded": r"takes 3 array arguments, got 2 \(its arguments: x, w, b\)"}),
    "too many": ((X, W, B, B), {
        "jitted": "takes 3 positional arguments but 4 were given",
        "compiled": r"takes 3 array arguments \(x, w, b\), got 4",
        "loaded": r"takes 3 array arguments, got 4"}),
    # Three plain arrays of the right types and a subclass among them: a fast path counting
    # only the plain ones ran the kernels on the wrong buffers (a crash, before it counted all).
    "a subclass among matching arrays": ((X, TINY, W, B), {
        "jitted": "takes 3 positional arguments but 4 were given",
        "compiled": r"takes 3 array arguments \(x, w, b\), got 4",
        "loaded": r"takes 3 array arguments, got 4"}),
    "shape": ((X, W[:, :2], B), {
        "compiled": r"argument w should be f32\[8,3\], got f32\[8,2\]",
        "loaded": r"argument w should be float32\[8, 3\], got float32\[8, 2\]"}),
    "dtype": ((X, W.astype(np.int32), B), {
        "compiled": r"argument w should be f32\[8,3\], got s32\[8,3\]",
        "loaded": r"argument w should be float32\[8, 3\], got int32\[8, 3\]"}),
    "None for an array": ((X, W, None), {
        "compiled": "argument b should be an array, got None",
        "loaded": "argument b: NoneType is not an array"}),
    "a tuple for an array": ((X, (W,), B), {
        "compiled": r"argument w should be an array, got \(\*,\)",
        "loaded": r"argument w should be float32\[8, 3\], got float32\[1, 8, 3\]"}),
    "str": ((X, W, "text"), {
        "jitted": "argument b: str is not an array",
        "compiled": "argument b: str is not an array",
        "loaded": r"argument b should be float32\[3\], got str"}),
    "object": ((X, W, object()), {kind: "argument b: object is not an array"
                                  for kind in ("jitted", "compiled", "loaded")}),
    "complex": ((X, W, 1j), {
        "jitted": "argument b: complex numbers are not supported",
        "compiled": "argument b: complex numbers are not supported",
        "loaded": r"argument b should be float32\[3\], got complex128\[\]"}),
}

MODEL_CASES = {
    "a missing key": (({"w": W}, X), {
        "compiled": r"argument params should be \{'b': \*, 'w': \*\}, got \{'w': \*\}",
        "loaded": r"argument params should be a dict with keys \['b', 'w'\], got \['w'\]"}),
    "an extra key": (({"w": W, "b": B, "c": B}, X), {
        "compiled": r"argument params should be \{'b': \*, 'w': \*\}, got \{'b': \*, 'c': \*, 'w': \*\}",
        "loaded": r"argument params should be a dict with keys \['b', 'w'\], got \['b', 'c', 'w'\]"}),
    "a list for a dict": (([W, B], X), {
        "compiled": r"argument params should be \{'b': \*, 'w': \*\}, got \[\*, \*\]",
        "loaded": r"argument params should be a dict with keys \['b', 'w'\], got list"}),
    "a leaf's shape": (({"w": W[:5], "b": B}, X), {
        "compiled": r"argument params\['w'\] should be f32\[8,3\], got f32\[5,3\]",
        "loaded": r"argument params\['w'\] should be float32\[8, 3\], got float32\[5, 3\]"}),
    "a leaf's dtype": (({"w": W, "b": B.astype(np.int8)}, X), {
        "compiled": r"argument params\['b'\] should be f32\[3\], got s8\[3\]",
        "loaded": r"argument params\['b'\] should be float32\[3\], got int8\[3\]"}),
    "an unsupported leaf": (({"w": W, "b": object()}, X), {
        kind: r"argument params\['b'\]: object is not an array" for kind in ("jitted", "compiled", "loaded")}),
    "a str leaf": (({"w": "text", "b": B}, X), {
        "jitted": r"argument params\['w'\]: str is not an array",
        "compiled": r"argument params\['w'\]: str is not an array",
        "loaded": r"argument params\['w'\] should be float32\[8, 3\], got str"}),
    "too few": ((PARAMS,), {
        "jitted": "missing 1 required positional argument: 'x'",
        "compiled": r"takes 2 array arguments \(params, x\), got 1",
        "loaded": r"takes 2 array arguments, got 1 \(its arguments: params, x\)"}),
}


def cases(table: dict, which: int) -> list:
    return [pytest.param(which, args, kind, message, id=f"{kind}-{name}")
            for name, (args, messages) in table.items() for kind, message in messages.items()]


@pytest.mark.parametrize("which, args, kind, message", cases(AFFINE_CASES, 0) + cases(MODEL_CASES, 1))
def test_wrong_arguments_give_a_type_error_naming_the_argument(callables, which, args, kind, message):
    fn = callables[kind][which]
    good = (X, W, B) if which == 0 else (PARAMS, X)
    want = fn(*good)
    if kind == "jitted":
        assert bool(fn._fast) == (which == 0)  # affine's calls take the fast path, model's never
        before = (set(fn._cache), set(fn._fast))
    with pytest.raises(TypeError, match=message):
        fn(*args)
    with pytest.raises(TypeError, match=message):  # and the same before the call is started
        fn.call_async(*args)
    if kind == "jitted":
        assert (set(fn._cache), set(fn._fast), fn._compiling) == (*before, {})
    assert_tree_close(fn(*good), want)


def test_keyword_arguments_that_a_compiled_signature_lacks_are_named(callables):
    for kind in ("compiled", "loaded"):
        fn = callables[kind][1]
        with pytest.raises(TypeError, match=r"keyword arguments.*\[\], got \['extra'\]"):
            fn(PARAMS, X, extra=B)
        with pytest.raises(TypeError, match=r"takes 2 array arguments.*got 1"):
            fn(PARAMS, x=X)


# ---------------------------------------------------------------------------- primitives
def uses_cumlogsumexp(x):
    return jax.lax.cumlogsumexp(x, axis=0) * 2.0


def uses_bessel_i1e(x):
    return jax.lax.bessel_i1e(x) + 1.0


def uses_igammac_in_a_loop_body(x):
    return jax.lax.while_loop(lambda c: c[0] < 3, lambda c: (c[0] + 1, jax.lax.igammac(c[1], 2.0)), (0, x))[1]


def uses_bessel_i0e_in_a_branch(x):
    return jax.lax.cond(x.sum() > 0, lambda v: jax.lax.bessel_i0e(v), lambda v: v - 1.0, x)


def uses_igamma(x):
    return jax.lax.igamma(x, x + 1.0) + 1.0


@jax.jit
def _inner_scan(x):
    return jax.lax.scan(lambda c, v: (c + v, jax.lax.zeta(c * v, 2.0)), 0.0, x)[1]


def uses_zeta_in_a_scan_in_a_jitted_helper(x):
    return _inner_scan(x) - 1.0


PRIMITIVES = [(uses_cumlogsumexp, "cumlogsumexp", uses_cumlogsumexp),
              (uses_bessel_i1e, "bessel_i1e", uses_bessel_i1e),
              (uses_igammac_in_a_loop_body, "igammac", uses_igammac_in_a_loop_body),
              (uses_bessel_i0e_in_a_branch, "bessel_i0e", uses_bessel_i0e_in_a_branch),
              (uses_igamma, "igamma", uses_igamma),
              (uses_zeta_in_a_scan_in_a_jitted_helper, "zeta", _inner_scan)]


@pytest.mark.parametrize("fn, primitive, where", PRIMITIVES, ids=[p[1] for p in PRIMITIVES])
def test_unsupported_primitives_name_themselves_and_the_users_line(fn, primitive, where):
    jitted = xfuse.jit(fn)
    with pytest.raises(UnsupportedPrimitiveError) as info:
        jitted(f32(5))
    line = inspect.getsourcelines(where)[1] + 1 + (where is _inner_scan)  # the decorator's line
    name = getattr(where, "__name__", None) or where.__wrapped__.__name__
    assert info.value.primitive == primitive
    assert f"'{primitive}'" in str(info.value)
    assert f"test_bad_input.py:{line} ({name}" in str(info.value)  # a lambda in it: name.<locals>...
    assert (jitted._cache, jitted._fast, jitted._compiling) == ({}, {}, {})


def test_an_unsupported_signature_leaves_the_others_working():
    traces = []

    def rows(x):
        traces.append(x.shape)
        return jax.lax.cumlogsumexp(x, axis=1) if x.ndim == 2 else x * 2.0

    jitted = xfuse.jit(rows)
    x = f32(6)
    np.testing.assert_array_equal(jitted(x), x * 2)
    for _ in range(2):  # tried again, traced again: a failure is not cached
        with pytest.raises(UnsupportedPrimitiveError, match="'cumlogsumexp'"):
            jitted(f32(2, 3))
    with pytest.raises(UnsupportedPrimitiveError, match="'cumlogsumexp'"):
        jitted.lower(f32(2, 3))
    np.testing.assert_array_equal(jitted(x + 1), (x + 1) * 2)
    assert traces == [(6,), (2, 3), (2, 3), (2, 3)]
    assert jitted._cache_size() == 1 and len(jitted._fast) == 1 and jitted._compiling == {}


# ---------------------------------------------------------------------------- options
OPTIONS = {
    "passes: an unknown pass": (lambda: xfuse.jit(affine, passes="simplify,nonsense"),
                                r"passes= names unknown pass\(es\) nonsense"),
    "passes: not a pass": (lambda: xfuse.jit(affine, passes=[object()]), "passes= holds"),
    "donate_argnums: a name": (lambda: xfuse.jit(affine, donate_argnums="x"), "donate_argnums must hold ints"),
    "donate_argnums: also static": (lambda: xfuse.jit(affine, donate_argnums=0, static_argnums=0),
                                    "donate_argnums and static_argnums both name argument 0"),
    "backend: not a name": (lambda: xfuse.jit(affine, backend=3), "backend must be a backend's name"),
    "fallback: no backend": (lambda: xfuse.jit(affine, fallback="jax"), "fallback and backend_options need backend="),
    "fallback: the backend itself": (lambda: xfuse.jit(affine, backend="numba", fallback="numba"),
                                     "fallback='numba' is the backend itself"),
    "fallback: unknown": (lambda: xfuse.jit(affine, backend="numba", fallback="nope"),
                          "fallback='nope' is not available"),
    "backend_options: no backend": (lambda: xfuse.jit(affine, backend_options={"mode": "module"}),
                                    "fallback and backend_options need backend="),
    "backend_options: not a dict": (lambda: xfuse.jit(affine, backend="jax", backend_options=[("mode", "x")]),
                                    "backend_options must be a dict"),
    "backend_options: unknown key": (lambda: xfuse.jit(affine, backend="jax", backend_options={"colour": 1}),
                                     "backend_options: 'colour' is not an option of backend 'jax'"),
    "default_backend: unknown": (lambda: xfuse.default_backend("nope").__enter__(),
                                 "backend='nope' is not available"),
    "default_backend: bad options": (lambda: xfuse.default_backend("numba", options={"mode": "x"}).__enter__(),
                                     "backend_options: 'mode' is not an option of backend 'numba'"),
}


@pytest.mark.parametrize("make, message", OPTIONS.values(), ids=list(OPTIONS))
def test_bad_options_raise_a_value_error_naming_the_option(make, message):
    with pytest.raises(ValueError, match=message):
        make()


@pytest.mark.parametrize("options, message", [
    ({"mode": "zz"}, "mode='zz' is not a mode of the jax backend"),
    ({"device": 3}, "device= must be a jax.Device"),
    ({"device": "nosuch:0"}, "device='nosuch:0': jax has no such device"),
])
def test_bad_backend_option_values_fail_the_compile_and_cache_nothing(options, message):
    jitted = xfuse.jit(affine, backend="jax", backend_options=options)
    for _ in range(2):
        with pytest.raises(ValueError, match=message):
            jitted(X, W, B)
    assert (jitted._cache, jitted._fast, jitted._compiling) == ({}, {}, {})


def test_bad_save_options_name_the_option_and_leave_the_old_file(callables, tmp_path):
    compiled = callables["compiled"][0]
    path = compiled.save(tmp_path / "affine.xfa")
    before = path.read_bytes()
    with pytest.raises(ValueError, match="target='pentium' is not known"):
        compiled.save(path, target="pentium")
    with pytest.raises(ValueError, match="platforms= applies to the jax backend"):
        compiled.save(path, platforms=("cpu",))
    with pytest.raises(ValueError, match="no pass named 'nope'"):
        compiled.pass_diff("nope")
    assert path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["affine.xfa"]
    assert_tree_close(xfuse.aot.load(path)(X, W, B), compiled(X, W, B))


def test_artifacts_of_another_format_give_clear_errors(callables, tmp_path):
    """The header's format (newer ones are tested with the damaged files) and the manifest's."""
    import hashlib
    import struct

    from xfuse.runtime import artifact

    path = callables["compiled"][0].save(tmp_path / "affine.xfa")
    data = path.read_bytes()
    older = tmp_path / "older.xfa"
    older.write_bytes(data[:8] + struct.pack("<I", 0) + data[12:])
    with pytest.raises(xfuse.aot.ArtifactError, match=f"{re.escape(str(older))}: unknown artifact format 0"):
        xfuse.aot.load(older)
    manifest, blobs = artifact.read(path)  # a manifest of another format, checksum made valid
    text = json.dumps({**manifest, "format": 7}, sort_keys=True, separators=(",", ":")).encode()
    body = text + bytes(blobs)
    mixed = tmp_path / "mixed.xfa"
    mixed.write_bytes(artifact.PREFIX.pack(artifact.MAGIC, artifact.FORMAT, 0, len(text),
                                           hashlib.sha256(body).digest()) + body)
    with pytest.raises(xfuse.aot.ArtifactError, match="its manifest does not describe a program"):
        xfuse.aot.load(mixed)


@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    folder = tmp_path_factory.mktemp("cli")
    path = folder / "xfuse_bad_input_model.py"
    path.write_text("import jax.numpy as jnp\n\ndef affine(x, w, b):\n    return jnp.tanh(x @ w + b)\n")
    return path


@pytest.mark.parametrize("flags, message", [
    (["--arg", "f32[8", "-o", "{out}"], r"--arg 'f32\[8': write a type like"),
    (["--arg", "f32[4,8]", "--arg", "f32[8,3]", "--arg", "f32[3]", "--target", "pentium", "-o", "{out}"],
     "target='pentium' is not known"),
    (["--arg", "f32[4,8]", "--platform", "cpu", "-o", "{out}"], "--platform applies to --backend jax"),
    (["--arg", "f32[4,8]", "--backend", "jax", "--emit-c", "{dir}"], "--emit-c writes native code"),
    (["--arg", "f32[4,8]"], "give -o FILE"),
], ids=["arg", "target", "platform", "emit-c", "no output"])
def test_bad_aot_cli_flags_exit_2_naming_the_flag(model_file, tmp_path, capsys, flags, message):
    out = tmp_path / "out.xfa"
    flags = [f.format(out=out, dir=tmp_path / "c") for f in flags]
    assert aot_cli.main(["compile", f"{model_file}:affine", *flags]) == 2
    assert re.search(message, capsys.readouterr().err)
    assert list(tmp_path.iterdir()) == []  # no artifact, no temporary file


def test_bad_function_names_and_choices_on_the_command_lines(model_file, capsys):
    assert aot_cli.main(["compile", str(model_file), "--arg", "f32[3]", "-o", "x.xfa"]) == 2
    assert "name the function as module:function" in capsys.readouterr().err
    assert aot_cli.main(["compile", f"{model_file}:nothing", "--arg", "f32[3]", "-o", "x.xfa"]) == 2
    assert "has no attribute 'nothing'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:
        aot_cli.main(["compile", f"{model_file}:affine", "--backend", "numba"])
    assert info.value.code == 2 and "--backend: invalid choice: 'numba'" in capsys.readouterr().err
    from xfuse.cli import main as xfuse_main

    assert xfuse_main(["inspect", f"{model_file}:affine", "--arg", "f32[4,8]", "--backend", "nope"]) == 2
    assert "backend='nope' is not available" in capsys.readouterr().err


# ---------------------------------------------------------------------------- one process
BATCH = textwrap.dedent("""
    import json, os, pathlib, sys, warnings
    import numpy as np
    import jax, jax.numpy as jnp
    import xfuse

    root = pathlib.Path(os.environ["XFUSE_CACHE_DIR"])
    files = lambda: sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())

    def affine(x, w, b):
        return jnp.tanh(x @ w + b) * 0.75

    def model(params, x):
        return jax.lax.cumlogsumexp(x) if x.ndim == 1 else x @ params["w"] + params["b"]

    class Sub(np.ndarray):
        pass

    rng = np.random.default_rng(3)
    x, w, b = (rng.standard_normal(s).astype(np.float32) for s in [(4, 8), (8, 3), (3,)])
    big = np.ones(1 << 22, np.float32)
    tiny = np.zeros(1, np.float32).view(Sub)
    chain = lambda u, v: jnp.exp(-u) * v + 1.0
    calls = {}
    for backend in ("numba", "c"):
        j = xfuse.jit(affine, backend=backend)
        j(x, w, b)
        c = j.lower(x, w, b).compile()
        chained = xfuse.jit(chain, backend=backend)
        chained(big, big)
        big_compiled = chained.lower(big, big).compile()
        calls.update({
            f"{backend} jitted: too many": lambda j=j: j(x, w, b, b),
            f"{backend} jitted: a str": lambda j=j: j(x, w, "b"),
            f"{backend} compiled: a subclass among matching arrays": lambda c=big_compiled: c(big, tiny, big),
            f"{backend} compiled: None": lambda c=c: c(x, None, w, b),
            f"{backend} compiled: dtype": lambda c=c: c(x, w.astype(np.int64), b),
            f"{backend} jitted: a subclass among matching arrays": lambda j=chained: j(big, tiny, big),
        })
    loaded = xfuse.aot.load(xfuse.jit(chain).lower(big, big).compile().save(root.parent / "chain.xfa"))
    calls.update({
        "loaded: a subclass among matching arrays": lambda: loaded(big, tiny, big),
        "loaded: a jax array among matching arrays": lambda: loaded(big, jnp.ones(1), big),
        "loaded: shape": lambda: loaded(big, big[:7]),
        "unsupported primitive": lambda: xfuse.jit(model)({"w": w, "b": b}, b),
        "bad backend option": lambda: xfuse.jit(affine, backend="jax", backend_options={"mode": 1})(x, w, b),
        "bad passes": lambda: xfuse.jit(affine, passes="fuse,nonsense"),
    })
    before = files()
    raised = {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for name, call in calls.items():
            try:
                call()
                raised[name] = None
            except Exception as e:
                raised[name] = type(e).__name__
    after = files()
    m = xfuse.jit(model)
    np.testing.assert_allclose(m({"w": w, "b": b}, x), x @ w + b, rtol=1e-5, atol=1e-5)
    print("RESULT " + json.dumps({"raised": raised, "same_files": before == after,
                                  "warnings": [f"{w.category.__name__}: {w.message}" for w in caught],
                                  "new_entries": len(files()) > len(after)}))
""")


def test_a_batch_of_bad_calls_never_takes_the_process_down_or_writes_the_cache(tmp_path):
    cache = tmp_path / "cache"
    env = dict(os.environ, XFUSE_CACHE_DIR=str(cache))
    done = subprocess.run([sys.executable, "-c", BATCH], capture_output=True, text=True, env=env,
                          timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(next(l for l in done.stdout.splitlines() if l.startswith("RESULT "))[7:])
    raised = result["raised"]
    assert all(kind == "TypeError" for name, kind in raised.items() if ":" in name), raised
    assert raised["unsupported primitive"] == "UnsupportedPrimitiveError"
    assert raised["bad backend option"] == raised["bad passes"] == "ValueError"
    assert result["same_files"] and result["new_entries"], result
    assert not [w for w in result["warnings"] if "CacheWarning" in w], result["warnings"]


class Liar:
    """Says it has 3 elements; converts to 5."""

    shape = (3,)
    dtype = np.dtype(np.float32)

    def __array__(self, dtype=None, copy=None):
        return np.arange(5, dtype=dtype)


def test_an_object_whose_array_has_another_shape_is_refused():
    with pytest.raises(TypeError, match=r"argument x: Liar says its shape is \(3,\) but converts to .*\(5,\)"):
        xfuse.jit(lambda x: x + 1)(Liar())
