"""The runtime's way into C kernels (`runtime/native.py`): each kernel of a C library has a twin
taking one buffer of [data offset, integers, array objects], which reads the arrays' data
pointers itself. Plain C-contiguous native-endian ndarrays take it (read-only ones too); anything
else (a strided view, another byte order, a subclass) goes through the pointer-taking entry,
with the same results; threads calling one kernel at once each use a
buffer of their own.
"""

from __future__ import annotations

import ctypes
import threading

import jax.numpy as jnp
import numpy as np
import pytest

import xfuse
from xfuse.backends.numba.lowering import lower
from xfuse.runtime import native


def _axpy(x, y):
    return x * 2.0 + y


@pytest.fixture(scope="module")
def kernel():
    """(library, kernel name, the pointer-taking call) of _axpy on f32[64] in the C backend."""
    x = np.zeros(64, np.float32)
    compiled = xfuse.jit(_axpy, backend="c").lower(x, x).compile()
    program = lower(compiled.module).program
    (step,) = [s for s in program["steps"] if s["op"] == "kernel"]
    library = compiled.executable.library
    ints, arrays, outputs = native.kernel_arity(step)
    cfn = getattr(library, step["kernel"])
    cfn.restype = ctypes.c_int
    cfn.argtypes = [ctypes.c_int64] * ints + [ctypes.c_void_p] * arrays
    general = native.adapt(cfn, step["kernel"], ints, arrays - outputs)
    return library, step["kernel"], general, compiled


class Recording:
    def __init__(self, general):
        self.general, self.calls = general, 0
        self.__name__ = general.__name__

    def __call__(self, *args):
        self.calls += 1
        return self.general(*args)


def _entry(kernel):
    library, name, general, _ = kernel
    recording = Recording(general)
    twin = getattr(library, name + native.OBJECT_ENTRY)
    return native.adapt_objects(twin, recording, 2, 2, 3), recording


def test_the_data_offset_is_found_and_reads_every_array():
    assert native.DATA_OFFSET is not None
    base = np.arange(40, dtype=np.float64)
    for a in (base, base[3:], base.reshape(5, 8).T, np.empty(0, np.int8), np.ones((), np.float32)):
        assert ctypes.c_void_p.from_address(id(a) + native.DATA_OFFSET).value == a.ctypes.data


def test_kernels_of_a_c_library_take_the_object_entry(kernel):
    library, name, _, compiled = kernel
    found = native.kernels(library, lower(compiled.module).program)
    assert found[name].fn.__code__.co_filename == f"<xfuse kernel entry {name}>"
    x, y = np.linspace(-3, 3, 64, dtype=np.float32), np.full(64, 0.5, np.float32)
    np.testing.assert_array_equal(compiled(x, y), x * np.float32(2) + y)


def test_plain_arrays_take_the_twin_with_the_same_result(kernel):
    call, recording = _entry(kernel)
    x = np.array([np.nan, np.inf, -np.inf, -0.0, 1e-45, 3.5] * 10 + [1, 2, 3, 4], np.float32)
    y = np.arange(64, dtype=np.float32)
    out = np.full(64, 7, np.float32)
    call(0, 64, x, y, out)
    np.testing.assert_array_equal(out, x * np.float32(2) + y)
    assert recording.calls == 0
    out[:] = 7  # rows outside [10, 20) are not written
    call(10, 20, x, y, out)
    np.testing.assert_array_equal(out[10:20], (x * np.float32(2) + y)[10:20])
    assert (out[:10] == 7).all() and (out[20:] == 7).all()
    assert recording.calls == 0


class Sub(np.ndarray):
    pass


@pytest.mark.parametrize("odd", ["strided", "big-endian", "subclass", "read-only"])
def test_other_arrays_go_through_the_pointer_entry(kernel, odd):
    call, recording = _entry(kernel)
    x = np.linspace(-1, 1, 128, dtype=np.float32)[::2]
    y = np.arange(64, dtype=np.float32)
    expect = x * np.float32(2) + y
    out = np.empty(64, np.float32)
    if odd == "strided":
        assert not x.flags.c_contiguous
    elif odd == "big-endian":
        x = x.astype(">f4")
    elif odd == "subclass":
        x = np.ascontiguousarray(x).view(Sub)
    else:  # read through its data pointer as well
        x = np.frombuffer(np.ascontiguousarray(x).tobytes(), np.float32)
        assert not x.flags.writeable
    call(0, 64, x, y, out)
    np.testing.assert_array_equal(out, expect)
    assert recording.calls == (0 if odd == "read-only" else 1)


def test_threads_calling_one_kernel_at_once_each_get_their_own_buffer(kernel):
    call, recording = _entry(kernel)
    errors: list[str] = []

    def work(seed: int) -> None:
        rng = np.random.default_rng(seed)
        for _ in range(300):
            n = int(rng.integers(1, 65))
            x, y = rng.standard_normal(64).astype(np.float32), rng.standard_normal(64).astype(np.float32)
            out = np.zeros(64, np.float32)
            call(0, n, x, y, out)
            if not (np.array_equal(out[:n], x[:n] * np.float32(2) + y[:n]) and (out[n:] == 0).all()):
                errors.append(f"thread {seed}: wrong rows")
                return

    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and recording.calls == 0


def test_an_integer_kernel_through_an_artifact(tmp_path):
    """The same entry in a saved artifact, for int32 with wraparound."""
    from xfuse.runtime.artifact import load

    x = np.array([2**31 - 1, -(2**31), 0, -1, 5], np.int32)
    compiled = xfuse.jit(lambda a, b: a * 3 + b, backend="c").lower(x, x).compile()
    compiled.save(tmp_path / "f.xfa")
    loaded = load(tmp_path / "f.xfa")
    got = loaded(x, x[::-1].copy())
    np.testing.assert_array_equal(got, np.asarray(jnp.asarray(x) * 3 + jnp.asarray(x[::-1])))
    np.testing.assert_array_equal(loaded(x[::-1], x), np.asarray(jnp.asarray(x[::-1]) * 3 + jnp.asarray(x)))


def test_a_small_output_fusion_runs_its_product_into_the_output():
    """A serial output fusion of a C kernel: BLAS writes the product into the output, then the
    kernel applies its epilogue there; NaN and infinities come through as jax gives them."""
    import jax

    def f(x, w, b):
        return jnp.tanh(x @ w + b)

    rng = np.random.default_rng(1)
    x = rng.standard_normal((8, 32)).astype(np.float32)
    w, b = rng.standard_normal((32, 16)).astype(np.float32), rng.standard_normal(16).astype(np.float32)
    x[0, 0], x[1, :], w[:, 3] = np.nan, np.inf, 0
    compiled = xfuse.jit(f, backend="c").lower(x, w, b).compile()
    assert compiled.executable.steps[0].run.__name__ == "in_place"
    with np.errstate(invalid="ignore"):
        np.testing.assert_allclose(compiled(x, w, b), np.asarray(jax.jit(f)(x, w, b)), rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize("backend", ["numba", "c"])
def test_an_output_fusion_applies_its_epilogue_in_place(backend):
    """An output fusion computes its product into the output and applies the epilogue there
    (no scratch), elementwise (gelu) or row-wise (softmax), with jax.jit's results. A numba
    kernel with an elementwise epilogue has a twin of its loop reading the product from the
    output itself (LLVM vectorises a loop over two overlapping arrays only in its scalar
    form); called over one buffer or two, it gives the same bits."""
    import jax

    from xfuse.backends.numba.compile import full_text

    def gelu_layer(x, w, b):
        return jax.nn.gelu(x @ w + b, approximate=True)

    def softmax_layer(x, w, b):
        return jax.nn.softmax(x @ w + b, axis=-1)

    rng = np.random.default_rng(2)
    x = rng.standard_normal((256, 128)).astype(np.float32)  # past the parallel threshold
    w, b = (rng.standard_normal((128, 512)) * 0.1).astype(np.float32), rng.standard_normal(512).astype(np.float32)
    x[3, 7], x[5, :] = np.nan, np.inf
    for fn, by_rows in ((gelu_layer, False), (softmax_layer, True)):
        compiled = xfuse.jit(fn, backend=backend).lower(x, w, b).compile()
        (step,) = compiled.executable.steps
        assert step.scratch_bytes == 0
        with np.errstate(invalid="ignore"):
            np.testing.assert_allclose(compiled(x, w, b), np.asarray(jax.jit(fn)(x, w, b)), rtol=2e-5, atol=2e-6)
        if backend == "numba":
            (source,) = lower(compiled.module).kernels.values()
            assert ("dot.ctypes.data == out0.ctypes.data" in full_text(source)) is not by_rows
            kernel = step.run.dispatcher
            with np.errstate(invalid="ignore"):
                product = (x @ w).astype(np.float32)
            apart, alone = np.empty_like(product), product.copy()
            kernel(0, 256, 0, product, x, w, b, apart)
            kernel(0, 256, 0, alone, x, w, b, alone)
            np.testing.assert_array_equal(apart.view(np.uint32), alone.view(np.uint32))
