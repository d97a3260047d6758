"""The `xfuse` command line. Subcommands: `demo`, `bench`, `aot` (compile, run, inspect), and
`inspect` (a function's fusion as text, or as one standalone HTML report).

`bench` runs the benchmark suite of the source tree (`benchmarks/`, beside this package's
folder); its options are the suite's own (`xfuse bench --help`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def _bench(argv: list[str]) -> int:
    """Runs `benchmarks.suite.main`, finding the source tree's `benchmarks` if not importable."""
    try:
        from benchmarks.suite import main as bench
    except ImportError:
        root = Path(__file__).resolve().parent.parent
        if not (root / "benchmarks" / "suite.py").is_file():
            print(
                "xfuse bench: the benchmark suite lives in the source tree (benchmarks/); "
                "run it from a checkout with `pip install -e .[bench]`",
                file=sys.stderr,
            )
            return 2
        sys.path.insert(0, str(root))
        from benchmarks.suite import main as bench
    return bench(argv, prog="xfuse bench")


def _inspect(args) -> int:
    import xfuse
    from xfuse.aot.cli import find_function, parse_arg

    from .html import compiled_html, page

    fn = find_function(args.function)
    specs = [parse_arg(a) for a in args.arg]
    compiled = xfuse.jit(fn, backend=args.backend).lower(*specs).compile()
    if args.html:
        title = f"xfuse: {args.function}"
        Path(args.html).write_text(page(compiled_html(compiled, title=args.function), title), "utf-8")
        print(f"wrote {args.html}")
    else:
        print(compiled.as_text())
        print(compiled.fusion_report())
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="xfuse", description="xfuse: a fusion compiler for JAX")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("demo", help="build, print, parse, verify and run softmax(relu(x @ w + b))")
    sub.add_parser(
        "bench",
        add_help=False,  # --help and every other option go to the suite
        help="benchmark xfuse against jax.jit, NumPy and numexpr (options: xfuse bench --help)",
    )
    sub.add_parser("aot", add_help=False,
                   help="ahead-of-time artifacts: xfuse aot compile|run|inspect (xfuse aot --help)")
    inspect = sub.add_parser("inspect", help="a function's fused HLO and fusion report, or an HTML report")
    inspect.add_argument("function", help="module:function, or path/to/file.py:function")
    inspect.add_argument("--arg", action="append", default=[], metavar="TYPE",
                         help="an argument's type, e.g. f32[64,512]; once per argument, in order")
    inspect.add_argument("--backend", default=None, help="the backend to compile for (default numba)")
    inspect.add_argument("--html", metavar="FILE", help="write one standalone HTML report here")
    args, rest = parser.parse_known_args(argv)
    if args.command == "bench":
        return _bench(rest)
    if args.command == "aot":
        from xfuse.aot.cli import main as aot

        return aot(rest, prog="xfuse aot")
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    if args.command == "demo":
        from .demo import main as demo

        return demo()
    if args.command == "inspect":
        try:
            return _inspect(args)
        except (ValueError, TypeError) as error:
            print(f"xfuse inspect: {error}", file=sys.stderr)
            return 2
    return 2  # pragma: no cover - argparse rejects unknown commands


if __name__ == "__main__":
    sys.exit(main())
