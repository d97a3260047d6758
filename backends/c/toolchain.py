"""The system C compiler: finding it, the flags kernels are built with, and the CPU features a
build relies on.

The compiler is `$CC` if set, else the first of cc, gcc and clang on PATH. Kernels are built
with `-O3 -ffp-contract=off` (only the explicit fused multiply-adds of the math helpers fuse,
as in the numba backend), `-fwrapv` (integer arithmetic wraps, as XLA's does),
`-fno-math-errno` (sqrt and friends vectorise; errno is never read) and `-fno-trapping-math`
(no FP exception is ever observed, so selects of FP values vectorise). No `-ffast-math`.
Under `-fno-trapping-math` gcc folds `(float)(int)x` into `truncf(x)`, which keeps the sign
of a zero that the integer lost: the renderer clears the sign of a zero after every
integer-to-float conversion (`xf_unsign0_*`; adding +0.0 does not do, gcc drops it).

A target is a `-march` level; `native` is this machine's CPU. `features(target)` lists the
instruction-set extensions the compiler enables for it, in numpy's names (the names
`numpy._core._multiarray_umath.__cpu_features__` uses), so a loader with numpy alone can check a
CPU before running code built for another.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from functools import cache
from pathlib import Path

FLAGS = (
    "-O3", "-std=gnu11", "-fPIC", "-fwrapv", "-fno-math-errno", "-fno-trapping-math",
    "-ffp-contract=off", "-fno-semantic-interposition", "-fvisibility=hidden",
    "-Werror=implicit-function-declaration",
)  # fmt: skip
# A library must not leave a symbol to be found at load time (a missing helper fails the build).
LINK_FLAGS = ("-Wl,-z,defs",) if sys.platform.startswith("linux") else ()
TARGETS = {
    "native": ("-march=native",),
    "x86-64": ("-march=x86-64",),
    "x86-64-v2": ("-march=x86-64-v2",),
    "x86-64-v3": ("-march=x86-64-v3",),
    "x86-64-v4": ("-march=x86-64-v4",),
}
# Predefined macros of gcc and clang -> numpy's CPU feature names.
FEATURE_MACROS = {
    "__SSE3__": "SSE3", "__SSSE3__": "SSSE3", "__SSE4_1__": "SSE41", "__SSE4_2__": "SSE42",
    "__POPCNT__": "POPCNT", "__AVX__": "AVX", "__F16C__": "F16C", "__FMA__": "FMA3",
    "__AVX2__": "AVX2", "__BMI__": "BMI", "__BMI2__": "BMI2", "__LZCNT__": "LZCNT",
    "__MOVBE__": "MOVBE", "__AVX512F__": "AVX512F", "__AVX512CD__": "AVX512CD",
    "__AVX512BW__": "AVX512BW", "__AVX512DQ__": "AVX512DQ", "__AVX512VL__": "AVX512VL",
    "__AVX512VNNI__": "AVX512VNNI", "__AVX512IFMA__": "AVX512IFMA", "__AVX512VBMI__": "AVX512VBMI",
    "__AVX512VBMI2__": "AVX512VBMI2", "__AVX512BITALG__": "AVX512BITALG",
    "__AVX512FP16__": "AVX512FP16", "__AVX512BF16__": "AVX512BF16",
    "__AVX512VPOPCNTDQ__": "AVX512VPOPCNTDQ", "__ARM_NEON": "NEON", "__ARM_FEATURE_FMA": "ASIMD",
    "__ARM_FEATURE_SVE": "SVE",
}  # fmt: skip


class CompilerError(RuntimeError):
    """The C compiler is missing or rejected generated code; names the file it was building."""


@cache
def compiler() -> tuple[str, ...]:
    """The compiler command: `$CC`, else cc, gcc or clang from PATH, else zig's clang from the
    `ziglang` package (`pip install ziglang`: a C compiler for machines that have none)."""
    if os.environ.get("CC"):
        return tuple(shlex.split(os.environ["CC"]))
    for name in ("cc", "gcc", "clang"):
        path = shutil.which(name)
        if path:
            return (path,)
    try:
        import ziglang  # noqa: F401 - only its presence matters
    except ImportError:
        pass
    else:
        return (sys.executable, "-m", "ziglang", "cc")
    raise CompilerError(
        "no C compiler found: set CC, or install one (Debian/Ubuntu: apt install gcc; "
        "macOS: xcode-select --install; anywhere: pip install ziglang)"
    )


def is_zig() -> bool:
    return any("zig" in Path(part).name for part in compiler())


def openmp_available() -> bool:
    """Whether the compiler links OpenMP (zig's clang has no OpenMP runtime)."""
    return not is_zig()


def target_flags(target: str) -> tuple[str, ...]:
    if target not in TARGETS:
        raise ValueError(f"target={target!r} is not known; choose one of {', '.join(TARGETS)}")
    flags = TARGETS[target]
    if is_zig() and target != "native":  # zig names CPUs x86_64_v3, with -mcpu
        return (f"-mcpu={target.replace('-', '_')}",)
    return flags


@cache
def features(target: str = "native") -> tuple[str, ...]:
    """The CPU features code built for `target` may use, in numpy's names, sorted."""
    command = [*compiler(), *target_flags(target), "-dM", "-E", "-x", "c", os.devnull]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise CompilerError(f"{shlex.join(command)} failed:\n{result.stderr.strip()}")
    defined = {line.split()[1] for line in result.stdout.splitlines() if line.startswith("#define ")}
    return tuple(sorted({name for macro, name in FEATURE_MACROS.items() if macro in defined}))


@cache
def machine() -> str:
    """What the compiler builds for (its `-dumpmachine`, e.g. x86_64-linux-gnu)."""
    result = subprocess.run([*compiler(), "-dumpmachine"], capture_output=True, text=True)
    return result.stdout.strip() or "unknown"


def compile_shared(source: str, output: Path, target: str = "native", *, openmp: bool = False,
                   extra: tuple[str, ...] = (), name: str = "kernels") -> None:
    """Builds C `source` into the shared library `output`. On failure the source is kept in a
    file named in the error, so it can be read and rebuilt by hand."""
    output = Path(output)
    flags = [*build_flags(target, openmp), *extra]
    with tempfile.TemporaryDirectory(prefix="xfuse-cc-") as tmp:
        src = Path(tmp) / f"{name}.c"
        src.write_text(source)
        command = [*compiler(), *flags, "-shared", *LINK_FLAGS, "-o", str(output), str(src), "-lm"]
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0:
            kept = Path(tempfile.mkdtemp(prefix="xfuse-failed-")) / src.name
            kept.write_text(source)
            raise CompilerError(
                f"the C compiler rejected the generated {name} (kept at {kept}):\n"
                f"{shlex.join(command)}\n{result.stderr.strip()[:4000]}"
            )
        strip = shutil.which("strip")
        if strip:  # symbols of the entry points stay: they are dynamic
            subprocess.run([strip, "--strip-unneeded", str(output)], capture_output=True)


def build_flags(target: str = "native", openmp: bool = False) -> list[str]:
    """The flags `compile_shared` uses (also for building the same code by hand)."""
    quirks = ["-Wno-unused-command-line-argument"] if is_zig() else []  # zig adds its own -c
    return [*FLAGS, *target_flags(target), "-fopenmp" if openmp else "-fopenmp-simd", *quirks]
