"""The engines a workload runs on: xfuse.jit, jax.jit, NumPy and numexpr. `prepare` compiles
(where the engine compiles) and returns a zero-argument call plus what was learnt on the way:
compile times, and kernel counts for xfuse and for XLA.

XLA's kernel count (`xla_kernel_count`) reads the ENTRY computation of the optimised HLO text
(`jax.jit(f).lower(*args).compile().as_text()`) and counts the instructions that do work at
run time: fusions, custom-calls, dots, convolutions, reduces, sorts, scatters, loops and so
on, each once. Not counted: what only names or rearranges buffers and launches nothing
(`parameter`, `constant`, `tuple`, `get-tuple-element`, `bitcast`, the `*-start`/`*-done`
halves of async pairs' bookkeeping: `copy-start`, `copy-done`, `after-all`, `opt-barrier`,
`add-dependency`, `partition-id`, `replica-id`). A plain `copy` is counted: it moves data.
Nested computations (fusion bodies, loop bodies) are not opened.

Imports jax, numexpr and xfuse only inside the function for that engine, so that each
engine's process loads only its own thread pools.
"""

from __future__ import annotations

import importlib
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from .workloads import Workload

ENGINES = ("xfuse", "jax", "numpy", "numexpr")
LABELS = {"xfuse": "xfuse", "jax": "jax.jit", "numpy": "NumPy", "numexpr": "numexpr"}

NOT_KERNELS = frozenset(
    {
        "parameter",
        "constant",
        "tuple",
        "get-tuple-element",
        "bitcast",
        "copy-start",
        "copy-done",
        "after-all",
        "opt-barrier",
        "add-dependency",
        "partition-id",
        "replica-id",
    }
)


@dataclass
class Prepared:
    """A ready-to-time engine: `call()` runs the workload once and returns when it is done."""

    call: Callable[[], object]
    to_numpy: Callable[[object], np.ndarray]
    info: dict = field(default_factory=dict)


def current_rss() -> int:
    """Resident memory now, in bytes (Linux)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0


def _entry_lines(hlo_text: str) -> list[str]:
    lines = hlo_text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("ENTRY")), None)
    if start is None:
        return []
    body = []
    for line in lines[start + 1 :]:
        if line.startswith("}"):
            break
        body.append(line.strip())
    return body


def _opcode(line: str) -> str | None:
    """The opcode of one HLO instruction line: `%name = f32[2]{0} add(%a, %b), ...` -> add."""
    if " = " not in line:
        return None
    rest = line.split(" = ", 1)[1].lstrip()
    if rest.startswith("("):  # a tuple shape: skip to its matching parenthesis
        depth = 0
        for index, char in enumerate(rest):
            depth += {"(": 1, ")": -1}.get(char, 0)
            if depth == 0:
                rest = rest[index + 1 :]
                break
    else:
        rest = rest.split(" ", 1)[1] if " " in rest else ""
    opcode = rest.lstrip().split("(", 1)[0].strip()
    return opcode or None


def _label(opcode: str, line: str) -> str:
    """`fusion:kLoop`, `fusion:__ynn_fusion` (XLA:CPU's YNNPACK fusions), or the bare opcode."""
    if opcode != "fusion":
        return opcode
    custom = re.search(r'"fusion_config":\{"kind":"(\w+)"', line)
    kind = re.search(r"kind=(\w+)", line)
    return f"fusion:{custom.group(1) if custom else kind.group(1) if kind else '?'}"


def xla_kernels(hlo_text: str) -> list[str]:
    """The ENTRY instructions counted as kernels (see the module docstring), as labels."""
    kernels = []
    for line in _entry_lines(hlo_text):
        opcode = _opcode(line)
        if opcode is not None and opcode not in NOT_KERNELS:
            kernels.append(_label(opcode, line))
    return kernels


def _prepare_xfuse(workload: Workload, inputs: tuple, backend: str | None) -> Prepared:
    import xfuse

    import jax

    # Library set-up, once per process, is not compile time: jax's (its backend, as the jax
    # engine's device_put does before its clock starts, and its first trace), xfuse's imports
    # (the backend's modules too, loaded on first use, and the scan of installed plugins) and
    # numba's. Where Python writes no bytecode (PYTHONDONTWRITEBYTECODE), importing the numba
    # backend's modules parses them, some 0.1 s that an installed package does not pay.
    startup = time.perf_counter()
    jax.block_until_ready(jax.device_put(0.0))
    jax.make_jaxpr(lambda a: a * 2.0)(1.0)
    xfuse.jit(lambda a: a * 2.0).lower(np.float32(1.0))  # imports xfuse's frontend
    from xfuse.backends.registry import REGISTRY
    from xfuse.compiler import check_backend

    REGISTRY.get(check_backend(backend))
    if backend in (None, "numba"):
        from xfuse.backends import numba as numba_backend

        numba_backend.initialize()
        importlib.import_module("xfuse.backends.numba.backend")  # loaded on first use otherwise
    base = current_rss()
    start = time.perf_counter()
    jitted = xfuse.jit(workload.jax_fn, backend=backend)
    lowered = jitted.lower(*inputs)
    traced = time.perf_counter()
    compiled = lowered.compile()
    done = time.perf_counter()
    first = compiled(*inputs)
    first_call = time.perf_counter() - done
    info = {
        "backend": lowered.backend,
        "rss_base_bytes": base,
        "startup_s": start - startup,
        "trace_s": traced - start,
        "compile_s": done - traced,
        "first_call_s": first_call,
        "time_to_first_result_s": done - start + first_call,
        "kernel_count": compiled.kernel_count(),
    }
    try:
        fusions = compiled.fusion_report().fusions
        info["fusions"] = [f"{f.name} kind={f.kind} ({len(f.members)} ops)" for f in fusions]
        costs = compiled.cost_analysis()
        info["cost_analysis"] = {
            key: value for key, value in costs.items() if isinstance(value, (int, float))
        }
    except Exception as error:  # informative only; never fails the benchmark
        info["cost_analysis_error"] = f"{type(error).__name__}: {error}"
    del first
    info.update(_threads())
    if lowered.backend == "jax":  # timed as jax.jit is: inputs on the device, results waited for
        import jax

        device_inputs = jax.block_until_ready(jax.device_put(inputs))
        return Prepared(lambda: jax.block_until_ready(compiled(*device_inputs)), np.asarray, info)
    return Prepared(lambda: compiled(*inputs), np.asarray, info)


def _threads() -> dict:
    """How many threads xfuse's runtime splits a kernel's rows over, and whether its first call
    loaded oneDNN (`xfuse.runtime.onednn`: it loads for the first float32 product large enough
    to go to it)."""
    from xfuse.runtime import onednn
    from xfuse.runtime.parallel import num_threads

    return {"xfuse_threads": num_threads(), "onednn_loaded": onednn.loaded()}


def _prepare_jax(workload: Workload, inputs: tuple) -> Prepared:
    import jax

    device_inputs = [jax.device_put(a) for a in inputs]
    jax.block_until_ready(device_inputs)
    base = current_rss()
    start = time.perf_counter()
    jitted = jax.jit(workload.jax_fn)
    compiled = jitted.lower(*device_inputs).compile()
    done = time.perf_counter()
    jax.block_until_ready(jitted(*device_inputs))  # jit's own cache compiles again here
    first_call = time.perf_counter() - done
    kernels = xla_kernels(compiled.as_text())
    info = {
        "compile_s": done - start,
        "first_call_s": first_call,
        "rss_base_bytes": base,
        "xla_kernel_count": len(kernels),
        "xla_kernels": kernels,
    }
    return Prepared(lambda: jax.block_until_ready(jitted(*device_inputs)), np.asarray, info)


def prepare(engine: str, workload: Workload, inputs: tuple, backend: str | None = None) -> Prepared:
    """Compiles `workload` on `engine` for `inputs`; ValueError for an engine it lacks."""
    if engine == "xfuse":
        return _prepare_xfuse(workload, inputs, backend)
    if engine == "jax":
        return _prepare_jax(workload, inputs)
    if engine == "numpy":
        return Prepared(lambda: workload.numpy_fn(*inputs), np.asarray)
    if engine == "numexpr":
        if workload.numexpr_fn is None:
            raise ValueError(f"{workload.name} has no numexpr version")
        import numexpr

        info = {"threads": numexpr.get_num_threads()}
        return Prepared(lambda: workload.numexpr_fn(*inputs), np.asarray, info)
    raise ValueError(f"unknown engine {engine!r}; choose one of {', '.join(ENGINES)}")
