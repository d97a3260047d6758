"""The JAX backend: a fused module to `jax.jit` functions that XLA compiles for any device.

- mode="fusions" (the default): each top-level fusion, and each other instruction that
  computes at the top level, is a `jax.jit` function of its own, so XLA compiles each of
  xfuse's kernels separately and the fusion report means what it says. A plain Python driver
  (generated too, see `emit.emit_driver`) calls them in order; parameters, constants, tuples
  and tuple elements are Python values, with no dispatch.
- mode="module": the whole fused entry computation is one `jax.jit` function; XLA then fuses
  across xfuse's kernels as it likes.

`device` (a `jax.Device`, a name such as "gpu" or "cpu:0", or None for jax's default):
arguments go there and the functions run there; constants are put there once, at compile time.
Results are jax arrays, left on the device.

64-bit types: the module's dtypes are explicit, and jax computes 64-bit types only with its x64
mode on. A module with any 64-bit value is traced and run inside `jax.enable_x64(True)` (a
thread-local setting, about 1 us per call), whatever the global setting, so it computes in the
types it declares; a module without one runs under the global setting, where it means the same.
May import xfuse.hlo and jax (and numpy).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence

import jax
import numpy as np
from jax.sharding import SingleDeviceSharding

from xfuse.hlo import Computation, Instruction, Module, Op

from .emit import Source, compile_source, emit_driver, emit_function, kernel_computation, uses_64_bits

NAME = "jax"
MODES = ("fusions", "module")
# A parameter at least this large that several kernels read is put on the device once per call
# rather than copied in by each kernel.
SHARED_INPUT_BYTES = 1 << 20


class JaxExecutable:
    """`executable(arrays) -> list` of jax arrays, one per output (per tuple element of a tuple
    root). `kernels`: the `jax.jit` functions by instruction name (in "module" mode one, by the
    entry computation's name), `kernel_sources` their generated source; `driver_source`: the
    generated top level that calls them ("fusions" mode)."""

    def __init__(self, module: Module, mode: str, device: jax.Device | str | None) -> None:
        if mode not in MODES:
            choices = ", ".join(MODES)
            raise ValueError(f"mode={mode!r} is not a mode of the jax backend; choose one of {choices}")
        device = resolve_device(device)
        self.module = module
        self.mode = mode
        self.device = device
        self.x64 = uses_64_bits(module)
        self._sharding = SingleDeviceSharding(device) if device is not None else None
        self.kernels: dict[str, Callable] = {}
        self.kernel_sources: dict[str, str] = {}
        self.driver_source = ""
        with jax.enable_x64(True) if self.x64 else contextlib.nullcontext():
            self._run = self._build_fusions() if mode == "fusions" else self._build_module()

    # ------------------------------------------------------------------ building
    def _jit(self, fn: Callable) -> Callable:
        if self._sharding is None:
            return jax.jit(fn)
        return jax.jit(fn, in_shardings=self._sharding, out_shardings=self._sharding)

    def _put(self, array: np.ndarray) -> jax.Array:
        return jax.device_put(array, self.device)

    def _build_module(self) -> Callable:
        source = emit_function(self.module, constants_as_arguments=True, flat_return=True)
        self.kernel_sources[self.module.entry] = source.text
        entry = self.module.entry_computation
        constants = [self._put(entry[name].attr("value").array) for name in source.constant_arguments]
        jitted = self.kernels[self.module.entry] = self._jit(compile_source(source))
        if not constants:
            return jitted
        return lambda *arrays: jitted(*arrays, *constants)

    def _build_fusions(self) -> Callable:
        # by source text and constants: the kernels of one fused computation share one
        jitted: dict[tuple, Callable] = {}

        def kernel_source(comp: Computation, inst: Instruction) -> Source:
            if inst.op is Op.FUSION:
                return emit_function(self.module, self.module[inst.called])
            return emit_function(self.module, kernel_computation(comp, inst))

        driver = emit_driver(self.module, kernel_source)
        bound: dict[str, object] = {}
        for key, (global_name, source) in driver.kernels.items():
            self.kernel_sources[key] = source.text
            same = (source.text, *map(id, source.globals.values()))
            if same not in jitted:
                jitted[same] = self._jit(compile_source(source))
            bound[global_name] = self.kernels[key] = jitted[same]
        constants = {name: self._put(value) for name, value in driver.source.globals.items()}
        self.driver_source = driver.source.text
        run = compile_source(Source(driver.source.name, driver.source.text), {**bound, **constants})
        return self._with_placement(run)

    def _with_placement(self, run: Callable) -> Callable:
        """`run`, with the arguments that must be on the device put there first: those that are
        outputs themselves, and large ones several kernels read."""
        entry = self.module.entry_computation
        kernel_users = {p.name: 0 for p in entry.parameters}
        for inst in entry.instructions:
            if inst.op not in (Op.TUPLE, Op.GET_TUPLE_ELEMENT, Op.OPTIMIZATION_BARRIER):
                for name in set(inst.operands) & kernel_users.keys():
                    kernel_users[name] += 1
        placed = [
            i for i, p in enumerate(entry.parameters)
            if _is_output(entry, p.name)
            or (kernel_users[p.name] > 1 and p.shape.nbytes >= SHARED_INPUT_BYTES)
        ]  # fmt: skip
        if not placed:
            return run
        put = self._put

        def placed_run(*arrays):
            arrays = list(arrays)
            for i in placed:
                arrays[i] = put(arrays[i])
            return run(*arrays)

        return placed_run

    # ------------------------------------------------------------------ calling
    def __call__(self, arrays: Sequence[object]) -> list:
        if self.x64:
            with jax.enable_x64(True):
                return self._run(*arrays)
        return self._run(*arrays)

    def runner(self) -> Callable:
        """The call itself, for a caller that has checked the arguments already."""
        if self.x64:
            return self.__call__
        run = self._run
        return lambda arrays: run(*arrays)

    def kernel_source(self) -> str:
        return "\n".join(f"# ---- {name}\n{text}" for name, text in self.kernel_sources.items())

    def __repr__(self) -> str:
        where = f" on {self.device}" if self.device is not None else ""
        return f"<xfuse jax executable {self.module.name} ({self.mode}){where}>"


def _is_output(comp: Computation, name: str) -> bool:
    """Whether parameter `name` is returned as it is (through tuples and tuple elements)."""

    def reaches(value: str) -> bool:
        inst = comp[value]
        if inst.name == name:
            return True
        if inst.op in (Op.TUPLE, Op.OPTIMIZATION_BARRIER):
            return any(reaches(o) for o in inst.operands)
        if inst.op is Op.GET_TUPLE_ELEMENT:
            return reaches(inst.operands[0])
        return False

    return reaches(comp.root)


def resolve_device(device: jax.Device | str | None) -> jax.Device | None:
    """A `jax.Device` as it is, None (jax's default device), or a name: "gpu", "cpu:1"."""
    if device is None or isinstance(device, jax.Device):
        return device
    if not isinstance(device, str):
        raise ValueError(f"device= must be a jax.Device, a name such as 'gpu:0', or None; "
                         f"got {type(device).__name__}")
    platform, _, index = device.partition(":")
    try:
        return jax.devices(platform)[int(index or 0)]
    except (RuntimeError, ValueError, IndexError) as e:
        raise ValueError(f"device={device!r}: jax has no such device ({e})") from None


def compile_module(
    module: Module, mode: str = "fusions", device: jax.Device | str | None = None
) -> JaxExecutable:
    """An executable of `module` (fused, or not) for `device` in `mode` ("fusions" or "module")."""
    return JaxExecutable(module, mode, device)
