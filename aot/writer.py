"""Writing AOT artifacts: a compiled function's fused module lowered to a program, its kernels
rendered as C and built for the chosen target, packed with the manifest into one file.
"""

from __future__ import annotations

import datetime
import platform
import subprocess
import sys
from pathlib import Path

import numpy as np

from xfuse.backends.c import toolchain
from xfuse.backends.c.backend import build_library, c_source
from xfuse.backends.numba.lowering import lower
from xfuse.runtime import artifact
from xfuse.runtime.program import Kernel, build, walk

from .emit import without_callbacks
from .loop import loop_drivers

_LEAF = object()


def tree_json(treedef, what: str):
    """A jax tree structure as the artifact's JSON tree (tuples, lists, dicts, None, leaves)."""
    import jax

    structure = jax.tree_util.tree_unflatten(treedef, [_LEAF] * treedef.num_leaves)

    def convert(x):
        if x is _LEAF:
            return "*"
        if x is None:
            return None
        if isinstance(x, tuple):
            return {"tuple": [convert(v) for v in x]}
        if isinstance(x, list):
            return {"list": [convert(v) for v in x]}
        if isinstance(x, dict):
            if not all(isinstance(k, str) for k in x):
                raise ValueError(f"{what}: an artifact's dict keys must be strings, got {list(x)}")
            return {"dict": [[k, convert(v)] for k, v in x.items()]}
        raise ValueError(f"{what}: an artifact cannot hold a {type(x).__name__} in its signature "
                         "(tuples, lists, dicts with string keys and None can)")

    return convert(structure)


def _compiler_version() -> str:
    result = subprocess.run([*toolchain.compiler(), "--version"], capture_output=True, text=True)
    return (result.stdout.splitlines() or ["unknown"])[0]


def plan_summary(program: dict, constants: dict) -> dict:
    """The buffer plan of a program (as the loader will make it), for `inspect`."""
    dummy = {s["kernel"]: Kernel(lambda *a: None, pointers=True)  # C kernels
             for s in walk(program) if s["op"] == "kernel"}
    executable = build(program, dummy, constants)
    plan = executable.plan
    buffers = []
    for (step, k), offset in sorted(plan.offsets.items()):
        spec = executable.steps[step].out_specs[k]
        buffers.append({"step": executable.steps[step].name, "dims": list(spec.shape),
                        "dtype": np.dtype(spec.dtype).name, "offset": offset})
    for (step, k), slot in sorted(plan.in_place.items()):
        buffers.append({"step": executable.steps[step].name, "in_place_of": slot})
    stats = executable.memory_analysis()
    return {"arena_bytes": plan.arena_bytes, "temp_bytes": stats.temp_size_in_bytes,
            "argument_bytes": stats.argument_size_in_bytes, "output_bytes": stats.output_size_in_bytes,
            "buffers": buffers}


def signature_json(compiled) -> dict:
    """The call signature an artifact checks: argument and result trees, shapes, dtypes."""
    import jax

    info = compiled.lowered.info  # static arguments are already baked into the module
    n = len(info.leaves)
    return {
        "in_tree": tree_json(info.in_tree, compiled.module.name),
        "out_tree": tree_json(compiled.lowered.out_tree, compiled.module.name),
        "args": [[list(s.shape.dims), s.shape.dtype.numpy.name, bool(s.weak)] for s in info.leaves],
        "arg_names": info.splitter.dynamic_names(n + len(info.splitter.static_argnums))[:n],
        "x64": bool(jax.config.jax_enable_x64),
    }


def _created() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def save(compiled, path: str | Path, *, target: str = "native", platforms=None) -> Path:
    """Writes the artifact of an `xfuse.Compiled` to `path`; returns the path. A function
    compiled for the jax backend is saved in jax's own AOT form (`jax.export`, for `platforms`:
    default the current one); any other as native code for the CPU `target`."""
    if compiled.lowered.backend == "jax":
        return save_exported(compiled, path, platforms)
    if platforms is not None:
        raise ValueError("platforms= applies to the jax backend's artifacts; use target= for native code")
    without_callbacks(compiled.module, "xfuse.aot.save")
    lowered = lower(compiled.module)
    library = build_library(c_source(lowered) + loop_drivers(lowered), target).read_bytes()
    manifest = {
        "name": compiled.module.name,
        "xfuse": _version(),
        "created": _created(),
        "target": {"system": sys.platform, "machine": platform.machine().lower(), "cpu": target,
                   "features": list(toolchain.features(target)), "triple": toolchain.machine(),
                   "compiler": _compiler_version()},
        "signature": signature_json(compiled),
        "program": lowered.program,
        "constants": {k: {"dtype": v.dtype.name, "shape": list(v.shape)} for k, v in lowered.constants.items()},
        "kernels": [{"name": s["kernel"], "label": s["label"], "rows": s["rows"], "parallel": s["parallel"]}
                    for s in walk(lowered.program) if s["op"] == "kernel"],
        "plan": plan_summary(lowered.program, lowered.constants),
        "module": str(compiled.module),
    }
    blobs = {"library": library}
    blobs.update({f"const:{k}": np.ascontiguousarray(v).tobytes() for k, v in lowered.constants.items()})
    path = Path(path)
    artifact.write(path, manifest, blobs)
    return path


def save_exported(compiled, path: str | Path, platforms=None) -> Path:
    """The jax backend's artifact: the fused module exported with `jax.export` (StableHLO),
    in the same container and with the same signature checks; loading it needs jax."""
    import jax

    from xfuse.backends.jax.export import read_header, serialize

    blob = serialize(compiled.module, platforms)
    manifest = {
        "name": compiled.module.name,
        "xfuse": _version(),
        "created": _created(),
        "runtime": "jax",
        "target": {"platforms": list(read_header(blob)["platforms"]), "jax": jax.__version__},
        "signature": signature_json(compiled),
        "module": str(compiled.module),
    }
    path = Path(path)
    artifact.write(path, manifest, {"exported": blob})
    return path


def compile(  # noqa: A001
    fn, *args, path: str | Path, target: str = "native", platforms=None, static_argnums=(), **jit_options
) -> Path:
    """Compiles `fn` for `args` (arrays or `jax.ShapeDtypeStruct`s) and saves the artifact
    (`backend="jax"` among `jit_options` saves jax's AOT form, for `platforms`)."""
    import xfuse

    compiled = xfuse.jit(fn, static_argnums=static_argnums, **jit_options).lower(*args).compile()
    return save(compiled, path, target=target, platforms=platforms)


def inspect(path: str | Path) -> str:
    """A readable summary of an artifact: signature, kernels, buffer plan, sizes, target."""
    manifest, blobs = artifact.read(path)
    if manifest.get("runtime") == "jax":
        return _inspect_exported(path, manifest)
    target, plan = manifest["target"], manifest["plan"]
    spans = manifest["blobs"]
    lines = [f"{path}: xfuse artifact (format {manifest['format']}), {Path(path).stat().st_size} bytes",
             _function_line(manifest),
             f"  made by    xfuse {manifest['xfuse']} on {manifest['created']}",
             f"  target     {target['system']}/{target['machine']} cpu={target['cpu']} "
             f"({target['triple']}, {target['compiler']})",
             f"  needs      {', '.join(target['features']) or 'no CPU extensions'}",
             f"  library    {spans['library'][1]} bytes of native code",
             f"  constants  {sum(n for k, (_, n) in spans.items() if k.startswith('const:'))} bytes"
             f" in {len(manifest['constants'])} arrays",
             f"  buffers    arena {plan['arena_bytes']} B, temporaries {plan['temp_bytes']} B, "
             f"arguments {plan['argument_bytes']} B, outputs {plan['output_bytes']} B",
             f"  kernels    {len(manifest['kernels'])}"]
    for k in manifest["kernels"]:
        lines.append(f"    {k['name']}: {k['label']}, {k['rows']} rows{', parallel' if k['parallel'] else ''}")
    steps = list(walk(manifest["program"]))
    lines.append(f"  steps      {len(steps)}: " + ", ".join(f"{s['op']} {s['name']}" for s in steps))
    for b in plan["buffers"]:
        where = f"arena+{b['offset']}" if "offset" in b else f"in place of value {b['in_place_of']}"
        lines.append(f"    {b['step']}: {b.get('dtype', '')}{b.get('dims', '')} at {where}")
    return "\n".join(lines) + "\n"


def _function_line(manifest: dict) -> str:
    sig = manifest["signature"]
    args = ", ".join(f"{n}: {d}{dims}" for n, (dims, d, _) in zip(sig["arg_names"], sig["args"]))
    return f"  function   {manifest['name']}({args})"


def _inspect_exported(path, manifest: dict) -> str:
    target, spans = manifest["target"], manifest["blobs"]
    return "\n".join([
        f"{path}: xfuse artifact (format {manifest['format']}), {Path(path).stat().st_size} bytes",
        _function_line(manifest),
        f"  made by    xfuse {manifest['xfuse']} on {manifest['created']}",
        f"  runtime    jax.export (StableHLO), made with jax {target['jax']}; loading needs jax",
        f"  platforms  {', '.join(target['platforms'])}",
        f"  exported   {spans['exported'][1]} bytes",
    ]) + "\n"


def _version() -> str:
    import xfuse

    return xfuse.__version__
