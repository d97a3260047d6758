"""The jax backend ahead of time: a module exported with `jax.export` (StableHLO, serialized).

`serialize(module, platforms=None) -> bytes` exports the whole module as one function of its
parameters' shapes and dtypes, for the current platform or the ones named ("cpu", "cuda",
"rocm", "tpu"); its constants are compiled in. `deserialize(blob)` gives back a callable
`run(arrays) -> list` of jax arrays (one per output, as the executables' protocol has it),
jitted on first call, in any process with xfuse and the same or a newer jax (no tracing, no
fusion: XLA compiles the StableHLO). A blob is a header line (`read_header`: format version,
whether 64-bit types are used, the module's name, the platforms) followed by jax's own
serialization, which checks its version itself. May import xfuse.hlo and jax (and numpy).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Sequence

import jax
from jax import export as jax_export

from xfuse.hlo import Module

from .emit import compile_source, emit_function, uses_64_bits

MAGIC = b"xfuse-jax-export"
VERSION = 1


class ExportError(ValueError):
    """A blob that is not an xfuse jax export, or one of a newer format."""


def _x64(on: bool):
    return jax.enable_x64(True) if on else contextlib.nullcontext()


def serialize(module: Module, platforms: Sequence[str] | None = None) -> bytes:
    """The module's entry, exported for `platforms` (default: the current one)."""
    platforms = tuple(platforms) if platforms else (jax_export.default_export_platform(),)
    x64 = uses_64_bits(module)
    source = emit_function(module, flat_return=True)
    function = compile_source(source)
    parameters = module.entry_computation.parameters
    specs = [jax.ShapeDtypeStruct(p.shape.dims, p.shape.dtype.numpy) for p in parameters]
    with _x64(x64):
        exported = jax_export.export(jax.jit(function), platforms=platforms)(*specs)
    header = {"version": VERSION, "x64": x64, "module": module.name, "platforms": list(platforms)}
    return MAGIC + b" " + json.dumps(header).encode() + b"\n" + bytes(exported.serialize())


class Deserialized:
    """`run(arrays) -> list` of an exported module; `platforms`, `in_avals`, `out_avals` and
    `exported` (the `jax.export.Exported`) tell what it is."""

    def __init__(self, exported: jax_export.Exported, x64: bool, name: str) -> None:
        self.exported = exported
        self.x64 = x64
        self.name = name
        self.platforms = tuple(exported.platforms)
        self.in_avals = exported.in_avals
        self.out_avals = exported.out_avals
        self._call = jax.jit(exported.call)

    def __call__(self, arrays: Sequence[object]) -> list:
        if len(arrays) != len(self.in_avals):
            raise TypeError(f"{self.name} takes {len(self.in_avals)} arguments, got {len(arrays)}")
        with _x64(self.x64):
            return list(self._call(*arrays))

    def __repr__(self) -> str:
        return f"<xfuse jax export {self.name} for {', '.join(self.platforms)}>"


def read_header(blob: bytes) -> dict:
    """A blob's header: {"version", "x64", "module", "platforms"}; ExportError if it has none."""
    head, newline, _ = bytes(blob[:4096]).partition(b"\n")
    if not head.startswith(MAGIC + b" ") or not newline:
        raise ExportError("not an xfuse jax export (no xfuse-jax-export header)")
    try:
        header = json.loads(head[len(MAGIC) + 1 :])
        header["version"], header["x64"] = int(header["version"]), bool(header["x64"])
        header["module"], header["platforms"] = str(header["module"]), list(header["platforms"])
    except (ValueError, KeyError, TypeError) as e:
        raise ExportError(f"the xfuse jax export header is damaged: {e}") from None
    if header["version"] > VERSION:
        raise ExportError(
            f"an xfuse jax export of format {header['version']}; this xfuse reads up to {VERSION}"
        )
    return header


def deserialize(blob: bytes) -> Callable[[Sequence[object]], list]:
    """The callable of a `serialize`d module; ExportError if `blob` is not one."""
    blob = bytes(blob)
    header = read_header(blob)
    payload = blob[blob.index(b"\n") + 1 :]
    with _x64(header["x64"]):
        exported = jax_export.deserialize(bytearray(payload))
    return Deserialized(exported, header["x64"], header["module"])
