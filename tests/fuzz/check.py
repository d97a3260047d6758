"""Runs a fuzz program through every engine and compares each with the bounded baseline.

Engines: `jax.jit`, and `xfuse.jit` on every built-in backend (numba, c, jax, reference, the
last being the numpy reference interpreter), each with the default passes and with
`passes="none"` (no simplification and no fusion). A mismatch is reported with the program's
source, its inputs and the differing elements; `save_regression` writes the case as HLO text
plus an `.npz` of inputs, expected outputs and bounds under `tests/regressions/`, which
`tests/test_regressions.py` runs on every backend from then on.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import jax
import numpy as np

import xfuse
from tests.fuzz.bounds import Bound, compare, evaluate
from tests.fuzz.programs import Program

BACKENDS = ("numba", "c", "jax", "reference")
REGRESSIONS = Path(__file__).resolve().parents[1] / "regressions"


def engines(backends: Iterable[str] = BACKENDS) -> list[tuple[str, Callable]]:
    """(name, make) pairs: make(function) returns the function compiled by that engine."""
    found: list[tuple[str, Callable]] = [("jax.jit", jax.jit)]
    for backend in backends:
        for passes in (None, "none"):
            # The jax backend's default mode compiles each fusion on its own; with no fusion
            # that is one XLA compile per instruction, so the unfused run hands XLA the module.
            options = {"mode": "module"} if backend == "jax" and passes else None
            name = f"xfuse[{backend}{', no passes' if passes else ''}]"
            found.append((name, _maker(backend, passes, options)))
    return found


def _maker(backend: str, passes: str | None, options: dict | None) -> Callable:
    return lambda fn: xfuse.jit(fn, backend=backend, passes=passes, backend_options=options)


def _outputs(result) -> list[np.ndarray]:
    return [np.asarray(r) for r in jax.tree_util.tree_leaves(result)]


def mismatches(
    program: Program, inputs: Sequence[np.ndarray], which: Sequence[tuple[str, Callable]] | None = None
) -> list[str]:
    """What disagrees with the bounds, one line per engine and output (empty: all agree)."""
    try:
        want, bounds = evaluate(program, inputs)
    except Exception as e:  # noqa: BLE001 - a checker that cannot run is a finding too
        return [f"the eager baseline raised {type(e).__name__}: {e}"]
    fn = program.function()
    problems = []
    with jax.enable_x64(program.x64):
        for name, make in which or engines():
            try:
                got = _outputs(make(fn)(*[np.copy(a) for a in inputs]))
            except Exception as e:  # noqa: BLE001 - every failure is reported, not raised
                problems.append(f"{name} raised {type(e).__name__}: {e}")
                continue
            if name == "jax.jit" or name.startswith("xfuse[jax"):  # XLA's kernels, as jax.jit
                problems += describe_xla(name, got, want, bounds)
            else:
                problems += describe(name, got, want, bounds)
    return problems


def describe_xla(name: str, got: list, want: list[np.ndarray], bounds: list[Bound]) -> list[str]:
    """`describe` for an engine that runs XLA's kernels (jax.jit, xfuse's jax backend): it is
    not held to the outputs where XLA:CPU departs from the documented value (`xla_departs`)."""
    held = [i for i, b in enumerate(bounds) if not b.xla_departs]
    return describe(name, [got[i] for i in held] if len(got) == len(want) else got,
                    [want[i] for i in held], [bounds[i] for i in held])


def describe(name: str, got: list, want: list[np.ndarray], bounds: list[Bound]) -> list[str]:
    if len(got) != len(want):
        return [f"{name}: {len(got)} outputs, expected {len(want)}"]
    lines = []
    for i, (g, w, b) in enumerate(zip(got, want, bounds)):
        g = np.asarray(g)
        if g.shape != w.shape or g.dtype != w.dtype:
            lines.append(f"{name}: output {i} is {g.dtype}{list(g.shape)}, expected {w.dtype}{list(w.shape)}")
            continue
        bad = compare(g, w, b)
        if bad.any():
            where = [tuple(int(k) for k in index) for index in np.argwhere(bad)[:6]]
            shown = ", ".join(f"{list(k)}: {g[k]!r} vs {w[k]!r} (bound {4 * b.err[k]:.3g})" for k in where)
            lines.append(f"{name}: output {i}, {int(bad.sum())} of {bad.size} differ: {shown}")
    return lines


def report(program: Program, inputs: Sequence[np.ndarray], problems: list[str]) -> str:
    with np.printoptions(threshold=64, precision=8):
        shown = "\n".join(f"#   {v.name} = {np.asarray(a)!r}" for v, a in zip(program.inputs, inputs))
    return "\n".join([program.describe(), "# inputs:", shown, "# mismatches:", *problems])


def save_regression(program: Program, inputs: Sequence[np.ndarray], directory: Path = REGRESSIONS) -> Path:
    """Writes the case as `<hash>.hlo` (the traced module, before any pass) and `<hash>.npz`
    (inputs, the expected outputs and their bounds, the program's source)."""
    want, bounds = evaluate(program, inputs)
    with jax.enable_x64(program.x64):
        text = xfuse.jit(program.function()).lower(*inputs).as_text()
    name = hashlib.sha1(text.encode()).hexdigest()[:12]
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{name}.hlo").write_text(text)
    arrays = {f"input{i}": np.asarray(a) for i, a in enumerate(inputs)}
    for i, (w, b) in enumerate(zip(want, bounds)):
        arrays |= {f"want{i}": w, f"err{i}": b.err, f"wild{i}": b.wild}
    arrays["source"] = np.asarray(program.describe())
    np.savez(directory / f"{name}.npz", **_storable(arrays))
    return directory / f"{name}.hlo"


def _storable(arrays: dict) -> dict:
    """bfloat16 arrays as their bits (npz keeps no ml_dtypes types), the dtype beside them."""
    out = {}
    for key, a in arrays.items():
        if a.dtype.name == "bfloat16":
            out[key + ".bf16"] = a.view(np.uint16)
        else:
            out[key] = a
    return out


def load_regression(path: Path) -> tuple[str, dict[str, np.ndarray]]:
    import ml_dtypes

    with np.load(path.with_suffix(".npz")) as data:
        arrays = {}
        for key in data.files:
            if key.endswith(".bf16"):
                arrays[key[:-5]] = data[key].view(ml_dtypes.bfloat16)
            else:
                arrays[key] = data[key]
    return path.read_text(), arrays
