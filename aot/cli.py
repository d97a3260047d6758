"""`xfuse aot`: compile a function to an artifact, run an artifact on .npz inputs, inspect one.

    xfuse aot compile pkg.module:function --arg f32[64,512] --arg f32[512,1024] -o mlp.xfa
    xfuse aot run mlp.xfa inputs.npz -o outputs.npz
    xfuse aot inspect mlp.xfa

`run` and `inspect` import numpy alone. `compile --emit-c DIR` writes a C library and header
instead of (or beside, with -o) the artifact.
"""

from __future__ import annotations

import argparse
import importlib
import re
import sys
from pathlib import Path

ARG = re.compile(r"\s*([a-z]+\d*)\s*\[\s*([\d,\s]*)\]\s*")


def parse_arg(text: str):
    """`f32[64,512]` -> jax.ShapeDtypeStruct((64, 512), float32)."""
    import jax

    from xfuse.hlo import DType

    match = ARG.fullmatch(text)
    if not match:
        raise ValueError(f"--arg {text!r}: write a type like f32[64,512] (dtype, then the dims; f32[] is a scalar)")
    try:
        dtype = DType(match[1])
    except ValueError:
        names = ", ".join(d.value for d in DType)
        raise ValueError(f"--arg {text!r}: unknown dtype {match[1]!r} (one of {names})") from None
    dims = tuple(int(d) for d in match[2].replace(" ", "").split(",") if d)
    return jax.ShapeDtypeStruct(dims, dtype.numpy)


def find_function(spec: str):
    """`package.module:function` (or `path/to/file.py:function`) -> the function."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ValueError(f"{spec!r}: name the function as module:function")
    if module_name.endswith(".py"):
        path = Path(module_name).resolve()
        sys.path.insert(0, str(path.parent))
        module_name = path.stem
    else:
        sys.path.insert(0, str(Path.cwd()))
    try:
        target = importlib.import_module(module_name)
    except ImportError as e:
        raise ValueError(f"{spec!r}: cannot import {module_name!r} ({e})") from None
    for part in attr.split("."):
        if not hasattr(target, part):
            raise ValueError(f"{spec!r}: {module_name} has no attribute {attr!r}")
        target = getattr(target, part)
    if not callable(target):
        raise ValueError(f"{spec!r}: {attr} is not a function")
    return target


def _compile(args) -> int:
    import xfuse

    fn = find_function(args.function)
    specs = [parse_arg(a) for a in args.arg]
    if not args.output and not args.emit_c:
        raise ValueError("give -o FILE for the artifact, --emit-c DIR for a C library, or both")
    if args.platform and args.backend != "jax":
        raise ValueError("--platform applies to --backend jax (jax.export); use --target for native code")
    if args.emit_c and args.backend == "jax":
        raise ValueError("--emit-c writes native code; it does not apply to --backend jax")
    backend = "jax" if args.backend == "jax" else None  # native: the module is lowered to C at save
    jitted = xfuse.jit(fn, static_argnums=tuple(args.static_argnums), backend=backend)
    compiled = jitted.lower(*specs).compile()
    if args.output:
        path = compiled.save(args.output, target=args.target, platforms=args.platform or None)
        print(f"wrote {path} ({path.stat().st_size} bytes, {compiled.kernel_count()} kernels)")
    if args.emit_c:
        from xfuse.aot.emit import emit_c

        files = emit_c(compiled, args.emit_c, args.name, target=args.target)
        print("wrote " + ", ".join(str(p) for p in files.values()))
    return 0


def _run(args) -> int:
    import numpy as np

    from xfuse.aot.loading import load

    fn = load(args.artifact)
    names = fn.manifest["signature"]["arg_names"]
    with np.load(args.inputs) as data:
        keys = list(data.keys())
        if set(names) <= set(keys):
            arrays = [data[n] for n in names]
        elif keys == [f"arr_{i}" for i in range(len(keys))]:
            arrays = [data[k] for k in keys]
        else:
            raise ValueError(f"{args.inputs}: name the arrays after the arguments ({', '.join(names)}) "
                             "or save them positionally (np.savez(file, x, w, b))")
    result = fn(*arrays)
    leaves = _leaves(result)
    np.savez(args.output, *leaves)
    print(f"wrote {args.output}: " + ", ".join(f"{a.dtype}{list(a.shape)}" for a in leaves))
    return 0


def _leaves(tree) -> list:
    if isinstance(tree, (tuple, list)):
        return [x for t in tree for x in _leaves(t)]
    if isinstance(tree, dict):
        return [x for k in tree for x in _leaves(tree[k])]
    return [] if tree is None else [tree]


def _inspect(args) -> int:
    from xfuse.runtime.artifact import read

    if args.json:
        import json

        manifest, _ = read(args.artifact)
        print(json.dumps(manifest, indent=1))
        return 0
    from xfuse.aot.writer import inspect

    print(inspect(args.artifact), end="")
    return 0


def main(argv: list[str], prog: str = "xfuse aot") -> int:
    parser = argparse.ArgumentParser(prog=prog, description="ahead-of-time artifacts")
    sub = parser.add_subparsers(dest="command", required=True)
    c = sub.add_parser("compile", help="compile module:function for the given argument types")
    c.add_argument("function", help="module:function, or path/to/file.py:function")
    c.add_argument("--arg", action="append", default=[], metavar="TYPE",
                   help="an argument's type, e.g. f32[64,512]; once per argument, in order")
    c.add_argument("--static-argnums", type=int, nargs="*", default=[])
    c.add_argument("-o", "--output", help="the artifact to write (.xfa)")
    c.add_argument("--target", default="native",
                   help="the CPU to build for: native, x86-64, x86-64-v2, x86-64-v3, x86-64-v4")
    c.add_argument("--backend", choices=("native", "jax"), default="native",
                   help="native: C code run by the numpy-only runtime (default); jax: the module "
                        "exported with jax.export (loading needs jax)")
    c.add_argument("--platform", action="append", default=[],
                   help="with --backend jax: a platform to export for (cpu, cuda, rocm, tpu); repeatable")
    c.add_argument("--emit-c", metavar="DIR", help="also write a C library and header into DIR")
    c.add_argument("--name", help="the C entry function's prefix (default: the function's name)")
    r = sub.add_parser("run", help="run an artifact on the arrays of an .npz file (numpy only)")
    r.add_argument("artifact")
    r.add_argument("inputs", help=".npz of the arguments, by name or in order")
    r.add_argument("-o", "--output", required=True, help=".npz to write the results into, in order")
    i = sub.add_parser("inspect", help="signature, kernels, buffer plan, sizes, target, versions")
    i.add_argument("artifact")
    i.add_argument("--json", action="store_true", help="the whole manifest as JSON")
    args = parser.parse_args(argv)
    from xfuse.runtime.artifact import ArtifactError

    failures: tuple = (ArtifactError, ValueError, TypeError, OSError)
    if args.command == "compile":
        from xfuse.backends.c.toolchain import CompilerError

        failures += (CompilerError,)
    try:
        return {"compile": _compile, "run": _run, "inspect": _inspect}[args.command](args)
    except failures as e:
        print(f"{prog} {args.command}: {e}", file=sys.stderr)
        return 2
