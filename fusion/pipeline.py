"""The pass manager: passes, pipelines named as strings, verification after each pass, per-pass
dumps (`XFUSE_DUMP_TO=dir` writes `NN_<pass>.hlo`, as XLA's `--xla_dump_to`), and errors that
say which passes ran before the one that failed.

A pass is a small frozen dataclass with a `name`, its options as fields, and
`run(module) -> module` that returns the same object when nothing changed. May import
xfuse.hlo and networkx.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from xfuse.hlo import HloVerifyError, Module, verify


class Pass(Protocol):
    name: str

    def run(self, module: Module) -> Module: ...


class PassError(Exception):
    """A pass failed (raised, or produced a module that does not verify)."""


@dataclass
class PassRecord:
    """One pass as it ran: its name, whether it changed the module, and the module after it."""

    name: str
    changed: bool
    module: Module
    seconds: float = 0.0  # how long the pass ran


@dataclass
class PipelineResult:
    module: Module
    history: list[PassRecord] = field(default_factory=list)


REGISTRY: dict[str, Callable[[], Pass]] = {}


def register(name: str) -> Callable:
    """Class decorator: makes a pass nameable in pipeline strings."""

    def add(cls):
        REGISTRY[name] = cls
        return cls

    return add


def parse_pipeline(spec: str | Sequence[Pass] | None) -> list[Pass]:
    """`"simplify,cse,dce,fuse"` -> passes; `"none"` or `""` -> no passes; None -> the default."""
    if spec is None:
        spec = DEFAULT_PIPELINE
    if not isinstance(spec, str):
        passes = list(spec)
        for p in passes:
            if not hasattr(p, "run") or not hasattr(p, "name"):
                raise ValueError(f"passes= holds {p!r}, which is not a pass (name and run())")
        return passes
    names = [n.strip() for n in spec.split(",") if n.strip()]
    if names == ["none"]:
        return []
    unknown = [n for n in names if n not in REGISTRY]
    if unknown:
        known = ", ".join(sorted(REGISTRY))
        raise ValueError(f"passes= names unknown pass(es) {', '.join(unknown)}; known: {known}")
    return [REGISTRY[n]() for n in names]


def verify_each_pass() -> bool:
    """Verification after every pass: on under pytest and with XFUSE_VERIFY=1."""
    flag = os.environ.get("XFUSE_VERIFY")
    if flag is not None:
        return flag not in ("0", "", "false")
    return "PYTEST_CURRENT_TEST" in os.environ


def run_pipeline(
    module: Module,
    passes: Sequence[Pass],
    verify_passes: bool | None = None,
    dump_to: str | os.PathLike | None = None,
) -> PipelineResult:
    """Runs `passes` in order; records each; verifies and dumps as asked."""
    if verify_passes is None:
        verify_passes = verify_each_pass()
    if dump_to is None:
        dump_to = os.environ.get("XFUSE_DUMP_TO") or None
    dump_dir = Path(dump_to) if dump_to else None
    if dump_dir is not None:
        dump_dir.mkdir(parents=True, exist_ok=True)
        (dump_dir / f"{module.name}.00_input.hlo").write_text(str(module))
    result = PipelineResult(module)
    for number, p in enumerate(passes, start=1):
        ran = [r.name for r in result.history]
        before = result.module
        started = time.perf_counter()
        try:
            after = p.run(before)
        except Exception as e:
            raise PassError(f"pass '{p.name}' failed{_after(ran)}: {type(e).__name__}: {e}") from e
        if verify_passes:
            try:
                verify(after)
            except HloVerifyError as e:
                raise PassError(f"pass '{p.name}' produced an invalid module{_after(ran)}:\n{e}") from e
        seconds = time.perf_counter() - started
        result.history.append(PassRecord(p.name, after is not before, after, seconds))
        result.module = after
        if dump_dir is not None:
            (dump_dir / f"{module.name}.{number:02d}_{p.name}.hlo").write_text(str(after))
    if dump_dir is not None:
        (dump_dir / f"{module.name}.final.hlo").write_text(str(result.module))
    return result


def _after(ran: list[str]) -> str:
    return f" (after {', '.join(ran)})" if ran else " (the first pass)"


DEFAULT_PIPELINE = "simplify,fold,cse,licm,rowsplit,dce,fuse"
