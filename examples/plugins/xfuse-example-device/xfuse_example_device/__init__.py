"""An example xfuse backend plugin: the `example` device.

The device runs loop fusions and single instructions made of a few float elementwise ops; the
registry learns that from `capabilities` and places everything else on the fallback backend.
Importing this module is cheap; the registry imports it only when the backend is first used.
"""

from __future__ import annotations

from xfuse.backends.registry import Backend, Capabilities, Device

from .engine import OPS, compile_module

__version__ = "0.1.0"


class ExampleDevice(Backend):
    name = "example"
    description = "example device (a plugin package): float elementwise loop fusions"
    capabilities = Capabilities(
        ops=frozenset(OPS),
        fusion_kinds=frozenset({"loop"}),
        dtypes=frozenset({"f32", "f64"}),
    )
    options = ("trace",)

    def devices(self) -> list[Device]:
        return [Device(self.name, "cpu", 0, "example device (numpy)")]

    def compile(self, module, trace: bool = False):
        return compile_module(module, trace=trace)


BACKEND = ExampleDevice()
