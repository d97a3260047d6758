"""xfuse's own backends as registry objects (pyproject.toml names them in the entry-point group
`xfuse.backends`, as a plugin package would). Each imports its library only when it compiles.
May import xfuse.hlo and the standard library here; the backends' modules import the rest.
"""

from __future__ import annotations

from xfuse.hlo import Module

from .registry import Backend, Device, host_cpu


class NumbaBackend(Backend):
    name = "numba"
    loops_at_once = True  # xfuse's runtime runs them (runtime.program)
    description = "native CPU kernels compiled by numba (LLVM), BLAS for dots"

    def compile(self, module: Module, **options: object):
        from xfuse.backends.numba import compile_module

        return compile_module(module)


class CBackend(Backend):
    name = "c"
    loops_at_once = True  # xfuse's runtime runs them (runtime.program)
    description = "kernels rendered as C and built by the system C compiler (what AOT ships)"

    def compile(self, module: Module, **options: object):
        from xfuse.backends.c.backend import compile_module

        return compile_module(module)


class JaxBackend(Backend):
    name = "jax"
    description = "each fusion a jitted jax.lax function, run by XLA on any device jax has"
    options = ("mode", "device")
    host_arrays = False

    def devices(self) -> list[Device]:
        import jax

        found = []
        for d in [d for p in ("cpu", "gpu", "tpu") for d in _platform_devices(jax, p)]:
            device = Device(self.name, d.platform, d.id, getattr(d, "device_kind", str(d)))
            if device not in found:
                found.append(device)
        return found

    def compile(self, module: Module, **options: object):
        from xfuse.backends.jax import compile_module

        return compile_module(module, **options)


def _platform_devices(jax, platform_name: str) -> list:
    try:
        return jax.devices(platform_name)
    except RuntimeError:  # no such platform on this machine
        return []


class ReferenceBackend(Backend):
    name = "reference"
    description = "xfuse.hlo's numpy interpreter: slow and exact, the oracle of the tests"

    def devices(self) -> list[Device]:
        return [Device(self.name, "cpu", 0, f"{host_cpu()} (numpy)")]

    def compile(self, module: Module, **options: object):
        from xfuse.backends import reference

        return reference.compile(module)


NUMBA = NumbaBackend()
C = CBackend()
JAX = JaxBackend()
REFERENCE = ReferenceBackend()
BACKENDS = (NUMBA, C, JAX, REFERENCE)
