"""`xfuse.aot.load`: an artifact of native code runs on the numpy-only runtime
(`runtime/artifact.py`, nothing else imported); one holding a jax.export module (the jax
backend's AOT form) is deserialized by jax, with the same signature checks.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from xfuse.runtime.artifact import ArtifactError, Loaded, read
from xfuse.runtime.executable import guarded_call

if TYPE_CHECKING:
    from concurrent.futures import Future


def load(path) -> Loaded:
    """The function in an artifact, ready to call: `load("mlp.xfa")(x, w, b)`."""
    manifest, blobs = read(path)
    if manifest.get("runtime") == "jax":
        return ExportedLoaded(manifest, blobs, str(path))
    return Loaded(manifest, blobs, str(path))


class ExportedLoaded(Loaded):
    """A jax.export artifact: called like `Loaded` (same checks, same result structure); the
    results are jax arrays, on jax's default device."""

    def __init__(self, manifest: dict, blobs: memoryview, where: str = "artifact") -> None:
        try:
            from xfuse.backends.jax.export import ExportError, deserialize
        except ImportError as error:
            raise ArtifactError(f"{where}: holds a jax.export module, and jax cannot be imported "
                                f"here ({error})") from None
        self._signature(manifest, where)
        blob = self._blobs(manifest, blobs, where)
        try:
            self.executable = deserialize(bytes(blob("exported")))
        except (ExportError, ValueError) as error:
            raise ArtifactError(f"{where}: {error}") from None
        self._guarded = None if self._fast is None else guarded_call(self._fast, self._single, self.executable)

    def call_async(self, *args, **kwargs) -> Future:
        """A `concurrent.futures.Future` of the result (jax dispatches asynchronously itself)."""
        from concurrent.futures import Future

        from xfuse.runtime.artifact import unflatten

        future: Future = Future()
        try:
            outputs = self.executable(self.check(args, kwargs))
            future.set_result(outputs[0] if self._single else unflatten(self.out_tree, iter(outputs)))
        except Exception as error:  # noqa: BLE001 - delivered through the future
            future.set_exception(error)
        return future
