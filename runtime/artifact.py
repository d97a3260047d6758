"""AOT artifacts: one file holding a compiled function's native kernels, its program (steps
and buffers), its constants and a manifest; `load(path)` runs it with numpy alone.

Layout (little-endian):

    0   magic  b"XFUSEAOT"
    8   u32    format version (FORMAT)
    12  u32    0 (reserved)
    16  u64    manifest length M
    24  32 B   sha256 of everything from byte 56 to the end
    56  M B    manifest (JSON, UTF-8)
    56+M       blobs: the kernel library, then each constant's bytes; the manifest's "blobs"
               gives each one's (offset, length) from here

The manifest holds the signature (argument tree, shapes and dtypes, result tree), the target
(machine, CPU features the code was built for), the xfuse version and the program
(`runtime.program`). A truncated, corrupted or foreign file, a newer format, another machine
or a CPU without the features gives `ArtifactError`, before any native code is loaded.
Imports numpy and the standard library only (ml_dtypes for bfloat16 signatures).
"""

from __future__ import annotations

import json
import os
import platform
import struct
import sys

import numpy as np

from . import native, program
from .executable import MISS, method_class

try:  # the built-in SHA-256: importing hashlib loads OpenSSL, a quarter of a loader's start-up
    from _sha256 import sha256
except ImportError:  # Python 3.12 renamed it
    try:
        from _sha2 import sha256
    except ImportError:  # pragma: no cover - a Python built without it
        from hashlib import sha256

MAGIC = b"XFUSEAOT"
FORMAT = 1
PREFIX = struct.Struct("<8sIIQ32s")  # magic, format, reserved, manifest length, sha256


class ArtifactError(ValueError):
    """An artifact that cannot be run here; says why (names the file)."""


# ---------------------------------------------------------------------------- writing
def pack(manifest: dict, blobs: dict[str, bytes]) -> bytes:
    """The bytes of an artifact: `manifest` (its "blobs" entry is filled in here) and blobs."""
    offsets, data, at = {}, [], 0
    for name, blob in blobs.items():
        offsets[name] = [at, len(blob)]
        data.append(blob)
        at += len(blob)
    manifest = {**manifest, "format": FORMAT, "blobs": offsets}
    text = json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()
    body = text + b"".join(data)
    return PREFIX.pack(MAGIC, FORMAT, 0, len(text), sha256(body).digest()) + body


def write(path, manifest: dict, blobs: dict[str, bytes]) -> int:
    """Writes an artifact atomically (a reader never sees half a file); returns its size."""
    path = os.fspath(path)
    data = pack(manifest, blobs)
    folder, name = os.path.split(path)
    # A name of its own for each writer: threads of one process may save to one path at once.
    tmp = os.path.join(folder, f".{name}.{os.getpid()}.{os.urandom(6).hex()}.tmp")
    try:
        with open(tmp, "xb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return len(data)


# ---------------------------------------------------------------------------- reading
def read(path) -> tuple[dict, memoryview]:
    """(manifest, blob area) of a checked artifact."""
    path = os.fspath(path)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise ArtifactError(f"{path}: cannot read the artifact ({e.strerror or e})") from None
    return parse(data, str(path))


def parse(data: bytes, where: str = "artifact") -> tuple[dict, memoryview]:
    if len(data) < PREFIX.size:
        if not MAGIC.startswith(data[: len(MAGIC)]):
            raise ArtifactError(f"{where}: not an xfuse artifact (no XFUSEAOT header)")
        raise ArtifactError(f"{where}: truncated ({len(data)} bytes, shorter than the header)")
    magic, version, _, length, digest = PREFIX.unpack_from(data)
    if magic != MAGIC:
        raise ArtifactError(f"{where}: not an xfuse artifact (no XFUSEAOT header)")
    if version > FORMAT:
        raise ArtifactError(f"{where}: artifact format {version} is newer than this xfuse reads "
                            f"(format {FORMAT}); load it with a newer xfuse")
    if version < 1:
        raise ArtifactError(f"{where}: unknown artifact format {version}")
    body = memoryview(data)[PREFIX.size :]
    if sha256(body).digest() != digest:
        if PREFIX.size + length > len(data):
            raise ArtifactError(f"{where}: truncated ({len(data)} bytes; its manifest alone needs "
                                f"{PREFIX.size + length})")
        raise ArtifactError(f"{where}: corrupted (its checksum does not match its contents)")
    try:
        manifest = json.loads(bytes(body[:length]))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:  # a checksum of a bad manifest
        raise ArtifactError(f"{where}: its manifest is not valid JSON ({e})") from None
    return manifest, body[length:]


def _numpy_features() -> dict[str, bool]:
    """numpy's CPU feature detection: name -> present, for the names this numpy knows."""
    try:
        from numpy._core._multiarray_umath import __cpu_features__
    except ImportError:  # numpy < 2
        from numpy.core._multiarray_umath import __cpu_features__
    return dict(__cpu_features__)


def cpu_features() -> set[str]:
    """This CPU's features, in numpy's names."""
    return {name for name, present in _numpy_features().items() if present}


# Features an artifact may name that an older numpy does not know (numpy 2.0 has no BMI, BMI2,
# LZCNT or MOVBE), as Linux's /proc/cpuinfo names them (x86 reports lzcnt as "abm").
_CPUINFO_FLAGS = {"BMI": "bmi1", "BMI2": "bmi2", "LZCNT": "abm", "MOVBE": "movbe"}


def _cpuinfo_flags() -> set[str] | None:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return None


def missing_features(wanted) -> list[str]:
    """Those of `wanted` (numpy's names) this CPU lacks. numpy decides for the features it
    knows; the others are looked up in /proc/cpuinfo where there is one, else taken as present
    (nothing here can tell), so a loader with an older numpy does not refuse a CPU that has
    them."""
    known = _numpy_features()
    flags = _cpuinfo_flags() if any(name not in known for name in wanted) else None

    def present(name: str) -> bool:
        if name in known:
            return known[name]
        return flags is None or _CPUINFO_FLAGS.get(name, name.lower()) in flags

    return sorted(name for name in wanted if not present(name))


def host_platform() -> dict:
    return {"system": sys.platform, "machine": platform.machine().lower()}


def check_target(manifest: dict, where: str) -> None:
    target = manifest.get("target", {})
    host = host_platform()
    for key in ("system", "machine"):
        wanted = target.get(key)
        if wanted is not None and wanted != host[key]:
            raise ArtifactError(f"{where}: built for {target.get('system')}/{target.get('machine')}, "
                                f"this is {host['system']}/{host['machine']}")
    missing = missing_features(target.get("features", ()))
    if missing:
        raise ArtifactError(f"{where}: built for CPU features this CPU lacks: {', '.join(missing)} "
                            f"(target {target.get('cpu', '?')}); rebuild it with an older target, "
                            "e.g. `--target x86-64-v2`")


def load(path) -> Loaded:
    """The function in an artifact, ready to call: `load("mlp.xfa")(x, w, b)`."""
    manifest, blobs = read(path)
    return Loaded(manifest, blobs, str(path))


class Loaded:
    """A loaded artifact: call it like the compiled function it was saved from. Arguments are
    checked as `Compiled` checks them (structure, shapes and dtypes; TypeError naming the
    argument); results come back in the function's output structure."""

    def __init__(self, manifest: dict, blobs: memoryview, where: str = "artifact") -> None:
        if manifest.get("runtime") == "jax":
            raise ArtifactError(f"{where}: holds a module exported with jax.export; "
                                "xfuse.aot.load runs it where jax is installed")
        if manifest.get("format") != FORMAT or "program" not in manifest:
            raise ArtifactError(f"{where}: its manifest does not describe a program")
        check_target(manifest, where)
        self._signature(manifest, where)
        blob = self._blobs(manifest, blobs, where)
        constants = {}
        for key, info in manifest["constants"].items():
            raw = blob(f"const:{key}")
            constants[key] = np.frombuffer(raw, program.dtype(info["dtype"])).reshape(info["shape"]).copy()
        self.library = native.open_library_bytes(bytes(blob("library")), f"xfuse-{self.name}")
        kernels = native.kernels(self.library, manifest["program"])
        self.executable = program.build(manifest["program"], kernels, constants)
        self._guarded = None if self._fast is None else self.executable.guarded_runner(self._fast, self._single)
        if self._guarded is not None and self._single and type(self) is Loaded:
            self._own_call()

    def _own_call(self) -> None:
        """Gives this instance a class of its own whose `__call__` is the runtime's guarded
        call made a method, calling `Loaded.__call__` for any other arguments: a call pays for
        one Python frame, not two (as `xfuse.stages.Compiled` does; x + 1 on 4 floats took
        0.95-0.96 us against 1.03-1.07 us, most of it the kernel's call through ctypes)."""
        self.__class__ = method_class(Loaded, self.executable.guarded_runner(self._fast, True, method=Loaded.__call__))

    def _blobs(self, manifest: dict, blobs: memoryview, where: str):
        """`blob(key)`: the bytes of one blob, checked to lie inside the file."""
        spans = manifest["blobs"]

        def blob(key: str) -> memoryview:
            at, n = spans[key]
            if at + n > len(blobs):
                raise ArtifactError(f"{where}: blob {key!r} lies past the end of the file")
            return blobs[at : at + n]

        return blob

    def _signature(self, manifest: dict, where: str) -> None:
        self.manifest = manifest
        self.name = manifest.get("name", "function")
        self.path = where
        signature = manifest["signature"]
        self.in_tree, self.out_tree = signature["in_tree"], signature["out_tree"]
        self.arg_names = signature["arg_names"]
        self.specs = [(tuple(dims), program.dtype(name), weak) for dims, name, weak in signature["args"]]
        self.x64 = signature.get("x64", False)
        positional = self.in_tree == _positional(len(self.specs)) and not any(w for _, _, w in self.specs)
        # The fast path: positional numpy arrays of exactly the signature's shapes and dtypes.
        self._fast = [(s, d) for s, d, _ in self.specs] if positional else None
        self._single = self.out_tree == "*"

    def __repr__(self) -> str:
        args = ", ".join(f"{d.name}{list(s)}" for s, d, _ in self.specs)
        return f"<xfuse artifact {self.name}({args}) from {self.path}>"

    def __call__(self, *args, **kwargs):
        if not kwargs and self._guarded is not None:  # plain ndarrays of the signature, counted
            outputs = self._guarded(args)
            if outputs is not MISS:
                return outputs if self._single else unflatten(self.out_tree, iter(outputs))
        outputs = self.executable(self.check(args, kwargs))
        return outputs[0] if self._single else unflatten(self.out_tree, iter(outputs))

    def check(self, args: tuple, kwargs: dict) -> list[np.ndarray]:
        """The flat argument arrays; TypeError naming the first argument that does not fit."""
        leaves: list[tuple[str, object]] = []
        (_, (positional, keywords)), = self.in_tree.items()  # the tree of (args, kwargs)
        (_, trees), = positional.items()
        if len(args) != len(trees):
            raise TypeError(f"{self.name} takes {len(trees)} array arguments, got {len(args)} "
                            f"(its arguments: {', '.join(self.arg_names[: len(trees)])})")
        for i, (tree, value) in enumerate(zip(trees, args)):
            name = self.arg_names[i] if i < len(self.arg_names) else f"args[{i}]"
            flatten(tree, value, name, leaves, self.name)
        flatten(keywords, dict(kwargs), "", leaves, self.name)
        arrays = []
        for (path, leaf), (dims, dtype, weak) in zip(leaves, self.specs):
            array = _as_array(leaf, path, dtype, weak, self.x64)
            if array.shape != dims or array.dtype != dtype:
                raise TypeError(f"{self.name}: argument {path} should be {dtype.name}{list(dims)}, "
                                f"got {array.dtype.name}{list(array.shape)}")
            arrays.append(array)
        return arrays

    def call_async(self, *args, **kwargs):
        """A `concurrent.futures.Future` of the result; independent steps run at once."""
        from concurrent.futures import Future

        from .asynchronous import call_async

        inner = call_async(self.executable, self.check(args, kwargs))
        outer: Future = Future()

        def done(f):
            error = f.exception()
            if error is not None:
                outer.set_exception(error)
            else:
                outer.set_result(unflatten(self.out_tree, iter(f.result())))

        inner.add_done_callback(done)
        return outer


# ---------------------------------------------------------------------------- pytrees
# A tree is JSON: "*" a leaf, null None, {"tuple": [...]}, {"list": [...]}, {"dict": [[key, tree]...]}.
def _positional(n: int) -> dict:
    return {"tuple": [{"tuple": ["*"] * n}, {"dict": []}]}


def flatten(tree, value, path: str, out: list, fn: str) -> None:
    """Appends (path, leaf) for each leaf of `value`, checking it has the structure `tree`."""
    def where() -> str:
        return f"argument {path}" if path else "the keyword arguments"

    if tree == "*":
        out.append((path, value))
        return
    if tree is None:
        if value is not None:
            raise TypeError(f"{fn}: {where()} should be None, got {type(value).__name__}")
        return
    (kind, children), = tree.items()
    if kind in ("tuple", "list"):
        ok = isinstance(value, tuple) if kind == "tuple" else isinstance(value, list)
        if not ok or len(value) != len(children):
            got = f"{type(value).__name__} of {len(value)}" if isinstance(value, (tuple, list)) else type(value).__name__
            raise TypeError(f"{fn}: {where()} should be a {kind} of {len(children)}, got {got}")
        for i, (child, v) in enumerate(zip(children, value)):
            flatten(child, v, f"{path}[{i}]", out, fn)
        return
    if kind == "dict":
        keys = [k for k, _ in children]
        if not isinstance(value, dict) or sorted(value) != sorted(keys):
            got = sorted(value) if isinstance(value, dict) else type(value).__name__
            raise TypeError(f"{fn}: {where()} should be a dict with keys {keys}, got {got}")
        for key, child in children:
            flatten(child, value[key], f"{path}[{key!r}]" if path else key, out, fn)
        return
    raise TypeError(f"{fn}: unknown tree node {kind!r}")


def unflatten(tree, leaves):
    if tree == "*":
        return next(leaves)
    if tree is None:
        return None
    (kind, children), = tree.items()
    if kind == "tuple":
        return tuple(unflatten(c, leaves) for c in children)
    if kind == "list":
        return [unflatten(c, leaves) for c in children]
    return {key: unflatten(c, leaves) for key, c in children}


def _as_array(leaf, path: str, dtype: np.dtype, weak: bool, x64: bool) -> np.ndarray:
    if isinstance(leaf, (bool, int, float)) and not isinstance(leaf, np.generic):
        if isinstance(leaf, bool) or not weak:
            kind = np.bool_ if isinstance(leaf, bool) else (np.int64 if isinstance(leaf, int) else np.float64)
            leaf = np.asarray(leaf, kind)
            if not x64 and leaf.dtype.itemsize == 8:
                leaf = leaf.astype(np.int32 if leaf.dtype.kind == "i" else np.float32)
            return leaf
        return np.asarray(leaf, dtype)  # a weak Python scalar takes the argument's dtype
    if not hasattr(leaf, "dtype") or not hasattr(leaf, "shape"):
        try:
            array = np.asarray(leaf)
        except Exception:
            raise TypeError(f"argument {path}: {type(leaf).__name__} is not an array") from None
        if array.dtype == object:  # named as given, not as numpy made it
            raise TypeError(f"argument {path}: {type(leaf).__name__} is not an array")
    array = np.asarray(leaf)
    if not x64 and array.dtype.itemsize == 8 and array.dtype.kind in "iuf":  # as jax canonicalises
        array = array.astype({"i": np.int32, "u": np.uint32, "f": np.float32}[array.dtype.kind])
    if array.dtype.byteorder not in "=|":
        array = array.astype(array.dtype.newbyteorder("="))
    return array


__all__ = ["ArtifactError", "FORMAT", "Loaded", "load", "pack", "parse", "read", "write"]
